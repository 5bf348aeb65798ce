"""The application's calls on a session's request streams: start a request, update, cancel
or finish it, answer the peer's requests and their updates, send the messages a request
stream carries after its answer, and read a request's state.

:class:`RequestCalls` is the half of :class:`kvcs.moqt.control.ControlPlane` the
application drives (through :class:`kvcs.moqt.session.Session`); the other half reads the
control and request streams. Split from control.py, which held both (865 lines).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from . import wire
from .actions import ResetStream, SendStreamData, SetStreamPriority, StopSending, StreamOpener
from .config import UPDATE_COST
from .datastreams import DataStreams
from .errors import SessionUsageError, StreamResetCode
from .outbox import Outbox
from .requests import Request, RequestKind, RequestMessage, RequestRegistry, RequestState, Side

CONTROL_PRIORITY = (0,)
"""Scheduling key of the control and request streams: ahead of every data stream."""


def new_request(msg: RequestMessage, stream_id: int, side: Side,
                parser: wire.ControlStreamParser | None = None) -> Request:
    """The state of a request that ``msg`` starts on ``stream_id``."""
    req = Request(msg.request_id, stream_id, RequestKind(msg.TYPE), side, msg,
                  parser or wire.ControlStreamParser())
    p = msg.params
    if p.subscriber_priority is not None:
        req.subscriber_priority = p.subscriber_priority
    req.descending = p.group_order == wire.GroupOrder.DESCENDING
    return req


class RequestCalls:
    """The application's calls on request streams; :class:`ControlPlane` provides the
    state and the stream bookkeeping declared here."""

    _opener: StreamOpener
    _out: Outbox
    _requests: RequestRegistry
    _data: DataStreams
    _next_request_id: int
    _next_alias: int
    peer_setup: wire.SetupOptions | None
    budget: wire.ByteBudget

    if TYPE_CHECKING:  # provided by ControlPlane (the stream bookkeeping both halves share)
        def _forget_if_closed(self, req: Request) -> None: ...

        def _end_our_half(self, req: Request) -> None: ...

        def _fetch_may_finish(self, req: Request) -> None: ...

    # ------------------------------------------------------------------ API: requests

    def _start_request(self, build: Callable[[int], RequestMessage]) -> Request:
        """Open a request stream, then build the message with the next Request ID: if
        the transport cannot open a stream now (its peer's stream limit), it raises and
        no Request ID is spent (a gap would count against the peer's skipped IDs)."""
        if self._out.closed is not None:
            raise SessionUsageError("session is closed")
        stream_id = self._opener.open_stream(False)
        rid = self._next_request_id
        self._next_request_id += 2
        msg = build(rid)
        req = new_request(msg, stream_id, Side.REQUESTER)
        self._requests.add(req)
        self._out.emit(SetStreamPriority(req.stream_id, CONTROL_PRIORITY))
        self._out.emit(SendStreamData(req.stream_id, wire.encode_message(msg)))
        return req

    def _alloc_alias(self) -> int:
        alias = self._next_alias
        self._next_alias += 1
        return alias

    def subscribe(self, namespace: wire.TrackNamespace, name: bytes,
                  params: wire.Parameters) -> int:
        """Send SUBSCRIBE; returns its Request ID."""
        ns = tuple(namespace)
        return self._start_request(lambda rid: wire.Subscribe(rid, ns, name, params)).request_id

    def fetch(self, namespace: wire.TrackNamespace, name: bytes, params: wire.Parameters) -> int:
        """Send FETCH; returns its Request ID."""
        ns = tuple(namespace)
        return self._start_request(lambda rid: wire.Fetch(rid, ns, name, params)).request_id

    def track_status(self, namespace: wire.TrackNamespace, name: bytes,
                     params: wire.Parameters) -> int:
        """Send TRACK_STATUS; returns its Request ID."""
        ns = tuple(namespace)
        return self._start_request(lambda rid: wire.TrackStatus(rid, ns, name, params)).request_id

    def publish_namespace(self, namespace: wire.TrackNamespace, params: wire.Parameters) -> int:
        """Send PUBLISH_NAMESPACE; returns its Request ID."""
        ns = tuple(namespace)
        return self._start_request(lambda rid: wire.PublishNamespace(rid, ns, params)).request_id

    def subscribe_namespace(self, prefix: wire.TrackNamespace, params: wire.Parameters) -> int:
        """Send SUBSCRIBE_NAMESPACE; returns its Request ID."""
        ns = tuple(prefix)
        return self._start_request(lambda rid: wire.SubscribeNamespace(rid, ns, params)).request_id

    def subscribe_tracks(self, prefix: wire.TrackNamespace, params: wire.Parameters) -> int:
        """Send SUBSCRIBE_TRACKS; returns its Request ID."""
        ns = tuple(prefix)
        return self._start_request(lambda rid: wire.SubscribeTracks(rid, ns, params)).request_id

    def publish(self, namespace: wire.TrackNamespace, name: bytes, params: wire.Parameters,
                track_properties: wire.Properties, track_alias: int | None) -> int:
        """Send PUBLISH (we publish); returns its Request ID."""
        alias = self._alloc_alias() if track_alias is None else track_alias
        ns, props = tuple(namespace), tuple(track_properties)
        req = self._start_request(lambda rid: wire.Publish(rid, ns, name, alias, params, props))
        req.track_alias = alias
        return req.request_id

    def request_update(self, request_id: int, params: wire.Parameters) -> int:
        """Send REQUEST_UPDATE for a request we may update; returns the update's ID."""
        req = self._live(request_id)
        limit = self.peer_setup.max_request_updates if self.peer_setup else 0
        if limit and len(req.updates) >= limit:
            raise SessionUsageError("peer's MAX_REQUEST_UPDATES reached")
        uid = self._next_request_id
        self._send(req, wire.RequestUpdate(uid, params))
        self._next_request_id += 2
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
        req.publish_done = None  # over: the streams it counted no longer matter
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

    def _send(self, req: Request, msg: wire.Message, fin: bool = False) -> None:
        """Send ``msg`` on the request's stream if the table allows it from our side now
        (SessionUsageError otherwise)."""
        req.sending(type(msg))
        self._out.emit(SendStreamData(req.stream_id, wire.encode_message(msg), end=fin))
        if fin:
            req.send_closed = True
            self._forget_if_closed(req)

    def _answering(self, request_id: int, update_id: int | None,
                   message_type: type[wire.Message]) -> Request | None:
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
            req.charged -= UPDATE_COST
            self.budget.give(UPDATE_COST)
        return req

    def subscribe_ok(self, request_id: int, params: wire.Parameters,
                     track_properties: wire.Properties, track_alias: int | None) -> int:
        """Accept a SUBSCRIBE; returns the Track Alias chosen."""
        alias = self._alloc_alias() if track_alias is None else track_alias
        req = self._answering(request_id, None, wire.SubscribeOk)
        if req is not None:
            self._send(req, wire.SubscribeOk(alias, params, tuple(track_properties)))
            req.track_alias = alias
        return alias

    def fetch_ok(self, request_id: int, end_location: wire.Location, end_of_track: bool,
                 track_properties: wire.Properties) -> None:
        """Accept a FETCH."""
        req = self._answering(request_id, None, wire.FetchOk)
        if req is not None:
            self._send(req, wire.FetchOk(end_of_track, wire.Location(*end_location),
                                         wire.Parameters(), tuple(track_properties)))
            self._fetch_may_finish(req)  # its fetch stream may have ended already

    def request_ok(self, request_id: int, params: wire.Parameters,
                   track_properties: wire.Properties, update_id: int | None) -> None:
        """REQUEST_OK answering a request (TRACK_STATUS: then FIN) or one of its updates."""
        req = self._answering(request_id, update_id, wire.RequestOk)
        if req is None:
            return
        final = update_id is None and req.kind is RequestKind.TRACK_STATUS
        self._send(req, wire.RequestOk(params, tuple(track_properties)), fin=final)

    def request_error(self, request_id: int, code: int, reason: str, retry_interval: int,
                      update_id: int | None, redirect: wire.Redirect | None) -> None:
        """Reject a request (REQUEST_ERROR + FIN) or one of its updates."""
        req = self._answering(request_id, update_id, wire.RequestError)
        if req is None:
            return
        msg = wire.RequestError(int(code), retry_interval, reason, redirect)
        if update_id is not None:
            self._send(req, msg)
            return
        self._send(req, msg, fin=True)
        self._data.unbind_alias(req)  # a PUBLISH we refuse
        self._data.reset_streams(req, StreamResetCode.CANCELLED)

    def _stream_message(self, request_id: int, msg: wire.Message) -> None:
        if self._out.closed is None:
            self._send(self._live(request_id), msg)

    def namespace(self, request_id: int, namespace: wire.TrackNamespace) -> None:
        """Send NAMESPACE (suffix of ``namespace`` after the request's prefix)."""
        self._stream_message(request_id, wire.NamespaceMsg(self._suffix(request_id, namespace)))

    def namespace_done(self, request_id: int, namespace: wire.TrackNamespace) -> None:
        """Send NAMESPACE_DONE for a namespace announced earlier."""
        self._stream_message(request_id, wire.NamespaceDone(self._suffix(request_id, namespace)))

    def publish_skipped(self, request_id: int, namespace: wire.TrackNamespace, name: bytes) -> None:
        """Send PUBLISH_SKIPPED on a SUBSCRIBE_TRACKS stream."""
        self._stream_message(request_id,
                             wire.PublishSkipped(self._suffix(request_id, namespace), name))

    def _suffix(self, request_id: int, namespace: wire.TrackNamespace) -> tuple[bytes, ...]:
        prefix = tuple(self._live(request_id).namespace)
        ns = tuple(namespace)
        if ns[: len(prefix)] != prefix:
            raise SessionUsageError("namespace outside the request's prefix")
        return ns[len(prefix):]

    def publish_state_notify(self, request_id: int, params: wire.Parameters) -> None:
        """Send PUBLISH_STATE_NOTIFY on a subscription we publish."""
        self._stream_message(request_id, wire.PublishStateNotify(params))

    def publish_done(self, request_id: int, status: int, reason: str) -> None:
        """End a subscription we publish: FIN its open data streams, then PUBLISH_DONE with
        the stream count and FIN. Does nothing if the request is unknown or over."""
        req = self._requests.get(request_id)
        if req is None or req.finished or self._out.closed is not None:
            return
        req.check_send(wire.PublishDone)
        self._data.finish_streams(req)
        self._send(req, wire.PublishDone(int(status), req.streams_opened, reason), fin=True)

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
