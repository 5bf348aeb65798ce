"""The sans-IO MOQT draft-22 session state machine.

One :class:`Session` per QUIC connection (or WebTransport session), in either role. It
consumes stream and datagram events (:meth:`stream_data`, :meth:`stream_reset`,
:meth:`stop_sending`, :meth:`datagram`), and API calls from the application (requests,
answers, objects), and produces

* actions for the I/O binding (:meth:`actions`: bytes to write per stream, resets,
  STOP_SENDING, datagrams, the session close), and
* events for the application (:meth:`next_event`).

It owns the SETUP exchange on the unidirectional control streams (requests and data that
arrive before the peer's SETUP are buffered), request-ID parity and reuse checks, one
bidirectional stream per request with its lifecycle and allowed messages, REQUEST_UPDATE
bookkeeping (MAX_REQUEST_UPDATES), data stream framing in both directions, PUBLISH_DONE
stream counting, GOAWAY and session close with the draft's codes. It knows nothing about
tracks: serving objects from a store and relaying are applications of this class.

No sockets and no asyncio here: it is tested byte by byte.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import events as ev
from .actions import (
    Action,
    CloseSession,
    ResetStream,
    SendDatagram,
    SendStreamData,
    SetStreamPriority,
    StopSending,
    StreamOpener,
)
from .errors import ProtocolError, SessionCode, StreamResetCode, violation
from .wire import (
    MAX_VI64,
    AuthToken,
    ControlStreamParser,
    DataStreamParser,
    EndOfRange,
    Fetch,
    FetchHeader,
    FetchOk,
    FetchWriter,
    GoAway,
    GroupOrder,
    Location,
    Message,
    NamespaceDone,
    NamespaceMsg,
    NeedMore,
    ObjectRecord,
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
    SubgroupHeader,
    SubgroupWriter,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    TrackNamespace,
    TrackStatus,
    decode_datagram,
    decode_vi64,
    encode_datagram,
    encode_message,
    validate_full_name,
    validate_namespace,
)

log = logging.getLogger(__name__)

SETUP_TYPE = 0x2F00
MAX_SKIPPED_REQUEST_IDS = 4096
"""Peer Request IDs that may be outstanding below the highest one seen. Each request has
its own stream, so requests arrive out of order; a peer cannot have many more requests in
flight than its open bidirectional streams, so a larger gap is treated as invalid."""
CONTROL_PRIORITY = (0,)
_KIND_SUBSCRIBE = Subscribe.TYPE
_KIND_PUBLISH = Publish.TYPE
_KIND_FETCH = Fetch.TYPE
_KIND_TRACK_STATUS = TrackStatus.TYPE
_KIND_PUBLISH_NS = PublishNamespace.TYPE
_KIND_SUBSCRIBE_NS = SubscribeNamespace.TYPE
_KIND_SUBSCRIBE_TRACKS = SubscribeTracks.TYPE
_SUBSCRIPTIONS = frozenset({_KIND_SUBSCRIBE, _KIND_PUBLISH})
_UPDATABLE = frozenset(
    {
        _KIND_SUBSCRIBE,
        _KIND_PUBLISH,
        _KIND_FETCH,
        _KIND_PUBLISH_NS,
        _KIND_SUBSCRIBE_NS,
        _KIND_SUBSCRIBE_TRACKS,
    }
)
UNKNOWN_STREAM_COUNT = MAX_VI64


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


@dataclass(slots=True)
class Request:
    """State of one request and its bidirectional stream (either direction)."""

    request_id: int
    stream_id: int
    kind: int
    local: bool
    message: Message
    parser: ControlStreamParser = field(default_factory=ControlStreamParser)
    responded: bool = False
    established: bool = False
    finished: bool = False  # final response (error / done / status ok) sent or received
    local_fin: bool = False
    remote_fin: bool = False
    subscriber_priority: int = 128
    descending: bool = False
    track_alias: int | None = None
    # publisher side of a subscription / fetch
    streams_opened: int = 0
    open_streams: set[int] = field(default_factory=set)
    # subscriber side of a subscription
    done: PublishDone | None = None
    streams_ended: int = 0
    ended: bool = False  # SubscriptionEnded was reported
    # REQUEST_UPDATE bookkeeping: ids we sent and await answers for (FIFO), or ids the
    # peer sent and we have not answered yet
    updates: deque[int] = field(default_factory=deque)
    # SUBSCRIBE_NAMESPACE requester: announced namespaces
    namespaces: set[TrackNamespace] = field(default_factory=set)
    goaway_seen: bool = False

    @property
    def namespace(self) -> TrackNamespace:
        """The request's namespace or namespace prefix."""
        m = self.message
        if isinstance(m, SubscribeNamespace | SubscribeTracks):
            return m.namespace_prefix
        return m.namespace  # type: ignore[union-attr]


@dataclass(slots=True)
class _DataStream:
    stream_id: int
    parser: DataStreamParser | None = None
    prefix: bytearray | None = None  # bytes before the stream type is known
    request: Request | None = None
    kind: str = ""
    fill_id: int | None = None
    alias: int | None = None
    held: list[ObjectRecord | EndOfRange] | None = None  # waiting for the alias to be known
    held_end: int | bool | None = False  # False: not ended; None: FIN; int: reset code
    abandoned: bool = False


@dataclass(slots=True)
class _SendStream:
    request: Request
    writer: SubgroupWriter | FetchWriter
    kind: str
    wants_writable: bool = False


class Session:
    """A sans-IO MOQT draft-22 session. See the module docstring."""

    def __init__(self, config: SessionConfig, opener: StreamOpener) -> None:
        self.config = config
        self._opener = opener
        self._actions: list[Action] = []
        self._events: deque[ev.Event] = deque()
        self.closed: tuple[int, str] | None = None
        self.peer_setup: SetupOptions | None = None
        self._peer_control: int | None = None
        self._peer_control_parser = ControlStreamParser()
        self._goaway_received = False
        self._goaway_sent = False
        self._next_request_id = 0 if config.is_client else 1
        self._peer_parity = 1 if config.is_client else 0
        self._peer_next_request_id = self._peer_parity
        self._peer_skipped_ids: set[int] = set()  # below the next one, not yet seen
        self._requests: dict[int, Request] = {}  # request id -> request
        self._by_stream: dict[int, Request] = {}  # bidi stream id -> request
        self._opening: dict[int, ControlStreamParser] = {}  # peer bidi, first msg partial
        self._updates: dict[int, Request] = {}  # update id -> request (both directions)
        self._data: dict[int, _DataStream] = {}  # peer uni streams
        self._send: dict[int, _SendStream] = {}  # our uni streams
        self._aliases: dict[int, Request] = {}  # track alias -> subscription (subscriber)
        self._pending_alias: dict[int, list[_DataStream]] = {}
        self._next_alias = 0
        self._pre_setup: list[tuple[str, tuple[object, ...]]] = []
        self._pre_setup_bytes = 0
        self._control = opener.open_stream(True)
        self._emit(SetStreamPriority(self._control, CONTROL_PRIORITY))
        opts = SetupOptions(
            implementation=config.implementation,
            max_filter_ranges=config.max_filter_ranges,
            max_request_updates=config.max_request_updates,
            auth_tokens=config.auth_tokens,
        )
        if config.is_client and not config.webtransport:
            opts.path = config.path
            opts.authority = config.authority
        self._emit(SendStreamData(self._control, encode_message(Setup(opts))))

    # ------------------------------------------------------------------ plumbing

    def actions(self) -> list[Action]:
        """Return and clear the actions produced so far."""
        out = self._actions
        self._actions = []
        return out

    def next_event(self) -> ev.Event | None:
        """Return the next event for the application, or None."""
        return self._events.popleft() if self._events else None

    def events(self) -> Iterable[ev.Event]:
        """Drain all pending events."""
        while self._events:
            yield self._events.popleft()

    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _event(self, event: ev.Event) -> None:
        self._events.append(event)

    @property
    def is_closed(self) -> bool:
        """True once the session has been closed by either side."""
        return self.closed is not None

    def close(self, code: int = SessionCode.NO_ERROR, reason: str = "") -> None:
        """Close the session with a session termination code."""
        if self.closed is not None:
            return
        self.closed = (int(code), reason)
        self._emit(CloseSession(int(code), reason))
        self._event(ev.SessionClosed(int(code), reason, by_peer=False))

    def connection_lost(self, code: int | None, reason: str) -> None:
        """The transport is gone (peer close, idle timeout, ...)."""
        if self.closed is not None:
            return
        self.closed = (code if code is not None else SessionCode.INTERNAL_ERROR, reason)
        self._event(ev.SessionClosed(self.closed[0], reason, by_peer=True))

    def _fail(self, exc: ProtocolError) -> None:
        log.warning("closing MOQT session: %s", exc)
        self.close(exc.code, exc.reason[:1000])

    # ------------------------------------------------------------------ stream ids

    def _is_uni(self, sid: int) -> bool:
        return bool(sid & 2)

    def _is_local(self, sid: int) -> bool:
        return (sid & 1) == (0 if self.config.is_client else 1)

    # ------------------------------------------------------------------ inputs

    def stream_data(self, stream_id: int, data: bytes | memoryview, end: bool) -> None:
        """Bytes (and possibly FIN) arrived on a stream."""
        if self.closed is not None:
            return
        ds = self._data.get(stream_id)
        try:
            if ds is not None and ds.request is not None and ds.held is None \
                    and ds.parser is not None and not ds.abandoned:
                # hot path: more bytes of a data stream already attributed to a request
                self._feed(ds, data, end)
                return
            self._stream_data(stream_id, data, end)
        except ProtocolError as exc:
            self._fail(exc)

    def _stream_data(self, sid: int, data: bytes | memoryview, end: bool) -> None:
        if sid == self._peer_control:
            self._control_data(data, end)
            return
        if self._is_uni(sid):
            if self._is_local(sid):
                raise violation("data on our own unidirectional stream")
            self._uni_data(sid, data, end)
            return
        if self.peer_setup is None and not self._is_local(sid):
            self._buffer("_bidi_data", (sid, bytes(data), end), len(data))
            return
        self._bidi_data(sid, data, end)

    def _buffer(self, method: str, args: tuple[object, ...], size: int) -> None:
        self._pre_setup_bytes += size
        if self._pre_setup_bytes > self.config.setup_buffer_limit:
            raise violation("too much data before SETUP")
        self._pre_setup.append((method, args))

    def stream_reset(self, stream_id: int, code: int) -> None:
        """The peer reset its send side of a stream (RESET_STREAM)."""
        if self.closed is not None:
            return
        try:
            self._stream_reset(stream_id, code)
        except ProtocolError as exc:
            self._fail(exc)

    def _stream_reset(self, sid: int, code: int) -> None:
        if sid == self._peer_control:
            raise violation("control stream reset")
        if self._is_uni(sid):
            ds = self._data.get(sid)
            if ds is None and self.peer_setup is None:
                self._buffer("_stream_reset", (sid, code), 0)
                return
            if ds is not None:
                self._data_ended(ds, code)
            return
        req = self._by_stream.get(sid)
        if req is None:
            if self._opening.pop(sid, None) is None and self.peer_setup is None:
                self._buffer("_stream_reset", (sid, code), 0)
            return
        req.remote_fin = True
        self._request_aborted(req, code)

    def stop_sending(self, stream_id: int, code: int) -> None:
        """The peer asked us to stop sending on a stream (STOP_SENDING)."""
        if self.closed is not None:
            return
        if stream_id == self._control:
            self._fail(violation("STOP_SENDING on the control stream"))
            return
        send = self._send.pop(stream_id, None)
        if send is not None:
            send.request.open_streams.discard(stream_id)
            self._emit(ResetStream(stream_id, code))
            return
        req = self._by_stream.get(stream_id)
        if req is not None:
            if not req.local_fin:
                req.local_fin = True
                self._emit(ResetStream(stream_id, code))
            self._request_aborted(req, code)

    def datagram(self, data: bytes | memoryview) -> None:
        """A QUIC DATAGRAM arrived."""
        if self.closed is not None:
            return
        try:
            if self.peer_setup is None:
                self._buffer("_datagram", (bytes(data),), len(data))
                return
            self._datagram(data)
        except ProtocolError as exc:
            self._fail(exc)

    def _datagram(self, data: bytes | memoryview) -> None:
        decoded = decode_datagram(memoryview(data))
        if decoded is None:
            return  # padding
        alias, record, _eog = decoded
        req = self._aliases.get(alias)
        if req is None:
            return  # unknown alias: drop
        self._event(ev.ObjectReceived(req.request_id, record, -1))

    # ------------------------------------------------------------------ control stream

    def _control_data(self, data: bytes | memoryview, end: bool) -> None:
        for msg in self._peer_control_parser.feed(data):
            if isinstance(msg, Setup):
                if self.peer_setup is not None:
                    raise violation("second SETUP")
                self._on_setup(msg.options)
            elif self.peer_setup is None:
                raise violation("first message on the control stream is not SETUP")
            elif isinstance(msg, GoAway):
                self._on_goaway(msg, None)
            else:
                raise violation(f"{type(msg).__name__} on the control stream")
        if end:
            raise violation("control stream closed")

    def _on_setup(self, opts: SetupOptions) -> None:
        if self.config.is_client and (opts.path is not None or opts.authority is not None):
            if opts.path is not None:
                raise ProtocolError(SessionCode.INVALID_PATH, "PATH option from a server")
            raise ProtocolError(SessionCode.INVALID_AUTHORITY, "AUTHORITY option from a server")
        if self.config.webtransport and opts.path is not None:
            raise ProtocolError(SessionCode.INVALID_PATH, "PATH option over WebTransport")
        if self.config.webtransport and opts.authority is not None:
            raise ProtocolError(SessionCode.INVALID_AUTHORITY, "AUTHORITY over WebTransport")
        if opts.path is not None and not bytes(opts.path).startswith(b"/") and opts.path != b"":
            raise ProtocolError(SessionCode.MALFORMED_PATH, "PATH must start with '/'")
        for tok in opts.auth_tokens:
            if tok.alias_type in (0, 2):
                raise violation("DELETE or USE_ALIAS token in SETUP")
        self.peer_setup = opts
        self._event(ev.SessionEstablished(opts))
        pending, self._pre_setup = self._pre_setup, []
        self._pre_setup_bytes = 0
        for method, args in pending:
            getattr(self, method)(*args)

    def _on_goaway(self, msg: GoAway, req: Request | None) -> None:
        if msg.new_session_uri and not self.config.is_client:
            raise violation("GOAWAY with a URI from a client")
        if req is None:
            if self._goaway_received:
                raise violation("second GOAWAY on the control stream")
            self._goaway_received = True
        else:
            if req.goaway_seen:
                raise violation("second GOAWAY on a request stream")
            req.goaway_seen = True
        rid = req.request_id if req else None
        self._event(ev.GoAwayReceived(bytes(msg.new_session_uri), msg.timeout_ms, rid))

    # ------------------------------------------------------------------ uni streams

    def _uni_data(self, sid: int, data: bytes | memoryview, end: bool) -> None:
        ds = self._data.get(sid)
        if ds is None:
            ds = self._data[sid] = _DataStream(sid, prefix=bytearray())
        if ds.parser is None:
            assert ds.prefix is not None
            ds.prefix += data
            try:
                stream_type, _ = decode_vi64(ds.prefix, 0)
            except NeedMore:
                if end:
                    raise violation("unidirectional stream ended inside its type") from None
                return
            if stream_type == SETUP_TYPE:
                if self._peer_control is not None:
                    raise violation("second control stream")
                del self._data[sid]
                self._peer_control = sid
                self._control_data(memoryview(bytes(ds.prefix)), end)
                return
            if self.peer_setup is None:
                self._buffer("_uni_data", (sid, b"", end), len(data))
                return
            ds.parser = DataStreamParser(self._fetch_descending)
            data, ds.prefix = memoryview(bytes(ds.prefix)), None
        elif self.peer_setup is None:
            self._buffer("_uni_data", (sid, bytes(data), end), len(data))
            return
        if ds.abandoned:
            return
        self._feed(ds, data, end)

    def _feed(self, ds: _DataStream, data: bytes | memoryview, end: bool) -> None:
        """Parse more bytes of a data stream whose type is known; deliver what they hold."""
        assert ds.parser is not None
        items = ds.parser.feed(data)
        if items:
            self._data_items(ds, items)
        if end:
            ds.parser.finish()
            self._data_ended(ds, None)

    def _fetch_descending(self, request_id: int) -> bool:
        req = self._requests.get(request_id) or self._updates.get(request_id)
        return bool(req and req.descending)

    def _data_items(self, ds: _DataStream, items: list) -> None:
        for item in items:
            if isinstance(item, SubgroupHeader):
                ds.kind = "subgroup"
                ds.alias = item.track_alias
                req = self._aliases.get(item.track_alias)
                if req is None:
                    if self._subscribes_pending():
                        ds.held = []
                        self._pending_alias.setdefault(item.track_alias, []).append(ds)
                    else:
                        self._abandon(ds)
                        return
                else:
                    ds.request = req
            elif isinstance(item, FetchHeader):
                ds.kind = "fetch"
                rid = item.request_id
                req = self._requests.get(rid)
                if req is not None and req.local and req.kind == _KIND_FETCH:
                    ds.request = req
                    continue
                target = req if req is not None else self._updates.get(rid)
                if target is None or not _we_subscribe(target):
                    self._abandon(ds)
                    return
                ds.request = target
                ds.fill_id = rid
            elif ds.held is not None:
                ds.held.append(item)
            elif ds.request is not None:
                self._deliver(ds, item)

    def _deliver(self, ds: _DataStream, item: ObjectRecord | EndOfRange) -> None:
        req = ds.request
        assert req is not None
        if isinstance(item, ObjectRecord):
            self._event(ev.ObjectReceived(req.request_id, item, ds.stream_id, ds.fill_id))
        else:
            self._event(ev.RangeMarkerReceived(req.request_id, item, ds.stream_id, ds.fill_id))

    def _abandon(self, ds: _DataStream) -> None:
        ds.abandoned = True
        ds.held = None
        log.debug("abandoning data stream %d (unknown alias or request)", ds.stream_id)
        self._emit(StopSending(ds.stream_id, StreamResetCode.CANCELLED))

    def _data_ended(self, ds: _DataStream, reset_code: int | None) -> None:
        if ds.held is not None:
            ds.held_end = reset_code
            return
        self._data.pop(ds.stream_id, None)
        req = ds.request
        if req is None or ds.abandoned:
            return
        self._event(ev.DataStreamEnded(req.request_id, ds.stream_id, ds.kind, reset_code,
                                       ds.fill_id))
        if _we_subscribe(req):
            req.streams_ended += 1
            self._maybe_subscription_ended(req)

    def _resolve_alias(self, alias: int, req: Request) -> None:
        for ds in self._pending_alias.pop(alias, []):
            held, ds.held = ds.held or [], None
            ds.request = req
            for item in held:
                self._deliver(ds, item)
            if ds.held_end is not False:
                code = ds.held_end
                self._data_ended(ds, None if code is None else int(code))

    def _subscribes_pending(self) -> bool:
        return any(r.kind == _KIND_SUBSCRIBE and r.local and not r.responded
                   for r in self._requests.values())

    def _drop_unresolved_aliases(self) -> None:
        if self._subscribes_pending():
            return
        for streams in self._pending_alias.values():
            for ds in streams:
                self._abandon(ds)
                self._data.pop(ds.stream_id, None)
        self._pending_alias.clear()

    # ------------------------------------------------------------------ bidi streams

    def _bidi_data(self, sid: int, data: bytes | memoryview, end: bool) -> None:
        req = self._by_stream.get(sid)
        if req is not None:
            msgs = req.parser.feed(data)
        elif self._is_local(sid):
            return  # a request we already forgot
        else:
            # a new request stream: wait until its first message is complete
            parser = self._opening.get(sid) or ControlStreamParser()
            msgs = parser.feed(data)
            if not msgs:
                if end:
                    raise violation("request stream ended before its first message")
                self._opening[sid] = parser
                return
            self._opening.pop(sid, None)
            req = self._new_peer_request(sid, msgs[0], parser)
            msgs = msgs[1:]
        for msg in msgs:
            if req.local:
                self._on_response(req, msg)
            else:
                self._on_requester_message(req, msg)
        if end:
            if req.parser.buffered:
                raise violation("request stream ended inside a message")
            req.remote_fin = True
            self._on_remote_fin(req)

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

    def _new_peer_request(self, sid: int, msg: Message, parser: ControlStreamParser) -> Request:
        if not isinstance(
            msg,
            Subscribe | Publish | Fetch | TrackStatus | PublishNamespace | SubscribeNamespace
            | SubscribeTracks,
        ):
            raise violation(f"{type(msg).__name__} cannot start a request")
        self._check_peer_request_id(msg.request_id)
        if isinstance(msg, Subscribe | Fetch | TrackStatus | Publish):
            validate_full_name(msg.namespace, msg.name)
        elif isinstance(msg, PublishNamespace):
            validate_namespace(msg.namespace)
        req = Request(msg.request_id, sid, msg.TYPE, False, msg, parser=parser)
        p = msg.params
        if p.subscriber_priority is not None:
            req.subscriber_priority = p.subscriber_priority
        if p.group_order == GroupOrder.DESCENDING:
            req.descending = True
        if isinstance(msg, Publish):
            req.track_alias = msg.track_alias
            if msg.track_alias in self._aliases:
                raise ProtocolError(SessionCode.DUPLICATE_TRACK_ALIAS,
                                    f"track alias {msg.track_alias} in use")
            self._aliases[msg.track_alias] = req
            req.established = True
        self._requests[req.request_id] = req
        self._by_stream[sid] = req
        self._event(ev.RequestReceived(req.request_id, msg))
        return req

    def _on_requester_message(self, req: Request, msg: Message) -> None:
        """A message from the peer on a request it started (we respond)."""
        if isinstance(msg, GoAway):
            self._on_goaway(msg, req)
            return
        if isinstance(msg, RequestUpdate):
            if req.kind not in _UPDATABLE or req.kind == _KIND_PUBLISH:
                raise violation("REQUEST_UPDATE not allowed on this request")
            self._peer_update(req, msg)
            return
        if req.kind == _KIND_PUBLISH and isinstance(msg, PublishDone):
            if req.done is not None:
                raise violation("second PUBLISH_DONE")
            req.done = msg
            req.finished = True
            self._maybe_subscription_ended(req)
            return
        if req.kind == _KIND_PUBLISH and isinstance(msg, PublishStateNotify):
            self._event(ev.PublishStateNotified(req.request_id, msg))
            return
        if req.kind == _KIND_PUBLISH and isinstance(msg, RequestOk | RequestError):
            self._update_answered(req, msg)
            return
        raise violation(f"{type(msg).__name__} from the requester")

    def _update_answered(self, req: Request, msg: RequestOk | RequestError) -> None:
        if not req.updates:
            raise violation(f"{type(msg).__name__} without an outstanding REQUEST_UPDATE")
        uid = req.updates.popleft()
        if isinstance(msg, RequestOk):
            self._event(ev.RequestAccepted(req.request_id, msg, uid))
        else:
            self._event(ev.RequestRejected(req.request_id, msg, uid))

    def _peer_update(self, req: Request, msg: RequestUpdate) -> None:
        self._check_peer_request_id(msg.request_id)
        limit = self.config.max_request_updates
        if limit and len(req.updates) >= limit:
            raise ProtocolError(SessionCode.TOO_MANY_REQUEST_UPDATES, "too many REQUEST_UPDATEs")
        req.updates.append(msg.request_id)
        self._updates[msg.request_id] = req
        if msg.params.subscriber_priority is not None:
            req.subscriber_priority = msg.params.subscriber_priority
        self._event(ev.UpdateReceived(req.request_id, msg.request_id, msg.params))

    def _on_response(self, req: Request, msg: Message) -> None:
        """A message from the peer on a request we started."""
        if isinstance(msg, GoAway):
            self._on_goaway(msg, req)
            return
        kind = req.kind
        if not req.responded:
            if isinstance(msg, RequestError):
                req.responded = req.finished = True
                self._event(ev.RequestRejected(req.request_id, msg))
                self._forget_alias_wait()
                return
            if kind == _KIND_SUBSCRIBE and isinstance(msg, SubscribeOk):
                req.responded = req.established = True
                self._subscribe_ok(req, msg)
                return
            if kind == _KIND_FETCH and isinstance(msg, FetchOk):
                req.responded = True
                self._event(ev.FetchAccepted(req.request_id, msg))
                return
            if kind not in (_KIND_SUBSCRIBE, _KIND_FETCH) and isinstance(msg, RequestOk):
                req.responded = req.established = True
                if kind == _KIND_TRACK_STATUS:
                    req.finished = True
                elif msg.track_properties:
                    raise violation("REQUEST_OK with Track Properties")
                self._event(ev.RequestAccepted(req.request_id, msg))
                return
            raise violation(f"{type(msg).__name__} as the first response")
        if kind == _KIND_PUBLISH and isinstance(msg, RequestUpdate):
            self._peer_update(req, msg)
            return
        if isinstance(msg, RequestOk | RequestError):
            self._update_answered(req, msg)
            return
        if kind == _KIND_SUBSCRIBE and isinstance(msg, PublishDone):
            if req.done is not None:
                raise violation("second PUBLISH_DONE")
            req.done = msg
            req.finished = True
            self._maybe_subscription_ended(req)
            return
        if kind == _KIND_SUBSCRIBE and isinstance(msg, PublishStateNotify):
            self._event(ev.PublishStateNotified(req.request_id, msg))
            return
        if kind == _KIND_SUBSCRIBE_NS and isinstance(msg, NamespaceMsg):
            ns = tuple(req.namespace) + tuple(msg.suffix)
            validate_namespace(ns)
            req.namespaces.add(ns)
            self._event(ev.NamespaceAnnounced(req.request_id, ns))
            return
        if kind == _KIND_SUBSCRIBE_NS and isinstance(msg, NamespaceDone):
            ns = tuple(req.namespace) + tuple(msg.suffix)
            if ns not in req.namespaces:
                raise violation("NAMESPACE_DONE before its NAMESPACE")
            req.namespaces.discard(ns)
            self._event(ev.NamespaceWithdrawn(req.request_id, ns))
            return
        if kind == _KIND_SUBSCRIBE_TRACKS and isinstance(msg, PublishSkipped):
            ns = tuple(req.namespace) + tuple(msg.suffix)
            self._event(ev.PublishSkippedReceived(req.request_id, ns, bytes(msg.name)))
            return
        raise violation(f"unexpected {type(msg).__name__} on a request stream")

    def _subscribe_ok(self, req: Request, msg: SubscribeOk) -> None:
        alias = msg.track_alias
        other = self._aliases.get(alias)
        if other is not None and other is not req:
            same = (tuple(other.namespace), getattr(other.message, "name", None)) == (
                tuple(req.namespace), getattr(req.message, "name", None))
            if not same and not other.finished:
                raise ProtocolError(SessionCode.DUPLICATE_TRACK_ALIAS, f"track alias {alias}")
        req.track_alias = alias
        self._aliases[alias] = req
        self._event(ev.SubscribeAccepted(req.request_id, msg))
        self._resolve_alias(alias, req)
        self._forget_alias_wait()

    def _forget_alias_wait(self) -> None:
        if self._pending_alias:
            self._drop_unresolved_aliases()

    def _maybe_subscription_ended(self, req: Request) -> None:
        done = req.done
        if done is None:
            return
        if done.stream_count != UNKNOWN_STREAM_COUNT and req.streams_ended < done.stream_count:
            return
        if done.stream_count == UNKNOWN_STREAM_COUNT and any(
            ds.request is req for ds in self._data.values()
        ):
            return
        if req.track_alias is not None and self._aliases.get(req.track_alias) is req:
            del self._aliases[req.track_alias]
        req.ended = True
        self._event(ev.SubscriptionEnded(req.request_id, done))
        self._maybe_forget(req)

    def _on_remote_fin(self, req: Request) -> None:
        if req.local:
            if req.kind == _KIND_SUBSCRIBE_NS:
                for ns in sorted(req.namespaces):
                    self._event(ev.NamespaceWithdrawn(req.request_id, ns))
                req.namespaces.clear()
            if not req.finished and not (req.kind == _KIND_FETCH and req.responded):
                if req.kind in (_KIND_SUBSCRIBE_NS, _KIND_SUBSCRIBE_TRACKS, _KIND_PUBLISH_NS) \
                        and req.responded:
                    self._event(ev.RequestFailed(req.request_id, None, "responder ended"))
                elif not req.responded or req.kind in _SUBSCRIPTIONS:
                    self._event(ev.RequestFailed(req.request_id, None,
                                                 "stream ended without a final response"))
                req.finished = True
            if not req.local_fin and req.kind != _KIND_PUBLISH:
                # the responder is done: FIN our side too (digest 8.2) so both ends forget
                req.local_fin = True
                self._emit(SendStreamData(req.stream_id, b"", end=True))
        elif req.kind in (_KIND_PUBLISH, _KIND_PUBLISH_NS, _KIND_SUBSCRIBE_NS,
                          _KIND_SUBSCRIBE_TRACKS) and not req.finished:
            # the requester withdrew (PUBLISH without PUBLISH_DONE, or a namespace request)
            self._event(ev.RequestCancelled(req.request_id, None))
        self._maybe_forget(req)

    def _request_aborted(self, req: Request, code: int) -> None:
        """The peer reset or stopped the request stream: a cancel."""
        if req.local:
            if req.kind == _KIND_SUBSCRIBE_NS:
                for ns in sorted(req.namespaces):
                    self._event(ev.NamespaceWithdrawn(req.request_id, ns))
                req.namespaces.clear()
            if not req.finished:
                self._event(ev.RequestFailed(req.request_id, code, "request stream reset"))
            req.finished = True
        else:
            self._event(ev.RequestCancelled(req.request_id, code))
            self._reset_data_streams(req, StreamResetCode.CANCELLED)
            req.finished = True
        if not req.local_fin:
            req.local_fin = True
            self._emit(ResetStream(req.stream_id, StreamResetCode.CANCELLED))
        req.remote_fin = True
        self._maybe_forget(req)

    def _maybe_forget(self, req: Request) -> None:
        if req.local_fin and req.remote_fin:
            self._by_stream.pop(req.stream_id, None)
            if req.kind in _SUBSCRIPTIONS and not req.finished:
                return
            if _we_subscribe(req) and req.done is not None and not req.ended:
                return  # data streams counted by PUBLISH_DONE are still open
            self._requests.pop(req.request_id, None)
            for uid in req.updates:
                self._updates.pop(uid, None)

    # ------------------------------------------------------------------ API: requests

    def _next_rid(self) -> int:
        rid = self._next_request_id
        self._next_request_id += 2
        return rid

    def _start_request(self, msg: Message) -> int:
        if self.closed is not None:
            raise RuntimeError("session is closed")
        sid = self._opener.open_stream(False)
        req = Request(msg.request_id, sid, msg.TYPE, True, msg)  # type: ignore[union-attr]
        p = msg.params  # type: ignore[union-attr]
        if p.subscriber_priority is not None:
            req.subscriber_priority = p.subscriber_priority
        req.descending = p.group_order == GroupOrder.DESCENDING
        self._requests[req.request_id] = req
        self._by_stream[sid] = req
        self._emit(SetStreamPriority(sid, CONTROL_PRIORITY))
        self._emit(SendStreamData(sid, encode_message(msg)))
        return req.request_id

    def subscribe(self, namespace: TrackNamespace, name: bytes,
                  params: Parameters | None = None) -> int:
        """Send SUBSCRIBE; returns its Request ID."""
        return self._start_request(Subscribe(self._next_rid(), tuple(namespace), name,
                                             params or Parameters()))

    def fetch(self, namespace: TrackNamespace, name: bytes,
              params: Parameters | None = None) -> int:
        """Send FETCH; returns its Request ID."""
        return self._start_request(Fetch(self._next_rid(), tuple(namespace), name,
                                         params or Parameters()))

    def track_status(self, namespace: TrackNamespace, name: bytes,
                     params: Parameters | None = None) -> int:
        """Send TRACK_STATUS; returns its Request ID."""
        return self._start_request(TrackStatus(self._next_rid(), tuple(namespace), name,
                                               params or Parameters()))

    def publish_namespace(self, namespace: TrackNamespace,
                          params: Parameters | None = None) -> int:
        """Send PUBLISH_NAMESPACE; returns its Request ID. Withdraw with :meth:`cancel`."""
        return self._start_request(PublishNamespace(self._next_rid(), tuple(namespace),
                                                    params or Parameters()))

    def subscribe_namespace(self, prefix: TrackNamespace,
                            params: Parameters | None = None) -> int:
        """Send SUBSCRIBE_NAMESPACE; returns its Request ID."""
        return self._start_request(SubscribeNamespace(self._next_rid(), tuple(prefix),
                                                      params or Parameters()))

    def subscribe_tracks(self, prefix: TrackNamespace,
                         params: Parameters | None = None) -> int:
        """Send SUBSCRIBE_TRACKS; returns its Request ID."""
        return self._start_request(SubscribeTracks(self._next_rid(), tuple(prefix),
                                                   params or Parameters()))

    def publish(self, namespace: TrackNamespace, name: bytes, params: Parameters | None = None,
                track_properties: Properties = (), track_alias: int | None = None) -> int:
        """Send PUBLISH (we are the publisher); returns its Request ID."""
        alias = self._alloc_alias() if track_alias is None else track_alias
        rid = self._start_request(Publish(self._next_rid(), tuple(namespace), name, alias,
                                          params or Parameters(), tuple(track_properties)))
        self._requests[rid].track_alias = alias
        self._requests[rid].established = True
        return rid

    def request_update(self, request_id: int, params: Parameters) -> int:
        """Send REQUEST_UPDATE for one of our requests (or a PUBLISH we accepted)."""
        req = self._live(request_id)
        if req.kind not in _UPDATABLE:
            raise ValueError("this request cannot be updated")
        if req.local == (req.kind == _KIND_PUBLISH):
            raise ValueError("only the requester (or the subscriber of a PUBLISH) can update")
        limit = self.peer_setup.max_request_updates if self.peer_setup else 0
        if limit and len(req.updates) >= limit:
            raise ValueError("peer's MAX_REQUEST_UPDATES reached")
        uid = self._next_rid()
        req.updates.append(uid)
        self._updates[uid] = req
        if params.subscriber_priority is not None:
            req.subscriber_priority = params.subscriber_priority
        self._emit(SendStreamData(req.stream_id, encode_message(RequestUpdate(uid, params))))
        return uid

    def cancel(self, request_id: int, code: int = StreamResetCode.CANCELLED) -> None:
        """Cancel a request in either role: reset our side and STOP_SENDING theirs."""
        req = self._requests.get(request_id)
        if req is None or self.closed is not None:
            return
        if not req.local_fin:
            self._emit(ResetStream(req.stream_id, code))
            req.local_fin = True
        if not req.remote_fin:
            self._emit(StopSending(req.stream_id, code))
            req.remote_fin = True
        if not req.local:
            self._reset_data_streams(req, code)
        req.finished = True
        if req.track_alias is not None and self._aliases.get(req.track_alias) is req:
            del self._aliases[req.track_alias]
        self._maybe_forget(req)

    def finish_request(self, request_id: int) -> None:
        """FIN our side of a request stream (we will send nothing more on it)."""
        req = self._requests.get(request_id)
        if req is None or req.local_fin or self.closed is not None:
            return
        req.local_fin = True
        self._emit(SendStreamData(req.stream_id, b"", end=True))
        self._maybe_forget(req)

    def goaway(self, new_session_uri: bytes = b"", timeout_ms: int = 0) -> None:
        """Send GOAWAY on the control stream."""
        if self._goaway_sent or self.closed is not None:
            return
        if new_session_uri and self.config.is_client:
            raise ValueError("a client GOAWAY carries no URI")
        self._goaway_sent = True
        self._emit(SendStreamData(self._control,
                                  encode_message(GoAway(new_session_uri, timeout_ms))))

    # ------------------------------------------------------------------ API: answers

    def _live(self, request_id: int) -> Request:
        req = self._requests.get(request_id)
        if req is None:
            raise KeyError(f"no request {request_id}")
        return req

    def _send_on(self, req: Request, msg: Message, fin: bool = False) -> None:
        if self.closed is not None or req.local_fin:
            return
        self._emit(SendStreamData(req.stream_id, encode_message(msg), end=fin))
        if fin:
            req.local_fin = True
            self._maybe_forget(req)

    def _alloc_alias(self) -> int:
        alias = self._next_alias
        self._next_alias += 1
        return alias

    def subscribe_ok(self, request_id: int, params: Parameters | None = None,
                     track_properties: Properties = (), track_alias: int | None = None) -> int:
        """Accept a SUBSCRIBE; returns the Track Alias chosen."""
        req = self._live(request_id)
        if req.kind != _KIND_SUBSCRIBE or req.local or req.responded:
            raise ValueError("not an unanswered incoming SUBSCRIBE")
        alias = self._alloc_alias() if track_alias is None else track_alias
        req.responded = req.established = True
        req.track_alias = alias
        self._send_on(req, SubscribeOk(alias, params or Parameters(), tuple(track_properties)))
        return alias

    def fetch_ok(self, request_id: int, end_location: Location, end_of_track: bool = False,
                 track_properties: Properties = ()) -> None:
        """Accept a FETCH."""
        req = self._live(request_id)
        if req.kind != _KIND_FETCH or req.local or req.responded:
            raise ValueError("not an unanswered incoming FETCH")
        req.responded = True
        self._send_on(req, FetchOk(end_of_track, Location(*end_location), Parameters(),
                                   tuple(track_properties)))

    def request_ok(self, request_id: int, params: Parameters | None = None,
                   track_properties: Properties = (), update_id: int | None = None) -> None:
        """Send REQUEST_OK: for PUBLISH, TRACK_STATUS, the namespace requests, or an update.

        TRACK_STATUS is finished (FIN) right after it.
        """
        req = self._live(request_id)
        msg = RequestOk(params or Parameters(), tuple(track_properties))
        if update_id is not None:
            self._answer_update(req, update_id)
            self._send_on(req, msg)
            return
        if req.responded or req.kind in (_KIND_SUBSCRIBE, _KIND_FETCH):
            raise ValueError("request already answered or needs a specific OK")
        if req.local:
            raise ValueError("not an incoming request")
        req.responded = req.established = True
        fin = req.kind == _KIND_TRACK_STATUS
        if fin:
            req.finished = True
        self._send_on(req, msg, fin=fin)

    def request_error(self, request_id: int, code: int, reason: str = "",
                      retry_interval: int = 0, update_id: int | None = None,
                      redirect: Redirect | None = None) -> None:
        """Reject a request (REQUEST_ERROR + FIN) or one REQUEST_UPDATE of it."""
        req = self._live(request_id)
        msg = RequestError(int(code), retry_interval, reason, redirect)
        if update_id is not None:
            self._answer_update(req, update_id)
            self._send_on(req, msg)
            return
        req.responded = req.finished = True
        if req.kind == _KIND_PUBLISH and req.local is False:
            self._aliases.pop(req.track_alias or -1, None)
        self._send_on(req, msg, fin=True)
        if not req.local:
            self._reset_data_streams(req, StreamResetCode.CANCELLED)

    def _answer_update(self, req: Request, update_id: int) -> None:
        if self._updates.get(update_id) is not req:
            raise ValueError(f"no outstanding update {update_id}")
        del self._updates[update_id]
        if update_id in req.updates:
            req.updates.remove(update_id)

    def namespace(self, request_id: int, namespace: TrackNamespace) -> None:
        """Send NAMESPACE (suffix of ``namespace`` after the request's prefix)."""
        req = self._live(request_id)
        self._send_on(req, NamespaceMsg(self._suffix(req, namespace)))

    def namespace_done(self, request_id: int, namespace: TrackNamespace) -> None:
        """Send NAMESPACE_DONE for a namespace announced earlier."""
        req = self._live(request_id)
        self._send_on(req, NamespaceDone(self._suffix(req, namespace)))

    def publish_skipped(self, request_id: int, namespace: TrackNamespace, name: bytes) -> None:
        """Send PUBLISH_SKIPPED on a SUBSCRIBE_TRACKS stream."""
        req = self._live(request_id)
        self._send_on(req, PublishSkipped(self._suffix(req, namespace), name))

    @staticmethod
    def _suffix(req: Request, namespace: TrackNamespace) -> tuple[bytes, ...]:
        prefix = tuple(req.namespace)
        ns = tuple(namespace)
        if ns[: len(prefix)] != prefix:
            raise ValueError("namespace outside the request's prefix")
        return ns[len(prefix):]

    def publish_state_notify(self, request_id: int, params: Parameters) -> None:
        """Send PUBLISH_STATE_NOTIFY on a subscription we serve."""
        self._send_on(self._live(request_id), PublishStateNotify(params))

    def publish_done(self, request_id: int, status: int, reason: str = "") -> None:
        """End a subscription we serve: PUBLISH_DONE with the stream count, then FIN.

        Open data streams of the subscription are finished first (FIN), so the count is
        final.
        """
        req = self._requests.get(request_id)
        if req is None or req.finished:
            return
        for sid in sorted(req.open_streams):
            self._send.pop(sid, None)
            self._emit(SendStreamData(sid, b"", end=True))
        req.open_streams.clear()
        req.finished = True
        if req.track_alias is not None and self._aliases.get(req.track_alias) is req:
            del self._aliases[req.track_alias]
        self._send_on(req, PublishDone(int(status), req.streams_opened, reason), fin=True)

    # ------------------------------------------------------------------ API: data out

    def subscription_info(self, request_id: int) -> Request:
        """The state of a request (read-only use: priorities, alias, message)."""
        return self._live(request_id)

    def _data_priority(self, req: Request, publisher_priority: int, group: int,
                       fill: bool, subgroup: int = 0) -> tuple[int, ...]:
        gkey = MAX_VI64 - group if req.descending else group
        return (1, req.subscriber_priority, publisher_priority, gkey, 0 if fill else 1,
                subgroup)

    def open_subgroup(self, request_id: int, group_id: int, subgroup_id: int = 0,
                      publisher_priority: int | None = None, *,
                      default_priority: int = 128, end_of_group: bool = False,
                      first_object: bool = True, has_properties: bool = False) -> int:
        """Open a subgroup stream for subscription ``request_id``; returns the stream ID.

        ``publisher_priority`` None omits the priority byte (the track default,
        ``default_priority``, applies).
        """
        req = self._live(request_id)
        if req.track_alias is None or req.finished:
            raise ValueError("subscription is not established or already done")
        header = SubgroupHeader(req.track_alias, group_id, subgroup_id, publisher_priority,
                                has_properties, end_of_group, first_object)
        writer = SubgroupWriter(header)
        sid = self._opener.open_stream(True)
        req.streams_opened += 1
        req.open_streams.add(sid)
        self._send[sid] = _SendStream(req, writer, "subgroup")
        prio = default_priority if publisher_priority is None else publisher_priority
        self._emit(SetStreamPriority(sid, self._data_priority(req, prio, group_id, False,
                                                              subgroup_id)))
        self._emit(SendStreamData(sid, writer.header_bytes()))
        return sid

    def write_object(self, stream_id: int, object_id: int, payload: bytes | memoryview,
                     status: int = 0, properties: Properties | None = None,
                     end: bool = False) -> bool:
        """Write one object on a subgroup stream; False if the stream is gone."""
        s = self._send.get(stream_id)
        if s is None or self.closed is not None:
            return False
        writer = s.writer
        assert isinstance(writer, SubgroupWriter)
        prefix = writer.object_prefix(object_id, len(payload), status, properties)
        if payload:
            self._actions.append(SendStreamData(stream_id, prefix))
            self._actions.append(SendStreamData(stream_id, payload, end))
        else:
            self._actions.append(SendStreamData(stream_id, prefix, end))
        if end:
            self._closed_send(stream_id, s)
        return True

    def open_fetch_stream(self, request_id: int, fill_id: int | None = None,
                          publisher_priority: int = 128, first_group: int = 0) -> int:
        """Open a fetch stream for FETCH ``request_id``, or a fill stream of subscription
        ``request_id`` (``fill_id`` = the SUBSCRIBE's or REQUEST_UPDATE's Request ID)."""
        req = self._live(request_id)
        rid = request_id if fill_id is None else fill_id
        descending = req.descending
        writer = FetchWriter(rid, descending)
        sid = self._opener.open_stream(True)
        kind = "fetch" if fill_id is None else "fill"
        if req.kind in _SUBSCRIPTIONS:
            req.streams_opened += 1
        req.open_streams.add(sid)
        self._send[sid] = _SendStream(req, writer, kind)
        self._emit(SetStreamPriority(sid, self._data_priority(
            req, publisher_priority, first_group, True)))
        self._emit(SendStreamData(sid, writer.header_bytes()))
        return sid

    def write_fetch_object(self, stream_id: int, group_id: int, subgroup_id: int,
                           object_id: int, publisher_priority: int,
                           payload: bytes | memoryview, properties: Properties | None = None,
                           datagram: bool = False) -> bool:
        """Write one object on a fetch/fill stream; False if the stream is gone."""
        writer = self._fetch_writer(stream_id)
        if writer is None:
            return False
        prefix = writer.object_prefix(group_id, subgroup_id, object_id, publisher_priority,
                                      len(payload), properties, datagram)
        self._actions.append(SendStreamData(stream_id, prefix))
        if payload:
            self._actions.append(SendStreamData(stream_id, payload))
        return True

    def _fetch_writer(self, stream_id: int) -> FetchWriter | None:
        s = self._send.get(stream_id)
        if s is None or self.closed is not None:
            return None
        assert isinstance(s.writer, FetchWriter)
        return s.writer

    def write_end_of_range(self, stream_id: int, kind: int, group_id: int,
                           object_id: int) -> bool:
        """Write an End of Range marker on a fetch/fill stream."""
        writer = self._fetch_writer(stream_id)
        if writer is None:
            return False
        self._actions.append(SendStreamData(stream_id,
                                            writer.end_of_range(kind, group_id, object_id)))
        return True

    def end_data_stream(self, stream_id: int) -> None:
        """FIN a data stream we opened."""
        s = self._send.get(stream_id)
        if s is None or self.closed is not None:
            return
        self._emit(SendStreamData(stream_id, b"", end=True))
        self._closed_send(stream_id, s)

    def reset_data_stream(self, stream_id: int, code: int) -> None:
        """Reset a data stream we opened (fill failure, cancel, malformed upstream)."""
        s = self._send.get(stream_id)
        if s is None or self.closed is not None:
            return
        self._emit(ResetStream(stream_id, code))
        self._closed_send(stream_id, s)

    def _closed_send(self, sid: int, s: _SendStream) -> None:
        self._send.pop(sid, None)
        s.request.open_streams.discard(sid)

    def _reset_data_streams(self, req: Request, code: int) -> None:
        for sid in sorted(req.open_streams):
            self._send.pop(sid, None)
            self._emit(ResetStream(sid, code))
        req.open_streams.clear()

    def send_datagram(self, request_id: int, record: ObjectRecord,
                      end_of_group: bool = False) -> None:
        """Send one object as a datagram on subscription ``request_id``."""
        req = self._live(request_id)
        if req.track_alias is None:
            raise ValueError("subscription has no track alias")
        self._emit(SendDatagram(encode_datagram(req.track_alias, record, end_of_group)))

    def data_stream_open(self, stream_id: int) -> bool:
        """True while a data stream we opened can still be written."""
        return stream_id in self._send

    def reprioritize(self, stream_id: int, publisher_priority: int, group_id: int) -> None:
        """Give a fetch/fill stream the priority of the group it is now carrying."""
        s = self._send.get(stream_id)
        if s is not None:
            self._emit(SetStreamPriority(stream_id, self._data_priority(
                s.request, publisher_priority, group_id, True)))

    def want_writable(self, stream_id: int) -> None:
        """Ask for a :class:`~kvcs.moqt.events.DataStreamWritable` event once the transport
        has taken the data queued on our stream (all of it, or down to its low-water
        mark, so that the writer can top the stream up before it runs dry)."""
        s = self._send.get(stream_id)
        if s is not None:
            s.wants_writable = True

    def stream_writable(self, stream_id: int) -> None:
        """Input from the binding: the queue of ``stream_id`` emptied or fell to the
        binding's low-water mark."""
        s = self._send.get(stream_id)
        if s is not None and s.wants_writable:
            s.wants_writable = False
            self._event(ev.DataStreamWritable(s.request.request_id, stream_id))


def _we_subscribe(req: Request) -> bool:
    """True if we are the subscriber of this subscription."""
    return (req.kind == _KIND_SUBSCRIBE and req.local) or (
        req.kind == _KIND_PUBLISH and not req.local)


def count_ranges(params: Parameters) -> int:
    """Number of Ranges over all Range Filter parameters (and those inside the fill)."""
    n = sum(len(f.ranges) for f in params.range_filters)
    if params.fill is not None:
        n += sum(len(f.ranges) for f in params.fill.range_filters)
    return n
