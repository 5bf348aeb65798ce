"""KVSP Index records (profile section 8): which holders have which blocks. No I/O.

A holder URI is either the ``https://`` URL of one block's container or a ``moqt://`` URI
naming a relay and the full five-field namespace of a publication that contains the block.
The profile does not say how a URI names a namespace; kvcs puts it in the fragment, which
is never sent to the relay (the relay URL is the URI without it)::

    moqt://relay.example:4443/#kvcs-1/<ScopeID>/<CompatID>/<AnchorKey>/<PublicationID>

each field percent-encoded (RFC 3986: binary fields as %XX, hex-namespace fields as their
text). :func:`publication_uri` and :func:`parse_publication_uri` convert.

:class:`ReplicaIndex` keeps the records a KVSP holder answers lookups with: holder URIs per
(Scope ID, CompatID, Block Key), each until its expiry (the publication's retention), in
memory and bounded.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

from ..errors import KvcsError

__all__ = [
    "MAX_HOLDERS_PER_KEY",
    "MAX_URI_LENGTH",
    "IndexFullError",
    "ReplicaIndex",
    "parse_publication_uri",
    "publication_uri",
]

#: Longest holder URI accepted (the MOQT limit on a URI, e.g. GOAWAY's).
MAX_URI_LENGTH = 8192
#: Holder URIs kept per Block Key; a new registration replaces the one expiring first.
MAX_HOLDERS_PER_KEY = 16


def publication_uri(relay_url: str, namespace: Sequence[bytes]) -> str:
    """The ``moqt://`` holder URI of a publication: the relay URL with the namespace fields
    in the fragment (ValueError for another scheme or an empty namespace)."""
    parts = urllib.parse.urlsplit(relay_url)
    if parts.scheme != "moqt" or not parts.hostname:
        raise ValueError(f"a publication's holder URI needs a moqt:// relay URL: {relay_url!r}")
    if not namespace:
        raise ValueError("the namespace has no field")
    fragment = "/".join(urllib.parse.quote(bytes(f), safe="") for f in namespace)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path or "/", fragment=fragment))


def parse_publication_uri(uri: str) -> tuple[str, tuple[bytes, ...]]:
    """(relay URL, namespace fields) of a ``moqt://`` holder URI; ValueError otherwise."""
    if len(uri) > MAX_URI_LENGTH:
        raise ValueError(f"holder URI longer than {MAX_URI_LENGTH} characters")
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme != "moqt" or not parts.hostname:
        raise ValueError(f"not a moqt:// URI: {uri[:80]!r}")
    if not parts.fragment:
        raise ValueError(f"the moqt:// URI names no namespace (no fragment): {uri[:80]!r}")
    fields = tuple(urllib.parse.unquote_to_bytes(f) for f in parts.fragment.split("/"))
    return urllib.parse.urlunsplit(parts._replace(fragment="")), fields


class IndexFullError(KvcsError):
    """The index holds as many records as it may."""


class ReplicaIndex:
    """Holder URIs per (Scope ID, CompatID, Block Key), each with an expiry time.

    ``max_records`` bounds the memory (a registration beyond it raises
    :class:`IndexFullError`); each key keeps at most :data:`MAX_HOLDERS_PER_KEY` URIs.
    Times are seconds on any clock the caller uses consistently (kvcs: ``time.time()``).
    """

    def __init__(self, max_records: int = 1 << 20) -> None:
        self.max_records = max_records
        self._records: dict[tuple[bytes, bytes, bytes], dict[str, float]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def register(self, scope: bytes, compat: bytes, block_key: bytes, holder: str,
                 expires_at: float) -> None:
        """Record that ``holder`` has ``block_key`` until ``expires_at`` (a later
        registration of the same URI moves its expiry)."""
        held = self._records.setdefault((scope, compat, block_key), {})
        if holder not in held:
            if len(held) >= MAX_HOLDERS_PER_KEY:
                del held[min(held, key=held.__getitem__)]
                self._count -= 1
            if self._count >= self.max_records:
                raise IndexFullError(f"the index holds {self._count} records")
            self._count += 1
        held[holder] = expires_at

    def holders(self, scope: bytes, compat: bytes, block_key: bytes, now: float) -> list[str]:
        """The unexpired holder URIs of ``block_key``, the one registered first first."""
        held = self._records.get((scope, compat, block_key), {})
        return [uri for uri, until in held.items() if until > now]

    def expire(self, now: float) -> int:
        """Forget every record expired at ``now``; returns how many."""
        gone = 0
        for key in list(self._records):
            held = self._records[key]
            for uri in [u for u, until in held.items() if until <= now]:
                del held[uri]
                gone += 1
            if not held:
                del self._records[key]
        self._count -= gone
        return gone
