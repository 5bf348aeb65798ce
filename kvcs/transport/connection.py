"""One QUIC connection carrying one MOQT session: the core of the asyncio binding.

A :class:`MoqtConnection` drives the library's sans-IO ``QuicConnection`` through its
adapter (:mod:`kvcs.transport.quic`) over a :class:`~kvcs.transport.udp.UdpSocket` (its
own on a client, the server's shared one), feeds QUIC (or WebTransport,
:mod:`.webtransport`) events into the sans-IO session, calls the attached
:class:`~kvcs.transport.interfaces.SessionHandler` after every batch of inputs, then
drains ``session.actions()`` and carries them out: stream data goes through a priority
:class:`~kvcs.transport.scheduler.SendScheduler`. It pings a quiet peer
(:attr:`QuicSettings.keep_alive_s <kvcs.transport.QuicSettings.keep_alive_s>`).

Application code that calls session API methods itself (outside the handler) must call
:meth:`MoqtConnection.flush` afterwards. Servers (:mod:`.server`) and clients
(:mod:`.client`) make the connections.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, Protocol

from kvcs.moqt.actions import (
    Action,
    CloseSession,
    ResetStream,
    SendDatagram,
    SendStreamData,
    SetStreamPriority,
    StopSending,
)

from ..errors import KvcsError
from .certs import fingerprint_sha256
from .config import ALPN_H3, ALPN_MOQT, QuicSettings
from .interfaces import (
    ConnectionInfo,
    SansIOSession,
    SessionFactory,
    SessionHandler,
    SessionHook,
    SessionInputs,
)
from .quic.base import NetworkAddress, QuicAdapter, QuicConnectionAPI
from .scheduler import SendScheduler
from .udp import UdpSocket
from .webtransport import H3_NO_ERROR, WebTransport, wt_to_http_error

logger = logging.getLogger(__name__)

INTERNAL_ERROR = 0x1
"""MOQT session termination code used when the session or the hook raises."""

QUIC_NO_ERROR = 0x0
QUIC_PROTOCOL_VIOLATION = 0xA

#: QUIC CRYPTO_ERROR for TLS alert bad_certificate(42): used on a pin mismatch.
PIN_MISMATCH_ERROR = 0x100 + 42

WT_CLOSE_GRACE = 2.0
"""Seconds to wait for the peer to close the QUIC connection after our
CLOSE_WEBTRANSPORT_SESSION capsule before closing it ourselves."""

_ping_ids = itertools.count(1)


class DatagramSizeFellBack(KvcsError, ConnectionError):
    """The handshake completed only after the QUIC library cut the connection's datagram
    size for good: :mod:`.client` dials once more."""


class CidRouter(Protocol):
    """Where a server routes datagrams by destination connection ID."""

    def add_cid(self, cid: bytes, conn: MoqtConnection) -> None:
        """``conn`` issued a new connection ID."""
        ...

    def remove_cid(self, cid: bytes) -> None:
        """A connection ID was retired."""
        ...


class _Unanswered:
    """The termination of a connection forgotten by :meth:`MoqtConnection.forget_if_unanswered`
    (in the shape of the QUIC libraries' ConnectionTerminated event)."""

    error_code = 0
    reason_phrase = "nothing from the client decrypted"


class MoqtConnection:
    """One QUIC connection carrying one MOQT session (raw QUIC or WebTransport).

    Implements :class:`~kvcs.moqt.actions.StreamOpener`. Usable as an async context
    manager (closes with code 0 on exit). Made by :func:`~kvcs.transport.connect` and
    :func:`~kvcs.transport.serve`.
    """

    def __init__(
        self,
        quic: QuicConnectionAPI,
        lib: QuicAdapter,
        *,
        factory: SessionFactory,
        settings: QuicSettings,
        on_session: SessionHook | None = None,
        authority: str | None = None,
        path: str | None = None,
        webtransport: bool = False,
        pin_sha256: bytes | None = None,
        redial_on_fallback: bool = False,
        sock: socket.socket | None = None,
        udp: UdpSocket | None = None,
        cid_router: CidRouter | None = None,
    ) -> None:
        """A client passes its own ``sock`` (read by the connection, closed with it), a
        server connection the server's ``udp`` socket (the server reads it)."""
        self._loop = asyncio.get_running_loop()
        self._quic = quic
        self._lib = lib
        self.settings = settings
        self.session: SansIOSession | None = None
        self.info: ConnectionInfo | None = None
        self.handler: SessionHandler | None = None
        """The application side of the session (see :meth:`attach`)."""
        self._factory = factory
        self._on_session = on_session
        self._is_client = bool(quic.configuration.is_client)
        self._authority = authority
        self._path = path
        self._want_webtransport = webtransport
        self._pin = pin_sha256
        self._redial_on_fallback = redial_on_fallback
        self._owns_socket = sock is not None
        self._udp = udp if sock is None else UdpSocket(
            sock, self, batching=settings.gso, receive_size=settings.datagram_receive_buffer,
            on_error=self._socket_error)
        self._cid_router = cid_router
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._transmit_handle: asyncio.Handle | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._writable_scheduled = False
        self._scheduler = SendScheduler(quic, lib.send_view(quic), lib.errors,
                                        settings.send_watermark)
        self._inputs = SessionInputs(self._scheduler.drop, self._session_failed)
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._closed = asyncio.Event()
        self._pending: list[Callable[[], None]] = []
        self._lost = False
        self._local_close: tuple[int, str] | None = None
        self._terminated: Any = None  # the library's ConnectionTerminated event
        self._drain_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._closed_callbacks: list[Callable[[], None]] = []
        self._datagram_size = lib.datagram_size(quic)
        self._heard_at = self._loop.time()  # last datagram from the peer
        self._answered = False  # a datagram was sent (a server: the client's decrypted)
        self._keep_alive: asyncio.TimerHandle | None = None
        self._keep_alive_every = 0.0
        self._wt: WebTransport | None = None
        self._wt_close_timer: asyncio.TimerHandle | None = None
        events = lib.events
        self._events = events
        self._errors = lib.errors
        self._handlers: dict[type, Callable[[Any], None]] = {
            events.HandshakeCompleted: self._on_handshake,
            events.ConnectionTerminated: self._on_terminated,
            events.ConnectionIdIssued: self._on_cid_issued,
            events.ConnectionIdRetired: self._on_cid_retired,
            events.PingAcknowledged: lambda event: None,  # keep-alive: the ACK is enough
        }
        self._raw_events = {events.StreamDataReceived, events.StreamReset,
                            events.StopSendingReceived, events.DatagramFrameReceived}

    # -- public API -----------------------------------------------------------------

    def attach(self, handler: SessionHandler) -> None:
        """Make ``handler`` the application side of this connection's session."""
        self.handler = handler

    def add_close_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the QUIC connection has ended."""
        self._closed_callbacks.append(callback)

    @property
    def is_closed(self) -> bool:
        """True once the QUIC connection has ended."""
        return self._closed.is_set()

    @property
    def is_webtransport(self) -> bool:
        """Whether the session runs over WebTransport."""
        return self._wt is not None

    @property
    def library(self) -> str:
        """The QUIC library of this connection (``"qh3"`` or ``"aioquic"``)."""
        return self._lib.name

    @property
    def max_datagram_size(self) -> int:
        """Largest UDP payload this connection sends now, in bytes: the settings'
        ``max_datagram_size`` unless the QUIC library or the peer lowered it (the peer's
        ``max_udp_payload_size``; qh3 after a slow handshake, see
        :meth:`~kvcs.transport.quic.qh3.Qh3Adapter.datagram_size_fell_back`), or qh3's path
        probing raised a smaller one (up to 1452 bytes). Changes are logged at DEBUG."""
        return self._lib.datagram_size(self._quic)

    @property
    def gso(self) -> bool:
        """Whether sends batch equal-size datagrams with UDP GSO now (``QuicSettings.gso``
        on a kernel that takes it)."""
        return self._udp is not None and self._udp.gso

    @property
    def gro(self) -> bool:
        """Whether the socket receives coalesced datagrams (UDP GRO)."""
        return self._udp is not None and self._udp.gro

    @property
    def buffered_bytes(self) -> int:
        """Stream bytes written but not yet sent: scheduler queues plus QUIC unsent."""
        return self._scheduler.buffered_bytes

    @property
    def queued_bytes(self) -> int:
        """Stream bytes written and still waiting in the send scheduler: what grows when
        the peer does not read (QUIC itself holds at most the send watermark plus what
        the peer's flow control lets be in flight). Constant time."""
        return self._scheduler.queued_bytes

    async def wait_ready(self) -> None:
        """Wait until the session exists (handshake, and CONNECT for WebTransport)."""
        await asyncio.shield(self._ready)

    async def wait_closed(self) -> None:
        """Wait until the QUIC connection has ended."""
        await self._closed.wait()

    async def drain(self, limit: int = 0) -> None:
        """Wait until :attr:`buffered_bytes` <= ``limit``; raise ConnectionError if closed."""
        if self._terminated is not None or self._local_close is not None:
            raise ConnectionError("connection closed")
        if self.buffered_bytes <= limit:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._drain_waiters.append((limit, waiter))
        await waiter

    def flush(self) -> None:
        """Drain the session's actions, carry them out and transmit."""
        self._flush_handle = None
        if self.is_closed:
            return
        self._apply_actions()
        self.transmit()

    def flush_soon(self) -> None:
        """:meth:`flush` at the end of this event-loop turn (once, however often called):
        object writes and requests made by several tasks in one turn (a consumer's K and V
        FETCHes, a relay fanning one object out) share one transmit and one datagram."""
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self.flush)

    def open_stream(self, unidirectional: bool) -> int:
        """StreamOpener: allocate a new local stream (no I/O). Past the peer's stream
        limit the stream exists for the session at once; what is written on it waits in
        the send scheduler until the peer's MAX_STREAMS lets it out."""
        if self._wt is not None:
            stream_id, preamble = self._wt.open_stream(unidirectional)
        else:
            stream_id, preamble = self._quic.get_next_available_stream_id(unidirectional), b""
        try:
            self._scheduler.open(stream_id, preamble)  # the next call gets a new ID
        except self._errors:
            # the connection closed before the session heard of it; the stream is dead
            # and the session learns of the close from the next event
            logger.debug("stream %d opened on a closed connection", stream_id)
        self._transmit_soon()
        return stream_id

    def close(self, code: int = 0, reason: str = "") -> None:
        """Close the MOQT session with a session termination code (see module doc)."""
        self._close_session(code, reason)
        self.transmit()

    async def __aenter__(self) -> MoqtConnection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        await self.wait_closed()

    def connect(self, addr: NetworkAddress) -> None:
        """Client: start the handshake with the server at ``addr``."""
        self._quic.connect(addr, now=self._loop.time())
        self.transmit()

    # -- UDP ----------------------------------------------------------------------

    def datagrams_received(self, datagrams: list[bytes], addr: NetworkAddress) -> None:
        """:meta private: feed datagrams that arrived together from ``addr`` to QUIC; the
        events wait for :meth:`receive_done`, once the socket was read."""
        now = self._loop.time()
        self._heard_at = now
        self._lib.receive_datagrams(self._quic, datagrams, addr, now)

    def segments_received(self, buffer: bytes, segment_size: int,
                          addr: NetworkAddress) -> None:
        """:meta private: as :meth:`datagrams_received`, for a GRO buffer (datagrams of
        ``segment_size`` bytes back to back)."""
        now = self._loop.time()
        self._heard_at = now
        self._lib.receive_segments(self._quic, buffer, segment_size, addr, now)

    def receive_done(self) -> None:
        """:meta private: the socket was read (a client's; the server's listener calls it
        for each connection that received any): handle the events, then transmit once.
        Handling them once per read rather than per GRO buffer gives the session its
        stream data in larger pieces (a relay read ~5 buffers per readiness event at
        1452-byte datagrams: handling each on its own cost it ~7% more CPU per MiB)."""
        self._process_events()
        self.transmit()

    def close_socket(self) -> None:
        """:meta private: a client's socket closes (after the connection ended or failed
        to start); nothing more is sent."""
        for handle in (self._timer, self._transmit_handle, self._flush_handle,
                       self._keep_alive):
            if handle is not None:
                handle.cancel()
        if self._owns_socket and self._udp is not None:
            self._udp.close()
            self._udp = None

    def transmit(self) -> None:
        """Refill QUIC from the scheduler, send datagrams, re-arm the timer."""
        self._transmit_handle = None
        udp = self._udp
        if udp is None:
            return
        quic, scheduler = self._quic, self._scheduler
        for _ in range(16):
            scheduler.refill()
            try:
                datagrams = quic.datagrams_to_send(now=self._loop.time())
            except self._errors as exc:  # pragma: no cover - qh3 core hiccup
                logger.debug("datagrams_to_send failed: %s", exc)
                break
            if datagrams:
                udp.send(datagrams)
                self._answered = True
            if not datagrams or not scheduler.has_queued:
                break
            if scheduler.unsent_bytes() >= scheduler.watermark:
                break  # QUIC is blocked (cwnd / pacing), not starved
        timer_at = quic.get_timer()
        if self._timer is not None and self._timer_at != timer_at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and timer_at is not None:
            self._timer = self._loop.call_at(timer_at, self._handle_timer)
        self._timer_at = timer_at
        size = self._lib.datagram_size(quic)  # 0.7 us on qh3, once per transmit
        if size != self._datagram_size:
            logger.debug("%s connection: datagram size %d -> %d bytes",
                         "client" if self._is_client else "server", self._datagram_size, size)
            self._datagram_size = size
        if self._drain_waiters:
            self._wake_drainers()
        if scheduler.drained and not self._writable_scheduled:
            self._writable_scheduled = True
            self._loop.call_soon(self._report_writable)

    def _transmit_soon(self) -> None:
        if self._transmit_handle is None:
            self._transmit_handle = self._loop.call_soon(self.transmit)

    def _handle_timer(self) -> None:
        now = max(self._timer_at or 0.0, self._loop.time())
        self._timer = None
        self._timer_at = None
        self._quic.handle_timer(now=now)
        self._process_events()
        self.transmit()

    def _report_writable(self) -> None:
        """Tell the session which of its streams drained, let the application react (e.g.
        a paused fetch cursor writes more), then send what it wrote."""
        self._writable_scheduled = False
        drained, self._scheduler.drained = self._scheduler.drained, []
        session = self.session
        if session is None or self._udp is None:
            return
        writable = getattr(session, "stream_writable", None)
        if writable is None:
            return
        for stream_id in dict.fromkeys(drained):
            writable(stream_id)
        self._notify_session_changed()
        self.flush()

    def _notify_session_changed(self) -> None:
        """Let the handler react to session events."""
        if self.handler is not None:
            try:
                self.handler.session_changed()
            except Exception:
                logger.exception("session handler failed")

    def _process_events(self) -> None:
        """Handle every event QUIC has; then, if the session took input, let the handler
        react and carry out the session's actions."""
        inputs = self._inputs
        inputs.taken = False
        quic, handlers = self._quic, self._handlers
        event = quic.next_event()
        while event is not None:
            handler = handlers.get(type(event))
            if handler is not None:
                handler(event)
            elif self._wt is not None:
                self._wt.quic_event(event)
            else:
                self._on_raw_event(event)
            event = quic.next_event()
        if inputs.taken and self.session is not None:
            inputs.taken = False
            self._notify_session_changed()
            self._apply_actions()

    def _on_cid_issued(self, event: Any) -> None:
        if self._cid_router is not None:
            self._cid_router.add_cid(event.connection_id, self)

    def _on_cid_retired(self, event: Any) -> None:
        if self._cid_router is not None:
            self._cid_router.remove_cid(event.connection_id)

    # -- handshake and session creation ---------------------------------------------

    def _socket_error(self, exc: OSError) -> None:
        """A client's socket reported an ICMP error. Port unreachable before the handshake
        completes: nothing listens there, so the dial fails at once instead of after the
        whole timeout. Later ones are left to QUIC (a restarting peer comes back)."""
        if isinstance(exc, ConnectionRefusedError) and not self._ready.done():
            self._fail(ConnectionRefusedError(exc.errno, "nothing listens on that UDP port"))

    def _fail(self, exc: BaseException) -> None:
        if not self._ready.done():
            self._ready.set_exception(exc)
            self._ready.exception()  # mark retrieved; connect() re-raises

    def _on_handshake(self, event: Any) -> None:
        alpn = event.alpn_protocol
        if self._is_client and self._pin is not None:
            der = self._lib.peer_certificate(self._quic)
            got = fingerprint_sha256(der) if der is not None else "none"
            want = ":".join(f"{b:02X}" for b in self._pin)
            if got != want:
                logger.warning("certificate pin mismatch: got %s, want %s", got, want)
                self._quic.close(
                    error_code=PIN_MISMATCH_ERROR, reason_phrase="certificate pin mismatch"
                )
                self._fail(ConnectionError(f"certificate pin mismatch (got {got})"))
                return
        configured = int(self._quic.configuration.max_datagram_size)
        if self._lib.datagram_size_fell_back(self._quic):
            why = (f"the server answered the QUIC handshake late and {self._lib.name} cut the "
                   f"datagram size from {configured} to "
                   f"{self.max_datagram_size} bytes for the connection's life")
            if self._redial_on_fallback:
                self._local_close = (QUIC_NO_ERROR, "redialing")
                self._quic.close(error_code=QUIC_NO_ERROR, reason_phrase="redialing")
                self._fail(DatagramSizeFellBack(why))
                return
            logger.warning("%s (twice: does the path drop larger datagrams?)", why)
        logger.debug("%s connection with %s: datagram size %d bytes (configured %d)",
                     "client" if self._is_client else "server",
                     self._lib.peer_address(self._quic), self.max_datagram_size, configured)
        self._start_keep_alive()
        if alpn == ALPN_MOQT and not self._want_webtransport:
            self._create_session("quic", alpn, self._authority, self._path)
        elif alpn == ALPN_H3:
            self._wt = WebTransport(
                self._quic, self._lib, self._inputs, is_client=self._is_client,
                start_session=self._start_webtransport_session,
                peer_closed=self._wt_session_ended, refused=self._wt_refused,
                accepting=lambda: self._local_close is None)
            if self._is_client:
                self._wt.send_connect(self._authority, self._path)
        else:
            self._quic.close(
                error_code=QUIC_PROTOCOL_VIOLATION,
                reason_phrase=f"unexpected ALPN {alpn!r}",
            )
            self._fail(ConnectionError(f"unexpected ALPN {alpn!r}"))

    def _create_session(
        self,
        transport: Literal["quic", "webtransport"],
        alpn: str,
        authority: str | None,
        path: str | None,
    ) -> None:
        self.info = ConnectionInfo(
            is_client=self._is_client,
            transport=transport,
            authority=authority,
            path=path,
            peer_address=self._lib.peer_address(self._quic),
            alpn=alpn,
        )
        try:
            self.session = self._factory(self, self.info)
        except Exception as exc:
            logger.exception("session factory failed")
            self._close_session(INTERNAL_ERROR, "session factory failed")
            self._fail(exc)
            return
        self._inputs.session = self.session
        if self._on_session is not None:
            try:
                self._on_session(self)
            except Exception:
                logger.exception("on_session hook failed")
        if not self._ready.done():
            self._ready.set_result(None)
        pending, self._pending = self._pending, []
        for call in pending:
            call()
        self._inputs.taken = True

    def _session_failed(self) -> None:
        self._close_session(INTERNAL_ERROR, "internal error")

    # -- keep-alive -----------------------------------------------------------------

    def _start_keep_alive(self) -> None:
        every = self.settings.keep_alive_interval(
            is_client=self._is_client, idle_timeout=self._lib.idle_timeout(self._quic))
        if every is None:
            return
        self._keep_alive_every = every
        self._keep_alive = self._loop.call_later(every, self._keep_alive_due)
        logger.debug("%s connection: PING after %.1f s without a packet from the peer",
                     "client" if self._is_client else "server", every)

    def _keep_alive_due(self) -> None:
        """Ping the peer if nothing came from it for the keep-alive interval (its ACK
        restarts both ends' idle timers), then check again when the next one could end."""
        self._keep_alive = None
        if self._udp is None or self._terminated is not None or self._local_close is not None:
            return
        now, every = self._loop.time(), self._keep_alive_every
        due = self._heard_at + every
        if now >= due - 0.001:  # the loop may call a little early (clock resolution)
            try:
                self._quic.send_ping(next(_ping_ids))
            except self._errors as exc:  # pragma: no cover - the connection just died
                logger.debug("keep-alive PING failed: %s", exc)
                return
            self.transmit()
            due = now + every
        self._keep_alive = self._loop.call_at(due, self._keep_alive_due)

    # -- raw QUIC -------------------------------------------------------------------

    def _on_raw_event(self, event: Any) -> None:
        kind = type(event)
        if kind not in self._raw_events:
            return
        inputs = self._inputs
        if inputs.session is None:
            if self._local_close is None:
                self._pending.append(functools.partial(self._on_raw_event, event))
            return
        events = self._events
        if kind is events.StreamDataReceived:
            inputs.stream_data(event.stream_id, event.data, event.end_stream)
        elif kind is events.DatagramFrameReceived:
            inputs.datagram(event.data)
        elif kind is events.StreamReset:
            inputs.stream_reset(event.stream_id, event.error_code)
        else:
            inputs.stop_sending(event.stream_id, event.error_code)

    # -- WebTransport ---------------------------------------------------------------

    def _start_webtransport_session(self, authority: str | None, path: str | None) -> bool:
        self._create_session("webtransport", ALPN_H3, authority, path)
        return self.session is not None

    def _wt_refused(self, reason: str) -> None:
        logger.warning(reason)
        self._quic.close(error_code=H3_NO_ERROR, reason_phrase=reason)
        self._fail(ConnectionError(reason))

    def _wt_session_ended(self, code: int, reason: str) -> None:
        """The peer closed the WebTransport session: report it and close the connection."""
        self._report_lost(code, reason)
        if self._local_close is None:
            self._local_close = (code, reason)
        self._quic.close(error_code=H3_NO_ERROR, reason_phrase="WebTransport session closed")
        self._transmit_soon()

    # -- actions --------------------------------------------------------------------

    def _apply_actions(self) -> None:
        session = self.session
        if session is None:
            return
        while True:
            try:
                actions = session.actions()
            except Exception:
                logger.exception("session.actions() failed")
                self._close_session(INTERNAL_ERROR, "internal error")
                return
            if not actions:
                return
            for action in actions:
                self._apply(action)

    def _apply(self, action: Action) -> None:
        if self._local_close is not None or self._terminated is not None:
            return
        quic, wt = self._quic, self._wt
        try:
            if isinstance(action, SendStreamData):
                self._scheduler.write(action.stream_id, action.data, action.end)
            elif isinstance(action, SetStreamPriority):
                self._scheduler.set_priority(action.stream_id, action.priority)
            elif isinstance(action, ResetStream):
                code = wt_to_http_error(action.code) if wt else action.code
                self._scheduler.reset(action.stream_id, code)
            elif isinstance(action, StopSending):
                code = wt_to_http_error(action.code) if wt else action.code
                quic.stop_stream(action.stream_id, code)
            elif isinstance(action, SendDatagram):
                if wt is not None:
                    wt.send_datagram(action.data)
                else:
                    quic.send_datagram_frame(action.data)
            elif isinstance(action, CloseSession):
                self._close_session(action.code, action.reason)
            else:  # pragma: no cover - future actions
                logger.warning("unknown action %r", action)
        except self._errors as exc:
            # the stream or connection is already gone
            logger.debug("action %r failed: %s", action, exc)

    def _close_session(self, code: int, reason: str) -> None:
        if self._local_close is not None or self._terminated is not None:
            return
        self._local_close = (code, reason)
        self._fail(ConnectionError(f"closed locally: {code:#x} {reason}"))
        wt = self._wt
        if wt is not None and wt.session_id is not None and self.session is not None:
            # CLOSE_WEBTRANSPORT_SESSION capsule + FIN on the CONNECT stream; the peer
            # then closes the QUIC connection (or we do after WT_CLOSE_GRACE).
            try:
                wt.send_close(code, reason)
                self._wt_close_timer = self._loop.call_later(
                    WT_CLOSE_GRACE, self._close_quic, H3_NO_ERROR, "WebTransport session closed"
                )
                self._transmit_soon()
                return
            except Exception as exc:  # pragma: no cover - defensive
                logger.debug("cannot send close capsule: %s", exc)
            self._close_quic(H3_NO_ERROR, reason)
        else:
            self._close_quic(code, reason)

    def _close_quic(self, code: int, reason: str) -> None:
        self._quic.close(error_code=code, reason_phrase=reason)
        self.transmit()

    # -- termination ----------------------------------------------------------------

    def _report_lost(self, code: int | None, reason: str) -> None:
        if self._lost:
            return
        self._lost = True
        if self.session is not None:
            try:
                self.session.connection_lost(code, reason)
            except Exception:
                logger.exception("session.connection_lost failed")

    def forget_if_unanswered(self) -> None:
        """:meta private: a server's connection that has sent nothing yet (no packet of
        its client could be decrypted) ends now, without CONNECTION_CLOSE or draining:
        nobody could read them (:attr:`QuicSettings.handshake_timeout
        <kvcs.transport.QuicSettings.handshake_timeout>`)."""
        if self._answered or self._terminated is not None:
            return
        logger.info("server connection forgotten: nothing from its client decrypted")
        for handle in (self._timer, self._transmit_handle, self._flush_handle):
            if handle is not None:
                handle.cancel()
        self._on_terminated(_Unanswered())

    def _on_terminated(self, event: Any) -> None:
        if self._terminated is not None:
            return  # forgotten before QUIC ended it
        self._terminated = event
        self._closed.set()
        if self._keep_alive is not None:
            self._keep_alive.cancel()
        if self._wt_close_timer is not None:
            self._wt_close_timer.cancel()
        if self._local_close is not None:
            code, reason = self._local_close
        else:
            code, reason = event.error_code, event.reason_phrase
        self._fail(
            ConnectionError(f"connection closed: {event.error_code:#x} {event.reason_phrase}")
        )
        self._report_lost(code, reason)
        for _, waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionError("connection closed"))
                waiter.exception()
        self._drain_waiters.clear()
        for callback in self._closed_callbacks:
            callback()
        if self._owns_socket:
            self._loop.call_soon(self.close_socket)

    def _wake_drainers(self) -> None:
        buffered = self.buffered_bytes
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for limit, waiter in self._drain_waiters:
            if waiter.done():
                continue
            if buffered <= limit:
                waiter.set_result(None)
            else:
                keep.append((limit, waiter))
        self._drain_waiters = keep
