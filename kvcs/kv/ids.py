"""KVSP identifiers: Compatibility Descriptor/ID, scope key/ID, Block Keys and the KVCS namespace.

Implements sections 1-4 of the KVSP profile (``kvsp-profile.md``) and the five-field Track
Namespace of the KVCS document.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .dtypes import DTYPE_NAMES, dtype_for
from .errors import DescriptorError

__all__ = [
    "NAMESPACE_FIELD0",
    "CompatDescriptor",
    "KvcsNamespace",
    "ScopeKey",
    "anchor_key",
    "block_keys",
    "block_keys_sha256",
    "canonical_bytes",
    "compat_id",
    "new_publication_id",
    "scope_id",
]

_MAX_DIM = 1 << 20
_MAX_SAFE_INT = (1 << 53) - 1  # keeps the canonical form identical to RFC 8785 (JCS)

_REQUIRED: dict[str, type] = {
    "kvsp": int,
    "model": str,
    "revision": str,
    "tokenizer": str,
    "layers": int,
    "kv_heads": int,
    "head_dim": int,
    "dtype": str,
    "block_tokens": int,
    "layout": str,
    "rope": str,
}
_SIZE_MEMBERS = ("layers", "kv_heads", "head_dim", "block_tokens")
_ROPE_VALUES = ("post", "pre", "none")


def _check_json_value(value: Any, path: str) -> None:
    """Reject anything that is not a string, int, bool, list or str-keyed object."""
    if isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if abs(value) > _MAX_SAFE_INT:
            raise DescriptorError(f"{path}: integer {value} exceeds 2^53-1 (not canonical in JCS)")
        return
    if isinstance(value, float):
        top, _, member = path.partition(".")
        if top == "descriptor" and (_REQUIRED.get(member) is int or member == "v_head_dim"):
            raise DescriptorError(f"{path} must be an integer (floats are not allowed), got "
                                  f"{value!r}")
        raise DescriptorError(f"{path}: floats are not allowed in a descriptor; write "
                              f"{value!r} as the string {str(value)!r}")
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json_value(item, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise DescriptorError(f"{path}: object key {k!r} is not a string")
            _check_json_value(v, f"{path}.{k}")
        return
    if value is None:
        raise DescriptorError(f"{path}: null is not allowed")
    raise DescriptorError(f"{path}: value of type {type(value).__name__} is not allowed")


def _check_size(d: Mapping[str, Any], name: str) -> None:
    v = d[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise DescriptorError(f"descriptor.{name} must be an integer, got {type(v).__name__}")
    if not 1 <= v <= _MAX_DIM:
        raise DescriptorError(f"descriptor.{name} = {v} is outside 1..2^20")


def _validate(d: Any) -> dict[str, Any]:
    if not isinstance(d, Mapping):
        raise DescriptorError(f"descriptor must be a JSON object, got {type(d).__name__}")
    _check_json_value(d, "descriptor")
    missing = [name for name in _REQUIRED if name not in d]
    if missing:
        raise DescriptorError(
            f"descriptor is missing required member{'s' * (len(missing) > 1)} "
            f"{', '.join(map(repr, missing))} (the "
            f"required members are {', '.join(_REQUIRED)}; `kvcs descriptor` prints a template)")
    for name, typ in _REQUIRED.items():
        v = d[name]
        if typ is int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise DescriptorError(
                    f"descriptor.{name} must be an integer, got {type(v).__name__}"
                )
        elif not isinstance(v, typ):
            raise DescriptorError(f"descriptor.{name} must be a string, got {type(v).__name__}")
    if d["kvsp"] != 1:
        raise DescriptorError(f"descriptor.kvsp = {d['kvsp']} is not supported (expected 1)")
    for name in _SIZE_MEMBERS:
        _check_size(d, name)
    if d["dtype"] not in DTYPE_NAMES:
        raise DescriptorError(
            f"descriptor.dtype {d['dtype']!r} is not one of {', '.join(DTYPE_NAMES)}"
        )
    if d["layout"] != "tnd":
        raise DescriptorError(f"descriptor.layout {d['layout']!r} is not supported (only 'tnd')")
    if d["rope"] not in _ROPE_VALUES:
        raise DescriptorError(f"descriptor.rope {d['rope']!r} is not one of post, pre, none")
    if "v_head_dim" in d:
        _check_size(d, "v_head_dim")
    if "extra" in d and not isinstance(d["extra"], Mapping):
        raise DescriptorError(
            f"descriptor.extra must be an object, got {type(d['extra']).__name__}"
        )
    return _thaw_json(d)


def _thaw_json(value: Any) -> Any:
    """Deep-copy a validated JSON value into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _thaw_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw_json(v) for v in value]
    return value


@dataclass(frozen=True)
class CompatDescriptor:
    """A validated KVSP Compatibility Descriptor (profile section 2).

    Construct with :meth:`from_dict` or :meth:`from_json`; both raise DescriptorError with a
    message naming the offending member.
    """

    members: dict[str, Any] = field(compare=False)
    canonical: bytes = field(repr=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CompatDescriptor:
        """Validate a descriptor given as a mapping."""
        members = _validate(d)
        try:
            canon = json.dumps(
                members, sort_keys=True, separators=(",", ":"), ensure_ascii=False
            ).encode("utf-8")
        except UnicodeEncodeError as exc:
            msg = f"descriptor contains a string that is not UTF-8: {exc}"
            raise DescriptorError(msg) from None
        return cls(members, canon)

    @classmethod
    def from_json(cls, data: bytes | str) -> CompatDescriptor:
        """Parse and validate a descriptor given as JSON text."""
        try:
            d = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DescriptorError(f"descriptor is not valid JSON: {exc}") from None
        return cls.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        """Return a deep copy of the members as plain JSON values."""
        return _thaw_json(self.members)

    @property
    def compat_id(self) -> bytes:
        """SHA-256 of the canonical bytes (32 octets)."""
        return hashlib.sha256(self.canonical).digest()

    @property
    def layers(self) -> int:
        """Number of layers ``L``."""
        return int(self.members["layers"])

    @property
    def kv_heads(self) -> int:
        """Number of KV heads ``H``."""
        return int(self.members["kv_heads"])

    @property
    def head_dim(self) -> int:
        """Key head dimension ``D``."""
        return int(self.members["head_dim"])

    @property
    def v_head_dim(self) -> int:
        """Value head dimension (``v_head_dim`` if present, else ``head_dim``)."""
        return int(self.members.get("v_head_dim", self.members["head_dim"]))

    @property
    def block_tokens(self) -> int:
        """Tokens per block ``B``."""
        return int(self.members["block_tokens"])

    @property
    def dtype_name(self) -> str:
        """KVSP element type name."""
        return str(self.members["dtype"])

    @property
    def dtype(self) -> np.dtype:
        """numpy dtype of the elements."""
        return dtype_for(self.dtype_name)

    def k_shape(self) -> tuple[int, int, int]:
        """Shape (B, H, D) of one block's K tensor for one layer."""
        return (self.block_tokens, self.kv_heads, self.head_dim)

    def v_shape(self) -> tuple[int, int, int]:
        """Shape (B, H, Dv) of one block's V tensor for one layer."""
        return (self.block_tokens, self.kv_heads, self.v_head_dim)

    def raw_bytes(self) -> tuple[int, int]:
        """Octets of one block's K and V tensors for one layer, raw encoding."""
        item = self.dtype.itemsize
        return (self.block_tokens * self.kv_heads * self.head_dim * item,
                self.block_tokens * self.kv_heads * self.v_head_dim * item)


def _as_descriptor(desc: CompatDescriptor | Mapping[str, Any]) -> CompatDescriptor:
    return desc if isinstance(desc, CompatDescriptor) else CompatDescriptor.from_dict(desc)


def canonical_bytes(desc: CompatDescriptor | Mapping[str, Any]) -> bytes:
    """Canonical UTF-8 JSON of a descriptor (sorted keys, compact, non-ASCII unescaped)."""
    return _as_descriptor(desc).canonical


def compat_id(desc: CompatDescriptor | Mapping[str, Any]) -> bytes:
    """Compatibility ID: SHA-256 of the canonical bytes (32 octets)."""
    return _as_descriptor(desc).compat_id


# --------------------------------------------------------------------------- scope


@dataclass(frozen=True)
class ScopeKey:
    """A 32-octet scope secret ``S`` (profile section 3). Its repr never shows the key."""

    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.key, bytes) or len(self.key) != 32:
            raise DescriptorError("a scope key is exactly 32 octets")

    @classmethod
    def from_bytes(cls, key: bytes | bytearray | memoryview) -> ScopeKey:
        """Wrap 32 raw octets."""
        return cls(bytes(key))

    @classmethod
    def from_hex(cls, text: str) -> ScopeKey:
        """Parse 64 hexadecimal characters (surrounding whitespace ignored)."""
        text = text.strip()
        if len(text) != 64:
            raise DescriptorError("a hex scope key is exactly 64 hex characters")
        try:
            return cls(bytes.fromhex(text))
        except ValueError:
            raise DescriptorError("scope key is not valid hex") from None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ScopeKey:
        """Read a key file holding either 32 raw octets or 64 hex characters, or the scope
        key of a JSON scope file (``kvcs keygen``)."""
        data = Path(path).read_bytes()
        if len(data) == 32:
            return cls(data)
        if data.lstrip().startswith(b"{"):
            from .scopefile import parse_scope_file  # the scope file format lives there

            return parse_scope_file(data, str(path)).scope_key
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise DescriptorError(f"{path}: neither 32 raw octets nor 64 hex characters") from None
        return cls.from_hex(text)

    @classmethod
    def from_env(cls, name: str = "KVCS_SCOPE_KEY") -> ScopeKey:
        """Read a hex scope key from environment variable ``name``."""
        value = os.environ.get(name)
        if value is None:
            raise DescriptorError(f"environment variable {name} is not set")
        return cls.from_hex(value)

    @classmethod
    def generate(cls) -> ScopeKey:
        """Return a new random scope key."""
        return cls(secrets.token_bytes(32))


def _key_bytes(key: ScopeKey | bytes) -> bytes:
    if isinstance(key, ScopeKey):
        return key.key
    return ScopeKey.from_bytes(key).key


def scope_id(key: ScopeKey | bytes) -> bytes:
    """ScopeID = first 16 octets of HMAC-SHA256(S, "kvsp-1 scope-id")."""
    return hmac.new(_key_bytes(key), b"kvsp-1 scope-id", hashlib.sha256).digest()[:16]


# --------------------------------------------------------------------------- block keys


def _tokens_be(tokens: Sequence[int] | np.ndarray) -> bytes:
    try:
        arr = np.asarray(tokens)
    except (OverflowError, ValueError) as exc:
        raise DescriptorError(f"token ids must be unsigned 32-bit integers: {exc}") from None
    if arr.ndim != 1:
        raise DescriptorError("tokens must be a one-dimensional sequence")
    if arr.size == 0:
        return b""
    if arr.dtype.kind not in "iu":
        raise DescriptorError(f"token ids must be integers, got dtype {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF:
        raise DescriptorError("token ids must be in 0..2^32-1")
    return arr.astype(">u4", copy=False).tobytes()


def block_keys(
    scope_key: ScopeKey | bytes,
    compat: bytes,
    tokens: Sequence[int] | np.ndarray,
    block_tokens: int,
) -> list[bytes]:
    """Block Keys of the complete blocks of ``tokens`` (profile section 4).

    ``BK[i] = HMAC(S, "kvsp-1 block" || CompatID || BK[i-1] || u32be(t_0) ... u32be(t_{B-1}))``
    with ``BK[-1]`` = 32 zero octets. A trailing partial block gets no key.
    """
    if len(compat) != 32:
        raise DescriptorError("a Compatibility ID is exactly 32 octets")
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int | np.integer):
        raise DescriptorError("block_tokens must be an integer")
    if not 1 <= int(block_tokens) <= _MAX_DIM:
        raise DescriptorError(f"block_tokens = {block_tokens} is outside 1..2^20")
    packed = _tokens_be(tokens)
    step = 4 * int(block_tokens)
    base = hmac.new(_key_bytes(scope_key), b"kvsp-1 block" + bytes(compat), hashlib.sha256)
    prev = bytes(32)
    keys: list[bytes] = []
    view = memoryview(packed)
    for off in range(0, len(packed) - step + 1, step):
        h = base.copy()
        h.update(prev)
        h.update(view[off : off + step])
        prev = h.digest()
        keys.append(prev)
    return keys


def anchor_key(keys: Sequence[bytes], n: int) -> bytes:
    """Anchor Key of a prefix of ``n`` complete blocks: ``keys[n-1]``."""
    if not 1 <= n <= len(keys):
        raise DescriptorError(f"anchor of {n} blocks needs 1 <= n <= {len(keys)}")
    return keys[n - 1]


def block_keys_sha256(keys: Sequence[bytes]) -> bytes:
    """SHA-256 of the concatenated raw Block Keys, as carried (hex) in a manifest segment."""
    h = hashlib.sha256()
    for k in keys:
        if len(k) != 32:
            raise DescriptorError("a Block Key is exactly 32 octets")
        h.update(k)
    return h.digest()


# --------------------------------------------------------------------------- namespace

#: Field 0 of every KVCS Track Namespace.
NAMESPACE_FIELD0 = b"kvcs-1"
_FIELD_LENGTHS = (16, 32, 32, 16)
_FIELD_NAMES = ("scope_id", "compat_id", "anchor_key", "publication_id")
_HEX_DIGITS = frozenset(b"0123456789abcdef")


def new_publication_id() -> bytes:
    """Return a fresh random 16-octet Publication ID."""
    return secrets.token_bytes(16)


@dataclass(frozen=True)
class KvcsNamespace:
    """The five-field KVCS Track Namespace ("kvcs-1", ScopeID, CompatID, AnchorKey, PubID).

    The standard encoding carries fields 1-4 as raw octets. ``hex_fields=True`` selects an
    opt-in, non-standard encoding for relays that accept only UTF-8 namespace fields: fields
    1-4 are carried as lowercase hexadecimal ASCII. Both ends must select it; the field lengths
    differ (32/64/64/32) so the two encodings cannot be mistaken for each other.
    """

    scope_id: bytes
    compat_id: bytes
    anchor_key: bytes
    publication_id: bytes

    def __post_init__(self) -> None:
        for name, length in zip(_FIELD_NAMES, _FIELD_LENGTHS, strict=True):
            value = getattr(self, name)
            if not isinstance(value, bytes):
                object.__setattr__(self, name, bytes(value))
                value = getattr(self, name)
            if len(value) != length:
                raise ValueError(f"namespace {name} must be {length} octets, got {len(value)}")

    def _values(self) -> tuple[bytes, bytes, bytes, bytes]:
        return (self.scope_id, self.compat_id, self.anchor_key, self.publication_id)

    def to_fields(self, *, hex_fields: bool = False) -> tuple[bytes, ...]:
        """Return the MOQT Track Namespace tuple (five fields)."""
        values = self._values()
        if hex_fields:
            return (NAMESPACE_FIELD0, *(v.hex().encode("ascii") for v in values))
        return (NAMESPACE_FIELD0, *values)

    def to_tuple(self) -> tuple[bytes, ...]:
        """Same as ``to_fields()`` (raw octets)."""
        return self.to_fields()

    def prefix(self, n_fields: int, *, hex_fields: bool = False) -> tuple[bytes, ...]:
        """The first ``n_fields`` (1..5) fields, e.g. 2 for the scope, 4 for the token prefix."""
        if not 1 <= n_fields <= 5:
            raise ValueError("a namespace prefix has 1 to 5 fields")
        return self.to_fields(hex_fields=hex_fields)[:n_fields]

    @classmethod
    def from_fields(
        cls, fields: Sequence[bytes | bytearray | memoryview], *, hex_fields: bool = False
    ) -> KvcsNamespace:
        """Parse a MOQT Track Namespace tuple; raises ValueError if it is not a KVCS namespace."""
        if len(fields) != 5:
            raise ValueError(f"a KVCS namespace has 5 fields, got {len(fields)}")
        items = [bytes(f) for f in fields]
        if items[0] != NAMESPACE_FIELD0:
            raise ValueError(f"namespace field 0 is {items[0]!r}, expected {NAMESPACE_FIELD0!r}")
        values: list[bytes] = []
        for name, length, raw in zip(_FIELD_NAMES, _FIELD_LENGTHS, items[1:], strict=True):
            if hex_fields:
                if len(raw) != 2 * length or not _HEX_DIGITS.issuperset(raw):
                    raise ValueError(
                        f"namespace {name} must be {2 * length} lowercase hex characters"
                    )
                raw = bytes.fromhex(raw.decode("ascii"))
            elif len(raw) != length:
                raise ValueError(f"namespace {name} must be {length} octets, got {len(raw)}")
            values.append(raw)
        return cls(*values)

    @classmethod
    def from_tuple(cls, fields: Sequence[bytes]) -> KvcsNamespace:
        """Same as ``from_fields(fields)`` (raw octets)."""
        return cls.from_fields(fields)
