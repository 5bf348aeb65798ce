"""The control plane of a MOQT session: the control streams and every request stream.

On the unidirectional control streams: our SETUP, the peer's SETUP (checked) and GOAWAY.
On each bidirectional request stream: the request-starting message (Request ID parity and
reuse, names), then every later message in either direction, each judged by the request
state table of :mod:`kvcs.moqt.requests`; REQUEST_UPDATE bookkeeping (MAX_REQUEST_UPDATES);
the end of a request (FIN, reset, STOP_SENDING, cancel) and when to forget it; PUBLISH_DONE
and the subscriber's wait for the data streams it counts. The application's calls that
start, answer, update and end requests are :mod:`kvcs.moqt.control_calls`
(:class:`RequestCalls`, which :class:`ControlPlane` completes); the data streams are
:mod:`kvcs.moqt.datastreams`' business.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from . import events as ev
from . import wire
from .actions import ResetStream, SendStreamData, SetStreamPriority, StreamOpener
from .config import (
    MAX_SKIPPED_REQUEST_IDS,
    MAX_UNKNOWN_SETUP_OPTIONS,
    REQUEST_COST,
    RETRY_AFTER_MS,
    UPDATE_COST,
    SessionConfig,
)
from .control_calls import CONTROL_PRIORITY, RequestCalls, new_request
from .datastreams import DataStreams
from .errors import (
    ProtocolError,
    RequestErrorCode,
    SessionCode,
    SessionUsageError,
    StreamResetCode,
    violation,
)
from .outbox import Outbox
from .ratelimit import WAITING_COST, RequestGate, WaitingStream
from .requests import (
    Ending,
    Request,
    RequestKind,
    RequestMessage,
    RequestRegistry,
    RequestState,
    Side,
    message_footprint,
    namespace_footprint,
)

log = logging.getLogger(__name__)

SETUP_TYPE = wire.Setup.TYPE
"""0x2F00: both the control stream's type and its first message's type."""
UNKNOWN_STREAM_COUNT = wire.MAX_VI64
"""PUBLISH_DONE's Stream Count when the publisher does not know it (digest 4.11)."""
_REQUEST_TYPES = frozenset(m.TYPE for m in (
    wire.Subscribe, wire.Publish, wire.Fetch, wire.TrackStatus, wire.PublishNamespace,
    wire.SubscribeNamespace, wire.SubscribeTracks))
"""Types of the messages that start a request (:data:`~kvcs.moqt.requests.RequestMessage`):
what the session's :class:`~kvcs.moqt.ratelimit.RequestGate` paces."""
_NAMESPACE_REQUESTS = frozenset({
    RequestKind.PUBLISH_NAMESPACE, RequestKind.SUBSCRIBE_NAMESPACE,
    RequestKind.SUBSCRIBE_TRACKS,
})


class ControlPlane(RequestCalls):
    """Control and request streams of one session. See the module docstring."""

    def __init__(self, config: SessionConfig, opener: StreamOpener, out: Outbox,
                 requests: RequestRegistry, data: DataStreams,
                 on_setup: Callable[[], None]) -> None:
        self._config = config
        self._opener = opener
        self._out = out
        self._requests = requests
        self._data = data
        self._on_setup = on_setup
        self.peer_setup: wire.SetupOptions | None = None
        self.peer_control_stream: int | None = None
        self._peer_control_parser = wire.ControlStreamParser()
        self._goaway_received = False
        self._goaway_sent = False
        self._next_request_id = 0 if config.is_client else 1
        self._peer_parity = 1 if config.is_client else 0
        self._peer_next_request_id = self._peer_parity
        self._peer_skipped_ids: set[int] = set()  # below the next one, not seen yet
        # peer streams whose first message is partial
        self._opening: dict[int, wire.ControlStreamParser] = {}
        self._draining: set[int] = set()
        """Peer request streams we are done with (refused, or our final message sent)
        whose peer half is still open: what arrives on them is dropped until it ends."""
        self.budget = wire.ByteBudget(config.max_control_bytes)
        """Control state the peer makes us keep (``max_control_bytes``): the messages of
        its requests, unfinished control messages, pending REQUEST_UPDATEs, namespaces."""
        self.gate = (RequestGate(config.request_rate, config.request_burst, config.clock())
                     if config.request_rate > 0 else None)
        """The peer's new requests waiting, undecoded, for their turn (``request_rate``);
        None: each is decoded as it arrives."""
        self._next_alias = 0
        self.control_stream = opener.open_stream(True)
        out.emit(SetStreamPriority(self.control_stream, CONTROL_PRIORITY))
        opts = wire.SetupOptions(
            implementation=config.implementation,
            max_filter_ranges=config.max_filter_ranges,
            max_request_updates=config.max_request_updates,
            auth_tokens=config.auth_tokens,
        )
        if config.is_client and not config.webtransport:
            opts.path = config.path
            opts.authority = config.authority
        out.emit(SendStreamData(self.control_stream, wire.encode_message(wire.Setup(opts))))

    @property
    def draining_streams(self) -> int:
        """Peer request streams we are done with whose peer half is still open."""
        return len(self._draining)

    def drop_input(self) -> None:
        """The session is closed: forget unfinished messages and streams being drained."""
        for parser in self._opening.values():
            self.budget.give(parser.buffered)
        self._opening.clear()
        self._draining.clear()
        for waiting in self.gate.clear() if self.gate is not None else ():
            self.budget.give(waiting.charged + waiting.parser.buffered)
        for req in self._requests:
            # the requests' state is let go with the session: its charge too, so that a
            # closed session accounts for nothing (the relay's held_bytes returns to 0)
            self.budget.give(req.parser.buffered + req.charged)
            req.charged = 0
            req.parser.clear()

    def is_local(self, stream_id: int) -> bool:
        """True for a stream we opened (QUIC stream ID parity)."""
        return (stream_id & 1) == (0 if self._config.is_client else 1)

    # ------------------------------------------------------------------ control streams

    def open_peer_control(self, stream_id: int, data: bytes | bytearray | memoryview,
                          end: bool) -> None:
        """The peer opened its control stream (a unidirectional stream of type SETUP)."""
        if self.peer_control_stream is not None:
            raise violation("second control stream")
        self.peer_control_stream = stream_id
        self.control_data(data, end)

    def control_data(self, data: bytes | bytearray | memoryview, end: bool) -> None:
        """Bytes on the peer's control stream: SETUP first, then only GOAWAY."""
        for msg in self._peer_control_parser.feed(data):
            if isinstance(msg, wire.Setup):
                if self.peer_setup is not None:
                    raise violation("second SETUP")
                self._accept_setup(msg.options)
                self._on_setup()
            elif self.peer_setup is None:
                raise violation("first message on the control stream is not SETUP")
            elif isinstance(msg, wire.GoAway):
                self._on_goaway(msg, None)
            else:
                raise violation(f"{type(msg).__name__} on the control stream")
        if end:
            raise violation("control stream closed")

    def _accept_setup(self, opts: wire.SetupOptions) -> None:
        cfg = self._config
        if cfg.is_client and opts.path is not None:
            raise ProtocolError(SessionCode.INVALID_PATH, "PATH option from a server")
        if cfg.is_client and opts.authority is not None:
            raise ProtocolError(SessionCode.INVALID_AUTHORITY, "AUTHORITY option from a server")
        if cfg.webtransport and opts.path is not None:
            raise ProtocolError(SessionCode.INVALID_PATH, "PATH option over WebTransport")
        if cfg.webtransport and opts.authority is not None:
            raise ProtocolError(SessionCode.INVALID_AUTHORITY, "AUTHORITY over WebTransport")
        if opts.path is not None and not bytes(opts.path).startswith(b"/") and opts.path != b"":
            raise ProtocolError(SessionCode.MALFORMED_PATH, "PATH must start with '/'")
        for tok in opts.auth_tokens:
            if tok.alias_type in (0, 2):
                raise violation("DELETE or USE_ALIAS token in SETUP")
        if len(opts.auth_tokens) > cfg.max_setup_tokens:
            raise ProtocolError(SessionCode.UNAUTHORIZED, f"{len(opts.auth_tokens)} tokens in "
                                f"SETUP (we accept {cfg.max_setup_tokens})")
        opts.unknown = opts.unknown[:MAX_UNKNOWN_SETUP_OPTIONS]  # ignored: keep a sample
        self.peer_setup = opts
        self._out.event(ev.SessionEstablished(opts))

    def _on_goaway(self, msg: wire.GoAway, req: Request | None) -> None:
        if msg.new_session_uri and not self._config.is_client:
            raise violation("GOAWAY with a URI from a client")
        if req is None:
            if self._goaway_received:
                raise violation("second GOAWAY on the control stream")
            self._goaway_received = True
        else:
            if req.goaway_received:
                raise violation("second GOAWAY on a request stream")
            req.goaway_received = True
        rid = req.request_id if req else None
        self._out.event(ev.GoAwayReceived(bytes(msg.new_session_uri), msg.timeout_ms, rid))

    def goaway(self, new_session_uri: bytes = b"", timeout_ms: int = 0) -> None:
        """Send GOAWAY on our control stream (once)."""
        if self._goaway_sent or self._out.closed is not None:
            return
        if new_session_uri and self._config.is_client:
            raise SessionUsageError("a client GOAWAY carries no URI")
        self._goaway_sent = True
        goaway = wire.GoAway(new_session_uri, timeout_ms)
        self._out.emit(SendStreamData(self.control_stream, wire.encode_message(goaway)))

    # ------------------------------------------------------------------ request streams in

    def stream_data(self, stream_id: int, data: bytes | memoryview, end: bool) -> None:
        """Bytes on a bidirectional (request) stream."""
        if stream_id in self._draining:
            if end:
                self._draining.discard(stream_id)
            return
        req = self._requests.on_stream(stream_id)
        if req is not None:
            self._take(req, self._feed(req.parser, data), end)
        elif self.is_local(stream_id):
            return  # a request of ours we already forgot
        elif self.gate is not None and (waiting := self.gate.get(stream_id)) is not None:
            self._wait_more(waiting, data, end)
        else:
            # a new request stream: wait until its first message is complete
            parser = self._opening.pop(stream_id, None) or wire.ControlStreamParser()
            frames = self._frames(parser, data)
            if not frames:
                if end:
                    raise violation("request stream ended before its first message")
                if self.budget.over:
                    self._refuse(stream_id, parser, "unfinished requests over our limit")
                else:
                    self._opening[stream_id] = parser
                return
            if self.gate is not None and frames[0][0] in _REQUEST_TYPES and \
                    not self.gate.admit(self._config.clock()):
                self._wait(WaitingStream(stream_id, parser), frames, end)
                return
            self._open(stream_id, parser, frames, end)

    def _open(self, stream_id: int, parser: wire.ControlStreamParser,
              frames: list[tuple[int, bytes]], end: bool) -> None:
        """Decode a new request stream's first message (and what followed it) and start
        the request, or refuse it."""
        first = wire.decode_message(*frames[0])
        req = self._new_peer_request(stream_id, first, parser)
        if req is None:  # refused: the rest of the stream is dropped
            if end:
                self._draining.discard(stream_id)
            return
        self._take(req, [wire.decode_message(t, body) for t, body in frames[1:]], end)

    def _take(self, req: Request, msgs: list[wire.Message], end: bool) -> None:
        """Messages (and maybe FIN) on the stream of a request we keep."""
        for msg in msgs:
            self._on_message(req, msg)
            if self.budget.over:
                self._shed(req)
                return
        if self.budget.over:  # an unfinished message
            self._shed(req)
            return
        if end:
            if req.parser.buffered:
                raise violation("request stream ended inside a message")
            self._on_peer_fin(req)

    # ------------------------------------------------------------------ paced requests

    def _wait(self, waiting: WaitingStream, frames: list[tuple[int, bytes]],
              end: bool) -> None:
        """A new request past the session's request rate: it waits, undecoded, charged to
        the control budget (refused, still undecoded, when that is over its limit)."""
        assert self.gate is not None
        first = not len(self.gate)
        self.gate.hold(waiting)
        waiting.charged = WAITING_COST
        self.budget.force(WAITING_COST)
        self._wait_more(waiting, b"", end, frames)
        if first and self.gate.get(waiting.stream_id) is not None:
            self._announce_wait()

    def _wait_more(self, waiting: WaitingStream, data: bytes | memoryview, end: bool,
                   frames: list[tuple[int, bytes]] | None = None) -> None:
        """More bytes (and maybe FIN) of a waiting request stream: framed, not decoded."""
        assert self.gate is not None
        more = frames if frames is not None else self._frames(waiting.parser, data)
        cost = sum(len(body) for _, body in more)
        waiting.frames += more
        waiting.charged += cost
        self.budget.force(cost)
        waiting.end = waiting.end or end
        if end and waiting.parser.buffered:
            raise violation("request stream ended inside a message")
        if self.budget.over:
            self.gate.drop(waiting.stream_id)
            self.budget.give(waiting.charged)
            self._refuse(waiting.stream_id, waiting.parser,
                         "waiting requests over our limit")
            if end:
                self._draining.discard(waiting.stream_id)

    def _announce_wait(self) -> None:
        assert self.gate is not None
        delay = self.gate.next_due(self._config.clock())
        if delay is not None:
            self._out.event(ev.RequestsWaiting(len(self.gate), delay))

    def resume_requests(self) -> None:
        """Decode and start the waiting requests whose turn has come (oldest first); if
        some still wait, :class:`~kvcs.moqt.events.RequestsWaiting` says when to call
        again."""
        if self.gate is None:
            return
        for waiting in self.gate.due(self._config.clock()):
            self.budget.give(waiting.charged)
            self._open(waiting.stream_id, waiting.parser, waiting.frames, waiting.end)
        self._announce_wait()

    def _frames(self, parser: wire.ControlStreamParser,
                data: bytes | memoryview) -> list[tuple[int, bytes]]:
        """Frame a request stream's bytes; what its parser keeps of an unfinished message
        is charged to the control budget."""
        before = parser.buffered
        frames = parser.frames(data)
        self.budget.force(parser.buffered - before)
        return frames

    def _feed(self, parser: wire.ControlStreamParser,
              data: bytes | memoryview) -> list[wire.Message]:
        """Feed a request stream's parser; what it keeps of an unfinished message is
        charged to the control budget."""
        before = parser.buffered
        msgs = parser.feed(data)
        self.budget.force(parser.buffered - before)
        return msgs

    def _refuse(self, stream_id: int, parser: wire.ControlStreamParser, reason: str) -> None:
        """Refuse a peer request stream over our limits: REQUEST_ERROR EXCESSIVE_LOAD
        (retry after :data:`~kvcs.moqt.config.RETRY_AFTER_MS`) and FIN; what else arrives
        on it is dropped. Nothing is kept but the stream ID, until the peer ends it."""
        log.info("refusing request stream %d: %s", stream_id, reason)
        self.budget.give(parser.buffered)
        self._draining.add(stream_id)
        msg = wire.RequestError(RequestErrorCode.EXCESSIVE_LOAD, RETRY_AFTER_MS + 1, reason)
        self._out.emit(SendStreamData(stream_id, wire.encode_message(msg), end=True))

    def _shed(self, req: Request) -> None:
        """The peer's control state went over ``max_control_bytes`` on ``req``'s stream:
        cancel that request (EXCESSIVE_LOAD); the rest of the session goes on."""
        if self._requests.get(req.request_id) is not req:
            return
        code = StreamResetCode.EXCESSIVE_LOAD
        log.warning("%s %d cancelled: the peer's control state is over our limit (%d "
                    "bytes)", req.kind.name, req.request_id, self.budget.limit)
        req.publish_done = None
        self.cancel(req.request_id, code)
        if req.side is Side.REQUESTER:
            self._out.event(ev.RequestFailed(req.request_id, code,
                                             "peer's control state over our limit"))
        else:
            self._out.event(ev.RequestCancelled(req.request_id, code))

    def _check_peer_request_id(self, rid: int) -> None:
        """Wrong parity or a reused ID closes the session (INVALID_REQUEST_ID). Requests
        travel on separate streams, so a lower ID may arrive after a higher one: IDs
        skipped over are remembered until they arrive."""
        if rid & 1 != self._peer_parity:
            raise ProtocolError(SessionCode.INVALID_REQUEST_ID, f"request ID {rid} wrong parity")
        nxt = self._peer_next_request_id
        if rid >= nxt:
            if rid > nxt:
                if len(self._peer_skipped_ids) + (rid - nxt) // 2 > MAX_SKIPPED_REQUEST_IDS:
                    raise ProtocolError(SessionCode.INVALID_REQUEST_ID,
                                        f"request ID {rid} skips too many IDs")
                self._peer_skipped_ids.update(range(nxt, rid, 2))
            self._peer_next_request_id = rid + 2
        elif rid in self._peer_skipped_ids:
            self._peer_skipped_ids.discard(rid)  # overtaken by a later request's stream
        else:
            raise ProtocolError(SessionCode.INVALID_REQUEST_ID, f"request ID {rid} reused")

    def _new_peer_request(self, stream_id: int, msg: wire.Message,
                          parser: wire.ControlStreamParser) -> Request | None:
        """The peer's request-starting message: a new request, or None if refused over
        ``max_requests`` or ``max_control_bytes`` (REQUEST_ERROR EXCESSIVE_LOAD)."""
        if not isinstance(msg, RequestMessage):
            raise violation(f"{type(msg).__name__} cannot start a request")
        self._check_peer_request_id(msg.request_id)
        if isinstance(msg, wire.Subscribe | wire.Fetch | wire.TrackStatus | wire.Publish):
            wire.validate_full_name(msg.namespace, msg.name)
        elif isinstance(msg, wire.PublishNamespace):
            wire.validate_namespace(msg.namespace_prefix)
        if self._requests.peer_requests >= self._config.max_requests:
            self._refuse(stream_id, parser, f"{self._config.max_requests} requests open")
            return None
        cost = REQUEST_COST + message_footprint(msg)
        if not self.budget.take(cost):
            self._refuse(stream_id, parser, "requests over our limit")
            return None
        req = new_request(msg, stream_id, Side.RESPONDER, parser)
        req.charged = cost
        if isinstance(msg, wire.Publish):
            req.track_alias = msg.track_alias
            self._check_alias(msg.track_alias, req)
            self._data.bind_alias(msg.track_alias, req)
        self._requests.add(req)
        self._out.event(ev.RequestReceived(req.request_id, msg))
        return req

    def _check_alias(self, alias: int, req: Request) -> None:
        """A Track Alias must not name two different tracks of live subscriptions at once
        (digest 7.6); subscriptions to the same track may share one."""
        other = self._data.alias_owner(alias)
        if other is None or other is req or other.finished:
            return
        if other.full_track_name != req.full_track_name:
            raise ProtocolError(SessionCode.DUPLICATE_TRACK_ALIAS, f"track alias {alias} in use")

    def _on_message(self, req: Request, msg: wire.Message) -> None:
        """A message from the peer on a request stream, after the first one."""
        before = req.received(msg)  # the table: PROTOCOL_VIOLATION if not allowed
        rid = req.request_id
        match msg:
            case wire.GoAway():
                self._on_goaway(msg, req)
            case wire.RequestUpdate():
                self._on_update(req, msg)
            case wire.RequestOk() if before is RequestState.UNANSWERED:
                if req.kind is not RequestKind.TRACK_STATUS and msg.track_properties:
                    raise violation("REQUEST_OK with Track Properties")
                self._out.event(ev.RequestAccepted(rid, msg))
            case wire.RequestError() if before is RequestState.UNANSWERED:
                self._out.event(ev.RequestRejected(rid, msg))
                self._data.abandon_held()
            case wire.RequestOk() | wire.RequestError():
                self._on_update_answer(req, msg)
            case wire.SubscribeOk():
                self._on_subscribe_ok(req, msg)
            case wire.FetchOk():
                self._out.event(ev.FetchAccepted(rid, msg))
                if req.streams_ended:  # the fetch stream overtook FETCH_OK: complete
                    self._forget(req)
            case wire.PublishDone():
                req.publish_done = msg
                self._subscription_may_end(req)
                if (req.publish_done is not None
                        and msg.stream_count != UNKNOWN_STREAM_COUNT):
                    self._out.event(ev.StreamsOutstanding(
                        rid, msg.stream_count - req.streams_ended))
            case wire.PublishStateNotify():
                self._out.event(ev.PublishStateNotified(rid, msg))
            case wire.NamespaceMsg():
                ns = tuple(req.namespace) + tuple(msg.suffix)
                wire.validate_namespace(ns)
                if ns not in req.namespaces:
                    req.namespaces.add(ns)
                    cost = namespace_footprint(ns)
                    req.charged += cost
                    self.budget.force(cost)
                self._out.event(ev.NamespaceAnnounced(rid, ns))
            case wire.NamespaceDone():
                ns = tuple(req.namespace) + tuple(msg.suffix)
                if ns not in req.namespaces:
                    raise violation("NAMESPACE_DONE before its NAMESPACE")
                req.namespaces.discard(ns)
                cost = namespace_footprint(ns)
                req.charged -= cost
                self.budget.give(cost)
                self._out.event(ev.NamespaceWithdrawn(rid, ns))
            case wire.PublishSkipped():
                ns = tuple(req.namespace) + tuple(msg.suffix)
                self._out.event(ev.PublishSkippedReceived(rid, ns, bytes(msg.name)))

    def _on_update(self, req: Request, msg: wire.RequestUpdate) -> None:
        self._check_peer_request_id(msg.request_id)
        if req.send_closed or req.our_state is RequestState.DONE:
            return  # it crossed our end of the request: nobody will answer it
        limit = self._config.max_request_updates
        if limit and len(req.updates) >= limit:
            raise ProtocolError(SessionCode.TOO_MANY_REQUEST_UPDATES, "too many REQUEST_UPDATEs")
        self._requests.add_peer_update(msg.request_id, req)
        req.charged += UPDATE_COST
        self.budget.force(UPDATE_COST)
        if msg.params.subscriber_priority is not None:
            req.subscriber_priority = msg.params.subscriber_priority
        self._out.event(ev.UpdateReceived(req.request_id, msg.request_id, msg.params))

    def _on_update_answer(self, req: Request, msg: wire.RequestOk | wire.RequestError) -> None:
        try:
            uid = self._requests.answer_update(req)
        except LookupError:
            raise violation(f"{type(msg).__name__} without an outstanding "
                            "REQUEST_UPDATE") from None
        if isinstance(msg, wire.RequestOk):
            self._out.event(ev.RequestAccepted(req.request_id, msg, uid))
        else:
            self._out.event(ev.RequestRejected(req.request_id, msg, uid))

    def _on_subscribe_ok(self, req: Request, msg: wire.SubscribeOk) -> None:
        self._check_alias(msg.track_alias, req)
        req.track_alias = msg.track_alias
        self._out.event(ev.SubscribeAccepted(req.request_id, msg))
        self._data.bind_alias(msg.track_alias, req)
        self._data.abandon_held()

    def data_stream_ended(self, req: Request, sent: bool) -> None:
        """A data stream of ``req`` ended: one we sent (``sent``) or one we received (the
        data plane counted it). Ends a FETCH on either side, or a subscription we receive
        whose PUBLISH_DONE waited for it."""
        if req.kind is RequestKind.FETCH:
            if sent:
                self._fetch_may_finish(req)
            else:
                self._fetch_received(req)
        elif not sent and req.we_subscribe:
            self._subscription_may_end(req)

    def track_malformed(self, req: Request, reason: str) -> None:
        """A data stream shows the track of ``req``, which we receive, to be malformed:
        cancel the request with MALFORMED_TRACK (digest 8.8), stop its other streams and
        tell the application (objects delivered before stay delivered)."""
        if self._requests.get(req.request_id) is not req:
            return
        code = StreamResetCode.MALFORMED_TRACK
        log.warning("%s %d: malformed track: %s", req.kind.name, req.request_id, reason)
        self._data.stop_receiving(req, code)
        self.cancel(req.request_id, code)
        if req.side is Side.REQUESTER:
            self._out.event(ev.RequestFailed(req.request_id, code, f"malformed track: {reason}"))
        else:
            self._out.event(ev.RequestCancelled(req.request_id, code))

    def _fetch_may_finish(self, req: Request) -> None:
        """A FETCH we serve is complete once FETCH_OK is out and its fetch stream has
        ended (FIN or reset): FIN our half of the request stream, its final act (digest
        8.2, 8.4). Updates still unanswered are moot then: the objects are all sent."""
        if (req.side is Side.RESPONDER and req.streams_opened and not req.open_streams
                and req.responder_state is RequestState.ACCEPTED and not req.send_closed):
            req.end_of_stream(Side.RESPONDER)
            self._end_our_half(req)
            self._forget_if_closed(req)

    def _fetch_received(self, req: Request) -> None:
        """The fetch stream of our FETCH ended (FIN or reset): we will send no more
        updates (FIN, digest 8.2) and, once FETCH_OK is in, keep nothing of it (8.4: the
        subscriber keeps fetch state until the data stream's FIN or reset); the
        responder's FIN then finds the stream forgotten and is ignored."""
        if not req.send_closed:
            req.end_of_stream(Side.REQUESTER)
            self._end_our_half(req)
        if req.responded:
            self._forget(req)

    def _subscription_may_end(self, req: Request, waited: bool = False) -> None:
        """After PUBLISH_DONE, the subscription ends once the streams it counts have ended
        (or, count unknown, once none is open), or once ``waited`` for them long enough
        (:meth:`stop_waiting_for_streams`)."""
        done = req.publish_done
        if done is None:
            return
        missing = 0
        if waited:
            missing = max(0, done.stream_count - req.streams_ended)
            log.info("subscription %d: %d of the %d streams PUBLISH_DONE counts never "
                     "came: ended", req.request_id, missing, done.stream_count)
        elif done.stream_count != UNKNOWN_STREAM_COUNT:
            if req.streams_ended < done.stream_count:
                return
        elif self._data.receiving_for(req):
            return
        self._data.unbind_alias(req)
        req.publish_done = None
        self._out.event(ev.SubscriptionEnded(req.request_id, done, missing))
        self._forget_if_closed(req)

    def stop_waiting_for_streams(self, request_id: int) -> bool:
        """End our subscription ``request_id`` whose PUBLISH_DONE arrived, even if streams
        it counts are still missing (the digest 4.11 timer expired). Does nothing if it
        has ended already. While a stream of it is still open (data still arriving, e.g. a
        16 MiB fill on a loaded host) it is not ended: returns True, wait again."""
        req = self._requests.get(request_id)
        if req is None or req.publish_done is None:
            return False
        received = self._data.received_for(req)
        if received is not None:
            now = self._config.clock()
            before, since = req.received_after_done
            if received != before:
                req.received_after_done = (received, now)
                return True
            if now - since < self._config.publish_done_stall_s:
                return True
            # every byte may have come and the end not (qh3 2.1 can lose a lone FIN for
            # good): the stream is given up and counted missing, so that the
            # subscription can end instead of lasting as long as the session
            log.info("subscription %d: a data stream stayed open %.0f s after PUBLISH_DONE "
                     "without a byte: taken as lost", request_id, now - since)
            self._data.stop_receiving(req, StreamResetCode.CANCELLED)
        self._subscription_may_end(req, waited=True)
        return False

    def _on_peer_fin(self, req: Request) -> None:
        """The peer finished its half of the request stream."""
        req.receive_closed = True
        answered = req.responded
        fetch_accepted = (req.kind is RequestKind.FETCH and req.side is Side.REQUESTER
                          and req.responder_state is RequestState.ACCEPTED)
        ending = req.end_of_stream(req.side.other)
        rid = req.request_id
        if req.side is Side.REQUESTER:
            self._withdraw_namespaces(req)
            if ending is Ending.FAILED:
                reason = ("responder ended" if answered and req.kind in _NAMESPACE_REQUESTS
                          else "stream ended without a final response")
                self._out.event(ev.RequestFailed(rid, None, reason))
            if not req.send_closed and (req.kind is not RequestKind.PUBLISH
                                        or ending is Ending.CLEAN):
                # the responder is done: FIN our side too (digest 8.2) so both ends forget
                # (a PUBLISH lives on while we publish, unless it was refused)
                self._end_our_half(req)
        else:
            if ending is Ending.WITHDRAWN:
                self._out.event(ev.RequestCancelled(rid, None))
            if not req.send_closed and req.finished:
                # the requester withdrew it or sent its final message (PUBLISH_DONE): the
                # request is over for us too, end our half so that both ends forget it
                self._end_our_half(req)
        if fetch_accepted and not req.streams_ended:
            # the fetch stream may still be on its way (streams are not ordered): keep
            # the request until it ends (digest 8.4), see _fetch_received
            self._requests.close_stream(req)
            return
        self._forget_if_closed(req)

    def _withdraw_namespaces(self, req: Request) -> None:
        """SUBSCRIBE_NAMESPACE's stream ended: every namespace it announced is done."""
        for ns in sorted(req.namespaces):
            self._out.event(ev.NamespaceWithdrawn(req.request_id, ns))
            cost = namespace_footprint(ns)
            req.charged -= cost
            self.budget.give(cost)
        req.namespaces.clear()

    def stream_reset(self, stream_id: int, code: int) -> None:
        """The peer reset its half of a request stream: a cancel."""
        req = self._requests.on_stream(stream_id)
        if req is not None:
            self._aborted(req, code)
            return
        self._draining.discard(stream_id)
        parser = self._opening.pop(stream_id, None)
        if parser is not None:
            self.budget.give(parser.buffered)
        waiting = self.gate.drop(stream_id) if self.gate is not None else None
        if waiting is not None:  # cancelled before its turn: never decoded
            self.budget.give(waiting.charged + waiting.parser.buffered)

    def stop_sending(self, stream_id: int, code: int) -> None:
        """The peer asked us to stop sending on a request stream (a cancel)."""
        req = self._requests.on_stream(stream_id)
        if req is None:
            return
        if not req.send_closed:
            req.send_closed = True
            self._out.emit(ResetStream(stream_id, code))
        self._aborted(req, code)

    def _aborted(self, req: Request, code: int) -> None:
        """The peer reset or stopped the request stream: the request is cancelled."""
        if req.side is Side.REQUESTER:
            self._withdraw_namespaces(req)
            if not req.finished:
                self._out.event(ev.RequestFailed(req.request_id, code, "request stream reset"))
        else:
            self._out.event(ev.RequestCancelled(req.request_id, code))
        self._data.reset_streams(req, StreamResetCode.CANCELLED)
        req.end()
        if not req.send_closed:
            req.send_closed = True
            self._out.emit(ResetStream(req.stream_id, StreamResetCode.CANCELLED))
        req.receive_closed = True
        self._forget_if_closed(req)

    def _end_our_half(self, req: Request) -> None:
        req.send_closed = True
        self._out.emit(SendStreamData(req.stream_id, b"", end=True))

    def _forget_if_closed(self, req: Request) -> None:
        """Both halves of the stream ended: forget the request, unless we subscribe and
        the data streams its PUBLISH_DONE counts are still open. A request of the peer is
        forgotten as soon as our final message is out: nothing the peer may still send
        on its stream matters then (it is dropped until the stream ends)."""
        if req.send_closed and req.receive_closed:
            self._requests.close_stream(req)
            if req.publish_done is None:
                self._forget(req)
            if req.kind is RequestKind.SUBSCRIBE and req.side is Side.REQUESTER:
                self._data.abandon_held()  # it may have been the SUBSCRIBE they waited for
        elif req.send_closed and req.side is Side.RESPONDER and req.finished:
            self._draining.add(req.stream_id)
            self._forget(req)

    def _forget(self, req: Request) -> None:
        """Drop a request and give back what it was charged."""
        if self._requests.get(req.request_id) is not req:
            return
        self.budget.give(req.charged + req.parser.buffered)
        req.charged = 0
        req.parser.clear()
        self._requests.forget(req)
