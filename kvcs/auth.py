"""Authorization: tokens mapped to namespace prefixes allowed for publish / subscribe.

Auth file (JSON)::

    {"tokens": [
        {"token": "alice-secret",
         "publish":   [["kvcs-1", "hex:6d1c6481cd428737da312c089db3832a"]],
         "subscribe": [["kvcs-1", "hex:6d1c6481cd428737da312c089db3832a"]]}
    ]}

Namespace fields are strings: UTF-8 text, or ``hex:`` followed by hex digits for raw
bytes (KVCS Scope IDs are 16 raw octets). A prefix may also be one string with fields
separated by ``/`` (``"kvcs-1/hex:6d1c..."``). A token value may also be ``hex:...``.
"subscribe" covers SUBSCRIBE, FETCH, TRACK_STATUS and SUBSCRIBE_NAMESPACE; "publish" covers
PUBLISH_NAMESPACE. A request is allowed when one of its tokens has a prefix that is a
field-wise prefix of the request's namespace (for SUBSCRIBE_NAMESPACE: of the requested
prefix).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .moqt.wire import TrackNamespace, namespace_has_prefix

PUBLISH = "publish"
SUBSCRIBE = "subscribe"


class AuthError(ConfigError):
    """A bad auth file."""


def parse_field(text: str) -> bytes:
    """One namespace field: UTF-8 text or ``hex:`` + hex digits."""
    if not isinstance(text, str):
        raise AuthError(f"namespace field must be a string, got {text!r}")
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:])
        except ValueError:
            raise AuthError(f"bad hex namespace field {text!r}") from None
    return text.encode()


def parse_namespace(value: Any) -> TrackNamespace:
    """A namespace prefix: a list of field strings, or one ``/``-separated string."""
    if isinstance(value, str):
        parts = [p for p in value.split("/") if p != ""]
    elif isinstance(value, list):
        parts = value
    else:
        raise AuthError(f"namespace prefix must be a list of strings or a string: {value!r}")
    return tuple(parse_field(p) for p in parts)


def render_namespace(ns: TrackNamespace, *, short: bool = True) -> str:
    """Readable form of a namespace for logs (text fields as is, others as hex:). With
    ``short`` (default), a binary field longer than 4 bytes shows its first 4 as
    ``hex:6d1c6481..``: a KVCS namespace is then ~60 characters instead of ~210 (log lines
    of 300+ characters of hex before); 8 hex digits tell publications apart in a log."""
    out = []
    for f in ns:
        try:
            s = f.decode()
            if s.isprintable() and "/" not in s:
                out.append(s)
                continue
        except UnicodeDecodeError:
            pass
        out.append("hex:" + (f[:4].hex() + ".." if short and len(f) > 4 else f.hex()))
    return "/".join(out)


@dataclass(frozen=True)
class Grant:
    """What one token allows."""

    publish: tuple[TrackNamespace, ...] = ()
    subscribe: tuple[TrackNamespace, ...] = ()
    name: str = ""


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class Authorizer:
    """Decides whether a set of token values allows an action on a namespace."""

    def __init__(self, grants: dict[bytes, Grant] | None = None, anonymous: bool = False):
        self.grants = dict(grants or {})
        self.anonymous = anonymous
        self._by_digest = {_digest(tok): (tok, g) for tok, g in self.grants.items()}

    def replace_rules(self, other: Authorizer) -> None:
        """Take every rule of ``other`` (a reloaded token file): requests are checked
        against them from now on; sessions already open stay."""
        vars(self).update(vars(other))

    @classmethod
    def from_file(cls, path: str) -> Authorizer:
        """Load the JSON auth file (see module doc); raises AuthError."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise AuthError(f"cannot read auth file {path}: {exc.strerror}") from None
        except ValueError as exc:
            raise AuthError(f"auth file {path} is not valid JSON: {exc}") from None
        return cls.from_mapping(data, str(path))

    @classmethod
    def from_mapping(cls, data: Any, where: str = "auth") -> Authorizer:
        """Build from the decoded auth file structure."""
        if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
            raise AuthError(f"{where}: expected {{\"tokens\": [...]}}")
        grants: dict[bytes, Grant] = {}
        for i, entry in enumerate(data["tokens"]):
            if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
                raise AuthError(f"{where}: tokens[{i}] needs a string \"token\"")
            unknown = set(entry) - {"token", "publish", "subscribe", "name"}
            if unknown:
                raise AuthError(f"{where}: tokens[{i}] has unknown keys {sorted(unknown)}")
            tok = parse_field(entry["token"])
            if not tok:
                raise AuthError(f"{where}: tokens[{i}] has an empty token")
            if tok in grants:
                raise AuthError(f"{where}: tokens[{i}] repeats a token")
            pubs = entry.get("publish", [])
            subs = entry.get("subscribe", [])
            if not isinstance(pubs, list) or not isinstance(subs, list):
                raise AuthError(f"{where}: tokens[{i}] publish/subscribe must be lists")
            grants[tok] = Grant(tuple(parse_namespace(p) for p in pubs),
                                tuple(parse_namespace(p) for p in subs),
                                str(entry.get("name", f"tokens[{i}]")))
        return cls(grants)

    def _lookup(self, token: bytes) -> Grant | None:
        """The token's grant, by the SHA-256 of the token: one hash and one dict lookup
        whatever the number of tokens configured (comparing with each took up to 42 ms for
        a request stuffed with tokens against a 100-token file); the found entry is then
        compared in constant time, so timing tells nothing about how much of a guess
        matched."""
        found = self._by_digest.get(_digest(token))
        if found is None or not hmac.compare_digest(found[0], token):
            return None
        return found[1]

    def allowed(self, tokens: list[bytes], action: str, namespace: TrackNamespace) -> bool:
        """True if one of ``tokens`` allows ``action`` (publish/subscribe) on ``namespace``."""
        if self.anonymous:
            return True
        ns = tuple(namespace)
        for tok in tokens:
            grant = self._lookup(tok)
            if grant is None:
                continue
            prefixes = grant.publish if action == PUBLISH else grant.subscribe
            if any(namespace_has_prefix(ns, p) for p in prefixes):
                return True
        return False
