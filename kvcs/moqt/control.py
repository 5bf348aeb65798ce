"""The control plane of a MOQT session: the control streams and every request stream.

On the unidirectional control streams: our SETUP, the peer's SETUP (checked) and GOAWAY.
On each bidirectional request stream: the request-starting message (Request ID parity and
reuse, names), then every later message in either direction, each judged by the request
state table of :mod:`kvcs.moqt.requests`; REQUEST_UPDATE bookkeeping (MAX_REQUEST_UPDATES);
the end of a request (FIN, reset, STOP_SENDING, cancel) and when to forget it; PUBLISH_DONE
and the subscriber's wait for the data streams it counts. The application's calls that
start, answer, update and end requests land here too; the data streams are
:mod:`kvcs.moqt.datastreams`' business.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from . import events as ev
from .actions import ResetStream, SendStreamData, SetStreamPriority, StopSending, StreamOpener
from .datastreams import DataStreams
from .errors import ProtocolError, SessionCode, SessionUsageError, StreamResetCode, violation
from .outbox import Outbox
from .requests import (
    Ending,
    Request,
    RequestKind,
    RequestMessage,
    RequestRegistry,
    RequestState,
    Side,
)
from .wire import (
    MAX_VI64,
    AuthToken,
    ControlStreamParser,
    Fetch,
    FetchOk,
    GoAway,
    GroupOrder,
    Location,
    Message,
    NamespaceDone,
    NamespaceMsg,
    Parameters,
    Properties,
    Publish,
    PublishDone,
    PublishNamespace,
    PublishSkipped,
    PublishStateNotify,
    Redirect,
    RequestError,
    RequestOk,
    RequestUpdate,
    Setup,
    SetupOptions,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    TrackNamespace,
    TrackStatus,
    encode_message,
    validate_full_name,
    validate_namespace,
)

log = logging.getLogger(__name__)

SETUP_TYPE = Setup.TYPE
"""0x2F00: both the control stream's type and its first message's type."""
CONTROL_PRIORITY = (0,)
"""Scheduling key of the control and request streams: ahead of every data stream."""
MAX_SKIPPED_REQUEST_IDS = 4096
"""Peer Request IDs that may be outstanding below the highest one seen. Each request has
its own stream, so requests arrive out of order; a peer cannot have many more requests in
flight than its open bidirectional streams, so a larger gap is treated as invalid."""
UNKNOWN_STREAM_COUNT = MAX_VI64
"""PUBLISH_DONE's Stream Count when the publisher does not know it (digest 4.11)."""
_NAMESPACE_REQUESTS = frozenset({
    RequestKind.PUBLISH_NAMESPACE, RequestKind.SUBSCRIBE_NAMESPACE,
    RequestKind.SUBSCRIBE_TRACKS,
})


@dataclass(slots=True)
class SessionConfig:
    """Settings of one MOQT session.

    ``path``/``authority`` are sent as SETUP options by a client over raw QUIC (never over
    WebTransport). ``max_filter_ranges`` and ``max_request_updates`` are what we accept
    from the peer (advertised in our SETUP). ``setup_buffer_limit`` bounds how many bytes
    of requests and data a peer may send before its SETUP.
    """

    is_client: bool
    implementation: str = "kvcs/0.1"
    path: bytes | None = None
    authority: bytes | None = None
    auth_tokens: tuple[AuthToken, ...] = ()
    max_filter_ranges: int = 16
    max_request_updates: int = 0
    setup_buffer_limit: int = 1 << 20
    write_window: int = 0
    """Bytes a fetch or fill stream may have queued before its sender waits for
    :meth:`Session.stream_writable` (0: no limit). Keeps memory bounded and lets the
    binding's scheduler interleave streams by priority instead of draining one long
    stream first; only set it when the binding reports writability."""
    webtransport: bool = False


class ControlPlane:
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
        self.peer_setup: SetupOptions | None = None
        self.peer_control_stream: int | None = None
        self._peer_control_parser = ControlStreamParser()
        self._goaway_received = False
        self._goaway_sent = False
        self._next_request_id = 0 if config.is_client else 1
        self._peer_parity = 1 if config.is_client else 0
        self._peer_next_request_id = self._peer_parity
        self._peer_skipped_ids: set[int] = set()  # below the next one, not seen yet
        self._opening: dict[int, ControlStreamParser] = {}  # peer streams, first message partial
        self._next_alias = 0
        self.control_stream = opener.open_stream(True)
        out.emit(SetStreamPriority(self.control_stream, CONTROL_PRIORITY))
        opts = SetupOptions(
            implementation=config.implementation,
            max_filter_ranges=config.max_filter_ranges,
            max_request_updates=config.max_request_updates,
            auth_tokens=config.auth_tokens,
        )
        if config.is_client and not config.webtransport:
            opts.path = config.path
            opts.authority = config.authority
        out.emit(SendStreamData(self.control_stream, encode_message(Setup(opts))))

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
            if isinstance(msg, Setup):
                if self.peer_setup is not None:
                    raise violation("second SETUP")
                self._accept_setup(msg.options)
                self._on_setup()
            elif self.peer_setup is None:
                raise violation("first message on the control stream is not SETUP")
            elif isinstance(msg, GoAway):
                self._on_goaway(msg, None)
            else:
                raise violation(f"{type(msg).__name__} on the control stream")
        if end:
            raise violation("control stream closed")

    def _accept_setup(self, opts: SetupOptions) -> None:
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
        self.peer_setup = opts
        self._out.event(ev.SessionEstablished(opts))

    def _on_goaway(self, msg: GoAway, req: Request | None) -> None:
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
        self._out.emit(SendStreamData(self.control_stream,
                                      encode_message(GoAway(new_session_uri, timeout_ms))))

    # ------------------------------------------------------------------ request streams in

    def stream_data(self, stream_id: int, data: bytes | memoryview, end: bool) -> None:
        """Bytes on a bidirectional (request) stream."""
        req = self._requests.on_stream(stream_id)
        if req is not None:
            msgs = req.parser.feed(data)
        elif self.is_local(stream_id):
            return  # a request of ours we already forgot
        else:
            # a new request stream: wait until its first message is complete
            parser = self._opening.get(stream_id) or ControlStreamParser()
            msgs = parser.feed(data)
            if not msgs:
                if end:
                    raise violation("request stream ended before its first message")
                self._opening[stream_id] = parser
                return
            self._opening.pop(stream_id, None)
            req = self._new_peer_request(stream_id, msgs[0], parser)
            msgs = msgs[1:]
        for msg in msgs:
            self._on_message(req, msg)
        if end:
            if req.parser.buffered:
                raise violation("request stream ended inside a message")
            self._on_peer_fin(req)

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

    def _new_peer_request(self, stream_id: int, msg: Message,
                          parser: ControlStreamParser) -> Request:
        if not isinstance(msg, RequestMessage):
            raise violation(f"{type(msg).__name__} cannot start a request")
        self._check_peer_request_id(msg.request_id)
        if isinstance(msg, Subscribe | Fetch | TrackStatus | Publish):
            validate_full_name(msg.namespace, msg.name)
        elif isinstance(msg, PublishNamespace):
            validate_namespace(msg.namespace_prefix)
        req = self._request(msg, stream_id, Side.RESPONDER, parser)
        if isinstance(msg, Publish):
            req.track_alias = msg.track_alias
            self._check_alias(msg.track_alias, req)
            self._data.bind_alias(msg.track_alias, req)
        self._requests.add(req)
        self._out.event(ev.RequestReceived(req.request_id, msg))
        return req

    @staticmethod
    def _request(msg: RequestMessage, stream_id: int, side: Side,
                 parser: ControlStreamParser | None = None) -> Request:
        req = Request(msg.request_id, stream_id, RequestKind(msg.TYPE), side, msg,
                      parser or ControlStreamParser())
        p = msg.params
        if p.subscriber_priority is not None:
            req.subscriber_priority = p.subscriber_priority
        req.descending = p.group_order == GroupOrder.DESCENDING
        return req

    def _check_alias(self, alias: int, req: Request) -> None:
        """A Track Alias must not name two different tracks of live subscriptions at once
        (digest 7.6); subscriptions to the same track may share one."""
        other = self._data.alias_owner(alias)
        if other is None or other is req or other.finished:
            return
        if other.full_track_name != req.full_track_name:
            raise ProtocolError(SessionCode.DUPLICATE_TRACK_ALIAS, f"track alias {alias} in use")

    def _on_message(self, req: Request, msg: Message) -> None:
        """A message from the peer on a request stream, after the first one."""
        before = req.received(msg)  # the table: PROTOCOL_VIOLATION if not allowed
        rid = req.request_id
        match msg:
            case GoAway():
                self._on_goaway(msg, req)
            case RequestUpdate():
                self._on_update(req, msg)
            case RequestOk() if before is RequestState.UNANSWERED:
                if req.kind is not RequestKind.TRACK_STATUS and msg.track_properties:
                    raise violation("REQUEST_OK with Track Properties")
                self._out.event(ev.RequestAccepted(rid, msg))
            case RequestError() if before is RequestState.UNANSWERED:
                self._out.event(ev.RequestRejected(rid, msg))
                self._data.abandon_held()
            case RequestOk() | RequestError():
                self._on_update_answer(req, msg)
            case SubscribeOk():
                self._on_subscribe_ok(req, msg)
            case FetchOk():
                self._out.event(ev.FetchAccepted(rid, msg))
            case PublishDone():
                req.publish_done = msg
                self._subscription_may_end(req)
            case PublishStateNotify():
                self._out.event(ev.PublishStateNotified(rid, msg))
            case NamespaceMsg():
                ns = tuple(req.namespace) + tuple(msg.suffix)
                validate_namespace(ns)
                req.namespaces.add(ns)
                self._out.event(ev.NamespaceAnnounced(rid, ns))
            case NamespaceDone():
                ns = tuple(req.namespace) + tuple(msg.suffix)
                if ns not in req.namespaces:
                    raise violation("NAMESPACE_DONE before its NAMESPACE")
                req.namespaces.discard(ns)
                self._out.event(ev.NamespaceWithdrawn(rid, ns))
            case PublishSkipped():
                ns = tuple(req.namespace) + tuple(msg.suffix)
                self._out.event(ev.PublishSkippedReceived(rid, ns, bytes(msg.name)))

    def _on_update(self, req: Request, msg: RequestUpdate) -> None:
        self._check_peer_request_id(msg.request_id)
        if req.send_closed or req.our_state is RequestState.DONE:
            return  # it crossed our end of the request: nobody will answer it
        limit = self._config.max_request_updates
        if limit and len(req.updates) >= limit:
            raise ProtocolError(SessionCode.TOO_MANY_REQUEST_UPDATES, "too many REQUEST_UPDATEs")
        self._requests.add_update(msg.request_id, req)
        if msg.params.subscriber_priority is not None:
            req.subscriber_priority = msg.params.subscriber_priority
        self._out.event(ev.UpdateReceived(req.request_id, msg.request_id, msg.params))

    def _on_update_answer(self, req: Request, msg: RequestOk | RequestError) -> None:
        try:
            uid = self._requests.answer_update(req)
        except LookupError:
            raise violation(f"{type(msg).__name__} without an outstanding "
                            "REQUEST_UPDATE") from None
        if isinstance(msg, RequestOk):
            self._out.event(ev.RequestAccepted(req.request_id, msg, uid))
        else:
            self._out.event(ev.RequestRejected(req.request_id, msg, uid))

    def _on_subscribe_ok(self, req: Request, msg: SubscribeOk) -> None:
        self._check_alias(msg.track_alias, req)
        req.track_alias = msg.track_alias
        self._out.event(ev.SubscribeAccepted(req.request_id, msg))
        self._data.bind_alias(msg.track_alias, req)
        self._data.abandon_held()

    def subscription_stream_ended(self, req: Request) -> None:
        """A data stream of a subscription we receive ended (the data plane counts it)."""
        self._subscription_may_end(req)

    def _subscription_may_end(self, req: Request) -> None:
        """After PUBLISH_DONE, the subscription ends once the streams it counts have ended
        (or, count unknown, once none is open)."""
        done = req.publish_done
        if done is None:
            return
        if done.stream_count != UNKNOWN_STREAM_COUNT:
            if req.streams_ended < done.stream_count:
                return
        elif self._data.receiving_for(req):
            return
        self._data.unbind_alias(req)
        req.publish_done = None
        self._out.event(ev.SubscriptionEnded(req.request_id, done))
        self._forget_if_closed(req)

    def _on_peer_fin(self, req: Request) -> None:
        """The peer finished its half of the request stream."""
        req.receive_closed = True
        answered = req.responded
        ending = req.end_of_stream(req.side.other)
        rid = req.request_id
        if req.side is Side.REQUESTER:
            self._withdraw_namespaces(req)
            if ending is Ending.FAILED:
                reason = ("responder ended" if answered and req.kind in _NAMESPACE_REQUESTS
                          else "stream ended without a final response")
                self._out.event(ev.RequestFailed(rid, None, reason))
            if not req.send_closed and req.kind is not RequestKind.PUBLISH:
                # the responder is done: FIN our side too (digest 8.2) so both ends forget
                self._end_our_half(req)
        elif ending is Ending.WITHDRAWN:
            self._out.event(ev.RequestCancelled(rid, None))
        self._forget_if_closed(req)

    def _withdraw_namespaces(self, req: Request) -> None:
        """SUBSCRIBE_NAMESPACE's stream ended: every namespace it announced is done."""
        for ns in sorted(req.namespaces):
            self._out.event(ev.NamespaceWithdrawn(req.request_id, ns))
        req.namespaces.clear()

    def stream_reset(self, stream_id: int, code: int) -> None:
        """The peer reset its half of a request stream: a cancel."""
        req = self._requests.on_stream(stream_id)
        if req is None:
            self._opening.pop(stream_id, None)
        else:
            self._aborted(req, code)

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
        the data streams its PUBLISH_DONE counts are still open."""
        if req.send_closed and req.receive_closed:
            self._requests.close_stream(req)
            if req.publish_done is None:
                self._requests.forget(req)
            if req.kind is RequestKind.SUBSCRIBE and req.side is Side.REQUESTER:
                self._data.abandon_held()  # it may have been the SUBSCRIBE they waited for

    # ------------------------------------------------------------------ API: requests

    def _start_request(self, msg: RequestMessage) -> Request:
        if self._out.closed is not None:
            raise SessionUsageError("session is closed")
        req = self._request(msg, self._opener.open_stream(False), Side.REQUESTER)
        self._requests.add(req)
        self._out.emit(SetStreamPriority(req.stream_id, CONTROL_PRIORITY))
        self._out.emit(SendStreamData(req.stream_id, encode_message(msg)))
        return req

    def _next_rid(self) -> int:
        rid = self._next_request_id
        self._next_request_id += 2
        return rid

    def _alloc_alias(self) -> int:
        alias = self._next_alias
        self._next_alias += 1
        return alias

    def subscribe(self, namespace: TrackNamespace, name: bytes, params: Parameters) -> int:
        """Send SUBSCRIBE; returns its Request ID."""
        return self._start_request(Subscribe(self._next_rid(), tuple(namespace), name,
                                             params)).request_id

    def fetch(self, namespace: TrackNamespace, name: bytes, params: Parameters) -> int:
        """Send FETCH; returns its Request ID."""
        return self._start_request(Fetch(self._next_rid(), tuple(namespace), name,
                                         params)).request_id

    def track_status(self, namespace: TrackNamespace, name: bytes, params: Parameters) -> int:
        """Send TRACK_STATUS; returns its Request ID."""
        return self._start_request(TrackStatus(self._next_rid(), tuple(namespace), name,
                                               params)).request_id

    def publish_namespace(self, namespace: TrackNamespace, params: Parameters) -> int:
        """Send PUBLISH_NAMESPACE; returns its Request ID."""
        return self._start_request(PublishNamespace(self._next_rid(), tuple(namespace),
                                                    params)).request_id

    def subscribe_namespace(self, prefix: TrackNamespace, params: Parameters) -> int:
        """Send SUBSCRIBE_NAMESPACE; returns its Request ID."""
        return self._start_request(SubscribeNamespace(self._next_rid(), tuple(prefix),
                                                      params)).request_id

    def subscribe_tracks(self, prefix: TrackNamespace, params: Parameters) -> int:
        """Send SUBSCRIBE_TRACKS; returns its Request ID."""
        return self._start_request(SubscribeTracks(self._next_rid(), tuple(prefix),
                                                   params)).request_id

    def publish(self, namespace: TrackNamespace, name: bytes, params: Parameters,
                track_properties: Properties, track_alias: int | None) -> int:
        """Send PUBLISH (we publish); returns its Request ID."""
        alias = self._alloc_alias() if track_alias is None else track_alias
        req = self._start_request(Publish(self._next_rid(), tuple(namespace), name, alias,
                                          params, tuple(track_properties)))
        req.track_alias = alias
        return req.request_id

    def request_update(self, request_id: int, params: Parameters) -> int:
        """Send REQUEST_UPDATE for a request we may update; returns the update's ID."""
        req = self._live(request_id)
        limit = self.peer_setup.max_request_updates if self.peer_setup else 0
        if limit and len(req.updates) >= limit:
            raise SessionUsageError("peer's MAX_REQUEST_UPDATES reached")
        uid = self._next_request_id
        self._send(req, RequestUpdate(uid, params))
        self._next_rid()
        self._requests.add_update(uid, req)
        if params.subscriber_priority is not None:
            req.subscriber_priority = params.subscriber_priority
        return uid

    def cancel(self, request_id: int, code: int) -> None:
        """Cancel a request in either role: reset our half, STOP_SENDING theirs."""
        req = self._requests.get(request_id)
        if req is None or self._out.closed is not None:
            return
        if not req.send_closed:
            self._out.emit(ResetStream(req.stream_id, code))
            req.send_closed = True
        if not req.receive_closed:
            self._out.emit(StopSending(req.stream_id, code))
            req.receive_closed = True
        self._data.reset_streams(req, code)
        req.end()
        self._data.unbind_alias(req)
        self._forget_if_closed(req)

    def finish_request(self, request_id: int) -> None:
        """FIN our half of a request stream (we will send nothing more on it)."""
        req = self._requests.get(request_id)
        if req is None or req.send_closed or self._out.closed is not None:
            return
        req.end_of_stream(req.side)
        self._end_our_half(req)
        self._forget_if_closed(req)

    # ------------------------------------------------------------------ API: answers

    def _live(self, request_id: int) -> Request:
        req = self._requests.get(request_id)
        if req is None:
            raise SessionUsageError(f"no request {request_id} (never started, or over and "
                                    "forgotten)")
        return req

    def _send(self, req: Request, msg: Message, fin: bool = False) -> None:
        """Send ``msg`` on the request's stream if the table allows it from our side now
        (SessionUsageError otherwise)."""
        req.sending(type(msg))
        self._out.emit(SendStreamData(req.stream_id, encode_message(msg), end=fin))
        if fin:
            req.send_closed = True
            self._forget_if_closed(req)

    def _answering(self, request_id: int, update_id: int | None,
                   message_type: type[Message]) -> Request | None:
        """The request an answer is for, once the table allows it (SessionUsageError
        otherwise); None once the session is closed (nothing more is sent). The request
        itself is answered while our side is UNANSWERED, an update (``update_id``, now
        settled) after that."""
        if self._out.closed is not None:
            return None
        req = self._live(request_id)
        req.check_send(message_type)
        what = f"{req.kind.name} {request_id}"
        if req.our_state is RequestState.UNANSWERED:
            if update_id is not None:
                raise SessionUsageError(f"answer {what} before its updates")
        elif update_id is None:
            raise SessionUsageError(f"{what} awaits no answer from us "
                                    f"({req.our_state.value}): name the update it answers")
        else:
            try:
                self._requests.answer_update(req, update_id)
            except LookupError as exc:
                raise SessionUsageError(str(exc)) from None
        return req

    def subscribe_ok(self, request_id: int, params: Parameters, track_properties: Properties,
                     track_alias: int | None) -> int:
        """Accept a SUBSCRIBE; returns the Track Alias chosen."""
        alias = self._alloc_alias() if track_alias is None else track_alias
        req = self._answering(request_id, None, SubscribeOk)
        if req is not None:
            self._send(req, SubscribeOk(alias, params, tuple(track_properties)))
            req.track_alias = alias
        return alias

    def fetch_ok(self, request_id: int, end_location: Location, end_of_track: bool,
                 track_properties: Properties) -> None:
        """Accept a FETCH."""
        req = self._answering(request_id, None, FetchOk)
        if req is not None:
            self._send(req, FetchOk(end_of_track, Location(*end_location), Parameters(),
                                    tuple(track_properties)))

    def request_ok(self, request_id: int, params: Parameters, track_properties: Properties,
                   update_id: int | None) -> None:
        """REQUEST_OK answering a request (TRACK_STATUS: then FIN) or one of its updates."""
        req = self._answering(request_id, update_id, RequestOk)
        if req is None:
            return
        final = update_id is None and req.kind is RequestKind.TRACK_STATUS
        self._send(req, RequestOk(params, tuple(track_properties)), fin=final)

    def request_error(self, request_id: int, code: int, reason: str, retry_interval: int,
                      update_id: int | None, redirect: Redirect | None) -> None:
        """Reject a request (REQUEST_ERROR + FIN) or one of its updates."""
        req = self._answering(request_id, update_id, RequestError)
        if req is None:
            return
        msg = RequestError(int(code), retry_interval, reason, redirect)
        if update_id is not None:
            self._send(req, msg)
            return
        self._send(req, msg, fin=True)
        self._data.unbind_alias(req)  # a PUBLISH we refuse
        self._data.reset_streams(req, StreamResetCode.CANCELLED)

    def _stream_message(self, request_id: int, msg: Message) -> None:
        if self._out.closed is None:
            self._send(self._live(request_id), msg)

    def namespace(self, request_id: int, namespace: TrackNamespace) -> None:
        """Send NAMESPACE (suffix of ``namespace`` after the request's prefix)."""
        self._stream_message(request_id, NamespaceMsg(self._suffix(request_id, namespace)))

    def namespace_done(self, request_id: int, namespace: TrackNamespace) -> None:
        """Send NAMESPACE_DONE for a namespace announced earlier."""
        self._stream_message(request_id, NamespaceDone(self._suffix(request_id, namespace)))

    def publish_skipped(self, request_id: int, namespace: TrackNamespace, name: bytes) -> None:
        """Send PUBLISH_SKIPPED on a SUBSCRIBE_TRACKS stream."""
        self._stream_message(request_id,
                             PublishSkipped(self._suffix(request_id, namespace), name))

    def _suffix(self, request_id: int, namespace: TrackNamespace) -> tuple[bytes, ...]:
        prefix = tuple(self._live(request_id).namespace)
        ns = tuple(namespace)
        if ns[: len(prefix)] != prefix:
            raise SessionUsageError("namespace outside the request's prefix")
        return ns[len(prefix):]

    def publish_state_notify(self, request_id: int, params: Parameters) -> None:
        """Send PUBLISH_STATE_NOTIFY on a subscription we publish."""
        self._stream_message(request_id, PublishStateNotify(params))

    def publish_done(self, request_id: int, status: int, reason: str) -> None:
        """End a subscription we publish: FIN its open data streams, then PUBLISH_DONE with
        the stream count and FIN. Does nothing if the request is unknown or over."""
        req = self._requests.get(request_id)
        if req is None or req.finished or self._out.closed is not None:
            return
        req.check_send(PublishDone)
        self._data.finish_streams(req)
        self._send(req, PublishDone(int(status), req.streams_opened, reason), fin=True)

    # ------------------------------------------------------------------ requests, read

    def request(self, request_id: int) -> Request:
        """A request the session keeps state for (SessionUsageError if none)."""
        return self._live(request_id)

    def publishing(self, request_id: int, *, fetch: bool = False) -> Request:
        """The request if we may send objects for it now: a FETCH we answer (``fetch``),
        or else a subscription we publish that has its Track Alias (SUBSCRIBE_OK sent, or
        our PUBLISH). SessionUsageError otherwise."""
        req = self._live(request_id)
        what = f"{req.kind.name} {request_id}"
        if req.publisher_side is not req.side or fetch != (req.kind is RequestKind.FETCH):
            raise SessionUsageError(f"we do not publish {'a FETCH' if fetch else 'a subscription'}"
                                    f" as {what}")
        if req.finished:
            raise SessionUsageError(f"{what} is over")
        if not fetch and req.track_alias is None:
            raise SessionUsageError(f"{what} is not established")
        return req
