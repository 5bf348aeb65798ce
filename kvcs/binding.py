"""One MOQT session bound to its QUIC connection (asyncio), and the servers that bind them.

A :class:`BoundSession` is a sans-IO :class:`~kvcs.moqt.session.Session` bound to its
connection (:mod:`kvcs.transport`): event pump, SETUP timeout, a
:class:`~kvcs.moqt.serving.TrackServer` that serves the session's origin (and wakes the
connection when serving a changed track wrote something), flushing. Its subclasses answer
the peer's requests: an application's :class:`~kvcs.endpoint.Endpoint`, a relay's
:class:`~kvcs.relay.session.RelaySession`. :func:`open_session` connects one,
:func:`serve_sessions` accepts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .admission import RequestPacer
from .errors import SessionError
from .moqt import events as ev
from .moqt.errors import RequestErrorCode, SessionCode
from .moqt.origin import NamespaceNotice
from .moqt.serving import TrackServer
from .moqt.session import Session, SessionConfig
from .moqt.wire import AuthToken, SetupOptions, TrackNamespace
from .transport import ConnectionInfo, MoqtConnection, QuicSettings, Server, connect, serve

log = logging.getLogger(__name__)

WRITE_WINDOW = 1 << 20
"""Bytes a fetch/fill stream may queue before its cursor waits for the transport to take
them (the binding reports writability): bounds memory and lets streams interleave."""
SETUP_TIMEOUT = 10.0
"""Seconds a server waits for the client's SETUP before closing the session."""


class MoqtRequestError(SessionError):
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


class SessionClosedError(SessionError, ConnectionError):
    """The MOQT session ended while a request was in progress."""


class BoundSession:
    """A sans-IO session bound to its QUIC connection: what an :class:`Endpoint` and a
    relay session share.

    It is the connection's :class:`~kvcs.transport.SessionHandler`: it drains the
    session's events, closes a server session whose peer sends no SETUP within
    :data:`SETUP_TIMEOUT`, lets its :class:`~kvcs.moqt.serving.TrackServer` take the events
    of the requests it serves, keeps the SETUP and close state, and flushes. Subclasses
    answer the peer's requests (:meth:`handle_request`), take every other event
    (:meth:`handle_event`) and clean up when the session ends (:meth:`session_ended`).
    """

    def __init__(self, conn: MoqtConnection, pacer: RequestPacer | None = None,
                 max_backlog: int | None = None, max_cursors: int = 0) -> None:
        assert conn.session is not None and isinstance(conn.session, Session)
        self.conn = conn
        self.session: Session = conn.session
        self.pacer = pacer
        """Hands the peer's requests to :meth:`handle_request` at the server's pace
        (:class:`~kvcs.admission.RequestPacer`, shared by its sessions); None: at once."""
        self.server = TrackServer(
            self.session, on_request_ended=self.served_request_ended,
            backlog=None if max_backlog is None else self._backlog,
            max_backlog=max_backlog or 0, wake=conn.flush_soon, max_cursors=max_cursors)
        """Serves tracks to the peer (its counters: ``objects_sent``, ``bytes_sent``); with
        ``max_backlog``, a live subscriber that lets more bytes than that queue up is
        ended with TOO_FAR_BEHIND (:attr:`TrackServer.max_backlog
        <kvcs.moqt.serving.TrackServer.max_backlog>`); ``max_cursors``: fetch and fill streams
        written at once (:attr:`TrackServer.max_cursors
        <kvcs.moqt.serving.TrackServer.max_cursors>`)."""
        loop = asyncio.get_running_loop()
        self._established: asyncio.Future[SetupOptions] = loop.create_future()
        self._closed: asyncio.Future[tuple[int, str]] = loop.create_future()
        self._resume: asyncio.TimerHandle | None = None  # RequestsWaiting
        conn.attach(self)
        conn.add_close_callback(self._on_connection_closed)
        if not self.session.config.is_client:
            # a peer that never sends SETUP is closed (CONTROL_MESSAGE_TIMEOUT)
            loop.call_later(SETUP_TIMEOUT, self._check_setup)

    # ----------------------------------------------------------------- state

    def _backlog(self) -> int:
        """Stream bytes waiting to be sent to the peer: the connection's send queue and
        what the session wrote in this event-loop turn (handed to the queue at the turn's
        flush). Counting the queue alone, a relay that fanned out a loaded turn's objects
        passed its 48 MiB session backlog by 1.05 MiB."""
        return self.conn.queued_bytes + self.session.pending_stream_bytes

    @property
    def peer_setup(self) -> SetupOptions | None:
        """The peer's Setup Options once its SETUP arrived."""
        return self.session.peer_setup

    async def established(self) -> SetupOptions:
        """Wait for the peer's SETUP."""
        return await asyncio.shield(self._established)

    @property
    def is_closed(self) -> bool:
        """True once the session has ended."""
        return self._closed.done() or self.session.is_closed

    @property
    def max_datagram_size(self) -> int:
        """Largest UDP payload the session's connection sends now, in bytes
        (:attr:`MoqtConnection.max_datagram_size
        <kvcs.transport.MoqtConnection.max_datagram_size>`)."""
        return self.conn.max_datagram_size

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
            self._ended(self.session.closed or (0, "closed"))
        return self._closed.result()

    # ----------------------------------------------------------------- sending

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

    def send_namespace(self, request_id: int, namespace: TrackNamespace, active: bool) -> None:
        """NAMESPACE (``active``) or NAMESPACE_DONE on the peer's SUBSCRIBE_NAMESPACE
        ``request_id``, sent at the end of the loop turn."""
        if self.is_closed:
            return
        with contextlib.suppress(KeyError, ValueError):  # the request ended meanwhile
            if active:
                self.session.namespace(request_id, namespace)
            else:
                self.session.namespace_done(request_id, namespace)
        self.schedule_flush()

    # ----------------------------------------------------------------- events

    def session_changed(self) -> None:
        """:class:`~kvcs.transport.SessionHandler`: handle the session's new events."""
        self._dispatch()

    def _dispatch(self) -> None:
        while (e := self.session.next_event()) is not None:
            try:
                self._handle(e)
            except Exception:
                log.exception("error handling %s", type(e).__name__)

    def _handle(self, e: ev.Event) -> None:
        if isinstance(e, ev.ObjectReceived):
            self.handle_event(e)  # the hot path: straight to the subclass
        elif self.server.handle(e):
            return
        elif isinstance(e, ev.RequestReceived):
            if self.pacer is None:
                self.handle_request(e)
            else:
                self.pacer.submit(self, e.request_id, functools.partial(self._paced, e))
        elif (isinstance(e, ev.RequestCancelled) and self.pacer is not None
              and self.pacer.withdraw(self, e.request_id)):
            return  # cancelled while it waited for its turn: never handled
        elif isinstance(e, ev.SessionEstablished):
            resolve_once(self._established, e.options)
        elif isinstance(e, ev.SessionClosed):
            self._ended((e.code, e.reason))
        elif isinstance(e, ev.StreamsOutstanding):
            asyncio.get_running_loop().call_later(
                self.session.config.publish_done_wait_s, self._stop_waiting, e.request_id)
        elif isinstance(e, ev.RequestsWaiting):
            if self._resume is None:
                self._resume = asyncio.get_running_loop().call_later(e.delay,
                                                                     self._resume_requests)
        elif isinstance(e, ev.GoAwayReceived):
            log.info("peer sent GOAWAY (uri=%r, timeout %d ms)", e.new_session_uri, e.timeout_ms)
        else:
            self.handle_event(e)

    def _resume_requests(self) -> None:
        """The peer's waiting requests may be decoded (``SessionConfig.request_rate``)."""
        self._resume = None
        if self.is_closed:
            return
        self.session.resume_requests()
        self._dispatch()
        self.schedule_flush()

    def _stop_waiting(self, request_id: int) -> None:
        """The digest 4.11 timer of a PUBLISH_DONE whose streams are missing expired."""
        if self.is_closed:
            return
        if self.session.stop_waiting_for_streams(request_id):
            # a stream of it is still receiving: the timer is for streams never seen
            asyncio.get_running_loop().call_later(
                self.session.config.publish_done_wait_s, self._stop_waiting, request_id)
            return
        self._dispatch()

    def _paced(self, e: ev.RequestReceived) -> None:
        """Request ``e``'s turn has come (:attr:`pacer`)."""
        if self.is_closed:
            return
        try:
            self.handle_request(e)
        except Exception:
            log.exception("error handling %s", type(e.message).__name__)
        self.schedule_flush()

    def open_requests(self) -> int:
        """Requests the peer has open with us (admission limits them)."""
        return self.server.active

    def open_fetches(self) -> int:
        """FETCHes of the peer being served (admission limits them)."""
        return self.server.fetching

    def handle_request(self, e: ev.RequestReceived) -> None:
        """A request of the peer (SUBSCRIBE, FETCH, PUBLISH_NAMESPACE, ...)."""
        self.session.request_error(e.request_id, RequestErrorCode.NOT_SUPPORTED,
                                   f"{type(e.message).__name__} not supported here")

    def handle_event(self, e: ev.Event) -> None:
        """Any other event: objects, answers to our requests, cancellations."""

    def served_request_ended(self, request_id: int) -> None:
        """A subscription or fetch served by :attr:`server` has ended."""

    def session_ended(self, code: int, reason: str) -> None:
        """The session has ended (called once)."""

    def _ended(self, closed: tuple[int, str]) -> None:
        if self._closed.done():
            return
        self._closed.set_result(closed)
        if self.pacer is not None:
            self.pacer.forget(self)
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if not self._established.done():
            self._established.set_exception(SessionClosedError(f"session closed: {closed}"))
            self._established.exception()
        self.session_ended(*closed)
        self.server.close()

    def _check_setup(self) -> None:
        if self.session.peer_setup is None and not self.is_closed:
            log.warning("peer sent no SETUP within %.0f s: closing", SETUP_TIMEOUT)
            self.close(SessionCode.CONTROL_MESSAGE_TIMEOUT, "no SETUP")

    def _on_connection_closed(self) -> None:
        self.session.connection_lost(None, "connection closed")
        self._dispatch()


B = TypeVar("B", bound=BoundSession)


def send_namespace_notices(notices: Iterable[NamespaceNotice[B]]) -> None:
    """Send what an :class:`~kvcs.moqt.origin.Origin` said each watcher must get."""
    for n in notices:
        n.session.send_namespace(n.request_id, n.namespace, n.active)


def answer_namespace_update(session: Session, e: ev.UpdateReceived) -> None:
    """Answer a REQUEST_UPDATE of a SUBSCRIBE_NAMESPACE we serve: REQUEST_OK when it
    changes nothing (a peer's :meth:`NamespaceWatch.sync
    <kvcs.endpoint.NamespaceWatch.sync>`; sent after the NAMESPACE messages already queued
    on the stream, so it tells the peer its list is whole), NOT_SUPPORTED for a new
    prefix."""
    if e.params.track_namespace_prefix is not None:
        session.request_error(e.request_id, RequestErrorCode.NOT_SUPPORTED,
                              "a namespace subscription's prefix cannot be changed",
                              update_id=e.update_id)
    else:
        session.request_ok(e.request_id, update_id=e.update_id)


async def open_session(
    url: str,
    make: Callable[[MoqtConnection], B],
    *,
    settings: QuicSettings | None = None,
    verify: bool = True,
    cafile: str | None = None,
    pin_sha256: str | bytes | None = None,
    auth_tokens: tuple[AuthToken, ...] = (),
    implementation: str = "kvcs/0.1",
    timeout: float = 10.0,
) -> B:
    """Connect to ``moqt://`` (raw QUIC) or ``https://`` (WebTransport), bind the session
    with ``make(conn)`` and wait for the peer's SETUP (ConnectionError if none comes)."""

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
    bound = make(conn)
    bound.session_changed()  # the peer's SETUP may already be in
    bound.flush()
    try:
        await asyncio.wait_for(bound.established(), timeout)
    except TimeoutError:
        bound.close(SessionCode.CONTROL_MESSAGE_TIMEOUT, "no SETUP")
        raise ConnectionError(f"{url}: peer sent no SETUP") from None
    return bound


async def serve_sessions(
    host: str,
    port: int,
    bind: Callable[[MoqtConnection], None],
    *,
    certfile: str,
    keyfile: str | None = None,
    settings: QuicSettings | None = None,
    implementation: str = "kvcs/0.1",
    max_filter_ranges: int = 16,
    max_request_updates: int = 0,
    request_rate: float = 0.0,
    request_burst: int = 64,
) -> Server:
    """Accept MOQT sessions (raw QUIC and WebTransport on one UDP port); ``bind(conn)``
    makes the handler of each new session (an :class:`Endpoint`, a relay session) before
    any of its events are handled. ``request_rate``, ``request_burst``: the new requests
    each session decodes (:attr:`SessionConfig.request_rate
    <kvcs.moqt.config.SessionConfig.request_rate>`)."""

    def factory(opener: Any, info: ConnectionInfo) -> Session:
        return Session(SessionConfig(
            is_client=False,
            implementation=implementation,
            webtransport=info.transport == "webtransport",
            max_filter_ranges=max_filter_ranges,
            max_request_updates=max_request_updates,
            write_window=WRITE_WINDOW,
            request_rate=request_rate,
            request_burst=request_burst,
        ), opener)

    return await serve(host, port, factory, settings, certfile, keyfile, on_session=bind)


def resolve_once(fut: asyncio.Future[Any] | None, value: Any) -> None:
    """Set ``fut``'s result unless it is None or already done."""
    if fut is not None and not fut.done():
        fut.set_result(value)


__all__ = [
    "SETUP_TIMEOUT",
    "WRITE_WINDOW",
    "BoundSession",
    "MoqtRequestError",
    "SessionClosedError",
    "open_session",
    "resolve_once",
    "send_namespace_notices",
    "serve_sessions",
]
