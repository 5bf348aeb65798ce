"""The data plane of a MOQT session: unidirectional data streams and datagrams (digest 7).

Incoming, it parses subgroup and fetch streams and attributes each to its request: a
subgroup stream or datagram by Track Alias, a fetch or fill stream by the Request ID in its
FETCH_HEADER. A subgroup stream whose alias is unknown while one of our SUBSCRIBEs is still
unanswered is held (its SUBSCRIBE_OK may still be on the way, streams are not ordered) and
delivered once the alias is bound, otherwise abandoned with STOP_SENDING. It reports
objects, End of Range markers and stream ends as events, and counts the streams of the
subscriptions we receive for PUBLISH_DONE.

Outgoing, it opens subgroup and fetch/fill streams for the requests we publish, frames
objects, keeps each stream's scheduling priority, counts the streams for PUBLISH_DONE and
reports drained streams.

Which requests exist, and whether they may carry objects, is the control plane's business:
it hands :class:`~kvcs.moqt.requests.Request` records in and binds Track Aliases.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from . import events as ev
from .actions import (
    ResetStream,
    SendDatagram,
    SendStreamData,
    SetStreamPriority,
    StopSending,
    StreamOpener,
)
from .errors import SessionUsageError, StreamResetCode
from .outbox import Outbox
from .requests import SUBSCRIPTIONS, Request, RequestKind, RequestRegistry, Side
from .wire import (
    MAX_VI64,
    DataStreamParser,
    EndOfRange,
    FetchHeader,
    FetchWriter,
    ObjectRecord,
    Properties,
    StreamItem,
    SubgroupHeader,
    SubgroupWriter,
    decode_datagram,
    encode_datagram,
)

log = logging.getLogger(__name__)

_NOT_ENDED = -1
"""``_Incoming.held_end`` while a held stream has not ended (reset codes are >= 0)."""


@dataclass(slots=True, eq=False)
class _Incoming:
    """A data stream the peer opened."""

    stream_id: int
    parser: DataStreamParser
    request: Request | None = None
    kind: str = ""
    fill_id: int | None = None
    held: list[ObjectRecord | EndOfRange] | None = None
    """Items waiting for the stream's Track Alias to be bound (None: not held)."""
    held_end: int | None = _NOT_ENDED
    """How a held stream ended: None for FIN, a reset code, or _NOT_ENDED."""
    abandoned: bool = False


@dataclass(slots=True, eq=False)
class _Outgoing:
    """A data stream we opened."""

    request: Request
    writer: SubgroupWriter | FetchWriter
    wants_writable: bool = False


class DataStreams:
    """Data streams and datagrams of one session, both directions. See the module
    docstring."""

    def __init__(self, out: Outbox, opener: StreamOpener, requests: RequestRegistry,
                 on_subscription_stream_ended: Callable[[Request], None]) -> None:
        self._out = out
        self._opener = opener
        self._requests = requests
        self._on_subscription_stream_ended = on_subscription_stream_ended
        self._incoming: dict[int, _Incoming] = {}
        self._outgoing: dict[int, _Outgoing] = {}
        self._aliases: dict[int, Request] = {}  # Track Alias -> subscription we receive
        self._held: dict[int, list[_Incoming]] = {}  # Track Alias -> streams waiting for it

    # ------------------------------------------------------------------ incoming streams

    def feed(self, stream_id: int, data: bytes | bytearray | memoryview, end: bool) -> bool:
        """More bytes of a data stream already open; False if ``stream_id`` is not one."""
        ds = self._incoming.get(stream_id)
        if ds is None:
            return False
        if ds.abandoned:
            if end:
                del self._incoming[stream_id]
            return True
        items = ds.parser.feed(data)
        if items:
            self._items(ds, items)
        if end:
            ds.parser.finish()
            self._ended(ds, None)
        return True

    def open(self, stream_id: int, data: bytes | bytearray | memoryview, end: bool) -> None:
        """The first bytes of a new data stream (from its type on, known not to be the
        control stream)."""
        self._incoming[stream_id] = _Incoming(stream_id,
                                              DataStreamParser(self._fetch_descending))
        self.feed(stream_id, data, end)

    def reset(self, stream_id: int, code: int) -> None:
        """The peer reset a data stream."""
        ds = self._incoming.get(stream_id)
        if ds is not None:
            self._ended(ds, code)

    def _fetch_descending(self, request_id: int) -> bool:
        req = self._requests.find(request_id)
        return bool(req and req.descending)

    def _items(self, ds: _Incoming, items: list[StreamItem]) -> None:
        for item in items:
            if isinstance(item, SubgroupHeader):
                ds.kind = "subgroup"
                req = self._aliases.get(item.track_alias)
                if req is not None:
                    ds.request = req
                elif self._requests.awaiting_subscribe_ok():
                    ds.held = []
                    self._held.setdefault(item.track_alias, []).append(ds)
                else:
                    self._abandon(ds)
                    return
            elif isinstance(item, FetchHeader):
                ds.kind = "fetch"
                req = self._requests.find(item.request_id)
                if req is None:
                    self._abandon(ds)
                    return
                if req.request_id == item.request_id and req.kind is RequestKind.FETCH \
                        and req.side is Side.REQUESTER:
                    ds.request = req
                elif req.we_subscribe:  # a fill stream of a subscription or its update
                    ds.request = req
                    ds.fill_id = item.request_id
                else:
                    self._abandon(ds)
                    return
            elif ds.held is not None:
                ds.held.append(item)
            elif ds.request is not None:
                self._deliver(ds, item)

    def _deliver(self, ds: _Incoming, item: ObjectRecord | EndOfRange) -> None:
        req = ds.request
        assert req is not None
        if isinstance(item, ObjectRecord):  # the hot path: append, no call
            self._out.events.append(ev.ObjectReceived(req.request_id, item, ds.stream_id,
                                                      ds.fill_id))
        else:
            self._out.event(ev.RangeMarkerReceived(req.request_id, item, ds.stream_id,
                                                   ds.fill_id))

    def _abandon(self, ds: _Incoming) -> None:
        ds.abandoned = True
        ds.held = None
        log.debug("abandoning data stream %d (unknown alias or request)", ds.stream_id)
        self._out.emit(StopSending(ds.stream_id, StreamResetCode.CANCELLED))

    def _ended(self, ds: _Incoming, reset_code: int | None) -> None:
        if ds.held is not None:
            ds.held_end = reset_code
            return
        self._incoming.pop(ds.stream_id, None)
        req = ds.request
        if req is None or ds.abandoned:
            return
        self._out.event(ev.DataStreamEnded(req.request_id, ds.stream_id, ds.kind, reset_code,
                                           ds.fill_id))
        if req.we_subscribe:
            req.streams_ended += 1
            self._on_subscription_stream_ended(req)

    def receiving_for(self, req: Request) -> bool:
        """True while a data stream attributed to ``req`` is still open."""
        return any(ds.request is req for ds in self._incoming.values())

    # ------------------------------------------------------------------ track aliases

    def alias_owner(self, alias: int) -> Request | None:
        """The subscription we receive under ``alias``, if any."""
        return self._aliases.get(alias)

    def bind_alias(self, alias: int, req: Request) -> None:
        """Objects under ``alias`` belong to ``req`` from now on; streams held for it are
        delivered."""
        self._aliases[alias] = req
        for ds in self._held.pop(alias, []):
            held, ds.held = ds.held or [], None
            ds.request = req
            for item in held:
                self._deliver(ds, item)
            if ds.held_end != _NOT_ENDED:
                self._ended(ds, ds.held_end)

    def unbind_alias(self, req: Request) -> None:
        """``req`` no longer receives objects under its alias."""
        if req.track_alias is not None and self._aliases.get(req.track_alias) is req:
            del self._aliases[req.track_alias]

    def abandon_held(self) -> None:
        """Abandon the held streams once none of our SUBSCRIBEs awaits its answer."""
        if not self._held or self._requests.awaiting_subscribe_ok():
            return
        for streams in self._held.values():
            for ds in streams:
                self._abandon(ds)
                if ds.held_end != _NOT_ENDED:
                    self._incoming.pop(ds.stream_id, None)
        self._held.clear()

    # ------------------------------------------------------------------ datagrams

    def datagram(self, data: bytes | memoryview) -> None:
        """A QUIC DATAGRAM arrived: deliver its object, drop it if its alias is unknown."""
        decoded = decode_datagram(memoryview(data))
        if decoded is None:
            return  # padding
        alias, record, _eog = decoded
        req = self._aliases.get(alias)
        if req is not None:
            self._out.event(ev.ObjectReceived(req.request_id, record, -1))

    def send_datagram(self, req: Request, record: ObjectRecord,
                      end_of_group: bool = False) -> None:
        """Send one object of subscription ``req`` as a datagram."""
        assert req.track_alias is not None
        self._out.emit(SendDatagram(encode_datagram(req.track_alias, record, end_of_group)))

    # ------------------------------------------------------------------ outgoing streams

    @staticmethod
    def _priority(req: Request, publisher_priority: int, group: int, fill: bool,
                  subgroup: int = 0) -> tuple[int, ...]:
        """Scheduling key (digest 8.6): subscriber priority, publisher priority, group in
        the subscription's order, fill before live, subgroup."""
        gkey = MAX_VI64 - group if req.descending else group
        return (1, req.subscriber_priority, publisher_priority, gkey, 0 if fill else 1,
                subgroup)

    def open_subgroup(self, req: Request, group_id: int, subgroup_id: int,
                      publisher_priority: int | None, default_priority: int,
                      end_of_group: bool, first_object: bool, has_properties: bool) -> int:
        """Open a subgroup stream of subscription ``req``; returns its stream ID."""
        assert req.track_alias is not None
        header = SubgroupHeader(req.track_alias, group_id, subgroup_id, publisher_priority,
                                has_properties, end_of_group, first_object)
        writer = SubgroupWriter(header)
        sid = self._opener.open_stream(True)
        req.streams_opened += 1
        req.open_streams.add(sid)
        self._outgoing[sid] = _Outgoing(req, writer)
        prio = default_priority if publisher_priority is None else publisher_priority
        self._out.emit(SetStreamPriority(sid, self._priority(req, prio, group_id, False,
                                                             subgroup_id)))
        self._out.emit(SendStreamData(sid, writer.header_bytes()))
        return sid

    def write_object(self, stream_id: int, object_id: int, payload: bytes | memoryview,
                     status: int, properties: Properties | None, end: bool) -> bool:
        """Write one object on a subgroup stream; False if the stream is gone."""
        s = self._outgoing.get(stream_id)
        if s is None:
            return False
        writer = s.writer
        if not isinstance(writer, SubgroupWriter):
            raise SessionUsageError(f"stream {stream_id} is a fetch stream")
        prefix = writer.object_prefix(object_id, len(payload), status, properties)
        actions = self._out.actions  # the hot path: two appends per object
        if payload:
            actions.append(SendStreamData(stream_id, prefix))
            actions.append(SendStreamData(stream_id, payload, end))
        else:
            actions.append(SendStreamData(stream_id, prefix, end))
        if end:
            self._closed(stream_id, s)
        return True

    def open_fetch_stream(self, req: Request, fill_id: int | None, publisher_priority: int,
                          first_group: int) -> int:
        """Open a fetch stream of FETCH ``req`` or a fill stream of subscription ``req``."""
        writer = FetchWriter(req.request_id if fill_id is None else fill_id, req.descending)
        sid = self._opener.open_stream(True)
        if req.kind in SUBSCRIPTIONS:
            req.streams_opened += 1
        req.open_streams.add(sid)
        self._outgoing[sid] = _Outgoing(req, writer)
        self._out.emit(SetStreamPriority(sid, self._priority(req, publisher_priority,
                                                             first_group, True)))
        self._out.emit(SendStreamData(sid, writer.header_bytes()))
        return sid

    def _fetch_writer(self, stream_id: int) -> FetchWriter | None:
        s = self._outgoing.get(stream_id)
        if s is None:
            return None
        if not isinstance(s.writer, FetchWriter):
            raise SessionUsageError(f"stream {stream_id} is a subgroup stream")
        return s.writer

    def write_fetch_object(self, stream_id: int, group_id: int, subgroup_id: int,
                           object_id: int, publisher_priority: int,
                           payload: bytes | memoryview, properties: Properties | None,
                           datagram: bool) -> bool:
        """Write one object on a fetch/fill stream; False if the stream is gone."""
        writer = self._fetch_writer(stream_id)
        if writer is None:
            return False
        prefix = writer.object_prefix(group_id, subgroup_id, object_id, publisher_priority,
                                      len(payload), properties, datagram)
        actions = self._out.actions
        actions.append(SendStreamData(stream_id, prefix))
        if payload:
            actions.append(SendStreamData(stream_id, payload))
        return True

    def write_end_of_range(self, stream_id: int, kind: int, group_id: int,
                           object_id: int) -> bool:
        """Write an End of Range marker on a fetch/fill stream; False if it is gone."""
        writer = self._fetch_writer(stream_id)
        if writer is None:
            return False
        self._out.emit(SendStreamData(stream_id, writer.end_of_range(kind, group_id, object_id)))
        return True

    def end_stream(self, stream_id: int) -> None:
        """FIN a data stream we opened."""
        s = self._outgoing.get(stream_id)
        if s is not None:
            self._out.emit(SendStreamData(stream_id, b"", end=True))
            self._closed(stream_id, s)

    def reset_stream(self, stream_id: int, code: int) -> bool:
        """Reset a data stream we opened; False if it is not open."""
        s = self._outgoing.get(stream_id)
        if s is None:
            return False
        self._out.emit(ResetStream(stream_id, code))
        self._closed(stream_id, s)
        return True

    def _closed(self, stream_id: int, s: _Outgoing) -> None:
        del self._outgoing[stream_id]
        s.request.open_streams.discard(stream_id)

    def finish_streams(self, req: Request) -> None:
        """FIN every open data stream of ``req`` (before PUBLISH_DONE counts them)."""
        for sid in sorted(req.open_streams):
            self._outgoing.pop(sid, None)
            self._out.emit(SendStreamData(sid, b"", end=True))
        req.open_streams.clear()

    def reset_streams(self, req: Request, code: int) -> None:
        """Reset every open data stream of ``req`` (it was cancelled or rejected)."""
        for sid in sorted(req.open_streams):
            self._outgoing.pop(sid, None)
            self._out.emit(ResetStream(sid, code))
        req.open_streams.clear()

    def is_open(self, stream_id: int) -> bool:
        """True while a data stream we opened can still be written."""
        return stream_id in self._outgoing

    def reprioritize(self, stream_id: int, publisher_priority: int, group_id: int) -> None:
        """Give a fetch/fill stream the priority of the group it is now carrying."""
        s = self._outgoing.get(stream_id)
        if s is not None:
            self._out.emit(SetStreamPriority(stream_id, self._priority(
                s.request, publisher_priority, group_id, True)))

    def want_writable(self, stream_id: int) -> None:
        """Report DataStreamWritable for ``stream_id`` the next time it drains."""
        s = self._outgoing.get(stream_id)
        if s is not None:
            s.wants_writable = True

    def writable(self, stream_id: int) -> None:
        """The binding drained ``stream_id`` (or down to its low-water mark)."""
        s = self._outgoing.get(stream_id)
        if s is not None and s.wants_writable:
            s.wants_writable = False
            self._out.event(ev.DataStreamWritable(s.request.request_id, stream_id))
