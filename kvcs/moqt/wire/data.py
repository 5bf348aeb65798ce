"""Data streams and datagrams (digest 7): headers, object records and fast writers.

Writers return only the small prefix bytes; the caller writes the payload separately so
payload bytes are never copied.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import violation
from .buffer import NeedMore, Reader
from .properties import Properties, encode_kvps, read_kvps
from .types import MAX_VI64, VALID_STATUSES, Location
from .vi64 import decode_vi64, encode_vi64

__all__ = [
    "END_OF_NON_EXISTENT_RANGE",
    "END_OF_RANGE_HAS_LENGTH",
    "END_OF_RANGE_KINDS",
    "END_OF_TIMED_OUT_RANGE",
    "END_OF_UNKNOWN_RANGE",
    "FETCH_HEADER_TYPE",
    "PADDING_DATAGRAM_TYPE",
    "PADDING_STREAM_TYPE",
    "SUBGROUP_ID_EXPLICIT",
    "SUBGROUP_ID_FIRST_OBJECT",
    "SUBGROUP_ID_ZERO",
    "EndOfRange",
    "FetchHeader",
    "FetchWriter",
    "ObjectRecord",
    "SubgroupHeader",
    "SubgroupWriter",
    "decode_datagram",
    "encode_datagram",
    "is_subgroup_type",
]

#: U2: End of Range records carry no Object Payload Length (marker-only form).
END_OF_RANGE_HAS_LENGTH = False

FETCH_HEADER_TYPE = 0x05
PADDING_STREAM_TYPE = 0x132B3E28
PADDING_DATAGRAM_TYPE = 0x132B3E29

END_OF_NON_EXISTENT_RANGE = 0x8C
END_OF_UNKNOWN_RANGE = 0x10C
END_OF_TIMED_OUT_RANGE = 0x20C
END_OF_RANGE_KINDS = frozenset(
    (END_OF_NON_EXISTENT_RANGE, END_OF_UNKNOWN_RANGE, END_OF_TIMED_OUT_RANGE)
)

SUBGROUP_ID_ZERO = 0
SUBGROUP_ID_FIRST_OBJECT = 1
SUBGROUP_ID_EXPLICIT = 2

_EMPTY = memoryview(b"")
_ENC_SMALL: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(256))


def is_subgroup_type(t: int) -> bool:
    """True for the 48 valid SUBGROUP_HEADER type values."""
    return 0x10 <= t < 0x80 and bool(t & 0x10) and (t & 0x06) != 0x06


# ----------------------------------------------------------------------------- headers


@dataclass(slots=True)
class SubgroupHeader:
    """SUBGROUP_HEADER (digest 7.1).

    ``subgroup_id_mode``: 0 = Subgroup ID 0 (no field), 1 = Subgroup ID is the first
    object's ID (no field; the parser fills ``subgroup_id`` after the first object),
    2 = explicit field. None (default) picks 0 when ``subgroup_id`` is 0, else 2.
    ``publisher_priority`` None = DEFAULT_PRIORITY bit (no priority byte).
    """

    track_alias: int
    group_id: int
    subgroup_id: int = 0
    publisher_priority: int | None = None
    has_properties: bool = False
    end_of_group: bool = False
    first_object: bool = False
    subgroup_id_mode: int | None = None

    def __post_init__(self) -> None:
        if self.subgroup_id_mode is None:
            self.subgroup_id_mode = SUBGROUP_ID_ZERO if self.subgroup_id == 0 else 2

    @property
    def type(self) -> int:
        """The Type Flags byte."""
        mode = self.subgroup_id_mode
        if mode not in (0, 1, 2):
            raise ValueError(f"bad subgroup id mode {mode}")
        if mode == SUBGROUP_ID_ZERO and self.subgroup_id != 0:
            raise ValueError("subgroup id mode 0 requires subgroup id 0")
        t = 0x10 | (mode << 1)
        if self.has_properties:
            t |= 0x01
        if self.end_of_group:
            t |= 0x08
        if self.publisher_priority is None:
            t |= 0x20
        if self.first_object:
            t |= 0x40
        return t

    def encode(self) -> bytes:
        """Encode the header (the first bytes of the stream)."""
        out = _ENC_SMALL[self.type] + encode_vi64(self.track_alias) + encode_vi64(self.group_id)
        if self.subgroup_id_mode == SUBGROUP_ID_EXPLICIT:
            out += encode_vi64(self.subgroup_id)
        if self.publisher_priority is not None:
            if not 0 <= self.publisher_priority <= 255:
                raise ValueError("publisher priority must fit in uint8")
            out += _ENC_SMALL[self.publisher_priority]
        return out

    @classmethod
    def parse(cls, buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[SubgroupHeader, int]:
        """Parse at ``pos``; return (header, new pos). NeedMore if incomplete."""
        if pos >= len(buf):
            raise NeedMore
        t = buf[pos]
        if not is_subgroup_type(t):
            raise violation(f"invalid SUBGROUP_HEADER type 0x{t:x}")
        return cls._parse_rest(t, buf, pos + 1)

    @classmethod
    def _parse_rest(
        cls, t: int, buf: bytes | bytearray | memoryview, p: int
    ) -> tuple[SubgroupHeader, int]:
        alias, p = decode_vi64(buf, p)
        group, p = decode_vi64(buf, p)
        mode = (t >> 1) & 3
        sg = 0
        if mode == SUBGROUP_ID_EXPLICIT:
            sg, p = decode_vi64(buf, p)
        prio = None
        if not t & 0x20:
            if p >= len(buf):
                raise NeedMore
            prio = buf[p]
            p += 1
        hdr = cls(alias, group, sg, prio, bool(t & 1), bool(t & 8), bool(t & 0x40), mode)
        return hdr, p

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> SubgroupHeader:
        """Decode a header occupying all of ``buf`` (truncation / trailing -> violation)."""
        try:
            hdr, p = cls.parse(buf, 0)
        except NeedMore:
            raise violation("truncated SUBGROUP_HEADER") from None
        if p != len(buf):
            raise violation("trailing bytes after SUBGROUP_HEADER")
        return hdr


@dataclass(slots=True)
class FetchHeader:
    """FETCH_HEADER (type 0x05): the FETCH's (or fill's SUBSCRIBE/REQUEST_UPDATE's) ID."""

    request_id: int

    TYPE = FETCH_HEADER_TYPE

    def encode(self) -> bytes:
        """Encode type 0x05 + Request ID."""
        return b"\x05" + encode_vi64(self.request_id)

    @classmethod
    def decode(cls, buf: bytes | bytearray | memoryview) -> FetchHeader:
        """Decode a header occupying all of ``buf``."""
        r = Reader(buf)
        if r.vi64() != FETCH_HEADER_TYPE:
            raise violation("not a FETCH_HEADER")
        rid = r.vi64()
        r.expect_end("FETCH_HEADER")
        return cls(rid)


# ----------------------------------------------------------------------------- records


@dataclass(slots=True)
class ObjectRecord:
    """One object from a subgroup stream, fetch stream or datagram: its header fields, in
    the one order every object record of kvcs uses (a track's ``CachedObject`` and the
    application's ``ReceivedObject`` are ObjectRecords with one field more).

    ``publisher_priority`` None = inherited default (subgroup DEFAULT_PRIORITY / datagram
    DEFAULT_PRIORITY). Fetch objects always have status 0. Datagram objects (and fetch
    objects flagged as datagrams) have ``datagram`` True and subgroup_id 0.
    """

    group_id: int
    object_id: int
    subgroup_id: int
    publisher_priority: int | None
    status: int
    properties: Properties
    payload: bytes | memoryview
    datagram: bool = False

    @property
    def location(self) -> Location:
        """The object's Location."""
        return Location(self.group_id, self.object_id)


@dataclass(slots=True, frozen=True)
class EndOfRange:
    """End of Range marker in a fetch stream (digest 7.3): Locations after the last
    serialized object up to and including (group_id, object_id) have status ``kind``."""

    kind: int
    group_id: int
    object_id: int


# ----------------------------------------------------------------------------- writers


class SubgroupWriter:
    """Serializes a subgroup stream: header bytes then per-object prefixes."""

    __slots__ = ("_mode1_id", "_prev", "_props", "header")

    def __init__(self, header: SubgroupHeader) -> None:
        self.header = header
        self._prev = -1
        self._props = header.has_properties
        self._mode1_id = header.subgroup_id if header.subgroup_id_mode == 1 else None

    def header_bytes(self) -> bytes:
        """The SUBGROUP_HEADER bytes."""
        return self.header.encode()

    def object_prefix(
        self,
        object_id: int,
        payload_len: int,
        status: int = 0,
        properties: Properties | None = None,
    ) -> bytes:
        """Bytes preceding an object's payload (Object ID delta, properties, length, status)."""
        prev = self._prev
        if prev < 0:
            if self._mode1_id is not None and object_id != self._mode1_id:
                raise ValueError("first object id must equal the subgroup id (mode 01)")
            delta = object_id
        else:
            delta = object_id - prev - 1
            if delta < 0:
                raise ValueError("object ids must increase within a subgroup")
        if object_id > MAX_VI64:
            raise ValueError("object id out of range")
        out = _ENC_SMALL[delta] if delta < 0x80 else encode_vi64(delta)
        if self._props:
            if properties:
                if status:
                    raise ValueError("properties on a non-Normal status object")
                pb = encode_kvps(properties)
                out += encode_vi64(len(pb)) + pb
            else:
                out += b"\x00"
        elif properties:
            raise ValueError("header has no PROPERTIES bit")
        self._prev = object_id
        if payload_len:
            if status:
                raise ValueError("status is only sent with an empty payload")
            return out + (
                _ENC_SMALL[payload_len] if payload_len < 0x80 else encode_vi64(payload_len)
            )
        if status not in VALID_STATUSES:
            raise ValueError(f"invalid object status {status}")
        return out + b"\x00" + _ENC_SMALL[status]


class FetchWriter:
    """Serializes a fetch stream with the smallest Serialization Flags (digest 7.3)."""

    __slots__ = ("_desc", "_group", "_marker", "_obj", "_prio", "_sub", "request_id")

    def __init__(self, request_id: int, descending: bool = False) -> None:
        self.request_id = request_id
        self._desc = descending
        self._group: int | None = None
        self._obj = 0
        self._sub: int | None = None
        self._prio: int | None = None
        self._marker = False

    def header_bytes(self) -> bytes:
        """The FETCH_HEADER bytes."""
        return b"\x05" + encode_vi64(self.request_id)

    def object_prefix(
        self,
        group_id: int,
        subgroup_id: int,
        object_id: int,
        publisher_priority: int,
        payload_len: int,
        properties: Properties | None = None,
        datagram: bool = False,
    ) -> bytes:
        """Bytes preceding an object's payload on a fetch stream."""
        flags = 0
        parts: list[bytes] = []
        pg = self._group
        if pg is None:
            flags = 0x0C
            gfield: bytes | None = encode_vi64(group_id)
            ofield: bytes | None = encode_vi64(object_id)
        else:
            gfield = None
            ofield = None
            if group_id != pg:
                flags |= 0x08
                if self._desc:
                    if group_id > pg:
                        raise ValueError("descending fetch: group must decrease")
                    gfield = encode_vi64(pg - group_id - 1)
                elif group_id < pg:
                    raise ValueError("ascending fetch: group must increase")
                else:
                    gfield = encode_vi64(group_id - pg - 1)
                if object_id != self._obj + 1:
                    flags |= 0x04
                    ofield = encode_vi64(object_id)
            elif object_id != self._obj + 1:
                if object_id < self._obj:
                    raise ValueError("object ids must not decrease within a group")
                flags |= 0x04
                ofield = encode_vi64(object_id - self._obj)
        sfield = None
        if datagram:
            flags |= 0x40
        else:
            ps = self._sub
            if ps is not None and subgroup_id == ps and not self._marker:
                flags |= 1
            elif subgroup_id == 0:
                pass
            elif ps is not None and subgroup_id == ps + 1:
                flags |= 2
            elif ps is not None and subgroup_id == ps:
                flags |= 1
            else:
                flags |= 3
                sfield = encode_vi64(subgroup_id)
        if not 0 <= publisher_priority <= 255:
            raise ValueError("publisher priority must fit in uint8")
        pfield = None
        if publisher_priority != self._prio:
            flags |= 0x10
            pfield = _ENC_SMALL[publisher_priority]
        if properties:
            flags |= 0x20
        parts.append(_ENC_SMALL[flags])
        if gfield is not None:
            parts.append(gfield)
        if sfield is not None:
            parts.append(sfield)
        if ofield is not None:
            parts.append(ofield)
        if pfield is not None:
            parts.append(pfield)
        if properties:
            pb = encode_kvps(properties)
            parts.append(encode_vi64(len(pb)))
            parts.append(pb)
        parts.append(encode_vi64(payload_len))
        self._group = group_id
        self._obj = object_id
        if not datagram:
            self._sub = subgroup_id
        self._prio = publisher_priority
        self._marker = False
        return b"".join(parts)

    def end_of_range(self, kind: int, group_id: int, object_id: int) -> bytes:
        """An End of Range record (marker-only unless END_OF_RANGE_HAS_LENGTH)."""
        if kind not in END_OF_RANGE_KINDS:
            raise ValueError(f"bad End of Range kind 0x{kind:x}")
        self._group = group_id
        self._obj = object_id
        self._marker = True
        out = encode_vi64(kind) + encode_vi64(group_id) + encode_vi64(object_id)
        if END_OF_RANGE_HAS_LENGTH:
            out += b"\x00"
        return out


# --------------------------------------------------------------------------- datagrams


def encode_datagram(track_alias: int, record: ObjectRecord, end_of_group: bool = False) -> bytes:
    """Encode an OBJECT_DATAGRAM (digest 7.5). Non-Normal status uses the STATUS form."""
    t = 0
    props = record.properties
    if props:
        t |= 0x01
    if end_of_group:
        t |= 0x02
    if record.object_id == 0:
        t |= 0x04
    if record.publisher_priority is None:
        t |= 0x08
    status = record.status
    if status:
        if status not in VALID_STATUSES:
            raise ValueError(f"invalid object status {status}")
        if end_of_group:
            raise ValueError("STATUS datagram cannot carry END_OF_GROUP")
        if props:
            raise ValueError("properties on a non-Normal status object")
        if len(record.payload):
            raise ValueError("status objects have no payload")
        t |= 0x20
    out = bytearray(_ENC_SMALL[t])
    out += encode_vi64(track_alias)
    out += encode_vi64(record.group_id)
    if record.object_id != 0:
        out += encode_vi64(record.object_id)
    if record.publisher_priority is not None:
        out.append(record.publisher_priority)
    if props:
        pb = encode_kvps(props)
        out += encode_vi64(len(pb))
        out += pb
    if status:
        out += encode_vi64(status)
    else:
        out += record.payload
    return bytes(out)


def decode_datagram(
    data: bytes | bytearray | memoryview,
) -> tuple[int, ObjectRecord, bool] | None:
    """Decode an OBJECT_DATAGRAM into (track alias, record, end_of_group).

    Returns None for a padding datagram. Invalid flags or layout -> PROTOCOL_VIOLATION.
    The payload is a zero-copy view of ``data``.
    """
    r = Reader(data)
    t = r.vi64()
    if t == PADDING_DATAGRAM_TYPE:
        return None
    if t >= 0x40 or t & 0x10 or (t & 0x22) == 0x22:
        raise violation(f"invalid OBJECT_DATAGRAM type 0x{t:x}")
    alias = r.vi64()
    group = r.vi64()
    oid = 0 if t & 0x04 else r.vi64()
    prio = None if t & 0x08 else r.u8()
    props: Properties = ()
    if t & 0x01:
        n = r.vi64()
        if n == 0:
            raise violation("datagram PROPERTIES bit with empty properties")
        props = read_kvps(r.sub(n))
    if t & 0x20:
        status = r.vi64()
        if status not in VALID_STATUSES:
            raise violation(f"invalid object status {status}")
        if props and status:
            raise violation("properties on a non-Normal status object")
        r.expect_end("OBJECT_DATAGRAM")
        payload = _EMPTY
    else:
        status = 0
        payload = r.rest()
    return alias, ObjectRecord(group, oid, 0, prio, status, props, payload, True), bool(t & 0x02)
