"""Incremental parsers for control streams and unidirectional data streams.

QUIC delivers stream bytes in arbitrary chunks. Payloads that lie inside one fed chunk are
handed out as zero-copy memoryview slices of that chunk; a payload spanning chunks is
copied once into a bytearray of exactly its length, allocated when its header is parsed.
A data stream parser charges what it keeps between chunks (that bytearray, an unfinished
object header) to the session's :class:`~kvcs.moqt.wire.buffer.ByteBudget`, and reports a
stream that contradicts itself (an object after End of Group, a repeated fetch object) as
a malformed track: both are :class:`~kvcs.moqt.errors.StreamError`, for that stream only.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import StreamError, malformed_track, over_limit, violation
from . import data as _data
from .buffer import ByteBudget, NeedMore
from .data import (
    END_OF_RANGE_KINDS,
    FETCH_HEADER_TYPE,
    PADDING_STREAM_TYPE,
    EndOfRange,
    FetchHeader,
    ObjectRecord,
    SubgroupHeader,
    is_subgroup_type,
)
from .messages import Message, decode_message
from .properties import Properties, decode_kvps
from .types import MAX_VI64, VALID_STATUSES
from .vi64 import VI64_LEN, VI64_MASK, decode_vi64

__all__ = [
    "MAX_OBJECT_PAYLOAD",
    "MAX_OBJECT_PROPERTIES",
    "ControlStreamParser",
    "DataStreamParser",
    "StreamItem",
]

#: Default cap on one object's payload (and Properties) length accepted by
#: :class:`DataStreamParser`; a larger announced length is refused before allocating
#: (PROTOCOL_VIOLATION).
MAX_OBJECT_PAYLOAD = 1 << 28
#: Default cap on one object's Properties length: a longer one stops the stream
#: (EXCESSIVE_LOAD). It bounds the unfinished header a stream keeps between chunks.
MAX_OBJECT_PROPERTIES = 1 << 16

StreamItem = SubgroupHeader | FetchHeader | ObjectRecord | EndOfRange

_EMPTY = memoryview(b"")


def _as_view(data: bytes | bytearray | memoryview) -> memoryview:
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.ndim != 1 or mv.itemsize != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


class ControlStreamParser:
    """Frames control messages by their 16-bit Length, then decodes them."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete message currently buffered."""
        return len(self._buf)

    def clear(self) -> None:
        """Drop an incomplete message (the stream is no longer read)."""
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Add stream bytes; return every message completed by them, in order."""
        return [decode_message(t, memoryview(body)) for t, body in self.frames(data)]

    def frames(self, data: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
        """Add stream bytes; return every message completed by them as (type, body),
        undecoded (:func:`~kvcs.moqt.wire.messages.decode_message` decodes one)."""
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        p = 0
        n = len(buf)
        while p < n:
            try:
                t, q = decode_vi64(buf, p)
            except NeedMore:
                break
            if q + 2 > n:
                break
            ln = (buf[q] << 8) | buf[q + 1]
            end = q + 2 + ln
            if end > n:
                break
            out.append((t, bytes(buf[q + 2 : end])))
            p = end
        if p:
            del buf[:p]
        return out


class DataStreamParser:
    """Parses a unidirectional data stream from its first byte.

    ``feed`` returns the header first (SubgroupHeader or FetchHeader), then ObjectRecord
    and EndOfRange items. Padding streams yield nothing. ``fetch_descending(request_id)``
    tells the Group ID delta direction of a fetch stream (default ascending).

    With a ``budget``, the bytes kept between ``feed`` calls (a payload spanning chunks,
    allocated when its header is parsed; an unfinished header) are charged to it and given
    back as they are handed out, or by :meth:`release`. ``feed`` raises
    :class:`~kvcs.moqt.errors.StreamError` (with the items completed before it) when the
    budget or ``max_properties`` would be exceeded (EXCESSIVE_LOAD), or when the stream
    shows its track to be malformed (MALFORMED_TRACK).
    """

    __slots__ = (
        "_budget",
        "_charged",
        "_desc",
        "_dst",
        "_dst_len",
        "_fetch_desc_cb",
        "_filled",
        "_final",
        "_g",
        "_hdr_prio",
        "_marker",
        "_max",
        "_max_props",
        "_mode1",
        "_o",
        "_pending",
        "_prio",
        "_props",
        "_rec",
        "_sg",
        "_sub",
        "header",
        "kind",
    )

    def __init__(
        self,
        fetch_descending: Callable[[int], bool] | None = None,
        *,
        max_payload: int = MAX_OBJECT_PAYLOAD,
        max_properties: int = MAX_OBJECT_PROPERTIES,
        budget: ByteBudget | None = None,
    ) -> None:
        self._fetch_desc_cb = fetch_descending
        self._max = max_payload
        self._max_props = max_properties
        self._budget = budget
        self._charged = 0  # of _pending, charged to the budget
        self._final = False  # a subgroup stream carried End of Group / End of Track
        self.kind: str | None = None
        self.header: SubgroupHeader | FetchHeader | None = None
        self._pending = bytearray()
        self._dst: memoryview | None = None
        self._dst_len = 0
        self._filled = 0
        self._rec: ObjectRecord | None = None
        # subgroup state
        self._props = False
        self._mode1 = False
        self._sg = 0
        self._hdr_prio: int | None = None
        # shared: previous object id (-1 = none) ; fetch: group (None = none)
        self._o = -1
        self._g: int | None = None
        self._sub: int | None = None
        self._prio: int | None = None
        self._marker = False
        self._desc = False

    # -------------------------------------------------------------- structure parsers

    def _parse_header(
        self, b: bytes | bytearray | memoryview, p: int
    ) -> tuple[int, StreamItem, int]:
        t0 = b[p]
        if t0 < 0x80 and is_subgroup_type(t0):
            hdr, p = SubgroupHeader._parse_rest(t0, b, p + 1)
            self.kind = "subgroup"
            self.header = hdr
            self._props = hdr.has_properties
            self._mode1 = hdr.subgroup_id_mode == 1
            self._sg = hdr.subgroup_id
            self._hdr_prio = hdr.publisher_priority
            return p, hdr, -1
        t, q = decode_vi64(b, p)
        if t == FETCH_HEADER_TYPE:
            rid, q = decode_vi64(b, q)
            fh = FetchHeader(rid)
            self.kind = "fetch"
            self.header = fh
            cb = self._fetch_desc_cb
            self._desc = bool(cb(rid)) if cb is not None else False
            return q, fh, -1
        if t == PADDING_STREAM_TYPE:
            self.kind = "padding"
            return q, None, -1  # type: ignore[return-value]
        raise violation(f"unknown data stream type 0x{t:x}")

    def _parse_subgroup_obj(
        self, b: bytes | bytearray | memoryview, p: int
    ) -> tuple[int, ObjectRecord, int]:
        n = len(b)
        if p >= n:
            raise NeedMore
        if self._final:
            raise malformed_track("object after End of Group / End of Track on its stream")
        c = b[p]
        if c < 0x80:
            delta = c
            p += 1
        else:
            delta, p = decode_vi64(b, p)
        props: Properties = ()
        if self._props:
            if p < n and not b[p]:  # no properties (the usual case): no call
                p += 1
            else:
                props, p = self._properties(b, p, n)
        if p >= n:
            raise NeedMore
        c = b[p]
        if c < 0x80:
            ln = c
            p += 1
        else:
            k = VI64_LEN[c]
            e = p + k
            if e > n:
                raise NeedMore
            ln = (
                int.from_bytes(b[p:e], "big") & VI64_MASK[k]
                if k < 9
                else int.from_bytes(b[p + 1 : e], "big")
            )
            p = e
        status = 0
        if not ln:
            status, p = decode_vi64(b, p)
            if status not in VALID_STATUSES:
                raise violation(f"invalid object status {status}")
            if status:
                if props:
                    raise violation("properties on a non-Normal status object")
                self._final = True  # End of Group / End of Track: nothing may follow
        prev = self._o
        if prev < 0:
            oid = delta
            if self._mode1:
                self._sg = oid
                self.header.subgroup_id = oid  # type: ignore[union-attr]
        else:
            oid = prev + delta + 1
            if oid > MAX_VI64:
                raise violation("object id overflows 2^64-1")
        self._o = oid
        hdr = self.header
        rec = ObjectRecord(hdr.group_id, oid, self._sg, self._hdr_prio, status, props, _EMPTY)  # type: ignore[union-attr]
        return p, rec, ln

    def _parse_fetch_obj(
        self, b: bytes | bytearray | memoryview, p: int
    ) -> tuple[int, StreamItem, int]:
        n = len(b)
        if p >= n:
            raise NeedMore
        flags = b[p]
        if flags < 0x80:
            p += 1
        else:
            flags, p = decode_vi64(b, p)
            if flags >= 0x80:
                if flags not in END_OF_RANGE_KINDS:
                    raise violation(f"invalid serialization flags 0x{flags:x}")
                g, p = decode_vi64(b, p)
                o, p = decode_vi64(b, p)
                if _data.END_OF_RANGE_HAS_LENGTH:
                    ln, p = decode_vi64(b, p)
                    if ln:
                        raise violation("End of Range with a payload")
                self._g = g
                self._o = o
                self._marker = True
                return p, EndOfRange(flags, g, o), -1
        pg = self._g
        if flags & 0x08:
            d, p = decode_vi64(b, p)
            if pg is None:
                g = d
            elif self._desc:
                g = pg - d - 1
                if g < 0:
                    raise violation("group id underflow")
            else:
                g = pg + d + 1
                if g > MAX_VI64:
                    raise violation("group id overflows 2^64-1")
        else:
            if pg is None:
                raise violation("first fetch object must carry a Group ID")
            g = pg
        dgram = bool(flags & 0x40)
        if dgram:
            sub = 0
        else:
            m = flags & 3
            if m == 0:
                sub = 0
            elif m == 3:
                sub, p = decode_vi64(b, p)
            else:
                ps = self._sub
                if ps is None:
                    raise violation("subgroup id refers to a missing prior object")
                sub = ps if m == 1 else ps + 1
                if sub > MAX_VI64:
                    raise violation("subgroup id overflows 2^64-1")
        if flags & 0x04:
            d, p = decode_vi64(b, p)
            if flags & 0x08:
                o = d
            else:
                if not d and not self._marker:
                    raise malformed_track(f"fetch object {g}/{self._o} repeated")
                o = self._o + d
        else:
            if pg is None:
                raise violation("first fetch object must carry an Object ID")
            o = self._o + 1
        if o > MAX_VI64:
            raise violation("object id overflows 2^64-1")
        if flags & 0x10:
            if p >= n:
                raise NeedMore
            prio = b[p]
            p += 1
        else:
            if self._prio is None:
                raise violation("priority refers to a missing prior object")
            prio = self._prio
        props: Properties = ()
        if flags & 0x20:
            props, p = self._properties(b, p, n)
        ln, p = decode_vi64(b, p)
        # commit
        self._g = g
        self._o = o
        if not dgram:
            self._sub = sub
        self._prio = prio
        self._marker = False
        return p, ObjectRecord(g, o, sub, prio, 0, props, _EMPTY, dgram), ln

    def _parse_struct(
        self, b: bytes | bytearray | memoryview, p: int
    ) -> tuple[int, StreamItem, int]:
        kind = self.kind
        if kind == "subgroup":
            return self._parse_subgroup_obj(b, p)
        if kind == "fetch":
            return self._parse_fetch_obj(b, p)
        return self._parse_header(b, p)

    # ------------------------------------------------------------------------- feed

    def _properties(self, b: bytes | bytearray | memoryview, p: int,
                    n: int) -> tuple[Properties, int]:
        """An object's Properties (length + KVPs) at ``p``; NeedMore if incomplete."""
        plen, p = decode_vi64(b, p)
        if not plen:
            return (), p
        if plen > self._max:
            raise violation(f"object properties length {plen} over limit")
        if plen > self._max_props:
            raise over_limit(f"object properties of {plen} bytes (limit {self._max_props})")
        end = p + plen
        if end > n:
            raise NeedMore
        return decode_kvps(b[p:end]), end

    def _copy(self, mv: memoryview, p: int, n: int, out: list[StreamItem]) -> int:
        dst = self._dst
        assert dst is not None
        filled = self._filled
        take = min(self._dst_len - filled, n - p)
        dst[filled : filled + take] = mv[p : p + take]
        filled += take
        if filled == self._dst_len:
            rec = self._rec
            assert rec is not None
            rec.payload = dst
            out.append(rec)
            self._dst = None
            self._rec = None
            if self._budget is not None:
                self._budget.give(self._dst_len)
        else:
            self._filled = filled
        return p + take

    def _payload(
        self, mv: memoryview, p: int, n: int, rec: ObjectRecord, ln: int, out: list[StreamItem]
    ) -> int:
        end = p + ln
        if end <= n:
            rec.payload = mv[p:end]
            out.append(rec)
            return end
        if ln > self._max:
            raise violation(f"object payload length {ln} over limit {self._max}")
        if self._budget is not None and not self._budget.take(ln):
            raise over_limit(f"no room for an object of {ln} bytes")
        dst = memoryview(bytearray(ln))
        got = n - p
        dst[:got] = mv[p:n]
        self._dst = dst
        self._dst_len = ln
        self._filled = got
        self._rec = rec
        return n

    def _resume(self, mv: memoryview, p: int, n: int, out: list[StreamItem]) -> int:
        """Finish a structure whose first bytes are in ``_pending``."""
        pend = self._pending
        k = 64
        while True:
            take = min(k, n - p)
            tmp = pend + mv[p : p + take]
            try:
                q, item, ln = self._parse_struct(tmp, 0)
            except NeedMore:
                if take == n - p:
                    self._pending = tmp
                    return n
                k *= 8
                continue
            self._pending = bytearray()
            p += q - len(pend)
            if ln < 0:
                if item is not None:
                    out.append(item)
                return p
            return self._payload(mv, p, n, item, ln, out)  # type: ignore[arg-type]

    def feed(self, data: bytes | bytearray | memoryview) -> list[StreamItem]:
        """Add stream bytes; return the header / objects / markers completed by them."""
        out: list[StreamItem] = []
        if self.kind == "padding":
            return out
        mv = _as_view(data)
        n = len(mv)
        p = 0
        try:
            if self._dst is not None:
                p = self._copy(mv, 0, n, out)
            if self._pending and p < n:
                p = self._resume(mv, p, n, out)
            # a subgroup stream's objects straight to their parser (one call per object
            # less than through _parse_struct)
            parse = self._parse_subgroup_obj if self.kind == "subgroup" else self._parse_struct
            while p < n:
                if self.kind == "padding":
                    break
                if self._dst is not None:  # pragma: no cover - _payload returns n then
                    break
                try:
                    q, item, ln = parse(mv, p)
                except NeedMore:
                    self._pending = bytearray(mv[p:n])
                    break
                if ln < 0:
                    if item is not None:
                        out.append(item)
                    p = q
                    if self.kind == "subgroup":
                        parse = self._parse_subgroup_obj
                    continue
                end = q + ln
                if end <= n:
                    item.payload = mv[q:end] if ln else _EMPTY  # type: ignore[union-attr]
                    out.append(item)
                    p = end
                else:
                    p = self._payload(mv, q, n, item, ln, out)  # type: ignore[arg-type]
            if self._budget is not None and len(self._pending) != self._charged:
                self._charge_pending()
        except StreamError as exc:
            exc.items = out
            raise
        return out

    def _charge_pending(self) -> None:
        """Charge the unfinished header kept for the next chunk (give back what the last
        one no longer needs)."""
        budget = self._budget
        assert budget is not None
        n = len(self._pending)
        budget.give(self._charged)
        self._charged = 0
        if not budget.take(n):
            raise over_limit(f"no room for an unfinished header of {n} bytes")
        self._charged = n

    @property
    def held(self) -> int:
        """Bytes kept between chunks (what is charged to the budget)."""
        return self._charged + (self._dst_len if self._dst is not None else 0)

    def release(self) -> None:
        """Forget what is kept between chunks and give its charge back (the stream is
        done with: ended, reset or stopped)."""
        if self._budget is not None:
            self._budget.give(self.held)
        self._charged = 0
        self._pending = bytearray()
        self._dst = None
        self._rec = None

    @property
    def in_progress(self) -> bool:
        """True while a header, object header or payload is incomplete."""
        return bool(self._pending) or self._dst is not None

    def finish(self) -> None:
        """Call at FIN: PROTOCOL_VIOLATION if the stream ended inside a header or object
        (or before its stream header)."""
        if self.kind is None:
            raise violation("data stream ended before its header")
        if self._pending or self._dst is not None:
            raise violation("data stream ended inside an object")
