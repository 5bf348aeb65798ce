"""A directory of KVSP containers (profile section 7), as served over HTTP (section 8).

Layout::

    {root}/{scope_id hex}/{compat_id hex}/{block_key hex}.kvsp

Every path component is lowercase hexadecimal of a fixed length (Scope ID 16 octets,
CompatID and Block Key 32), so no caller-supplied text ever reaches the file system:
:func:`parse_hex_id` validates identifiers taken from URLs or JSON before they become bytes.

Writes are atomic (a temporary file in the target directory, then ``os.replace``): a
reader sees a whole container or none.

Retention (KVCS "Operational Considerations": aligned with the publication's
MAX_CACHE_DURATION): a container written with an expiry has a sidecar
``{block_key hex}.expires`` holding that time (Unix seconds, decimal). An expired container
is never returned: reading it removes it, and :meth:`BlockStore.remove_expired` sweeps the
store. A container without a sidecar does not expire.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .container import build_container
from .ids import CompatDescriptor, ScopeKey, block_keys, scope_id

__all__ = ["SCOPE_ID_SIZE", "BlockStore", "parse_hex_id", "store_cache"]

log = logging.getLogger(__name__)

#: Octets of a Scope ID; CompatIDs and Block Keys have 32.
SCOPE_ID_SIZE = 16
_HEX = re.compile(r"[0-9a-f]+")
_SUFFIX = ".kvsp"
_EXPIRES = ".expires"


def parse_hex_id(text: object, size: int, what: str = "identifier") -> bytes:
    """Decode ``text``, exactly ``2*size`` lowercase hex digits, into ``size`` octets.

    Raises ValueError for anything else (upper case, odd length, other characters, a
    non-string), so the result is safe to use in paths and URLs.
    """
    if not isinstance(text, str) or len(text) != 2 * size or not _HEX.fullmatch(text):
        raise ValueError(f"{what} must be {2 * size} lowercase hex digits")
    return bytes.fromhex(text)


def _check(value: bytes, size: int, what: str) -> str:
    if not isinstance(value, bytes | bytearray) or len(value) != size:
        raise ValueError(f"{what} must be {size} octets")
    return bytes(value).hex()


class BlockStore:
    """Containers on disk, one file per (Scope ID, CompatID, Block Key)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, scope: bytes, compat: bytes, block_key: bytes) -> Path:
        """Where the container of ``block_key`` lives (ValueError for bad lengths)."""
        return (self.root / _check(scope, SCOPE_ID_SIZE, "Scope ID")
                / _check(compat, 32, "Compatibility ID")
                / (_check(block_key, 32, "Block Key") + _SUFFIX))

    def _expiry_path(self, path: Path) -> Path:
        return path.with_suffix(_EXPIRES)

    def put(self, scope: bytes, compat: bytes, block_key: bytes, data: bytes, *,
            expires_at: float | None = None) -> Path:
        """Store one container atomically (an existing one is replaced), to be served until
        ``expires_at`` (Unix time; None: no expiry); returns its path."""
        path = self.path(scope, compat, block_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        expiry = self._expiry_path(path)
        if expires_at is not None:  # the expiry first: never a moment without one
            _write_atomic(expiry, repr(float(expires_at)).encode())
        _write_atomic(path, data)
        if expires_at is None:
            with contextlib.suppress(FileNotFoundError):
                expiry.unlink()
        return path

    def expires_at(self, scope: bytes, compat: bytes, block_key: bytes) -> float | None:
        """When the stored container expires (None: never, or nothing stored)."""
        return self._expiry(self.path(scope, compat, block_key))

    def _expiry(self, path: Path) -> float | None:
        try:
            return float(self._expiry_path(path).read_text())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except ValueError:  # unreadable: treat as expired rather than serve forever
            return 0.0

    def _alive(self, path: Path, now: float | None = None) -> bool:
        """False (and the container removed) when it has expired."""
        until = self._expiry(path)
        if until is None or until > (time.time() if now is None else now):
            return True
        self._remove(path)
        return False

    def _remove(self, path: Path) -> None:
        for p in (path, self._expiry_path(path)):  # the container first: never served
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def get(self, scope: bytes, compat: bytes, block_key: bytes) -> bytes | None:
        """The stored container, or None when there is none or it has expired."""
        path = self.path(scope, compat, block_key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return data if self._alive(path) else None

    def has(self, scope: bytes, compat: bytes, block_key: bytes) -> bool:
        """True when an unexpired container is stored for ``block_key``."""
        path = self.path(scope, compat, block_key)
        return path.is_file() and self._alive(path)

    def remove_expired(self, now: float | None = None) -> int:
        """Remove every container expired at ``now`` (default: the current time); returns
        how many."""
        now = time.time() if now is None else now
        gone = 0
        for expiry in self.root.glob(f"*/*/*{_EXPIRES}"):
            if expiry.name.startswith(".tmp-"):  # being written by put()
                continue
            container = expiry.with_suffix(_SUFFIX)
            if not self._alive(container, now):
                gone += 1
        if gone:
            log.info("removed %d expired container(s) from %s", gone, self.root)
        return gone


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as fp:
            fp.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store_cache(
    store: BlockStore,
    desc: CompatDescriptor,
    scope: ScopeKey,
    tokens: Sequence[int] | np.ndarray,
    k_layers: Sequence[np.ndarray],
    v_layers: Sequence[np.ndarray],
    *,
    retention_s: float | None = None,
) -> list[bytes]:
    """Write one ``raw`` container per complete block of a cache; returns the Block Keys.

    ``k_layers``/``v_layers`` hold one array per layer of shape [tokens, kv_heads,
    head_dim] in ``desc.dtype``; blocks are cut at ``desc.block_tokens`` (token_start =
    block index * block_tokens) and a trailing partial block is not stored. The
    containers expire ``retention_s`` seconds from now (None: never); give the
    publication's retention (MAX_CACHE_DURATION).
    """
    if len(k_layers) != desc.layers or len(v_layers) != desc.layers:
        raise ValueError(f"need {desc.layers} K and V layers")
    B = desc.block_tokens
    keys = block_keys(scope, desc.compat_id, np.asarray(tokens, dtype=np.int64), B)
    rows = min(min(a.shape[0] for a in k_layers), min(a.shape[0] for a in v_layers))
    keys = keys[: rows // B]
    sid = scope_id(scope)
    expires_at = None if retention_s is None else time.time() + retention_s
    for i, key in enumerate(keys):
        rs = slice(i * B, (i + 1) * B)
        data = build_container(desc, "raw", key, i * B, [k[rs] for k in k_layers],
                               [v[rs] for v in v_layers])
        store.put(sid, desc.compat_id, key, data, expires_at=expires_at)
    log.info("stored %d container(s) under %s", len(keys), store.root)
    return keys
