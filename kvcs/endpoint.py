"""The asyncio face of one MOQT session: publish, subscribe, fetch and discover.

An :class:`Endpoint` is the :class:`~kvcs.binding.BoundSession` of an application: it
answers the peer's SUBSCRIBE / FETCH / TRACK_STATUS / SUBSCRIBE_NAMESPACE from its
:class:`~kvcs.moqt.origin.Origin`, publishes into that origin
(:class:`~kvcs.publishing.OriginPublisher`) and offers its own requests as coroutines.
The relay's sessions are the other kind (:mod:`kvcs.relay.session`).

Client::

    async with await Endpoint.connect("moqt://127.0.0.1:4443/", cafile=...) as ep:
        await ep.announce(ns)
        track = ep.create_track(ns, b"video")
        ep.publish(track, group_id=0, object_id=0, payload=b"...")
        sub = await ep.subscribe(ns, b"video", location_filter=LocationFilter.next_object())
        async for obj in sub: ...

Servers use :func:`serve_endpoints` and get one :class:`Endpoint` per accepted session
(:class:`~kvcs.hosting.TrackHost`: all serving one origin); :func:`serve_sessions` and
:func:`open_session` (:mod:`kvcs.binding`, re-exported here) bind sessions to other
handlers (the relay's).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from .admission import Admission
from .binding import (
    SETUP_TIMEOUT,
    WRITE_WINDOW,
    BoundSession,
    MoqtRequestError,
    SessionClosedError,
    answer_namespace_update,
    open_session,
    resolve_once,
    send_namespace_notices,
    serve_sessions,
)
from .errors import SessionError
from .moqt import events as ev
from .moqt.errors import PublishDoneCode, RequestErrorCode, SessionCode
from .moqt.origin import Origin
from .moqt.track import Track
from .moqt.wire import (
    AuthToken,
    EndOfRange,
    FetchOk,
    GroupOrder,
    Location,
    LocationFilter,
    ObjectRecord,
    Parameters,
    Properties,
    PublishDone,
    RangeFilter,
    RequestError,
    RequestOk,
    SubscribeOk,
    TrackNamespace,
    namespace_has_prefix,
)
from .publishing import OriginPublisher
from .routing import Router
from .transport import MoqtConnection, QuicSettings, Server

log = logging.getLogger(__name__)

T = TypeVar("T")


class HandOverError(SessionError, ConnectionError):
    """The peer did not confirm that it holds a track complete (:meth:`Endpoint.hand_over`)."""


@dataclass(slots=True)
class ReceivedObject(ObjectRecord):
    """One object as the application sees it: an :class:`ObjectRecord` (``payload`` a
    zero-copy view) and whether it came by a fill (FETCH) rather than the subscription."""

    fill: bool = field(default=False, kw_only=True)


_END = object()


def _received(e: ev.ObjectReceived) -> ReceivedObject:
    r = e.record
    return ReceivedObject(r.group_id, r.object_id, r.subgroup_id, r.publisher_priority,
                          r.status, r.properties, r.payload, r.datagram,
                          fill=e.fill_id is not None)


class _Stream:
    """Base of the async iterators delivering a request's objects."""

    def __init__(self, endpoint: Endpoint, request_id: int) -> None:
        self.endpoint = endpoint
        self.request_id = request_id
        # a deque and one waiter, not an asyncio.Queue: its put and get cost 0.97 us per
        # object against 0.18 (micro-benchmark, load 4; docs/perf-profile.md, "The MOQT
        # object path")
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._finished = False
        self.markers: list[EndOfRange] = []
        self.reset_streams: list[int] = []  # data streams that were reset (incomplete)
        self._deliver: Callable[[ReceivedObject], None] | None = None
        self._deliver_runs: Callable[[list[ReceivedObject]], None] | None = None

    def deliver_to(self, callback: Callable[[ReceivedObject], None]) -> None:
        """Hand every object from now on to ``callback`` as it is parsed, instead of
        queueing it for the iterator; the iterator then yields only the objects queued
        before this call and ends (or raises) with the request. Saves an asyncio.Queue
        put and get, and often a task switch, per object: 0.1-0.5 ms of a consumer's CPU
        per MiB of 32 KiB objects (docs/perf-profile.md)."""
        self._deliver = callback
        self._deliver_runs = None

    def deliver_runs_to(self, callback: Callable[[list[ReceivedObject]], None]) -> None:
        """As :meth:`deliver_to`, with the objects of the request parsed together (one
        read of the socket, in order, nothing of another request between them) handed
        over in one call: one call chain per run instead of per object."""
        self._deliver_runs = callback
        self._deliver = None

    def _put(self, item: Any) -> None:
        if self._deliver is not None:
            self._deliver(item)
            return
        if self._deliver_runs is not None:
            self._deliver_runs([item])
            return
        self._items.append(item)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if not self._finished:
            self._error = exc
            self._end()

    def _end(self) -> None:
        if not self._finished:
            self._finished = True
            self._items.append(_END)
            self._wake()

    def __aiter__(self) -> AsyncIterator[ReceivedObject]:
        return self

    async def __anext__(self) -> ReceivedObject:
        items = self._items
        while not items:
            waiter = self._waiter
            if waiter is None or waiter.done():  # done: cancelled with its last awaiter
                waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        if items[0] is _END:  # stays queued: the iterator keeps ending
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return items.popleft()  # type: ignore[no-any-return]

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
        self._updates: dict[int, asyncio.Future[RequestOk]] = {}

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

    def received(self) -> list[tuple[bool, TrackNamespace]]:
        """The changes received and not yet iterated, in arrival order (they are taken:
        iteration goes on after them)."""
        out: list[tuple[bool, TrackNamespace]] = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is _END:
                self._queue.put_nowait(_END)
                break
            out.append(item)
        return out

    async def sync(self) -> None:
        """Send a REQUEST_UPDATE that changes nothing and wait for its REQUEST_OK. The peer
        answers it on the request's stream after the NAMESPACE messages of what it held
        when it read the update, so :attr:`current` then lists every namespace under the
        prefix that the peer knew (one round trip). MoqtRequestError if refused."""
        uid = self.endpoint.session.request_update(self.request_id, Parameters())
        fut: asyncio.Future[RequestOk] = asyncio.get_running_loop().create_future()
        self._updates[uid] = fut
        self.endpoint.flush()
        await fut

    async def cancel(self) -> None:
        """Stop watching."""
        self.endpoint._cancel(self.request_id)
        self._queue.put_nowait(_END)


class Endpoint(OriginPublisher, BoundSession):
    """One MOQT session with asyncio APIs. Create with :meth:`connect` or a server.

    It serves its :attr:`origin` (tracks and namespaces) to the peer; a
    :class:`~kvcs.hosting.TrackHost` gives all its endpoints one origin. A subclass may
    answer the peer's requests differently by overriding :meth:`handle_request`.
    """

    def __init__(self, conn: MoqtConnection, *, origin: Origin[Endpoint] | None = None,
                 auth_tokens: tuple[AuthToken, ...] = (),
                 admission: Admission | None = None) -> None:
        super().__init__(conn, admission.pacer if admission is not None else None)
        self.origin: Origin[Endpoint] = Origin() if origin is None else origin
        self.auth_tokens = auth_tokens
        """Sent with every request (and in SETUP by :meth:`connect`)."""
        self.admission = admission
        """Checks the peer's requests (tokens, limits) before they are answered; None:
        every request is answered (a client endpoint trusts its relay)."""
        self.router: Router[Endpoint] = _EndpointRouter(self.origin, admission)
        """Routes the peer's requests (:mod:`kvcs.routing`)."""
        self.announced: dict[TrackNamespace, int] = {}  # our PUBLISH_NAMESPACEs
        self.peer_namespaces: dict[int, TrackNamespace] = {}  # the peer's PUBLISH_NAMESPACEs
        self._requests: dict[int, Any] = {}

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
    ) -> Self:
        """Connect to ``moqt://`` (raw QUIC) or ``https://`` (WebTransport) and wait for the
        peer's SETUP."""
        return await open_session(
            url, lambda conn: cls(conn, auth_tokens=auth_tokens), settings=settings,
            verify=verify, cafile=cafile, pin_sha256=pin_sha256, auth_tokens=auth_tokens,
            implementation=implementation, timeout=timeout)

    async def __aenter__(self) -> Endpoint:
        return self

    def flush(self) -> None:
        """Send what the session has queued, the objects published in this loop turn
        included (:meth:`publish`)."""
        self.origin.tell_staged()
        super().flush()

    def close(self, code: int = SessionCode.NO_ERROR, reason: str = "") -> None:
        """Close the session, after sending the objects published in this loop turn."""
        self.origin.tell_staged()
        super().close(code, reason)

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        await self.wait_closed()

    @property
    def peer_max_filter_ranges(self) -> int:
        """The peer's MAX_FILTER_RANGES (0 = no range filters allowed)."""
        return self.session.peer_setup.max_filter_ranges if self.session.peer_setup else 0

    @property
    def namespace_watches(self) -> dict[int, TrackNamespace]:
        """The peer's open SUBSCRIBE_NAMESPACE requests: Request ID -> prefix."""
        return self.origin.watches(self)

    def _cancel(self, request_id: int) -> None:
        self.session.cancel(request_id)
        self._requests.pop(request_id, None)
        self.flush()

    async def _answer(self, request_id: int, handle: object, answer: Awaitable[T]) -> T:
        """Register ``handle`` (what the request's events go to), send the request and
        wait for its answer. A caller that stops waiting (its task cancelled, e.g. by a
        timeout) never gets the handle, so the request is cancelled on both ends instead
        of staying registered."""
        self._requests[request_id] = handle
        self.schedule_flush()
        try:
            return await answer
        except asyncio.CancelledError:
            if request_id in self._requests and not self.is_closed:
                self._cancel(request_id)
            raise

    # ----------------------------------------------------------------- publishing
    # create_track, add_track, publish, publish_run: OriginPublisher

    async def announce(self, namespace: TrackNamespace, params: Parameters | None = None) -> None:
        """PUBLISH_NAMESPACE and wait for REQUEST_OK (raises MoqtRequestError); the peer's
        SUBSCRIBE_NAMESPACE watchers then see the namespace too."""
        p = params or Parameters(auth_tokens=self.auth_tokens)
        rid = self.session.publish_namespace(namespace, p)
        fut: asyncio.Future[RequestOk] = asyncio.get_running_loop().create_future()
        await self._answer(rid, fut, fut)
        ns = tuple(namespace)
        self.announced[ns] = rid
        send_namespace_notices(self.origin.publish(ns, self, rid))

    async def hand_over(self, namespace: TrackNamespace, timeout: float | None = 60.0, *,
                        live: bool = False) -> None:
        """Wait until the peer, a relay, holds every local track under ``namespace``
        complete, so that this session can end without taking the publication with it
        (docs/relay.md, "Publish and go").

        For each track, a SUBSCRIBE with Forward 0 (no object comes back): a kvcs relay
        pulls the whole track from us (it subscribes upstream with Forward 1 and a fill of
        the whole track whatever its subscribers' Forward) and ends the subscription with
        PUBLISH_DONE TRACK_ENDED once its copy is complete. Every track must have ended
        (End of Track), unless ``live``: then the hand-over starts while the tracks are
        still being written (the relay pulls each object as it is published instead of all
        of them at the end) and ends once they have ended and the relay holds them; the
        tracks are those under ``namespace`` at the call. Raises :class:`HandOverError` if a
        track has not ended (not ``live``), if the relay refuses or ends a subscription
        otherwise, or after ``timeout`` seconds (None: no limit).
        """
        ns = tuple(namespace)
        tracks = [t for t in self.origin.tracks.values()
                  if namespace_has_prefix(t.namespace, ns)]
        open_tracks = [t.name.decode(errors="replace") for t in tracks
                       if t.end_of_track is None]
        if open_tracks and not live:
            raise HandOverError(f"track(s) {', '.join(open_tracks)} have no End of Track: "
                                "a relay cannot hold them complete")

        async def confirm(track: Track) -> None:
            name = track.name.decode(errors="replace")
            sub: Subscription | None = None
            try:
                sub = await self.subscribe(track.namespace, track.name, forward=0)
                async for _ in sub:
                    pass  # Forward 0: nothing comes; the iteration ends at PUBLISH_DONE
            except (MoqtRequestError, SessionClosedError) as exc:
                raise HandOverError(f"track {name}: {exc}") from exc
            finally:
                if sub is not None and not sub.finished:
                    await sub.cancel()  # timed out: stop asking
            if sub.done is None or sub.done.status != PublishDoneCode.TRACK_ENDED:
                status = "no PUBLISH_DONE" if sub.done is None else _done_name(sub.done)
                raise HandOverError(f"track {name}: the relay ended it with {status}")

        tasks = [asyncio.ensure_future(confirm(t)) for t in tracks]
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout)
        except TimeoutError:
            raise HandOverError(f"the relay did not confirm every track within {timeout:g} "
                                "s") from None
        finally:
            for task in tasks:
                task.cancel()

    def withdraw(self, namespace: TrackNamespace) -> None:
        """Withdraw a namespace announced with :meth:`announce`."""
        ns = tuple(namespace)
        rid = self.announced.pop(ns, None)
        if rid is not None:
            self.session.cancel(rid)
            send_namespace_notices(self.origin.withdraw(ns, self, rid))
            self.schedule_flush()

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
        sub.ok = await self._answer(rid, sub, sub._accepted)
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
        res.ok = await self._answer(rid, res, res._accepted)
        return res

    async def track_status(self, namespace: TrackNamespace, name: bytes) -> RequestOk:
        """TRACK_STATUS; returns the REQUEST_OK (LARGEST_OBJECT, Track Properties)."""
        rid = self.session.track_status(namespace, name, self._params(None))
        fut: asyncio.Future[RequestOk] = asyncio.get_running_loop().create_future()
        return await self._answer(rid, fut, fut)

    async def subscribe_namespace(self, prefix: TrackNamespace) -> NamespaceWatch:
        """SUBSCRIBE_NAMESPACE; iterate the watch for (announced, namespace) changes."""
        rid = self.session.subscribe_namespace(prefix, self._params(None))
        watch = NamespaceWatch(self, rid)
        await self._answer(rid, watch, watch._accepted)
        return watch

    # ----------------------------------------------------------------- serving

    def open_requests(self) -> int:
        """Requests the peer has open with us (served, and namespace requests)."""
        return (self.server.active + len(self.peer_namespaces)
                + len(self.origin.watches(self)))

    def handle_request(self, e: ev.RequestReceived) -> None:
        """Answer the peer's request from :attr:`origin` (once :attr:`admission` admits
        it): :attr:`router`."""
        self.router.route(self, e)

    # ----------------------------------------------------------------- responses

    def handle_event(self, e: ev.Event) -> None:
        """Objects, answers and endings of our requests go to their waiting callers."""
        if isinstance(e, ev.ObjectReceived):
            target = self._requests.get(e.request_id)
            if isinstance(target, _Stream):
                runs = target._deliver_runs
                if runs is not None:
                    # the objects of this request queued right behind this one go with it
                    more = self.session.next_objects(e.request_id)
                    runs([_received(x) for x in (e, *more)] if more else [_received(e)])
                else:  # the iterator: one event per object, each through handle_event (an
                    # Endpoint subclass that observes objects, as tests/e2e/test_conformance.py
                    # does, would miss the rest of a run taken with next_objects)
                    target._put(_received(e))
            return
        rid = getattr(e, "request_id", None)
        target = self._requests.get(rid) if rid is not None else None
        if (isinstance(e, ev.SubscribeAccepted) and isinstance(target, Subscription)) or (
                isinstance(e, ev.FetchAccepted) and isinstance(target, FetchResult)):
            target.ok = e.message
            resolve_once(target._accepted, e.message)
            if isinstance(target, FetchResult) and target.finished:
                # the fetch stream overtook FETCH_OK (streams are not ordered)
                self._requests.pop(rid, None)  # type: ignore[arg-type]
        elif isinstance(e, ev.RequestAccepted):
            if e.update_id is not None and isinstance(target, Subscription | NamespaceWatch):
                resolve_once(target._updates.pop(e.update_id, None), e.message)
            elif isinstance(target, NamespaceWatch):
                resolve_once(target._accepted, e.message)
            elif isinstance(target, asyncio.Future):
                # TRACK_STATUS or PUBLISH_NAMESPACE answered (announce() keeps the latter)
                self._requests.pop(rid, None)  # type: ignore[arg-type]
                resolve_once(target, e.message)
        elif isinstance(e, ev.RequestRejected):
            m: RequestError = e.message
            exc = MoqtRequestError(m.code, m.reason, m.retry_interval)
            if e.update_id is not None and isinstance(target, Subscription | NamespaceWatch):
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
        elif isinstance(e, ev.UpdateReceived) and e.request_id in self.origin.watches(self):
            answer_namespace_update(self.session, e)
        elif isinstance(e, ev.RequestCancelled):
            ns = self.peer_namespaces.pop(e.request_id, None)
            if ns is not None:
                log.debug("peer withdrew namespace %r", ns)
            self.origin.unwatch(self, e.request_id)

    def session_ended(self, code: int, reason: str) -> None:
        """Fail what still waits; leave the (possibly shared) origin."""
        exc = SessionClosedError(f"session closed (code {code}: {reason})")
        for target in list(self._requests.values()):
            _fail_target(target, exc)
        self._requests.clear()
        for rid in self.origin.watches(self):
            self.origin.unwatch(self, rid)
        send_namespace_notices(self.origin.withdraw_all(self))  # on a shared origin


class _EndpointRouter(Router[Endpoint]):
    """An application's routing: it records the peer's PUBLISH_NAMESPACEs."""

    def published(self, session: Endpoint, request_id: int, namespace: TrackNamespace) -> None:
        session.peer_namespaces[request_id] = namespace


def _done_name(done: PublishDone) -> str:
    try:
        name = PublishDoneCode(done.status).name
    except ValueError:
        name = f"0x{done.status:x}"
    return f"{name} ({done.reason})" if done.reason else name


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


async def serve_endpoints(
    host: str,
    port: int,
    on_endpoint: Callable[[Endpoint], object],
    *,
    certfile: str,
    keyfile: str | None = None,
    settings: QuicSettings | None = None,
    origin: Origin[Endpoint] | None = None,
    endpoint_class: type[Endpoint] = Endpoint,
    admission: Admission | None = None,
    **session_options: Any,
) -> Server:
    """:func:`serve_sessions` with one ``endpoint_class`` per session, all serving
    ``origin`` if given (else each its own) and admitting requests by ``admission`` if
    given (each session then decodes the peer's requests at ``admission``'s request rate);
    ``on_endpoint`` is called with each new endpoint before any of its events are
    handled."""

    def bind(conn: MoqtConnection) -> None:
        on_endpoint(endpoint_class(conn, origin=origin, admission=admission))

    if admission is not None:  # each session decodes requests at the pacer's rate
        session_options.setdefault("request_rate", admission.limits.request_rate)
        session_options.setdefault("request_burst", admission.limits.request_burst)

    return await serve_sessions(host, port, bind, certfile=certfile, keyfile=keyfile,
                                settings=settings, **session_options)


__all__ = [
    "SETUP_TIMEOUT",
    "WRITE_WINDOW",
    "BoundSession",
    "Endpoint",
    "FetchResult",
    "HandOverError",
    "MoqtRequestError",
    "NamespaceWatch",
    "ReceivedObject",
    "SessionClosedError",
    "Subscription",
    "open_session",
    "send_namespace_notices",
    "serve_endpoints",
    "serve_sessions",
]
