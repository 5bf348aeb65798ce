"""Key-Value-Pair lists (digest 3.3): Track/Object Properties and Setup Options (5.2)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ProtocolError, SessionCode, violation
from .buffer import Reader
from .params import AuthToken, MessageBudget
from .types import MAX_VI64
from .vi64 import encode_vi64

__all__ = [
    "DEFAULT_PUBLISHER_GROUP_ORDER",
    "DEFAULT_PUBLISHER_PRIORITY",
    "DYNAMIC_GROUPS",
    "IMMUTABLE_PROPERTIES",
    "MAX_CACHE_DURATION",
    "MAX_KVP_BYTES",
    "OBJECT_DELIVERY_TIMEOUT",
    "PRIOR_GROUP_ID_GAP",
    "PRIOR_OBJECT_ID_GAP",
    "SETUP_AUTHORITY",
    "SETUP_AUTHORIZATION_TOKEN",
    "SETUP_MAX_AUTH_TOKEN_CACHE_SIZE",
    "SETUP_MAX_FILTER_RANGES",
    "SETUP_MAX_REQUEST_UPDATES",
    "SETUP_MOQT_IMPLEMENTATION",
    "SETUP_PATH",
    "SUBGROUP_DELIVERY_TIMEOUT",
    "Properties",
    "SetupOptions",
    "decode_kvps",
    "encode_kvps",
    "is_grease",
    "prop_get",
    "validate_track_properties",
]

Properties = tuple[tuple[int, int | bytes], ...]

# Property types (digest 5.3).
OBJECT_DELIVERY_TIMEOUT = 0x02
MAX_CACHE_DURATION = 0x04
SUBGROUP_DELIVERY_TIMEOUT = 0x06
IMMUTABLE_PROPERTIES = 0x0B
DEFAULT_PUBLISHER_PRIORITY = 0x0E
DEFAULT_PUBLISHER_GROUP_ORDER = 0x22
DYNAMIC_GROUPS = 0x30
PRIOR_GROUP_ID_GAP = 0x3C
PRIOR_OBJECT_ID_GAP = 0x3E

# Setup Option types (digest 5.2).
SETUP_PATH = 0x01
SETUP_AUTHORIZATION_TOKEN = 0x03
SETUP_MAX_AUTH_TOKEN_CACHE_SIZE = 0x04
SETUP_AUTHORITY = 0x05
SETUP_MAX_FILTER_RANGES = 0x06
SETUP_MOQT_IMPLEMENTATION = 0x07
SETUP_MAX_REQUEST_UPDATES = 0x08
#: The Setup Options kept as they are in one SetupOptions field each. The type's parity
#: fixes the value's kind (even: an integer, odd: bytes), as the field expects.
_SETUP_FIELDS = {
    SETUP_PATH: "path",
    SETUP_MAX_AUTH_TOKEN_CACHE_SIZE: "max_auth_token_cache_size",
    SETUP_AUTHORITY: "authority",
    SETUP_MAX_FILTER_RANGES: "max_filter_ranges",
    SETUP_MAX_REQUEST_UPDATES: "max_request_updates",
}

#: Largest allowed value length of an odd-typed KVP.
MAX_KVP_BYTES = 65535


def is_grease(t: int) -> bool:
    """True for GREASE code points ``0x7f*N + 0x9D``."""
    return t >= 0x9D and (t - 0x9D) % 0x7F == 0


def encode_kvps(props: Properties) -> bytes:
    """Encode (type, value) pairs as a KVP list, sorted ascending by type (stable)."""
    if not props:
        return b""
    items = sorted(props, key=lambda kv: kv[0])
    out = bytearray()
    prev = 0
    for t, v in items:
        out += encode_vi64(t - prev)
        prev = t
        if t & 1:
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise ValueError(f"odd property type 0x{t:x} needs a bytes value")
            if len(v) > MAX_KVP_BYTES:
                raise ValueError(f"property 0x{t:x} value longer than 65535 bytes")
            out += encode_vi64(len(v))
            out += v
        else:
            if not isinstance(v, int):
                raise ValueError(f"even property type 0x{t:x} needs an int value")
            out += encode_vi64(v)
    return bytes(out)


def read_kvps(r: Reader) -> Properties:
    """Decode a KVP list running to the end of ``r``."""
    out: list[tuple[int, int | bytes]] = []
    t = 0
    while r.pos < r.end:
        t += r.vi64()
        if t > MAX_VI64:
            raise violation("KVP type overflows 2^64-1")
        if t & 1:
            n = r.vi64()
            if n > MAX_KVP_BYTES:
                raise violation(f"KVP value length {n} > 65535")
            out.append((t, bytes(r.bytes(n))))
        else:
            out.append((t, r.vi64()))
    return tuple(out)


def decode_kvps(buf: bytes | bytearray | memoryview) -> Properties:
    """Decode a KVP list occupying all of ``buf`` (PROTOCOL_VIOLATION on bad framing)."""
    if not buf:
        return ()
    return read_kvps(Reader(buf))


def prop_get(
    props: Properties, type: int, default: int | bytes | None = None
) -> int | bytes | None:
    """Value of the first property of ``type`` in ``props``, else ``default``."""
    for t, v in props:
        if t == type:
            return v
    return default


def validate_track_properties(props: Properties) -> None:
    """Check the Track Property values the digest constrains (PROTOCOL_VIOLATION)."""
    for t, v in props:
        if t == DEFAULT_PUBLISHER_GROUP_ORDER and v not in (1, 2):
            raise violation(f"DEFAULT_PUBLISHER_GROUP_ORDER {v!r} not 1 or 2")
        if t == DYNAMIC_GROUPS and isinstance(v, int) and v > 1:
            raise violation(f"DYNAMIC_GROUPS {v} > 1")


def _kv_error(reason: str) -> ProtocolError:
    return ProtocolError(SessionCode.KEY_VALUE_FORMATTING_ERROR, reason)


@dataclass(slots=True)
class SetupOptions:
    """Setup Options of a SETUP message (digest 5.2).

    Integer options use 0 for "absent / default" and are not sent when 0. Unknown options
    (GREASE included) are ignored by the protocol but kept, in order, in ``unknown``.
    """

    path: bytes | None = None
    authority: bytes | None = None
    auth_tokens: tuple[AuthToken, ...] = ()
    max_auth_token_cache_size: int = 0
    max_filter_ranges: int = 0
    implementation: str | None = None
    max_request_updates: int = 0
    unknown: Properties = ()

    def to_properties(self) -> Properties:
        """The options as a (type, value) list (known ones first, then unknown)."""
        out: list[tuple[int, int | bytes]] = []
        if self.path is not None:
            out.append((SETUP_PATH, bytes(self.path)))
        out.extend((SETUP_AUTHORIZATION_TOKEN, tok.encode()) for tok in self.auth_tokens)
        if self.max_auth_token_cache_size:
            out.append((SETUP_MAX_AUTH_TOKEN_CACHE_SIZE, self.max_auth_token_cache_size))
        if self.authority is not None:
            out.append((SETUP_AUTHORITY, bytes(self.authority)))
        if self.max_filter_ranges:
            out.append((SETUP_MAX_FILTER_RANGES, self.max_filter_ranges))
        if self.implementation is not None:
            out.append((SETUP_MOQT_IMPLEMENTATION, self.implementation.encode()))
        if self.max_request_updates:
            out.append((SETUP_MAX_REQUEST_UPDATES, self.max_request_updates))
        out.extend(self.unknown)
        return tuple(out)

    def encode(self) -> bytes:
        """Encode as a KVP list (ascending types)."""
        return encode_kvps(self.to_properties())

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> SetupOptions:
        """Decode a Setup Options KVP list occupying all of ``buf``.

        Duplicated known options (other than AUTHORIZATION_TOKEN) -> PROTOCOL_VIOLATION;
        an unparsable known value -> KEY_VALUE_FORMATTING_ERROR; DELETE or USE_ALIAS
        tokens -> PROTOCOL_VIOLATION.
        """
        return cls.from_properties(decode_kvps(buf))

    @classmethod
    def from_properties(cls, props: Properties) -> SetupOptions:
        """Interpret a decoded KVP list as Setup Options."""
        opts = cls()
        seen: set[int] = set()
        tokens: list[AuthToken] = []
        unknown: list[tuple[int, int | bytes]] = []
        budget = MessageBudget()
        for t, v in props:
            if t == SETUP_AUTHORIZATION_TOKEN:
                assert isinstance(v, bytes)
                budget.token(len(v))  # MAX_TOKENS / MAX_TOKEN_BYTES: UNAUTHORIZED
                tok = AuthToken.decode(v)
                if tok.alias_type in (0, 2):
                    raise violation("DELETE / USE_ALIAS authorization token in SETUP")
                tokens.append(tok)
                continue
            if t > SETUP_MAX_REQUEST_UPDATES or t == 0 or t == 2:
                unknown.append((t, v))
                continue
            if t in seen:
                raise violation(f"duplicate setup option 0x{t:x}")
            seen.add(t)
            if t == SETUP_MOQT_IMPLEMENTATION:
                assert isinstance(v, bytes)
                try:
                    opts.implementation = v.decode("utf-8")
                except UnicodeDecodeError:
                    raise _kv_error("MOQT_IMPLEMENTATION is not UTF-8") from None
            else:
                setattr(opts, _SETUP_FIELDS[t], v)
        opts.auth_tokens = tuple(tokens)
        opts.unknown = tuple(unknown)
        return opts
