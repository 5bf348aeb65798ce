"""asyncio + QUIC (qh3 or aioquic) binding of a sans-IO MOQT session (raw QUIC, WebTransport).

One :class:`MoqtConnection` per QUIC connection owns one sans-IO session. It feeds QUIC
(or WebTransport) events into the session, calls the attached :class:`SessionHandler`
after every batch of inputs, then drains ``session.actions()`` and carries them out: stream
data goes through a priority :class:`~kvcs.transport.scheduler.SendScheduler`.

Application code that calls session API methods itself (outside the handler) must call
:meth:`MoqtConnection.flush` afterwards.

Server: :func:`serve` accepts raw QUIC (ALPN ``moqt-22``) and HTTP/3 WebTransport (ALPN
``h3``, extended CONNECT offering ``moqt-22``) on one UDP port.
Client: :func:`connect` with ``moqt://host:port/path`` (raw QUIC) or
``https://host:port/path`` (WebTransport).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
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
    StreamOpener,
)

from .backend import (
    BACKEND,
    FrameType,
    H3Connection,
    NetworkAddress,
    QuicConnection,
    QuicConnectionError,
    QuicConnectionProtocol,
    QuicErrorCode,
    QuicServer,
    events,
    h3events,
)
from .certs import fingerprint_sha256, parse_fingerprint
from .config import ALPN_H3, ALPN_MOQT, QuicSettings
from .scheduler import SendScheduler
from .webtransport import (
    CAPSULE_CLOSE_WEBTRANSPORT_SESSION,
    H3_NO_ERROR,
    CapsuleParser,
    decode_close_capsule,
    encode_close_capsule,
    http_to_wt_error,
    parse_sf_string_list,
    sf_string,
    wt_to_http_error,
)

logger = logging.getLogger(__name__)

INTERNAL_ERROR = 0x1
"""MOQT session termination code used when the session or the hook raises."""

#: QUIC CRYPTO_ERROR for TLS alert bad_certificate(42): used on a pin mismatch.
PIN_MISMATCH_ERROR = 0x100 + 42

WT_CLOSE_GRACE = 2.0
"""Seconds to wait for the peer to close the QUIC connection after our
CLOSE_WEBTRANSPORT_SESSION capsule before closing it ourselves."""


RECEIVE_BATCH = 32
"""Datagrams read from the UDP socket per readiness event. asyncio reads one datagram per
event loop iteration and aioquic transmits after each; reading what is queued first and
transmitting once per connection afterwards saves a ``datagrams_to_send`` pass (which
visits every stream) per datagram and lets ACKs cover more packets."""


def _datagram_stream_id(event: Any) -> int:
    """The CONNECT stream of an HTTP datagram. qh3 2.x hands out the raw Quarter Stream
    ID of RFC 9297 as ``flow_id``; aioquic converts it to ``stream_id``."""
    if BACKEND == "qh3":
        return int(event.flow_id) * 4
    return int(event.stream_id)


def _datagram_flow(stream_id: int) -> int:
    """What ``H3Connection.send_datagram`` takes for the CONNECT stream ``stream_id``: qh3
    writes its argument as the Quarter Stream ID, aioquic divides by 4 itself."""
    return stream_id // 4 if BACKEND == "qh3" else stream_id


class _ReceiveBatch:
    """Connections of one server socket that received datagrams in the current batch."""

    __slots__ = ("active", "pending")

    def __init__(self) -> None:
        self.active = False
        self.pending: dict[MoqtConnection, None] = {}


class SansIOSession(Protocol):
    """What the binding needs from a sans-IO MOQT session."""

    def stream_data(self, stream_id: int, data: bytes, end: bool) -> None:
        """Bytes received on a stream (after any WebTransport preamble)."""
        ...

    def stream_reset(self, stream_id: int, code: int) -> None:
        """Peer RESET_STREAM."""
        ...

    def stop_sending(self, stream_id: int, code: int) -> None:
        """Peer STOP_SENDING (the binding already dropped queued data of the stream)."""
        ...

    def datagram(self, data: bytes) -> None:
        """One QUIC DATAGRAM (WebTransport: payload after the quarter stream ID)."""
        ...

    def connection_lost(self, code: int | None, reason: str) -> None:
        """The connection or WebTransport session ended (called once)."""
        ...

    def actions(self) -> list[Action]:
        """Drain pending actions."""
        ...


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """What the session factory learns about a new connection."""

    is_client: bool
    transport: Literal["quic", "webtransport"]
    authority: str | None
    """Client: from the URL (raw QUIC: to send as SETUP AUTHORITY). WebTransport server:
    the CONNECT ``:authority``. Raw QUIC server: ``None`` (learnt from SETUP)."""
    path: str | None
    """Path with query, as for ``authority``."""
    peer_address: NetworkAddress | None
    alpn: str | None


SessionFactory = Callable[[StreamOpener, ConnectionInfo], SansIOSession]
"""Builds the session once the transport is ready; the opener is the connection."""

SessionHook = Callable[["MoqtConnection"], None]


class SessionHandler(Protocol):
    """What the binding calls on the application side of a session (an endpoint, a relay
    peer): attach one with :meth:`MoqtConnection.attach`."""

    def session_changed(self) -> None:
        """The session took input (it may have events); called after each batch of inputs
        and after streams drained, before the session's actions are sent."""
        ...


class MoqtConnection(QuicConnectionProtocol):
    """One QUIC connection carrying one MOQT session (raw QUIC or WebTransport).

    Implements :class:`~kvcs.moqt.actions.StreamOpener`. Usable as an async context
    manager (closes with code 0 on exit).
    """

    def __init__(
        self,
        quic: QuicConnection,
        stream_handler: Any = None,
        *,
        factory: SessionFactory,
        settings: QuicSettings,
        on_session: SessionHook | None = None,
        authority: str | None = None,
        path: str | None = None,
        webtransport: bool = False,
        pin_sha256: bytes | None = None,
        owns_transport: bool = False,
        sock: socket.socket | None = None,
        receive_batch: _ReceiveBatch | None = None,
    ) -> None:
        super().__init__(quic, stream_handler)
        if BACKEND == "aioquic":
            # peers may open many streams (aioquic hard-codes 128 concurrently)
            quic._local_max_streams_uni.value = settings.max_streams_uni
            quic._local_max_streams_bidi.value = settings.max_streams_bidi
        self.settings = settings
        self.session: SansIOSession | None = None
        self.info: ConnectionInfo | None = None
        self.handler: SessionHandler | None = None
        """The application side of the session (see :meth:`attach`)."""
        self._factory = factory
        self._on_session = on_session
        self._is_client = quic.configuration.is_client
        self._authority = authority
        self._path = path
        self._want_webtransport = webtransport
        self._pin = pin_sha256
        self._owns_transport = owns_transport
        self._sock = sock  # client: the socket of our own transport, read in batches
        self._receive_batch = receive_batch  # server: set while the server reads a batch
        self._writable_scheduled = False
        self._flush_handle: asyncio.Handle | None = None
        self._scheduler = SendScheduler(quic, settings.send_watermark)
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._inputs = False
        self._pending: list[Callable[[], None]] = []
        self._lost = False
        self._local_close: tuple[int, str] | None = None
        self._terminated: events.ConnectionTerminated | None = None
        self._drain_waiters: list[tuple[int, asyncio.Future[None]]] = []
        # WebTransport state
        self._h3: H3Connection | None = None
        self._wt_session_id: int | None = None
        self._wt_streams: set[int] = set()
        self._wt_pending: dict[int, list[h3events.H3Event]] = {}
        self._capsules = CapsuleParser()
        self._wt_close_timer: asyncio.TimerHandle | None = None
        self._closed_callbacks: list[Callable[[], None]] = []

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
        return self._h3 is not None

    @property
    def buffered_bytes(self) -> int:
        """Stream bytes written but not yet sent: scheduler queues plus aioquic unsent."""
        return self._scheduler.buffered_bytes

    async def wait_ready(self) -> None:
        """Wait until the session exists (handshake, and CONNECT for WebTransport)."""
        await asyncio.shield(self._ready)

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
        """StreamOpener: allocate a new local stream (no I/O)."""
        if self._h3 is not None:
            assert self._wt_session_id is not None
            stream_id = self._h3.create_webtransport_stream(
                self._wt_session_id, is_unidirectional=unidirectional
            )
            self._wt_streams.add(stream_id)
            if not unidirectional:
                # aioquic 1.7.2 would parse the peer's half of a locally opened WT bidi
                # stream as HTTP/3 frames: mark it as a WebTransport stream up front.
                created = self._h3._get_or_create_stream(stream_id)
                if BACKEND == "qh3":  # pragma: no cover - qh3 returns the stream itself
                    created = contextlib.nullcontext(created)  # type: ignore[assignment]
                with created as h3stream:
                    h3stream.frame_type = FrameType.WEBTRANSPORT_STREAM
                    h3stream.session_id = self._wt_session_id
                    h3stream.sending_ended = True  # we never send HTTP/3 frames on it
        else:
            stream_id = self._quic.get_next_available_stream_id(unidirectional)
            try:
                # create it now so that the next call gets a new ID
                self._quic.send_stream_data(stream_id, b"")
            except QuicConnectionError:
                # qh3: the connection closed before the session heard of it; the stream
                # is dead and the session learns of the close from the next event
                logger.debug("stream %d opened on a closed connection", stream_id)
        self._transmit_soon()
        return stream_id

    def close(self, code: int = 0, reason: str = "") -> None:  # type: ignore[override]
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

    # -- aioquic hooks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """:meta private:"""
        super().connection_made(transport)
        if self._owns_transport:
            # the asyncio datagram transport reads with recvfrom(max_size)
            transport.max_size = self.settings.datagram_receive_buffer  # type: ignore[attr-defined]

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        """:meta private: feed a datagram (and, on a client, every other one already queued
        on the socket) to aioquic, then transmit once (see :data:`RECEIVE_BATCH`)."""
        quic, loop = self._quic, self._loop
        quic.receive_datagram(data, addr, now=loop.time())  # type: ignore[arg-type]
        self._process_events()
        batch = self._receive_batch
        if batch is not None and batch.active:
            batch.pending[self] = None  # the server transmits after the batch
            return
        sock = self._sock
        if sock is not None:
            max_size = self.settings.datagram_receive_buffer
            for _ in range(RECEIVE_BATCH - 1):
                try:
                    data, addr = sock.recvfrom(max_size)
                except OSError:  # BlockingIOError: nothing queued; or closed / ICMP error
                    break
                quic.receive_datagram(data, addr, now=loop.time())
                self._process_events()
        self.transmit()

    def transmit(self) -> None:
        """Refill aioquic from the scheduler, send datagrams, re-arm the timer."""
        self._transmit_task = None
        if self._transport is None:
            return
        quic, sendto, scheduler = self._quic, self._transport.sendto, self._scheduler
        for _ in range(16):
            scheduler.refill()
            sent = 0
            try:
                datagrams = quic.datagrams_to_send(now=self._loop.time())
            except QuicConnectionError as exc:  # pragma: no cover - qh3 core hiccup
                logger.debug("datagrams_to_send failed: %s", exc)
                break
            for data, addr in datagrams:
                sendto(data, addr)
                sent += 1
            if not sent or not scheduler.has_queued:
                break
            if scheduler.unsent_bytes() >= scheduler.watermark:
                break  # aioquic is blocked (cwnd / pacing), not starved
        timer_at = quic.get_timer()
        if self._timer is not None and self._timer_at != timer_at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and timer_at is not None:
            self._timer = self._loop.call_at(timer_at, self._handle_timer)
        self._timer_at = timer_at
        if self._drain_waiters:
            self._wake_drainers()
        if scheduler.drained and not self._writable_scheduled:
            self._writable_scheduled = True
            self._loop.call_soon(self._report_writable)

    def _report_writable(self) -> None:
        """Tell the session which of its streams drained, let the application react (e.g.
        a paused fetch cursor writes more), then send what it wrote."""
        self._writable_scheduled = False
        drained, self._scheduler.drained = self._scheduler.drained, []
        session = self.session
        if session is None or self._transport is None:
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
        self._inputs = False
        super()._process_events()
        if self._inputs and self.session is not None:
            self._inputs = False
            self._notify_session_changed()
            self._apply_actions()

    def quic_event_received(self, event: events.QuicEvent) -> None:
        """:meta private: dispatch one QUIC event."""
        if isinstance(event, events.HandshakeCompleted):
            self._on_handshake(event)
        elif isinstance(event, events.ConnectionTerminated):
            self._on_terminated(event)
        elif self._h3 is not None:
            self._on_h3_quic_event(event)
        elif isinstance(
            event,
            events.StreamDataReceived
            | events.StreamReset
            | events.StopSendingReceived
            | events.DatagramFrameReceived,
        ):
            self._on_raw_event(event)

    # -- handshake and session creation ---------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if not self._ready.done():
            self._ready.set_exception(exc)
            self._ready.exception()  # mark retrieved; connect() re-raises

    def _on_handshake(self, event: events.HandshakeCompleted) -> None:
        alpn = event.alpn_protocol
        if self._is_client and self._pin is not None:
            cert = self._peer_certificate()
            got = fingerprint_sha256(cert) if cert is not None else "none"
            want = ":".join(f"{b:02X}" for b in self._pin)
            if got != want:
                logger.warning("certificate pin mismatch: got %s, want %s", got, want)
                self._quic.close(
                    error_code=PIN_MISMATCH_ERROR, reason_phrase="certificate pin mismatch"
                )
                self._fail(ConnectionError(f"certificate pin mismatch (got {got})"))
                return
        if alpn == ALPN_MOQT and not self._want_webtransport:
            self._create_session("quic", alpn, self._authority, self._path)
        elif alpn == ALPN_H3:
            self._h3 = H3Connection(self._quic, enable_webtransport=True)
            if self._is_client:
                self._send_connect()
        else:
            self._quic.close(
                error_code=QuicErrorCode.PROTOCOL_VIOLATION,
                reason_phrase=f"unexpected ALPN {alpn!r}",
            )
            self._fail(ConnectionError(f"unexpected ALPN {alpn!r}"))

    def _peer_certificate(self) -> Any:
        """The server certificate (aioquic: x509 object; qh3: DER bytes) or None."""
        if BACKEND == "qh3":
            cert = self._quic.get_peercert()  # type: ignore[attr-defined]
            return None if cert is None else bytes(cert.public_bytes())
        return self._quic.tls._peer_certificate

    def _peer_address(self) -> NetworkAddress | None:
        if BACKEND == "qh3":
            return self._quic._remote_addr  # type: ignore[attr-defined, no-any-return]
        return self._quic.get_peer_address() or None

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
            peer_address=self._peer_address(),
            alpn=alpn,
        )
        try:
            self.session = self._factory(self, self.info)
        except Exception as exc:
            logger.exception("session factory failed")
            self._close_session(INTERNAL_ERROR, "session factory failed")
            self._fail(exc)
            return
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
        self._inputs = True

    # -- raw QUIC -------------------------------------------------------------------

    def _on_raw_event(self, event: events.QuicEvent) -> None:
        session = self.session
        if session is None:
            if self._local_close is None:
                self._pending.append(functools.partial(self._on_raw_event, event))
            return
        self._inputs = True
        try:
            if isinstance(event, events.StreamDataReceived):
                session.stream_data(event.stream_id, event.data, event.end_stream)
            elif isinstance(event, events.StreamReset):
                session.stream_reset(event.stream_id, event.error_code)
            elif isinstance(event, events.StopSendingReceived):
                self._scheduler.drop(event.stream_id)
                session.stop_sending(event.stream_id, event.error_code)
            elif isinstance(event, events.DatagramFrameReceived):
                session.datagram(event.data)
        except Exception:
            logger.exception("session failed on %s", type(event).__name__)
            self._close_session(INTERNAL_ERROR, "internal error")

    # -- WebTransport ---------------------------------------------------------------

    def _send_connect(self) -> None:
        assert self._h3 is not None
        stream_id = self._quic.get_next_available_stream_id()
        self._wt_session_id = stream_id
        headers = [
            (b":method", b"CONNECT"),
            (b":protocol", b"webtransport"),
            (b":scheme", b"https"),
            (b":authority", (self._authority or "").encode()),
            (b":path", (self._path or "/").encode()),
            (b"wt-available-protocols", sf_string(ALPN_MOQT).encode()),
            (b"sec-webtransport-http3-draft02", b"1"),
        ]
        self._h3.send_headers(stream_id, headers)

    def _on_h3_quic_event(self, event: events.QuicEvent) -> None:
        assert self._h3 is not None
        for h3event in self._h3.handle_event(event):
            self._on_h3_event(h3event)
        # resets and STOP_SENDING produce no H3 events: map WT streams ourselves
        if isinstance(event, events.StreamReset | events.StopSendingReceived):
            self._on_wt_stream_signal(event)

    def _on_wt_stream_signal(self, event: events.StreamReset | events.StopSendingReceived) -> None:
        stream_id = event.stream_id
        if stream_id == self._wt_session_id and self.session is not None:
            self._wt_session_ended(0, "CONNECT stream reset")
            return
        if stream_id not in self._wt_streams:
            return
        if isinstance(event, events.StopSendingReceived):
            self._scheduler.drop(stream_id)
        session = self.session
        if session is None:
            return
        code = http_to_wt_error(event.error_code)
        if code is None:
            logger.debug("stream %d: non-WebTransport error code %#x", stream_id, event.error_code)
            code = 0
        self._inputs = True
        try:
            if isinstance(event, events.StreamReset):
                session.stream_reset(stream_id, code)
            else:
                session.stop_sending(stream_id, code)
        except Exception:
            logger.exception("session failed on %s", type(event).__name__)
            self._close_session(INTERNAL_ERROR, "internal error")

    def _on_h3_event(self, event: h3events.H3Event) -> None:
        if isinstance(event, h3events.HeadersReceived):
            if self._is_client:
                self._on_connect_response(event)
            else:
                self._on_connect_request(event)
        elif isinstance(event, h3events.WebTransportStreamDataReceived):
            if self.session is None or event.session_id != self._wt_session_id:
                if self.session is None and self._local_close is None:
                    self._wt_pending.setdefault(event.session_id, []).append(event)
                return
            if event.stream_id not in self._wt_streams:
                self._wt_streams.add(event.stream_id)
                h3stream = self._h3._stream.get(event.stream_id) if self._h3 else None
                if h3stream is not None:
                    h3stream.sending_ended = True  # lets aioquic forget it when done
            self._inputs = True
            try:
                self.session.stream_data(event.stream_id, event.data, event.stream_ended)
            except Exception:
                logger.exception("session failed on stream data")
                self._close_session(INTERNAL_ERROR, "internal error")
        elif isinstance(event, h3events.DatagramReceived):
            sid = _datagram_stream_id(event)
            if self.session is None or sid != self._wt_session_id:
                if self.session is None and self._local_close is None:
                    self._wt_pending.setdefault(sid, []).append(event)
                return
            self._inputs = True
            try:
                self.session.datagram(event.data)
            except Exception:
                logger.exception("session failed on datagram")
                self._close_session(INTERNAL_ERROR, "internal error")
        elif (
            isinstance(event, h3events.DataReceived)
            and event.stream_id == self._wt_session_id
            and self.session is not None
        ):
            for ctype, value in self._capsules.feed(event.data):
                if ctype == CAPSULE_CLOSE_WEBTRANSPORT_SESSION:
                    try:
                        code, reason = decode_close_capsule(value)
                    except ValueError:
                        code, reason = 0, "malformed close capsule"
                    self._wt_session_ended(code, reason)
                    return
            if event.stream_ended:
                self._wt_session_ended(0, "CONNECT stream closed")

    def _replay_wt_pending(self) -> None:
        for event in self._wt_pending.pop(self._wt_session_id or 0, []):
            self._on_h3_event(event)
        self._wt_pending.clear()

    def _on_connect_request(self, event: h3events.HeadersReceived) -> None:
        assert self._h3 is not None
        headers = {k.decode(): v.decode(errors="replace") for k, v in event.headers}
        stream_id = event.stream_id
        method, protocol = headers.get(":method"), headers.get(":protocol")
        offered = parse_sf_string_list(headers.get("wt-available-protocols", ""))
        status = 200
        if method != "CONNECT" or protocol != "webtransport" or self._wt_session_id is not None:
            status = 404
        elif ALPN_MOQT not in offered:
            status = 400
        if status != 200:
            logger.info(
                "rejecting %s %s (:protocol=%s, offered=%s): %d",
                method,
                headers.get(":path"),
                protocol,
                offered,
                status,
            )
            self._h3.send_headers(stream_id, [(b":status", str(status).encode())], end_stream=True)
            return
        self._wt_session_id = stream_id
        self._h3.send_headers(
            stream_id,
            [
                (b":status", b"200"),
                (b"wt-protocol", sf_string(ALPN_MOQT).encode()),
                (b"sec-webtransport-http3-draft", b"draft02"),
            ],
        )
        self._create_session(
            "webtransport", ALPN_H3, headers.get(":authority"), headers.get(":path", "/")
        )
        if self.session is not None:
            self._replay_wt_pending()

    def _on_connect_response(self, event: h3events.HeadersReceived) -> None:
        if event.stream_id != self._wt_session_id or self.session is not None:
            return
        headers = {k.decode(): v.decode(errors="replace") for k, v in event.headers}
        status = headers.get(":status", "")
        selected = parse_sf_string_list(headers.get("wt-protocol", ""))
        if not status.startswith("2") or selected != [ALPN_MOQT]:
            why = f"WebTransport CONNECT refused: status {status}, wt-protocol {selected}"
            logger.warning(why)
            self._quic.close(error_code=H3_NO_ERROR, reason_phrase=why)
            self._fail(ConnectionError(why))
            return
        self._create_session("webtransport", ALPN_H3, self._authority, self._path)
        if self.session is not None:
            self._replay_wt_pending()

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
        quic = self._quic
        wt = self._h3 is not None
        try:
            if isinstance(action, SendStreamData):
                self._scheduler.write(action.stream_id, action.data, action.end)
            elif isinstance(action, SetStreamPriority):
                self._scheduler.set_priority(action.stream_id, action.priority)
            elif isinstance(action, ResetStream):
                self._scheduler.drop(action.stream_id)
                code = wt_to_http_error(action.code) if wt else action.code
                quic.reset_stream(action.stream_id, code)
            elif isinstance(action, StopSending):
                code = wt_to_http_error(action.code) if wt else action.code
                quic.stop_stream(action.stream_id, code)
            elif isinstance(action, SendDatagram):
                if self._h3 is not None:
                    assert self._wt_session_id is not None
                    self._h3.send_datagram(_datagram_flow(self._wt_session_id), action.data)
                else:
                    quic.send_datagram_frame(action.data)
            elif isinstance(action, CloseSession):
                self._close_session(action.code, action.reason)
            else:  # pragma: no cover - future actions
                logger.warning("unknown action %r", action)
        except (ValueError, RuntimeError, QuicConnectionError) as exc:
            # the stream or connection is already gone (qh3 raises QuicConnectionError)
            logger.debug("action %r failed: %s", action, exc)

    def _close_session(self, code: int, reason: str) -> None:
        if self._local_close is not None or self._terminated is not None:
            return
        self._local_close = (code, reason)
        self._fail(ConnectionError(f"closed locally: {code:#x} {reason}"))
        if self._h3 is not None and self._wt_session_id is not None and self.session is not None:
            # CLOSE_WEBTRANSPORT_SESSION capsule + FIN on the CONNECT stream; the peer
            # then closes the QUIC connection (or we do after WT_CLOSE_GRACE).
            try:
                self._h3.send_data(
                    self._wt_session_id, encode_close_capsule(code, reason), end_stream=True
                )
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

    def _on_terminated(self, event: events.ConnectionTerminated) -> None:
        self._terminated = event
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
        if self._owns_transport and self._transport is not None:
            self._loop.call_soon(self._transport.close)

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


# -- server ---------------------------------------------------------------------------


def _udp_socket(host: str, port: int, settings: QuicSettings) -> socket.socket:
    """A bound non-blocking UDP socket (dual-stack for IPv6 wildcard hosts)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        settings.configure_socket(sock)
        sock.bind(addr)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _BatchingQuicServer(QuicServer):
    """:class:`QuicServer` that reads every queued datagram per readiness event (up to
    :data:`RECEIVE_BATCH`) and then transmits once per connection that received any."""

    def __init__(
        self, *, sock: socket.socket, max_size: int, batch: _ReceiveBatch, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._sock = sock
        self._max_size = max_size
        self._batch = batch

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        """:meta private:"""
        batch = self._batch
        batch.active = True
        try:
            super().datagram_received(data, addr)
            for _ in range(RECEIVE_BATCH - 1):
                try:
                    data, addr = self._sock.recvfrom(self._max_size)
                except OSError:  # BlockingIOError: nothing queued; or closed / ICMP error
                    break
                super().datagram_received(data, addr)
        finally:
            batch.active = False
            pending, batch.pending = batch.pending, {}
            for conn in pending:
                conn.transmit()


class Server:
    """A listening MOQT endpoint (raw QUIC + WebTransport on one UDP port)."""

    def __init__(self, quic_server: QuicServer, transport: asyncio.DatagramTransport) -> None:
        self._quic_server = quic_server
        self._transport = transport
        self.connections: set[MoqtConnection] = set()
        sockname = transport.get_extra_info("sockname")
        self.host: str = sockname[0]
        self.port: int = sockname[1]

    def _register(self, conn: MoqtConnection) -> None:
        self.connections.add(conn)
        conn.add_close_callback(lambda: self.connections.discard(conn))

    def close(self) -> None:
        """Close every connection (code 0) and the socket immediately."""
        for conn in list(self.connections):
            conn.close(0, "server shutdown")
        self.connections.clear()
        self._transport.close()

    async def aclose(self, timeout: float = 2.0) -> None:
        """Graceful shutdown: close sessions (code 0), wait for them, then the socket."""
        conns = list(self.connections)
        for conn in conns:
            conn.close(0, "server shutdown")
        if conns:
            await asyncio.wait(
                [asyncio.ensure_future(c.wait_closed()) for c in conns], timeout=timeout
            )
        self.connections.clear()
        self._transport.close()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def serve(
    host: str,
    port: int,
    factory: SessionFactory,
    settings: QuicSettings | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
    *,
    on_session: SessionHook | None = None,
) -> Server:
    """Listen on ``host:port`` (0 = ephemeral, see ``Server.port``) for raw QUIC (ALPN
    ``moqt-22``) and WebTransport (ALPN ``h3``) MOQT sessions."""
    if certfile is None:
        raise ValueError("serve() needs certfile (and keyfile unless the PEM holds the key)")
    settings = settings or QuicSettings()
    configuration = settings.quic_configuration(
        is_client=False, alpn_protocols=[ALPN_MOQT, ALPN_H3]
    )
    configuration.load_cert_chain(certfile, keyfile)
    loop = asyncio.get_running_loop()
    server_ref: list[Server] = []
    batch = _ReceiveBatch()

    def create_protocol(quic: QuicConnection, stream_handler: Any = None) -> MoqtConnection:
        conn = MoqtConnection(
            quic,
            stream_handler,
            factory=factory,
            settings=settings,
            on_session=on_session,
            receive_batch=batch,
        )
        if server_ref:
            server_ref[0]._register(conn)
        return conn

    sock = _udp_socket(host, port, settings)
    transport, quic_server = await loop.create_datagram_endpoint(
        lambda: _BatchingQuicServer(
            configuration=configuration,
            create_protocol=create_protocol,
            sock=sock,
            max_size=settings.datagram_receive_buffer,
            batch=batch,
        ),
        sock=sock,
    )
    transport.max_size = settings.datagram_receive_buffer  # type: ignore[attr-defined]
    server = Server(quic_server, transport)
    server_ref.append(server)
    logger.info("MOQT server listening on %s:%d", server.host, server.port)
    return server


# -- client ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    authority: str
    path: str
    webtransport: bool


def _parse_url(url: str) -> _Target:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("moqt", "https"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} (use moqt:// or https://)")
    if not parts.hostname:
        raise ValueError(f"URL without host: {url!r}")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target(parts.hostname, parts.port or 443, parts.netloc, path, parts.scheme == "https")


async def _open_connection(
    url: str,
    factory: SessionFactory,
    settings: QuicSettings | None,
    verify: bool,
    cafile: str | None,
    pin_sha256: str | bytes | None,
    timeout: float,
) -> MoqtConnection:
    target = _parse_url(url)
    settings = settings or QuicSettings()
    pin = parse_fingerprint(pin_sha256) if pin_sha256 is not None else None
    configuration = settings.quic_configuration(
        is_client=True, alpn_protocols=[ALPN_H3 if target.webtransport else ALPN_MOQT]
    )
    configuration.server_name = target.host
    if pin is not None or not verify:
        # a pin replaces CA validation; it is checked right after the handshake
        configuration.verify_mode = ssl.CERT_NONE
    else:
        configuration.verify_mode = ssl.CERT_REQUIRED
        if cafile is not None:
            configuration.load_verify_locations(cafile=cafile)
    if pin is not None and cafile is not None and verify:
        configuration.verify_mode = ssl.CERT_REQUIRED
        configuration.load_verify_locations(cafile=cafile)

    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_DGRAM)
    addr: NetworkAddress = infos[0][4]
    if len(addr) == 2:
        addr = ("::ffff:" + addr[0], addr[1], 0, 0)
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        settings.configure_socket(sock)
        sock.bind(("::", 0, 0, 0))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    quic = QuicConnection(configuration=configuration)
    transport, conn = await loop.create_datagram_endpoint(
        lambda: MoqtConnection(
            quic,
            factory=factory,
            settings=settings,
            authority=target.authority,
            path=target.path,
            webtransport=target.webtransport,
            pin_sha256=pin,
            owns_transport=True,
            sock=sock,
        ),
        sock=sock,
    )
    assert isinstance(conn, MoqtConnection)
    conn.connect(addr)
    try:
        await asyncio.wait_for(conn.wait_ready(), timeout)
    except BaseException as exc:
        if not conn.is_closed:
            conn._close_quic(QuicErrorCode.NO_ERROR, "connect failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(conn.wait_closed(), 1.0)
        transport.close()
        if isinstance(exc, TimeoutError):
            raise ConnectionError(f"timeout connecting to {url}") from exc
        raise
    return conn


class _Connect:
    """Awaitable and async context manager returned by :func:`connect`."""

    def __init__(self, opener: Callable[[], Awaitable[MoqtConnection]]) -> None:
        self._opener = opener
        self._conn: MoqtConnection | None = None

    def __await__(self) -> Generator[Any, None, MoqtConnection]:
        return self._opener().__await__()

    async def __aenter__(self) -> MoqtConnection:
        self._conn = await self._opener()
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()
            await self._conn.wait_closed()


def connect(
    url: str,
    factory: SessionFactory,
    settings: QuicSettings | None = None,
    *,
    verify: bool = True,
    cafile: str | None = None,
    pin_sha256: str | bytes | None = None,
    timeout: float = 10.0,
) -> _Connect:
    """Connect to ``moqt://host[:port]/path`` (raw QUIC, ALPN ``moqt-22``) or
    ``https://host[:port]/path`` (WebTransport). Default port 443.

    TLS: the server certificate is verified against the system CAs (certifi) unless
    ``cafile`` is given; ``verify=False`` disables verification; ``pin_sha256`` (hex,
    colons allowed) accepts exactly the certificate with that SHA-256 fingerprint instead
    of CA validation (the connection is closed on mismatch).

    ``await connect(...)`` returns the ready :class:`MoqtConnection`; ``async with
    connect(...) as conn`` also closes it on exit. Raises ConnectionError on failure.
    """
    return _Connect(
        functools.partial(
            _open_connection,
            url,
            factory,
            settings,
            verify,
            cafile,
            pin_sha256,
            timeout,
        )
    )
