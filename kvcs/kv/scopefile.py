"""Scope files: the key material of one KVCS scope in one JSON file (``kvcs keygen``).

A scope file carries the KVSP scope key S (which keys the identifiers) and the content
keys of MOQT Secure Objects (which protect the payloads), never the same key twice::

    {
      "kvcs_scope": 1,
      "scope_key": "<64 hex: S>",
      "content_keys": [
        {"key_id": 1, "suite": "AES_128_GCM_SHA256_128", "base_key": "<hex>"},
        {"key_id": 2, "suite": "AES_128_GCM_SHA256_128", "base_key": "<hex>", "current": true}
      ],
      "producer": {"kid": "producer", "private_key": "producer.pem",
                   "keyring": "producer.keyring.json"},
      "wire": "draft"
    }

Exactly one content key is ``current`` (publishers encrypt with it; consumers decrypt with
any). ``producer`` is optional: where the manifest.cose signing key and its public keyring
are, relative to the scope file. ``wire`` is optional: ``"draft"`` makes the scope's
Secure Objects those of the draft's vectors (Key ID property 0x02, QUIC varints), default
``"kvcs"`` (:mod:`kvcs.kv.secure_wire`). A plain ``scope.key`` (32 raw octets or 64 hex
characters) loads as a scope file without content keys. Every loading error is a
:class:`ScopeFileError` with a one-line message naming the file. docs/secure-objects.md
describes the format for users.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .cose import Keyring, ProducerKey
from .errors import DescriptorError
from .ids import ScopeKey
from .secure import DEFAULT_SUITE, CipherSuite, ContentKey, SecureObjects
from .secure_wire import KVCS_WIRE, SecureWire

__all__ = [
    "SCOPE_FILE_VERSION",
    "TRUST_PROTECTED",
    "TRUST_SIGNED",
    "TRUST_TRUSTED_RELAYS",
    "ProducerRef",
    "ScopeFile",
    "ScopeFileError",
    "load_scope_file",
    "parse_scope_file",
    "trust_level",
    "write_secret_file",
]

SCOPE_FILE_VERSION = 1

TRUST_TRUSTED_RELAYS = "trusted relays"
"""No content keys, no producer key: a relay that rewrites an object, its digest and the
unsigned manifest is believed (docs/security.md)."""
TRUST_SIGNED = "signed"
"""Producer signatures (manifest.cose) verified: relays can read, not forge."""
TRUST_PROTECTED = "protected"
"""Secure Objects under the scope's content keys: relays can neither read nor forge (any
holder of the content keys could)."""


def trust_level(protected: bool, signed: bool) -> str:
    """The trust level of a publication or retrieval, as publish, fetch and inspect print
    it (the table of docs/security.md): ``protected``, ``signed``, ``protected, signed``
    or ``trusted relays``."""
    levels = [name for on, name in ((protected, TRUST_PROTECTED), (signed, TRUST_SIGNED))
              if on]
    return ", ".join(levels) or TRUST_TRUSTED_RELAYS

PathLike = str | os.PathLike[str]


class ScopeFileError(ConfigError):
    """A scope file is missing, unreadable or malformed (one-line message)."""


@dataclass(frozen=True)
class ProducerRef:
    """Where the producer signing key of the scope lives (paths relative to the scope
    file): the private PEM (publisher side) and the public keyring JSON (consumers)."""

    kid: str
    private_key: str | None = None
    keyring: str | None = None


@dataclass(frozen=True)
class ScopeFile:
    """The keys of one scope. Construct with :meth:`new`, :func:`load_scope_file` or
    :func:`parse_scope_file`; derive rotated copies with :meth:`rotated`."""

    scope_key: ScopeKey
    content_keys: tuple[ContentKey, ...] = ()
    current_key_id: int | None = None
    producer: ProducerRef | None = None
    directory: Path | None = field(default=None, compare=False)
    """Directory the file was loaded from: the base of the producer paths."""
    wire: SecureWire = KVCS_WIRE
    """The Secure Objects wire of the scope (``"wire": "draft"`` in the file for the
    draft's vectors: Key ID property 0x02, QUIC varints; every member must use the same)."""

    def __post_init__(self) -> None:
        ids = [k.key_id for k in self.content_keys]
        if len(set(ids)) != len(ids):
            raise ValueError("two content keys share a Key ID")
        if self.content_keys and self.current_key_id not in ids:
            raise ValueError("exactly one content key must be current")
        if not self.content_keys and self.current_key_id is not None:
            raise ValueError("a current Key ID without content keys")
        if any(k.base_key == self.scope_key.key for k in self.content_keys):
            raise ValueError("a content key equals the scope key S; they must differ")

    @classmethod
    def new(
        cls, scope_key: ScopeKey | None = None, suite: CipherSuite = DEFAULT_SUITE,
        wire: SecureWire = KVCS_WIRE,
    ) -> ScopeFile:
        """A new scope (new S unless ``scope_key`` is given) with content key 1."""
        return cls(scope_key or ScopeKey.generate(), (ContentKey.generate(1, suite),), 1,
                   wire=wire)

    def rotated(self, suite: CipherSuite | None = None) -> ScopeFile:
        """A copy with a new current content key (Key ID one above the highest), the old
        keys kept so consumers still decrypt what they protected. ``suite`` defaults to
        the current key's."""
        current = self.current_content_key()
        chosen = suite or (current.suite if current else DEFAULT_SUITE)
        key_id = max((k.key_id for k in self.content_keys), default=0) + 1
        return replace(self, content_keys=(*self.content_keys,
                                           ContentKey.generate(key_id, chosen)),
                       current_key_id=key_id)

    def with_producer(self, producer: ProducerRef) -> ScopeFile:
        """A copy that names ``producer`` as the scope's signing key."""
        return replace(self, producer=producer)

    def current_content_key(self) -> ContentKey | None:
        """The content key publishers encrypt with (None: the scope is unprotected)."""
        return next((k for k in self.content_keys if k.key_id == self.current_key_id), None)

    def secure_objects(self) -> SecureObjects:
        """Secure Objects keyed with every content key, encrypting with the current one."""
        if not self.content_keys:
            raise ValueError("the scope has no content keys (run kvcs keygen --rotate)")
        return SecureObjects(self.content_keys, self.current_key_id, wire=self.wire)

    def _resolve(self, relative: str) -> Path:
        p = Path(relative)
        return p if p.is_absolute() or self.directory is None else self.directory / p

    def producer_key(self) -> ProducerKey | None:
        """The producer's signing key, if the scope file names one (publisher side)."""
        if self.producer is None or self.producer.private_key is None:
            return None
        path = self._resolve(self.producer.private_key)
        try:
            return ProducerKey.load(path, self.producer.kid)
        except (OSError, ValueError, TypeError) as exc:
            raise ScopeFileError(f"producer key {path}: {_reason(exc)}") from None

    def keyring(self) -> Keyring | None:
        """The producer public keys to trust, if the scope file names a keyring."""
        if self.producer is None or self.producer.keyring is None:
            return None
        path = self._resolve(self.producer.keyring)
        try:
            return Keyring.load(path)
        except (OSError, ValueError) as exc:
            raise ScopeFileError(f"producer keyring {path}: {_reason(exc)}") from None

    def to_json(self) -> bytes:
        """The file's bytes (indented JSON, keys in file order)."""
        doc: dict[str, Any] = {
            "kvcs_scope": SCOPE_FILE_VERSION,
            "scope_key": self.scope_key.key.hex(),
            "content_keys": [_key_json(k, k.key_id == self.current_key_id)
                             for k in self.content_keys],
        }
        if self.producer is not None:
            ref = {"kid": self.producer.kid, "private_key": self.producer.private_key,
                   "keyring": self.producer.keyring}
            doc["producer"] = {k: v for k, v in ref.items() if v is not None}
        if self.wire != KVCS_WIRE:
            doc["wire"] = self.wire.name
        return (json.dumps(doc, indent=2) + "\n").encode("ascii")


def _key_json(key: ContentKey, current: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"key_id": key.key_id, "suite": key.suite.name,
                           "base_key": key.base_key.hex()}
    if current:
        out["current"] = True
    return out


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def _member(obj: Mapping[str, Any], name: str, typ: type, where: str) -> Any:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, typ):
        raise ValueError(f"{where}{name} must be {'an integer' if typ is int else 'a string'}")
    return value


def _hex(text: str, what: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{what} is not hex") from None


def _parse_content_key(entry: Any, i: int) -> tuple[ContentKey, bool]:
    where = f"content_keys[{i}]."
    if not isinstance(entry, Mapping):
        raise ValueError(f"content_keys[{i}] must be an object")
    key_id = _member(entry, "key_id", int, where)
    suite_value = entry.get("suite", DEFAULT_SUITE.name)
    if not isinstance(suite_value, str | int) or isinstance(suite_value, bool):
        raise ValueError(f"{where}suite must be a suite name")
    base_key = _hex(_member(entry, "base_key", str, where), f"{where}base_key")
    current = entry.get("current", False)
    if not isinstance(current, bool):
        raise ValueError(f"{where}current must be true or false")
    try:
        key = ContentKey(key_id, CipherSuite.parse(suite_value), base_key)
    except ValueError as exc:
        raise ValueError(f"content_keys[{i}]: {exc}") from None
    return key, current


def _parse_producer(obj: Any) -> ProducerRef:
    if not isinstance(obj, Mapping):
        raise ValueError("producer must be an object")
    kid = _member(obj, "kid", str, "producer.")
    paths = {}
    for name in ("private_key", "keyring"):
        if name in obj:
            paths[name] = _member(obj, name, str, "producer.")
    return ProducerRef(kid, **paths)


def _parse(doc: Any) -> ScopeFile:
    if not isinstance(doc, Mapping):
        raise ValueError("a scope file is a JSON object")
    version = doc.get("kvcs_scope")
    if version != SCOPE_FILE_VERSION:
        raise ValueError(f"kvcs_scope is {version!r}, expected {SCOPE_FILE_VERSION}")
    try:
        scope_key = ScopeKey.from_hex(_member(doc, "scope_key", str, ""))
    except DescriptorError as exc:
        raise ValueError(f"scope_key: {exc}") from None
    entries = doc.get("content_keys", [])
    if not isinstance(entries, list):
        raise ValueError("content_keys must be an array")
    parsed = [_parse_content_key(e, i) for i, e in enumerate(entries)]
    current = [k.key_id for k, is_current in parsed if is_current]
    if parsed and len(current) != 1:
        raise ValueError(f"{len(current)} content keys are marked current; mark exactly one")
    producer = _parse_producer(doc["producer"]) if "producer" in doc else None
    wire = doc.get("wire", "kvcs")
    if not isinstance(wire, str):
        raise ValueError("wire must be \"kvcs\" or \"draft\"")
    return ScopeFile(scope_key, tuple(k for k, _ in parsed), current[0] if current else None,
                     producer, wire=SecureWire.named(wire))


def parse_scope_file(data: bytes, source: str = "scope file") -> ScopeFile:
    """Parse the JSON form of a scope file; ScopeFileError names ``source``."""
    try:
        return _parse(json.loads(data))
    except (ValueError, UnicodeDecodeError) as exc:
        reason = f"not JSON ({exc})" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise ScopeFileError(f"{source}: {reason}") from None


def load_scope_file(path: PathLike) -> ScopeFile:
    """Load a scope file, or a plain scope key file (no content keys)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ScopeFileError(f"{path}: {_reason(exc)}") from None
    if len(data) != 32 and data.lstrip().startswith(b"{"):
        scope = parse_scope_file(data, str(path))
        return replace(scope, directory=p.parent)
    try:
        return ScopeFile(ScopeKey.from_file(p), directory=p.parent)
    except (DescriptorError, OSError) as exc:
        raise ScopeFileError(f"{path}: {_reason(exc)}") from None


def write_secret_file(path: PathLike, data: bytes, *, overwrite: bool = False) -> None:
    """Write ``data`` to a new file with mode 0600; FileExistsError if ``path`` exists
    unless ``overwrite`` (which replaces it atomically, so a crash leaves the old one)."""
    p = Path(path)
    target = p.with_name(f".{p.name}.tmp") if overwrite else p
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    if overwrite:
        target.unlink(missing_ok=True)  # a leftover of an interrupted write
    fd = os.open(target, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask says
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        if fd >= 0:
            os.close(fd)
        target.unlink(missing_ok=True)
        raise
    if overwrite:
        os.replace(target, p)
