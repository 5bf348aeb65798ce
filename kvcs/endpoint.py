"""The asyncio face of one MOQT session: publish, subscribe, fetch and discover.

An :class:`Endpoint` owns a sans-IO :class:`~kvcs.moqt.session.Session` bound to a QUIC
connection (:mod:`kvcs.transport`) and a :class:`~kvcs.moqt.serving.TrackServer` that
answers the peer's SUBSCRIBE / FETCH / TRACK_STATUS from the endpoint's own tracks.

Client::

    async with await Endpoint.connect("moqt://127.0.0.1:4443/", cafile=...) as ep:
        await ep.announce(ns)
        track = ep.create_track(ns, b"video")
        ep.publish(track, group_id=0, object_id=0, payload=b"...")
        sub = await ep.subscribe(ns, b"video", location_filter=LocationFilter.next_object())
        async for obj in sub: ...

Servers (the relay, tests) use :func:`serve_endpoints` and get one :class:`Endpoint` per
accepted session. A ``request_handler`` hook lets an application (the relay) take over
incoming requests the endpoint cannot answer from its own tracks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from .moqt import events as ev
from .moqt.errors import RequestErrorCode, SessionCode
from .moqt.serving import TrackServer
from .moqt.session import Session, SessionConfig
from .moqt.track import Track, origin_track
from .moqt.wire import (
    AuthToken,
    EndOfRange,
    Fetch,
    FetchOk,
    GroupOrder,
    Location,
    LocationFilter,
    ObjectStatus,
    Parameters,
    Properties,
    PublishDone,
    PublishNamespace,
    RangeFilter,
    RequestError,
    RequestOk,
    SetupOptions,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    TrackNamespace,
    TrackStatus,
    namespace_has_prefix,
)
from .transport import ConnectionInfo, MoqtConnection, QuicSettings, connect, serve
from .transport.binding import Server

log = logging.getLogger(__name__)

WRITE_WINDOW = 1 << 20
"""Bytes a fetch/fill stream may queue before its cursor waits for the transport to take
them (the binding reports writability): bounds memory and lets streams interleave."""
SETUP_TIMEOUT = 10.0
"""Seconds a server waits for the client's SETUP before closing the session."""


class MoqtRequestError(Exception):
    """A request was refused (REQUEST_ERROR) or failed; carries the draft's code."""

    def __init__(self, code: int, reason: str, retry_interval: int = 0) -> None:
        try:
            name = RequestErrorCode(code).name
        except ValueError:
            name = f"0x{code:x}"
        super().__init__(f"{name}: {reason}" if reason else name)
        self.code = code
        self.reason = reason
        self.retry_interval = retry_interval


class SessionClosedError(ConnectionError):
    """The MOQT session ended while a request was in progress."""


@dataclass(frozen=True, slots=True)
class ReceivedObject:
    """One object as the application sees it; ``payload`` is a zero-copy view."""

    group_id: int
    object_id: int
    subgroup_id: int
    publisher_priority: int | None
    status: int
    properties: Properties
    payload: memoryview
    fill: bool

    @property
    def location(self) -> Location:
        """The object's Location."""
        return Location(self.group_id, self.object_id)


_END = object()


class _Stream:
    """Base of the async iterators delivering a request's objects."""

    def __init__(self, endpoint: Endpoint, request_id: int) -> None:
        self.endpoint = endpoint
        self.request_id = request_id
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._error: BaseException | None = None
        self._finished = False
        self.markers: list[EndOfRange] = []
        self.reset_streams: list[int] = []  # data streams that were reset (incomplete)

    def _put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    def _fail(self, exc: BaseException) -> None:
        if not self._finished:
            self._finished = True
            self._error = exc
            self._queue.put_nowait(_END)

    def _end(self) -> None:
        if not self._finished:
            self._finished = True
            self._queue.put_nowait(_END)

    def __aiter__(self) -> AsyncIterator[ReceivedObject]:
        return self

    async def __anext__(self) -> ReceivedObject:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return item

    async def collect(self, timeout: float | None = None) -> list[ReceivedObject]:
        """Read every object until the end (with an optional overall timeout)."""

        async def run() -> list[ReceivedObject]:
            return [o async for o in self]

        return await asyncio.wait_for(run(), timeout)

    @property
    def finished(self) -> bool:
        """True once the request has ended (cleanly or not)."""
        return self._finished

    async def cancel(self) -> None:
        """Cancel the request (reset + STOP_SENDING); the iterator ends."""
        self.endpoint._cancel(self.request_id)
        self._end()


class Subscription(_Stream):
    """A subscription: iterate it for objects (fill-delivered and live) until it ends."""

    def __init__(self, endpoint: Endpoint, request_id: int) -> None:
        super().__init__(endpoint, request_id)
        self.ok: SubscribeOk | None = None
        self.done: PublishDone | None = None
        self._accepted: asyncio.Future[SubscribeOk] = asyncio.get_running_loop().create_future()
        self._updates: dict[int, asyncio.Future[RequestOk]] = {}

    @property
    def largest(self) -> Location | None:
        """LARGEST_OBJECT from SUBSCRIBE_OK (None: the track was empty)."""
        return self.ok.params.largest_object if self.ok else None

    @property
    def track_properties(self) -> Properties:
        """Track Properties from SUBSCRIBE_OK."""
        return self.ok.track_properties if self.ok else ()

    async def update(self, params: Parameters) -> RequestOk:
        """Send REQUEST_UPDATE (e.g. FORWARD, a new fill) and wait for its answer."""
        uid = self.endpoint.session.request_update(self.request_id, params)
        fut: asyncio.Future[RequestOk] = asyncio.get_running_loop().create_future()
        self._updates[uid] = fut
        self.endpoint.flush()
        return await fut


class FetchResult(_Stream):
    """A fetch: iterate it for objects until the fetch stream ends."""

    def __init__(self, endpoint: Endpoint, request_id: int) -> None:
        super().__init__(endpoint, request_id)
        self.ok: FetchOk | None = None
        self._accepted: asyncio.Future[FetchOk] = asyncio.get_running_loop().create_future()



class NamespaceWatch:
    """Namespaces under a prefix: iterate for ``(announced, namespace)`` pairs."""

    def __init__(self, endpoint: Endpoint, request_id: int) -> None:
        self.endpoint = endpoint
        self.request_id = request_id
        self.current: set[TrackNamespace] = set()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._accepted: asyncio.Future[RequestOk] = asyncio.get_running_loop().create_future()
        self._error: BaseException | None = None

    def __aiter__(self) -> AsyncIterator[tuple[bool, TrackNamespace]]:
        return self

    async def __anext__(self) -> tuple[bool, TrackNamespace]:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return item

    async def next(self, timeout: float) -> tuple[bool, TrackNamespace] | None:
        """The next change, or None after ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except (TimeoutError, StopAsyncIteration):
            return None

    async def cancel(self) -> None:
        """Stop watching."""
        self.endpoint._cancel(self.request_id)
        self._queue.put_nowait(_END)


RequestHandler = Callable[["Endpoint", ev.RequestReceived], bool]
"""Hook for incoming requests; return True if it took the request."""
EventHook = Callable[["Endpoint", ev.Event], bool]
"""Hook for session events the endpoint does not consume itself; True if handled."""


class Endpoint:
    """One MOQT session with asyncio APIs. Create with :meth:`connect` or a server."""

    def __init__(self, conn: MoqtConnection) -> None:
        assert conn.session is not None and isinstance(conn.session, Session)
        self.conn = conn
        self.session: Session = conn.session
        self.server = TrackServer(self.session)
        self.tracks: dict[tuple[TrackNamespace, bytes], Track] = {}
        self.announced: dict[TrackNamespace, int] = {}  # our PUBLISH_NAMESPACEs
        self.peer_namespaces: dict[int, TrackNamespace] = {}  # the peer's PUBLISH_NAMESPACEs
        self.request_handler: RequestHandler | None = None
        self.event_hook: EventHook | None = None
        self.auth_tokens: tuple[AuthToken, ...] = ()
        self._requests: dict[int, Any] = {}
        self._ns_watchers: dict[int, TrackNamespace] = {}  # peer SUBSCRIBE_NAMESPACE -> prefix
        self._established: asyncio.Future[SetupOptions] = (
            asyncio.get_running_loop().create_future())
        self._closed: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        conn.attach(self)
        conn.add_close_callback(self._on_connection_closed)
        if not self.session.config.is_client:
            # a peer that never sends SETUP is closed (CONTROL_MESSAGE_TIMEOUT)
            asyncio.get_running_loop().call_later(SETUP_TIMEOUT, self._check_setup)

    # ----------------------------------------------------------------- lifecycle

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        settings: QuicSettings | None = None,
        verify: bool = True,
        cafile: str | None = None,
        pin_sha256: str | bytes | None = None,
        auth_tokens: tuple[AuthToken, ...] = (),
        implementation: str = "kvcs/0.1",
        timeout: float = 10.0,
    ) -> Endpoint:
        """Connect to ``moqt://`` (raw QUIC) or ``https://`` (WebTransport) and wait for the
        peer's SETUP."""

        def factory(opener: Any, info: ConnectionInfo) -> Session:
            cfg = SessionConfig(
                is_client=True,
                implementation=implementation,
                webtransport=info.transport == "webtransport",
                auth_tokens=auth_tokens,
                write_window=WRITE_WINDOW,
            )
            if info.transport == "quic":
                cfg.authority = (info.authority or "").encode()
                cfg.path = (info.path or "/").encode()
            return Session(cfg, opener)

        conn = await connect(url, factory, settings, verify=verify, cafile=cafile,
                             pin_sha256=pin_sha256, timeout=timeout)
        ep = cls(conn)
        ep.auth_tokens = auth_tokens
        ep._dispatch()
        ep.flush()
        try:
            await asyncio.wait_for(asyncio.shield(ep._established), timeout)
        except TimeoutError:
            ep.close(SessionCode.CONTROL_MESSAGE_TIMEOUT, "no SETUP")
            raise ConnectionError(f"{url}: peer sent no SETUP") from None
        return ep

    async def __aenter__(self) -> Endpoint:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()

    @property
    def peer_setup(self) -> SetupOptions | None:
        """The peer's Setup Options once its SETUP arrived."""
        return self.session.peer_setup

    @property
    def peer_max_filter_ranges(self) -> int:
        """The peer's MAX_FILTER_RANGES (0 = no range filters allowed)."""
        return self.session.peer_setup.max_filter_ranges if self.session.peer_setup else 0

    async def established(self) -> SetupOptions:
        """Wait for the peer's SETUP."""
        return await asyncio.shield(self._established)

    def close(self, code: int = SessionCode.NO_ERROR, reason: str = "") -> None:
        """Close the session."""
        if not self.session.is_closed:
            self.session.close(code, reason)
            self._dispatch()
            self.flush()

    async def wait_closed(self) -> tuple[int, str]:
        """Wait until the session has ended; returns (code, reason)."""
        with contextlib.suppress(Exception):
            await self.conn.wait_closed()
        if not self._closed.done():
            self._on_closed(self.session.closed or (0, "closed"))
        return self._closed.result()

    @property
    def is_closed(self) -> bool:
        """True once the session has ended."""
        return self._closed.done() or self.session.is_closed

    def flush(self) -> None:
        """Send what the session has queued (call after session API calls)."""
        self.conn.flush()

    def schedule_flush(self) -> None:
        """Flush at the end of this loop turn (:meth:`MoqtConnection.flush_soon`)."""
        self.conn.flush_soon()

    async def drain(self, limit: int = 4 << 20) -> None:
        """Back-pressure: wait until at most ``limit`` bytes are queued for sending."""
        self.flush()
        await self.conn.drain(limit)

    def session_changed(self) -> None:
        """:class:`~kvcs.transport.SessionHandler`: handle the session's new events."""
        self._dispatch()

    def _check_setup(self) -> None:
        if self.session.peer_setup is None and not self.is_closed:
            log.warning("peer sent no SETUP within %.0f s: closing", SETUP_TIMEOUT)
            self.close(SessionCode.CONTROL_MESSAGE_TIMEOUT, "no SETUP")

    def _cancel(self, request_id: int) -> None:
        self.session.cancel(request_id)
        self._requests.pop(request_id, None)
        self.flush()

    def _on_connection_closed(self) -> None:
        self.session.connection_lost(None, "connection closed")
        self._dispatch()

    # ----------------------------------------------------------------- publishing

    def create_track(self, namespace: TrackNamespace, name: bytes,
                     properties: Properties = ()) -> Track:
        """Create (or return) a local track that this endpoint serves to its peer."""
        return origin_track(self.tracks, namespace, name, properties)

    def add_track(self, track: Track) -> None:
        """Serve an existing track (e.g. one shared by several endpoints)."""
        self.tracks[track.full_name] = track

    def publish(self, track: Track, group_id: int, object_id: int, payload: bytes | memoryview,
                *, status: int = ObjectStatus.NORMAL, priority: int | None = None,
                subgroup_id: int = 0, properties: Properties = ()) -> None:
        """Add one object to a local track; live subscribers get it at once."""
        track.append(group_id, object_id, payload, status=status, priority=priority,
                     subgroup_id=subgroup_id, properties=properties)
        self.schedule_flush()

    async def announce(self, namespace: TrackNamespace, params: Parameters | None = None) -> None:
        """PUBLISH_NAMESPACE and wait for REQUEST_OK (raises MoqtRequestError)."""
        p = params or Parameters(auth_tokens=self.auth_tokens)
        rid = self.session.publish_namespace(namespace, p)
        fut: asyncio.Future[RequestOk] = asyncio.get_running_loop().create_future()
        self._requests[rid] = fut
        self.schedule_flush()
        await fut
        ns = tuple(namespace)
        self.announced[ns] = rid
        for wid, prefix in self._ns_watchers.items():
            if namespace_has_prefix(ns, prefix):
                self.session.namespace(wid, ns)
        self.flush()

    def withdraw(self, namespace: TrackNamespace) -> None:
        """Withdraw a namespace announced with :meth:`announce`."""
        ns = tuple(namespace)
        rid = self.announced.pop(ns, None)
        if rid is not None:
            self.session.cancel(rid)
            for wid, prefix in self._ns_watchers.items():
                if namespace_has_prefix(ns, prefix):
                    self.session.namespace_done(wid, ns)
            self.flush()

    # ----------------------------------------------------------------- consuming

    def _params(self, params: Parameters | None, **fields: Any) -> Parameters:
        """``params`` (or new ones) with our auth tokens and every given non-None field."""
        p = params or Parameters()
        if self.auth_tokens and not p.auth_tokens:
            p.auth_tokens = self.auth_tokens
        for name, value in fields.items():
            if value is not None and value != ():
                setattr(p, name, value)
        return p

    async def subscribe(
        self,
        namespace: TrackNamespace,
        name: bytes,
        *,
        location_filter: LocationFilter | None = None,
        fill: Parameters | None = None,
        priority: int | None = None,
        group_order: int | None = None,
        forward: int | None = None,
        range_filters: tuple[RangeFilter, ...] = (),
        params: Parameters | None = None,
    ) -> Subscription:
        """SUBSCRIBE and wait for SUBSCRIBE_OK (raises MoqtRequestError on REQUEST_ERROR).

        The exactly-once pattern: ``location_filter=LocationFilter.next_object()`` with
        ``fill=Parameters(location_filter=LocationFilter.none())``.
        """
        p = self._params(params, location_filter=location_filter, fill=fill,
                         subscriber_priority=priority, group_order=group_order,
                         forward=forward, range_filters=range_filters)
        rid = self.session.subscribe(namespace, name, p)
        sub = Subscription(self, rid)
        self._requests[rid] = sub
        self.schedule_flush()
        sub.ok = await sub._accepted
        return sub

    async def fetch(
        self,
        namespace: TrackNamespace,
        name: bytes,
        *,
        location_filter: LocationFilter | None = None,
        priority: int | None = None,
        group_order: int = GroupOrder.ASCENDING,
        range_filters: tuple[RangeFilter, ...] = (),
        params: Parameters | None = None,
    ) -> FetchResult:
        """FETCH and wait for FETCH_OK; iterate the result for objects."""
        p = self._params(params, location_filter=location_filter,
                         subscriber_priority=priority, group_order=group_order,
                         range_filters=range_filters)
        rid = self.session.fetch(namespace, name, p)
        res = FetchResult(self, rid)
        self._requests[rid] = res
        self.schedule_flush()
        res.ok = await res._accepted
        return res

    async def track_status(self, namespace: TrackNamespace, name: bytes) -> RequestOk:
        """TRACK_STATUS; returns the REQUEST_OK (LARGEST_OBJECT, Track Properties)."""
        rid = self.session.track_status(namespace, name, self._params(None))
        fut: asyncio.Future[RequestOk] = asyncio.get_running_loop().create_future()
        self._requests[rid] = fut
        self.schedule_flush()
        return await fut

    async def subscribe_namespace(self, prefix: TrackNamespace) -> NamespaceWatch:
        """SUBSCRIBE_NAMESPACE; iterate the watch for (announced, namespace) changes."""
        rid = self.session.subscribe_namespace(prefix, self._params(None))
        watch = NamespaceWatch(self, rid)
        self._requests[rid] = watch
        self.schedule_flush()
        await watch._accepted
        return watch

    # ----------------------------------------------------------------- dispatch

    def _dispatch(self) -> None:
        """Drain session events (runs inside the connection's input hook)."""
        while (e := self.session.next_event()) is not None:
            try:
                self._handle(e)
            except Exception:
                log.exception("error handling %s", type(e).__name__)

    def _handle(self, e: ev.Event) -> None:
        if isinstance(e, ev.ObjectReceived):
            target = self._requests.get(e.request_id)
            if isinstance(target, _Stream):
                r = e.record
                target._put(ReceivedObject(r.group_id, r.object_id, r.subgroup_id,
                                           r.publisher_priority, r.status, r.properties,
                                           r.payload, e.fill_id is not None))
                return
            if self.event_hook is not None:
                self.event_hook(self, e)
            return
        if self.server.handle(e):
            return
        if self.event_hook is not None and self.event_hook(self, e):
            return
        if isinstance(e, ev.RequestReceived):
            self._on_request(e)
        elif isinstance(e, ev.SessionEstablished):
            if not self._established.done():
                self._established.set_result(e.options)
        elif isinstance(e, ev.SessionClosed):
            self._on_closed((e.code, e.reason))
        else:
            self._on_response(e)

    def _on_closed(self, closed: tuple[int, str]) -> None:
        if not self._closed.done():
            self._closed.set_result(closed)
        if not self._established.done():
            self._established.set_exception(SessionClosedError(f"session closed: {closed}"))
            self._established.exception()
        exc = SessionClosedError(f"session closed (code {closed[0]}: {closed[1]})")
        for target in list(self._requests.values()):
            _fail_target(target, exc)
        self._requests.clear()
        self.server.close()

    def _on_response(self, e: ev.Event) -> None:
        rid = getattr(e, "request_id", None)
        target = self._requests.get(rid) if rid is not None else None
        if (isinstance(e, ev.SubscribeAccepted) and isinstance(target, Subscription)) or (
                isinstance(e, ev.FetchAccepted) and isinstance(target, FetchResult)):
            target.ok = e.message
            _resolve(target._accepted, e.message)
            if isinstance(target, FetchResult) and target.finished:
                # the fetch stream overtook FETCH_OK (streams are not ordered)
                self._requests.pop(rid, None)  # type: ignore[arg-type]
        elif isinstance(e, ev.RequestAccepted):
            if e.update_id is not None and isinstance(target, Subscription):
                _resolve(target._updates.pop(e.update_id, None), e.message)
            elif isinstance(target, NamespaceWatch):
                _resolve(target._accepted, e.message)
            elif isinstance(target, asyncio.Future):
                # TRACK_STATUS or PUBLISH_NAMESPACE answered (announce() keeps the latter)
                self._requests.pop(rid, None)  # type: ignore[arg-type]
                _resolve(target, e.message)
        elif isinstance(e, ev.RequestRejected):
            m: RequestError = e.message
            exc = MoqtRequestError(m.code, m.reason, m.retry_interval)
            if e.update_id is not None and isinstance(target, Subscription):
                fut = target._updates.pop(e.update_id, None)
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
                return
            self._requests.pop(rid, None)  # type: ignore[arg-type]
            _fail_target(target, exc)
        elif isinstance(e, ev.RequestFailed):
            self._requests.pop(rid, None)  # type: ignore[arg-type]
            _fail_target(target, MoqtRequestError(RequestErrorCode.INTERNAL_ERROR, e.reason))
        elif isinstance(e, ev.SubscriptionEnded) and isinstance(target, Subscription):
            target.done = e.message
            self._requests.pop(rid, None)  # type: ignore[arg-type]
            target._end()
        elif isinstance(e, ev.DataStreamEnded):
            if isinstance(target, _Stream) and e.reset_code is not None:
                target.reset_streams.append(e.stream_id)
            if isinstance(target, FetchResult):
                if target._accepted.done():
                    self._requests.pop(rid, None)  # type: ignore[arg-type]
                # else FETCH_OK (on the request stream) is still on its way
                if e.reset_code is not None:
                    target._fail(MoqtRequestError(RequestErrorCode.INTERNAL_ERROR,
                                                  f"fetch stream reset ({e.reset_code})"))
                else:
                    target._end()
        elif isinstance(e, ev.RangeMarkerReceived) and isinstance(target, _Stream):
            target.markers.append(e.marker)
        elif isinstance(e, ev.NamespaceAnnounced) and isinstance(target, NamespaceWatch):
            target.current.add(e.namespace)
            target._queue.put_nowait((True, e.namespace))
        elif isinstance(e, ev.NamespaceWithdrawn) and isinstance(target, NamespaceWatch):
            target.current.discard(e.namespace)
            target._queue.put_nowait((False, e.namespace))
        elif isinstance(e, ev.RequestCancelled):
            ns = self.peer_namespaces.pop(e.request_id, None)
            if ns is not None:
                self._on_peer_namespace_gone(ns)
            self._ns_watchers.pop(e.request_id, None)
        elif isinstance(e, ev.GoAwayReceived):
            log.info("peer sent GOAWAY (uri=%r, timeout %d ms)", e.new_session_uri, e.timeout_ms)

    # ----------------------------------------------------------------- serving

    def _on_request(self, e: ev.RequestReceived) -> None:
        if self.request_handler is not None and self.request_handler(self, e):
            return
        m = e.message
        s = self.session
        if isinstance(m, Subscribe | Fetch | TrackStatus):
            track = self.tracks.get((tuple(m.namespace), bytes(m.name)))
            if track is None:
                s.request_error(e.request_id, RequestErrorCode.DOES_NOT_EXIST, "no such track")
            elif isinstance(m, Subscribe):
                self.server.serve_subscribe(e.request_id, m, track)
            elif isinstance(m, Fetch):
                self.server.serve_fetch(e.request_id, m, track)
            else:
                self.server.serve_track_status(e.request_id, m, track)
        elif isinstance(m, PublishNamespace):
            self.peer_namespaces[e.request_id] = tuple(m.namespace)
            s.request_ok(e.request_id)
        elif isinstance(m, SubscribeNamespace):
            prefix = tuple(m.namespace_prefix)
            s.request_ok(e.request_id)
            self._ns_watchers[e.request_id] = prefix
            for ns in self.announced:
                if namespace_has_prefix(ns, prefix):
                    s.namespace(e.request_id, ns)
        else:
            s.request_error(e.request_id, RequestErrorCode.NOT_SUPPORTED,
                            f"{type(m).__name__} not supported here")

    def _on_peer_namespace_gone(self, ns: TrackNamespace) -> None:
        log.debug("peer withdrew namespace %r", ns)


def _resolve(fut: asyncio.Future[Any] | None, value: Any) -> None:
    if fut is not None and not fut.done():
        fut.set_result(value)


def _fail_target(target: Any, exc: BaseException) -> None:
    if isinstance(target, asyncio.Future):
        if not target.done():
            target.set_exception(exc)
            target.exception()  # mark retrieved: the awaiting caller sees it
    elif isinstance(target, Subscription | FetchResult):
        if not target._accepted.done():
            target._accepted.set_exception(exc)
            target._accepted.exception()
        for fut in getattr(target, "_updates", {}).values():
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
        target._fail(exc)
    elif isinstance(target, NamespaceWatch):
        if not target._accepted.done():
            target._accepted.set_exception(exc)
            target._accepted.exception()
        target._error = exc
        target._queue.put_nowait(_END)


EndpointHandler = Callable[[Endpoint], Any]


async def serve_endpoints(
    host: str,
    port: int,
    on_endpoint: EndpointHandler,
    *,
    certfile: str,
    keyfile: str | None = None,
    settings: QuicSettings | None = None,
    implementation: str = "kvcs/0.1",
    max_filter_ranges: int = 16,
    max_request_updates: int = 0,
) -> Server:
    """Accept MOQT sessions (raw QUIC and WebTransport on one UDP port); ``on_endpoint`` is
    called with each new :class:`Endpoint` before any of its events are handled."""

    def factory(opener: Any, info: ConnectionInfo) -> Session:
        return Session(SessionConfig(
            is_client=False,
            implementation=implementation,
            webtransport=info.transport == "webtransport",
            max_filter_ranges=max_filter_ranges,
            max_request_updates=max_request_updates,
            write_window=WRITE_WINDOW,
        ), opener)

    def on_session(conn: MoqtConnection) -> None:
        ep = Endpoint(conn)
        on_endpoint(ep)

    return await serve(host, port, factory, settings, certfile, keyfile, on_session=on_session)


__all__ = [
    "Endpoint",
    "FetchResult",
    "MoqtRequestError",
    "NamespaceWatch",
    "ReceivedObject",
    "SessionClosedError",
    "Subscription",
    "serve_endpoints",
]
