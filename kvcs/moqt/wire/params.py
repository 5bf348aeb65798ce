"""Message Parameters (digest 3.4, 5.1): Authorization Tokens, filters and FILL_PARAMETERS."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ProtocolError, SessionCode, violation
from .buffer import Reader
from .types import MAX_VI64, Location, Namespace, validate_namespace
from .vi64 import encode_vi64

__all__ = [
    "ALL_PARAMS",
    "FETCH_OK_PARAMS",
    "FETCH_PARAMS",
    "FILL_INNER_PARAMS",
    "FILL_PARAMETERS_COUNTED",
    "MAX_PARAMETERS",
    "MAX_RANGES",
    "MAX_TOKENS",
    "MAX_TOKEN_BYTES",
    "PARAM_AUTHORIZATION_TOKEN",
    "PARAM_EXPIRES",
    "PARAM_FILL_PARAMETERS",
    "PARAM_FILL_TIMEOUT",
    "PARAM_FORWARD",
    "PARAM_GROUP_ORDER",
    "PARAM_INCLUDE_PROPERTIES",
    "PARAM_LARGEST_OBJECT",
    "PARAM_LOCATION_FILTER",
    "PARAM_NEW_GROUP_REQUEST",
    "PARAM_OBJECTID_FILTER",
    "PARAM_OBJECT_DELIVERY_TIMEOUT",
    "PARAM_OBJECT_PROPERTY_FILTER",
    "PARAM_PRIORITY_FILTER",
    "PARAM_RENDEZVOUS_TIMEOUT",
    "PARAM_SUBGROUP_DELIVERY_TIMEOUT",
    "PARAM_SUBGROUP_FILTER",
    "PARAM_SUBSCRIBER_PRIORITY",
    "PARAM_TRACK_NAMESPACE_PREFIX",
    "PARAM_TRACK_PROPERTY_FILTER",
    "PUBLISH_NAMESPACE_PARAMS",
    "PUBLISH_PARAMS",
    "PUBLISH_STATE_NOTIFY_PARAMS",
    "RANGE_FILTER_TYPES",
    "REQUEST_OK_PARAMS",
    "REQUEST_UPDATE_PARAMS",
    "SUBSCRIBE_NAMESPACE_PARAMS",
    "SUBSCRIBE_OK_PARAMS",
    "SUBSCRIBE_PARAMS",
    "SUBSCRIBE_TRACKS_PARAMS",
    "TRACK_STATUS_PARAMS",
    "AuthToken",
    "LocationFilter",
    "MessageBudget",
    "Parameters",
    "RangeFilter",
    "decode_parameters",
    "encode_namespace",
    "encode_parameters",
]

#: U1: send FILL_PARAMETERS count-prefixed; on receive parse count-prefixed first, then
#: fall back to the count-less (moqxr) form; an empty value means "no inner parameters".
FILL_PARAMETERS_COUNTED = True

PARAM_OBJECT_DELIVERY_TIMEOUT = 0x02
PARAM_AUTHORIZATION_TOKEN = 0x03
PARAM_RENDEZVOUS_TIMEOUT = 0x04
PARAM_SUBGROUP_DELIVERY_TIMEOUT = 0x06
PARAM_EXPIRES = 0x08
PARAM_LARGEST_OBJECT = 0x09
PARAM_FILL_TIMEOUT = 0x0A
PARAM_FORWARD = 0x10
PARAM_SUBSCRIBER_PRIORITY = 0x20
PARAM_LOCATION_FILTER = 0x21
PARAM_GROUP_ORDER = 0x22
PARAM_FILL_PARAMETERS = 0x23
PARAM_SUBGROUP_FILTER = 0x25
PARAM_OBJECTID_FILTER = 0x26
PARAM_PRIORITY_FILTER = 0x27
PARAM_OBJECT_PROPERTY_FILTER = 0x28
PARAM_TRACK_PROPERTY_FILTER = 0x29
PARAM_NEW_GROUP_REQUEST = 0x32
PARAM_TRACK_NAMESPACE_PREFIX = 0x34
PARAM_INCLUDE_PROPERTIES = 0x35

RANGE_FILTER_TYPES = frozenset(range(0x25, 0x2A))
_OBJ_FILTERS = frozenset(range(0x25, 0x29))

# Codec-level allow-lists (digest 4.x / 5.1). Per-context narrowing is the session's job.
SUBSCRIBE_PARAMS = frozenset(
    {0x02, 0x03, 0x04, 0x06, 0x10, 0x20, 0x21, 0x22, 0x23, 0x32, 0x35} | _OBJ_FILTERS
)
SUBSCRIBE_OK_PARAMS = frozenset({PARAM_EXPIRES, PARAM_LARGEST_OBJECT})
#: Union over every request kind (digest 5.1 per-request table); never GROUP_ORDER.
REQUEST_UPDATE_PARAMS = frozenset(
    {0x02, 0x03, 0x06, 0x10, 0x20, 0x21, 0x23, 0x32, 0x34} | RANGE_FILTER_TYPES
)
#: Union of every REQUEST_OK context (digest 4.6).
REQUEST_OK_PARAMS = frozenset({PARAM_EXPIRES, PARAM_LARGEST_OBJECT})
PUBLISH_PARAMS = frozenset({0x02, 0x03, 0x06, 0x08, 0x09, 0x10, 0x20, 0x21, 0x22})
PUBLISH_STATE_NOTIFY_PARAMS = frozenset({PARAM_FORWARD, PARAM_LOCATION_FILTER, 0x09})
FETCH_PARAMS = frozenset({0x03, 0x0A, 0x20, 0x21, 0x22, 0x35} | _OBJ_FILTERS)
FETCH_OK_PARAMS: frozenset[int] = frozenset()
TRACK_STATUS_PARAMS = frozenset({PARAM_AUTHORIZATION_TOKEN, PARAM_INCLUDE_PROPERTIES})
PUBLISH_NAMESPACE_PARAMS = frozenset({PARAM_AUTHORIZATION_TOKEN})
SUBSCRIBE_NAMESPACE_PARAMS = frozenset({PARAM_AUTHORIZATION_TOKEN})
#: U6: accept any subscription parameter plus TRACK_PROPERTY_FILTER.
SUBSCRIBE_TRACKS_PARAMS = SUBSCRIBE_PARAMS | {PARAM_TRACK_PROPERTY_FILTER}
FILL_INNER_PARAMS = frozenset({0x0A, 0x20, 0x21, 0x22} | _OBJ_FILTERS)
ALL_PARAMS = frozenset(
    {0x02, 0x03, 0x04, 0x06, 0x08, 0x09, 0x0A, 0x10, 0x20, 0x21, 0x22, 0x23, 0x32, 0x34, 0x35}
    | RANGE_FILTER_TYPES
)
_REPEATABLE = frozenset({PARAM_AUTHORIZATION_TOKEN}) | RANGE_FILTER_TYPES

# Parse-time limits (ours: draft-22 bounds a message by its 16-bit Length only, digest
# 4.1). Checked before the per-parameter work: a SUBSCRIBE stuffed with 16,200 one-byte
# tokens took 32 ms to decode (a plain one 3 us); stopped at the 17th token it takes ~25 us.
MAX_PARAMETERS = 64
"""Parameters in one message (FILL_PARAMETERS' inner ones counted apart): over it, the
session closes with PROTOCOL_VIOLATION before any parameter is read."""
MAX_TOKENS = 16
"""AUTHORIZATION_TOKENs in one message, SETUP included (``SessionConfig.max_setup_tokens``
may lower it for SETUP): the session closes with UNAUTHORIZED, the code SETUP uses."""
MAX_TOKEN_BYTES = 16 << 10
"""Token value bytes in one message (a JWT is 1-4 KiB): over it, UNAUTHORIZED."""
MAX_RANGES = 256
"""Ranges kept over all Range Filters of one message (MAX_FILTER_RANGES, 16 by default, is
checked later with INVALID_FILTER): the rest of a filter is skipped unread and the filter
marked ``overflow`` (invalid)."""


class MessageBudget:
    """What one message's parameters may still use (:data:`MAX_TOKENS` ...)."""

    __slots__ = ("ranges", "token_bytes", "tokens")

    def __init__(self) -> None:
        self.tokens = MAX_TOKENS
        self.token_bytes = MAX_TOKEN_BYTES
        self.ranges = MAX_RANGES

    def token(self, n: int) -> None:
        """Charge one token of ``n`` value bytes (raises UNAUTHORIZED past a limit)."""
        self.tokens -= 1
        self.token_bytes -= n
        if self.tokens < 0:
            raise ProtocolError(SessionCode.UNAUTHORIZED,
                                f"more than {MAX_TOKENS} authorization tokens in a message")
        if self.token_bytes < 0:
            raise ProtocolError(SessionCode.UNAUTHORIZED, "more than "
                                f"{MAX_TOKEN_BYTES} bytes of authorization tokens in a message")


def encode_namespace(ns: Namespace) -> bytes:
    """Encode a Track Namespace tuple (count + length-prefixed fields); no limit checks."""
    out = bytearray(encode_vi64(len(ns)))
    for f in ns:
        out += encode_vi64(len(f))
        out += f
    return bytes(out)


def read_namespace(r: Reader) -> Namespace:
    """Read and validate a Track Namespace (digest 3.6 limits -> PROTOCOL_VIOLATION)."""
    n = r.vi64()
    if n > 32:
        raise violation(f"namespace has {n} fields (max 32)")
    fields = []
    for _ in range(n):
        ln = r.vi64()
        if ln == 0:
            raise violation("empty namespace field")
        if ln > 4096:
            raise violation("namespace field longer than 4096 bytes")
        fields.append(bytes(r.bytes(ln)))
    ns = tuple(fields)
    validate_namespace(ns)
    return ns


def _u8(v: int, what: str) -> bytes:
    if not 0 <= v <= 255:
        raise ValueError(f"{what} {v} does not fit in uint8")
    return bytes((v,))


# --------------------------------------------------------------------------- AuthToken

AUTH_DELETE = 0x0
AUTH_REGISTER = 0x1
AUTH_USE_ALIAS = 0x2
AUTH_USE_VALUE = 0x3


@dataclass(slots=True, frozen=True)
class AuthToken:
    """Authorization Token value (digest 3.8).

    ``alias_type`` 0 DELETE (alias), 1 REGISTER (alias, token_type, value), 2 USE_ALIAS
    (alias), 3 USE_VALUE (token_type, value). ``value`` runs to the end of the enclosing
    length-prefixed value.
    """

    alias_type: int
    alias: int | None = None
    token_type: int | None = None
    value: bytes | None = None

    def encode(self) -> bytes:
        """Encode the token (without the enclosing length)."""
        at = self.alias_type
        if at not in (0, 1, 2, 3):
            raise ValueError(f"unknown token alias type {at}")
        out = bytearray(encode_vi64(at))
        if at in (0, 1, 2):
            if self.alias is None:
                raise ValueError("token alias required")
            out += encode_vi64(self.alias)
        if at in (1, 3):
            if self.token_type is None or self.value is None:
                raise ValueError("token type and value required")
            out += encode_vi64(self.token_type)
            out += self.value
        return bytes(out)

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> AuthToken:
        """Decode a whole token value; undecodable -> KEY_VALUE_FORMATTING_ERROR."""
        r = Reader(buf, code=SessionCode.KEY_VALUE_FORMATTING_ERROR)
        at = r.vi64()
        if at in (AUTH_DELETE, AUTH_USE_ALIAS):
            alias = r.vi64()
            if not r.at_end:
                raise ProtocolError(
                    SessionCode.KEY_VALUE_FORMATTING_ERROR, "trailing bytes in token"
                )
            return cls(at, alias)
        if at == AUTH_REGISTER:
            alias = r.vi64()
            tt = r.vi64()
            return cls(at, alias, tt, bytes(r.rest()))
        if at == AUTH_USE_VALUE:
            tt = r.vi64()
            return cls(at, None, tt, bytes(r.rest()))
        raise ProtocolError(SessionCode.KEY_VALUE_FORMATTING_ERROR, f"token alias type {at}")


# ---------------------------------------------------------------------- LocationFilter

LF_NONE = 0x00
LF_RELATIVE_START = 0x01
LF_ABSOLUTE_START = 0x02
LF_ABSOLUTE_GROUP_END = 0x03
LF_ABSOLUTE_RANGE = 0x04
LF_NEXT_OBJECT = 0x05


@dataclass(slots=True, frozen=True)
class LocationFilter:
    """LOCATION_FILTER value (digest 6.1): a type plus the fields that type defines.

    For type 0x01 the StartGroup count is ``start_group``.
    """

    type: int
    start_group: int = 0
    start_object: int = 0
    end_group_delta: int = 0
    end_object: int = 0

    @classmethod
    def none(cls) -> LocationFilter:
        """Type 0x00: no filter (in FILL_PARAMETERS: whole track)."""
        return cls(LF_NONE)

    @classmethod
    def relative_start(cls, n: int) -> LocationFilter:
        """Type 0x01: start at {Largest.Group + 1 - n, 0}."""
        return cls(LF_RELATIVE_START, n)

    @classmethod
    def absolute_start(cls, g: int, o: int) -> LocationFilter:
        """Type 0x02: start at {g, o}, open-ended."""
        return cls(LF_ABSOLUTE_START, g, o)

    @classmethod
    def absolute_group_end(cls, g: int, o: int, delta: int) -> LocationFilter:
        """Type 0x03: {g, o} through the end of group g + delta."""
        return cls(LF_ABSOLUTE_GROUP_END, g, o, delta)

    @classmethod
    def absolute_range(cls, g: int, o: int, delta: int, end_object: int) -> LocationFilter:
        """Type 0x04: {g, o} .. {g + delta, end_object} inclusive."""
        return cls(LF_ABSOLUTE_RANGE, g, o, delta, end_object)

    @classmethod
    def next_object(cls) -> LocationFilter:
        """Type 0x05: start right after Largest Object."""
        return cls(LF_NEXT_OBJECT)

    def encode(self) -> bytes:
        """Encode as Location Filter Type followed by the type's fields."""
        t = self.type
        if t in (LF_NONE, LF_NEXT_OBJECT):
            return encode_vi64(t)
        if t == LF_RELATIVE_START:
            return encode_vi64(t) + encode_vi64(self.start_group)
        if t == LF_ABSOLUTE_START:
            return bytes((t,)) + encode_vi64(self.start_group) + encode_vi64(self.start_object)
        if t == LF_ABSOLUTE_GROUP_END:
            return (
                bytes((t,))
                + encode_vi64(self.start_group)
                + encode_vi64(self.start_object)
                + encode_vi64(self.end_group_delta)
            )
        if t == LF_ABSOLUTE_RANGE:
            return (
                bytes((t,))
                + encode_vi64(self.start_group)
                + encode_vi64(self.start_object)
                + encode_vi64(self.end_group_delta)
                + encode_vi64(self.end_object)
            )
        raise ValueError(f"unknown location filter type {t}")

    @classmethod
    def read(cls, r: Reader) -> LocationFilter:
        """Read a filter; type > 5 or group overflow -> PROTOCOL_VIOLATION."""
        t = r.vi64()
        if t in (LF_NONE, LF_NEXT_OBJECT):
            return cls(t)
        if t == LF_RELATIVE_START:
            return cls(t, r.vi64())
        if t == LF_ABSOLUTE_START:
            g = r.vi64()
            return cls(t, g, r.vi64())
        if t in (LF_ABSOLUTE_GROUP_END, LF_ABSOLUTE_RANGE):
            g = r.vi64()
            o = r.vi64()
            d = r.vi64()
            if g + d > MAX_VI64:
                raise violation("location filter end group overflows 2^64-1")
            if t == LF_ABSOLUTE_GROUP_END:
                return cls(t, g, o, d)
            return cls(t, g, o, d, r.vi64())
        raise violation(f"unknown location filter type {t}")

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> LocationFilter:
        """Decode a filter occupying all of ``buf``."""
        r = Reader(buf)
        lf = cls.read(r)
        r.expect_end("location filter")
        return lf

    def bounds(self, largest: Location | None) -> tuple[Location, Location | None]:
        """Inclusive (start, end) given the Largest Object; end None means open-ended."""
        t = self.type
        if t == LF_NONE:
            return Location(0, 0), None
        if t == LF_RELATIVE_START:
            if largest is None:
                return Location(0, 0), None
            g = min(MAX_VI64, max(0, largest.group + 1 - self.start_group))
            return Location(g, 0), None
        if t == LF_NEXT_OBJECT:
            if largest is None:
                return Location(0, 0), None
            return Location(largest.group, largest.object + 1), None
        start = Location(self.start_group, self.start_object)
        if t == LF_ABSOLUTE_START:
            return start, None
        end_group = self.start_group + self.end_group_delta
        if t == LF_ABSOLUTE_GROUP_END:
            return start, Location(end_group, MAX_VI64)
        return start, Location(end_group, self.end_object)


# ------------------------------------------------------------------------- RangeFilter


@dataclass(slots=True, frozen=True)
class RangeFilter:
    """A Range Filter parameter 0x25..0x29 (digest 3.7, 6.3).

    ``ranges`` are ABSOLUTE inclusive (start, end); only the last may have end None
    (open-ended). ``remove`` encodes/decodes the Length-0 "remove this filter" form.
    Decoding keeps out-of-range values (they are a REQUEST_ERROR INVALID_FILTER matter,
    not a session error): check :meth:`is_valid`.
    """

    param_type: int
    set_id: int = 0
    ranges: tuple[tuple[int, int | None], ...] = ()
    property_type: int | None = None
    remove: bool = False
    overflow: bool = False
    """More ranges than a message may carry (:data:`MAX_RANGES`): the rest went unread."""

    def has_property_type(self) -> bool:
        """True for OBJECT_PROPERTY_FILTER / TRACK_PROPERTY_FILTER."""
        return self.param_type in (PARAM_OBJECT_PROPERTY_FILTER, PARAM_TRACK_PROPERTY_FILTER)

    def is_valid(self) -> bool:
        """False if the filter should be refused with INVALID_FILTER."""
        if self.remove:
            return True
        if self.overflow:
            return False
        hi = 255 if self.param_type == PARAM_PRIORITY_FILTER else MAX_VI64
        for s, e in self.ranges:
            if s > hi or (e is not None and e > hi):
                return False
        return not (self.has_property_type() and (self.property_type or 0) & 1)

    def encode_value(self) -> bytes:
        """Encode the value without its Length prefix."""
        if self.remove:
            return b""
        out = bytearray(_u8(self.set_id, "SetID"))
        if self.has_property_type():
            if self.property_type is None:
                raise ValueError("property filter needs property_type")
            out += encode_vi64(self.property_type)
        prev = 0
        last = len(self.ranges) - 1
        for i, (s, e) in enumerate(self.ranges):
            if s < prev:
                raise ValueError("ranges must be ascending and non-overlapping")
            out += encode_vi64(s - prev)
            if e is None:
                if i != last:
                    raise ValueError("only the last range may be open-ended")
                break
            if e < s:
                raise ValueError("range end before start")
            out += encode_vi64(e - s)
            prev = e
        return bytes(out)

    @classmethod
    def read_value(cls, param_type: int, r: Reader, limit: int = MAX_RANGES) -> RangeFilter:
        """Decode a value occupying all of ``r`` (without Length), keeping at most ``limit``
        ranges (the rest is skipped unread and the filter marked ``overflow``)."""
        if r.at_end:
            return cls(param_type, remove=True)
        set_id = r.u8()
        pt = None
        if param_type in (PARAM_OBJECT_PROPERTY_FILTER, PARAM_TRACK_PROPERTY_FILTER):
            pt = r.vi64()
        ranges: list[tuple[int, int | None]] = []
        prev = 0
        while not r.at_end:
            if len(ranges) >= limit:
                r.pos = r.end
                return cls(param_type, set_id, tuple(ranges), pt, overflow=True)
            s = prev + r.vi64()
            if r.at_end:
                ranges.append((s, None))
                break
            e = s + r.vi64()
            ranges.append((s, e))
            prev = e
        return cls(param_type, set_id, tuple(ranges), pt)


# -------------------------------------------------------------------------- Parameters


@dataclass(slots=True)
class Parameters:
    """Decoded Message Parameters; None / () means absent."""

    object_delivery_timeout: int | None = None
    auth_tokens: tuple[AuthToken, ...] = ()
    rendezvous_timeout: int | None = None
    subgroup_delivery_timeout: int | None = None
    expires: int | None = None
    largest_object: Location | None = None
    fill_timeout: int | None = None
    forward: int | None = None
    subscriber_priority: int | None = None
    location_filter: LocationFilter | None = None
    group_order: int | None = None
    fill: Parameters | None = None
    range_filters: tuple[RangeFilter, ...] = ()
    new_group_request: int | None = None
    track_namespace_prefix: tuple[bytes, ...] | None = None
    include_properties: int | None = None

    def types(self) -> frozenset[int]:
        """Parameter types present."""
        out = {t for t, _ in _entries(self)}
        return frozenset(out)


def _entries(p: Parameters) -> list[tuple[int, bytes]]:
    """(type, encoded value) pairs in ascending type order."""
    e: list[tuple[int, bytes]] = []
    if p.object_delivery_timeout is not None:
        e.append((0x02, encode_vi64(p.object_delivery_timeout)))
    for tok in p.auth_tokens:
        v = tok.encode()
        e.append((0x03, encode_vi64(len(v)) + v))
    if p.rendezvous_timeout is not None:
        e.append((0x04, encode_vi64(p.rendezvous_timeout)))
    if p.subgroup_delivery_timeout is not None:
        e.append((0x06, encode_vi64(p.subgroup_delivery_timeout)))
    if p.expires is not None:
        e.append((0x08, encode_vi64(p.expires)))
    if p.largest_object is not None:
        g, o = p.largest_object
        e.append((0x09, encode_vi64(g) + encode_vi64(o)))
    if p.fill_timeout is not None:
        e.append((0x0A, encode_vi64(p.fill_timeout)))
    if p.forward is not None:
        if p.forward not in (0, 1):
            raise ValueError("FORWARD must be 0 or 1")
        e.append((0x10, bytes((p.forward,))))
    if p.subscriber_priority is not None:
        e.append((0x20, _u8(p.subscriber_priority, "SUBSCRIBER_PRIORITY")))
    if p.location_filter is not None:
        e.append((0x21, p.location_filter.encode()))
    if p.group_order is not None:
        if p.group_order not in (1, 2):
            raise ValueError("GROUP_ORDER must be 1 or 2")
        e.append((0x22, bytes((p.group_order,))))
    if p.fill is not None:
        inner = encode_parameters(p.fill) if FILL_PARAMETERS_COUNTED else _encode_list(p.fill)
        e.append((0x23, encode_vi64(len(inner)) + inner))
    for rf in sorted(p.range_filters, key=lambda f: f.param_type):
        if rf.param_type not in RANGE_FILTER_TYPES:
            raise ValueError(f"bad range filter type 0x{rf.param_type:x}")
        v = rf.encode_value()
        e.append((rf.param_type, encode_vi64(len(v)) + v))
    if p.new_group_request is not None:
        e.append((0x32, encode_vi64(p.new_group_request)))
    if p.track_namespace_prefix is not None:
        e.append((0x34, encode_namespace(p.track_namespace_prefix)))
    if p.include_properties is not None:
        if p.include_properties not in (0, 1):
            raise ValueError("INCLUDE_PROPERTIES must be 0 or 1")
        e.append((0x35, bytes((p.include_properties,))))
    return e


def _encode_list(p: Parameters) -> bytes:
    out = bytearray()
    prev = 0
    for t, v in _entries(p):
        out += encode_vi64(t - prev)
        out += v
        prev = t
    return bytes(out)


def encode_parameters(p: Parameters) -> bytes:
    """Encode Number of Parameters + (Type Delta, Value) entries in ascending order."""
    entries = _entries(p)
    out = bytearray(encode_vi64(len(entries)))
    prev = 0
    for t, v in entries:
        out += encode_vi64(t - prev)
        out += v
        prev = t
    return bytes(out)


def _read_one(r: Reader, t: int, p: Parameters, tokens: list, rfs: list,
              budget: MessageBudget) -> None:
    if t == 0x02:
        p.object_delivery_timeout = r.vi64()
    elif t == 0x03:
        n = r.vi64()
        budget.token(n)
        tokens.append(AuthToken.decode(r.bytes(n)))
    elif t == 0x04:
        p.rendezvous_timeout = r.vi64()
    elif t == 0x06:
        p.subgroup_delivery_timeout = r.vi64()
    elif t == 0x08:
        p.expires = r.vi64()
    elif t == 0x09:
        p.largest_object = r.location()
    elif t == 0x0A:
        p.fill_timeout = r.vi64()
    elif t == 0x10:
        v = r.u8()
        if v > 1:
            raise violation(f"FORWARD value {v}")
        p.forward = v
    elif t == 0x20:
        p.subscriber_priority = r.u8()
    elif t == 0x21:
        p.location_filter = LocationFilter.read(r)
    elif t == 0x22:
        v = r.u8()
        if v not in (1, 2):
            raise violation(f"GROUP_ORDER value {v}")
        p.group_order = v
    elif t == 0x23:
        p.fill = _read_fill(r.sub(r.vi64()), budget)
    elif 0x25 <= t <= 0x29:
        rf = RangeFilter.read_value(t, r.sub(r.vi64()), budget.ranges)
        budget.ranges -= len(rf.ranges)
        rfs.append(rf)
    elif t == 0x32:
        p.new_group_request = r.vi64()
    elif t == 0x34:
        p.track_namespace_prefix = read_namespace(r)
    elif t == 0x35:
        v = r.u8()
        if v > 1:
            raise violation(f"INCLUDE_PROPERTIES value {v}")
        p.include_properties = v
    else:  # pragma: no cover - guarded by ALL_PARAMS
        raise violation(f"unknown parameter 0x{t:x}")


def _read_params(r: Reader, allowed: frozenset[int], count: int | None,
                 budget: MessageBudget) -> Parameters:
    if count is not None and count > MAX_PARAMETERS:
        raise violation(f"{count} parameters in a message (we accept {MAX_PARAMETERS})")
    p = Parameters()
    tokens: list[AuthToken] = []
    rfs: list[RangeFilter] = []
    seen: set[int] = set()
    t = 0
    i = 0
    while (count is None and r.pos < r.end) or (count is not None and i < count):
        i += 1
        if i > MAX_PARAMETERS:
            raise violation(f"more than {MAX_PARAMETERS} parameters in a message")
        t += r.vi64()
        if t not in ALL_PARAMS:
            raise violation(f"unknown parameter type 0x{t:x}")
        if t not in allowed:
            raise violation(f"parameter 0x{t:x} not allowed here")
        if t in seen and t not in _REPEATABLE:
            raise violation(f"parameter 0x{t:x} repeated")
        seen.add(t)
        _read_one(r, t, p, tokens, rfs, budget)
    if tokens:
        p.auth_tokens = tuple(tokens)
    if rfs:
        p.range_filters = tuple(rfs)
    return p


def _read_fill(r: Reader, budget: MessageBudget) -> Parameters:
    """FILL_PARAMETERS value (U1): counted form first, count-less fallback (or reverse)."""
    if r.at_end:
        return Parameters()
    forms = (True, False) if FILL_PARAMETERS_COUNTED else (False, True)
    first_error: ProtocolError | None = None
    ranges = budget.ranges
    for counted in forms:
        rr = Reader(r.buf, r.pos, r.end)
        budget.ranges = ranges  # a form that failed charged nothing
        try:
            if counted:
                p = _read_params(rr, FILL_INNER_PARAMS, rr.vi64(), budget)
                rr.expect_end("FILL_PARAMETERS")
            else:
                p = _read_params(rr, FILL_INNER_PARAMS, None, budget)
        except ProtocolError as exc:
            if first_error is None:
                first_error = exc
            continue
        return p
    assert first_error is not None
    raise first_error


def decode_parameters(reader: Reader, allowed: frozenset[int]) -> Parameters:
    """Read Number of Parameters + entries from ``reader``.

    Unknown types, types not in ``allowed``, repeated non-repeatable types and more than
    :data:`MAX_PARAMETERS` raise PROTOCOL_VIOLATION; more than :data:`MAX_TOKENS` tokens or
    :data:`MAX_TOKEN_BYTES` of them, UNAUTHORIZED.
    """
    return _read_params(reader, allowed, reader.vi64(), MessageBudget())
