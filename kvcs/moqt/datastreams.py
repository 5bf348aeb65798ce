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
from collections.abc import Callable, Sequence
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
from .config import HELD_OBJECT_COST, ITEM_COST, STREAM_COST, SessionConfig
from .errors import SessionUsageError, StreamError, StreamResetCode, over_limit
from .outbox import Outbox
from .requests import Request, RequestKind, RequestRegistry, Side
from .wire import (
    MAX_VI64,
    ByteBudget,
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

JOIN_RUN_BELOW = 256 * 1024
"""A run of objects (:meth:`DataStreams.write_objects`) whose payloads total less than
this goes out in ONE joined write: what a relay forwards per read of its upstream (4-8
objects of 32 KiB) takes one trip through the scheduler instead of one per object. A
larger run (a publisher's layer) goes out in joined writes of up to
:data:`JOIN_WRITE_LIMIT`: one join of a 2 MiB layer would be a fresh 2 MiB buffer per
run, and a payload written by reference after its prefix cost the publisher more than the
join it saves (KVCS live direct, alternating runs at the same load: 3.14-3.15 against
2.46-2.94 ms/MiB on its event-loop thread: one more scheduler entry, refill turn and qh3
send_stream call per object)."""

JOIN_WRITE_BYTES = 64 * 1024
"""The scheduler's chunk, i.e. one qh3 ``send_stream`` call: what a joined write is sized
by (:data:`JOIN_WRITE_LIMIT`)."""

JOIN_WRITE_LIMIT = JOIN_WRITE_BYTES + 1024
"""The most a joined write carries, prefixes and payloads, whether its objects came as a
large run (:meth:`DataStreams.write_objects`) or one by one (:meth:`Outbox.write_joined
<kvcs.moqt.outbox.Outbox.write_joined>`): the scheduler's chunk plus room for the
prefixes, so that two 32 KiB objects (65,548 bytes with their 6-byte prefixes) go out as
one write and one qh3 ``send_stream`` call (the scheduler sends a chunk up to 1/32 over its
size whole), and three 16.6 KiB ``q8`` objects share one: the scheduler entry, refill turn
and qh3 call a write costs are paid per 64 KiB, not per object (docs/perf-profile.md, q8).
A large run held to 64 KiB exactly went one 32 KiB object per write: 32 writes per MiB of
a publisher's layers instead of 16."""


@dataclass(slots=True, eq=False)
class _Incoming:
    """A data stream the peer opened."""

    stream_id: int
    parser: DataStreamParser | None
    """None once the stream is abandoned (stopped): it is remembered until it ends."""
    request: Request | None = None
    kind: str = ""
    fill_id: int | None = None
    held: list[ObjectRecord | EndOfRange] | None = None
    """Items waiting for the stream's Track Alias to be bound (None: not held)."""
    held_end: int | None = _NOT_ENDED
    """How a held stream ended: None for FIN, a reset code, or _NOT_ENDED."""
    held_bytes: int = 0
    """What the held items are charged to the data budget."""
    stopped: StreamError | None = None
    """Why a held stream was stopped: reported to its request once the alias is bound."""
    received: int = 0
    """Bytes fed so far (a stream that stops receiving can be told from a slow one)."""

    @property
    def abandoned(self) -> bool:
        """We stopped reading it (unknown alias or request, a limit, a malformed track)."""
        return self.parser is None


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
                 config: SessionConfig, on_stream_ended: Callable[[Request, bool], None],
                 on_malformed: Callable[[Request, str], None]) -> None:
        self._out = out
        self._opener = opener
        self._requests = requests
        self._on_stream_ended = on_stream_ended
        """Called as (request, sent) when a data stream of the request ended: one we
        received (``sent`` False: FIN or reset) or one we sent (FIN or reset)."""
        self._on_malformed = on_malformed
        """Called as (request, reason) when a stream of a request we receive shows its
        track to be malformed (digest 8.8: the subscriber cancels the request)."""
        self.budget = ByteBudget(config.max_data_bytes)
        """What the peer makes us hold on its data streams (``max_data_bytes``)."""
        self._max_properties = config.max_object_properties
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
        ds.received += len(data)
        parser = ds.parser
        if parser is None:  # abandoned: its bytes are dropped until it ends
            if end:
                del self._incoming[stream_id]
            return True
        try:
            items = parser.feed(data)
        except StreamError as exc:
            self._items(ds, exc.items)
            if not ds.abandoned:
                self._stop(ds, exc)
            if end:
                del self._incoming[stream_id]
            return True
        if items:
            self._items(ds, items)
        if end:
            if ds.parser is not None:
                ds.parser.finish()
            self._ended(ds, None)
        return True

    def open(self, stream_id: int, data: bytes | bytearray | memoryview, end: bool) -> None:
        """The first bytes of a new data stream (from its type on, known not to be the
        control stream)."""
        ds = _Incoming(stream_id, DataStreamParser(
            self._fetch_descending, max_properties=self._max_properties, budget=self.budget))
        self._incoming[stream_id] = ds
        if not self.budget.take(STREAM_COST):
            ds.parser = None
            self._stop(ds, over_limit("too many data streams held"))
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
            if ds.abandoned:
                return
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
            elif isinstance(item, FetchHeader):
                ds.kind = "fetch"
                req = self._requests.find(item.request_id)
                if req is None:
                    self._abandon(ds)
                elif req.request_id == item.request_id and req.kind is RequestKind.FETCH \
                        and req.side is Side.REQUESTER:
                    ds.request = req
                elif req.we_subscribe:  # a fill stream of a subscription or its update
                    ds.request = req
                    ds.fill_id = item.request_id
                else:
                    self._abandon(ds)
            elif ds.held is not None:
                self._hold(ds, item)
            elif ds.request is not None:
                self._deliver(ds, item)

    def _hold(self, ds: _Incoming, item: ObjectRecord | EndOfRange) -> None:
        """Keep an item of a stream whose Track Alias is not bound yet. Its payload is
        copied: a view would pin the whole chunk it came in."""
        assert ds.held is not None
        cost = HELD_OBJECT_COST
        if isinstance(item, ObjectRecord):
            item.payload = memoryview(bytes(item.payload))
            cost += len(item.payload) + ITEM_COST * len(item.properties)
        if not self.budget.take(cost):
            self._stop(ds, over_limit("too much data held for an unknown Track Alias"))
            return
        ds.held_bytes += cost
        ds.held.append(item)

    def _deliver(self, ds: _Incoming, item: ObjectRecord | EndOfRange) -> None:
        req = ds.request
        assert req is not None
        if isinstance(item, ObjectRecord):  # the hot path: append, no call
            self._out.events.append(ev.ObjectReceived(req.request_id, item, ds.stream_id,
                                                      ds.fill_id))
        else:
            self._out.event(ev.RangeMarkerReceived(req.request_id, item, ds.stream_id,
                                                   ds.fill_id))

    def _release(self, ds: _Incoming) -> None:
        """Give back what the stream holds (parser, held items) and stop parsing it."""
        if ds.parser is not None:
            ds.parser.release()
            ds.parser = None
            self.budget.give(STREAM_COST)
        if ds.held is not None:
            self.budget.give(ds.held_bytes)
            ds.held_bytes = 0
            ds.held = None

    def _abandon(self, ds: _Incoming) -> None:
        """A stream for an unknown Track Alias or request: STOP_SENDING, drop its bytes."""
        log.debug("abandoning data stream %d (unknown alias or request)", ds.stream_id)
        self._release(ds)
        self._out.emit(StopSending(ds.stream_id, StreamResetCode.CANCELLED))

    def _stop(self, ds: _Incoming, exc: StreamError) -> None:
        """Stop reading a stream that exceeds a limit or shows its track to be malformed:
        STOP_SENDING with the error's code; objects it delivered before stay delivered.
        A stream of a request ends for it with that code (counted for PUBLISH_DONE); a
        malformed track cancels the request (digest 8.8)."""
        log.info("stopping data stream %d: %s", ds.stream_id, exc.reason)
        if ds.held is not None:
            ds.stopped = exc  # stays listed under its alias: see bind_alias
        self._release(ds)
        self._out.emit(StopSending(ds.stream_id, exc.code))
        if ds.request is not None and ds.stopped is None:
            self._stopped_for(ds, exc)

    def _stopped_for(self, ds: _Incoming, exc: StreamError) -> None:
        """A stream of ``ds.request`` was stopped: it ended for the request, with the
        error's code; a malformed track fails the request."""
        req = ds.request
        assert req is not None
        if exc.code == StreamResetCode.MALFORMED_TRACK:
            self._on_malformed(req, exc.reason)
        self._out.event(ev.DataStreamEnded(req.request_id, ds.stream_id, ds.kind, exc.code,
                                           ds.fill_id))
        req.streams_ended += 1
        self._on_stream_ended(req, False)

    def _ended(self, ds: _Incoming, reset_code: int | None) -> None:
        if ds.held is not None:
            ds.held_end = reset_code
            return
        self._incoming.pop(ds.stream_id, None)
        req = ds.request
        if ds.abandoned or req is None:
            self._release(ds)
            return
        self._release(ds)
        self._out.event(ev.DataStreamEnded(req.request_id, ds.stream_id, ds.kind, reset_code,
                                           ds.fill_id))
        req.streams_ended += 1
        self._on_stream_ended(req, False)

    def receiving_for(self, req: Request) -> bool:
        """True while a data stream attributed to ``req`` is still open."""
        return any(ds.request is req and not ds.abandoned for ds in self._incoming.values())

    def received_for(self, req: Request) -> int | None:
        """Bytes received so far on the data streams of ``req`` still open (None: none)."""
        open_streams = [ds.received for ds in self._incoming.values()
                        if ds.request is req and not ds.abandoned]
        return sum(open_streams) if open_streams else None

    def stop_receiving(self, req: Request, code: int) -> None:
        """STOP_SENDING every data stream still open for ``req`` (it was cancelled)."""
        for ds in list(self._incoming.values()):
            if ds.request is req and not ds.abandoned:
                self._release(ds)
                self._out.emit(StopSending(ds.stream_id, code))

    def drop_input(self) -> None:
        """The session is closed: let go of every incoming stream and what it holds."""
        for ds in self._incoming.values():
            self._release(ds)
        self._incoming.clear()
        self._held.clear()

    # ------------------------------------------------------------------ track aliases

    def alias_owner(self, alias: int) -> Request | None:
        """The subscription we receive under ``alias``, if any."""
        return self._aliases.get(alias)

    def bind_alias(self, alias: int, req: Request) -> None:
        """Objects under ``alias`` belong to ``req`` from now on; streams held for it are
        delivered."""
        self._aliases[alias] = req
        for ds in self._held.pop(alias, []):
            ds.request = req
            if ds.stopped is not None:  # stopped while held: it counts, and may fail req
                self._stopped_for(ds, ds.stopped)
                continue
            held, ds.held = ds.held or [], None
            self.budget.give(ds.held_bytes)
            ds.held_bytes = 0
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
                if ds.stopped is None:
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

    @staticmethod
    def _subgroup_writer(stream_id: int, s: _Outgoing) -> SubgroupWriter:
        """The subgroup writer of an outgoing stream (SessionUsageError for a fetch stream)."""
        if not isinstance(s.writer, SubgroupWriter):
            raise SessionUsageError(f"stream {stream_id} is a fetch stream")
        return s.writer

    def write_object(self, stream_id: int, object_id: int, payload: bytes | memoryview,
                     status: int, properties: Properties | None, end: bool) -> bool:
        """Write one object on a subgroup stream; False if the stream is gone."""
        s = self._outgoing.get(stream_id)
        if s is None:
            return False
        prefix = self._subgroup_writer(stream_id, s).object_prefix(
            object_id, len(payload), status, properties)
        # one write of prefix + payload, shared with the objects written just before it
        # on this stream (Outbox.write_joined): the copy (~2 us for 32 KiB) costs less
        # than a second trip through the scheduler and qh3's send_stream (JOIN_RUN_BELOW)
        self._out.write_joined(stream_id, prefix, payload, end, JOIN_WRITE_LIMIT)
        if end:
            self._closed(stream_id, s)
        return True

    def write_objects(self, stream_id: int, objs: Sequence[ObjectRecord], end: bool) -> bool:
        """Write objects on a subgroup stream in as few writes as :data:`JOIN_RUN_BELOW`
        and :data:`JOIN_WRITE_LIMIT` allow (one for a relay's run); False if the stream
        is gone."""
        s = self._outgoing.get(stream_id)
        if s is None:
            return False
        prefix = self._subgroup_writer(stream_id, s).object_prefix
        actions = self._out.actions
        last = len(objs) - 1
        if not last:  # a run of one: a producer's single publish (see write_object)
            o = objs[0]
            payload = o.payload
            self._out.write_joined(
                stream_id, prefix(o.object_id, len(payload), o.status, o.properties),
                payload, end, JOIN_WRITE_LIMIT)
        elif sum([len(o.payload) for o in objs]) >= JOIN_RUN_BELOW:
            # joined writes of up to JOIN_WRITE_LIMIT each
            run: list[bytes | memoryview] = []
            size = 0
            for o in objs:
                payload = o.payload
                head = prefix(o.object_id, len(payload), o.status, o.properties)
                n = len(head) + len(payload)
                if size and size + n > JOIN_WRITE_LIMIT:
                    actions.append(SendStreamData(stream_id, b"".join(run), False))
                    run = []
                    size = 0
                run.append(head)
                if payload:
                    run.append(payload)
                size += n
            actions.append(SendStreamData(stream_id, b"".join(run), end))
        else:
            parts: list[bytes | memoryview] = []
            for o in objs:
                payload = o.payload
                parts.append(prefix(o.object_id, len(payload), o.status, o.properties))
                if payload:
                    parts.append(payload)
            if parts:
                actions.append(SendStreamData(stream_id, b"".join(parts), end))
        if end:
            self._closed(stream_id, s)
        return True

    def open_fetch_stream(self, req: Request, fill_id: int | None, publisher_priority: int,
                          first_group: int) -> int:
        """Open a fetch stream of FETCH ``req`` or a fill stream of subscription ``req``."""
        writer = FetchWriter(req.request_id if fill_id is None else fill_id, req.descending)
        sid = self._opener.open_stream(True)
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
        # one write of prefix + payload (see write_object)
        self._out.actions.append(SendStreamData(
            stream_id, b"".join((prefix, payload)) if payload else prefix))
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
        self._on_stream_ended(s.request, True)

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

    @property
    def open_count(self) -> int:
        """Data streams the session keeps state for, both directions."""
        return len(self._incoming) + len(self._outgoing)

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
