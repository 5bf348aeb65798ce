"""The listening side: :func:`serve` and :class:`Server`.

One UDP socket accepts raw QUIC (ALPN ``moqt-22``) and HTTP/3 WebTransport (ALPN ``h3``,
extended CONNECT offering ``moqt-22``) MOQT sessions. :class:`_Listener` routes datagrams
to connections by destination connection ID, as the QUIC libraries' own servers do; the
socket (:class:`~kvcs.transport.udp.UdpSocket`) reads every queued datagram per
readiness event, then each connection that received any handles its events and
transmits once. Each connection gets the datagram size of its peer's address
(:meth:`QuicSettings.datagram_size_for <kvcs.transport.QuicSettings.datagram_size_for>`):
loopback clients the library's largest, others what fits the internet, unless the
settings fix one size for all.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from ..moqt.ratelimit import TokenBucket
from .config import ALPN_H3, ALPN_MOQT, MIN_DATAGRAM_SIZE, QuicSettings
from .connection import MoqtConnection
from .interfaces import SessionFactory, SessionHook
from .quic import adapter
from .quic.base import NetworkAddress, QuicAdapter, split_segments
from .udp import UdpSocket, udp_socket

logger = logging.getLogger(__name__)

NewConnection = Callable[["_Listener", bytes, NetworkAddress], MoqtConnection]


class _Listener:
    """The receiver of a server socket: routes datagrams by destination connection ID,
    opens a connection for each new client Initial, answers unknown QUIC versions with
    Version Negotiation, and has each connection that received datagrams transmit once
    after the socket was read."""

    def __init__(self, lib: QuicAdapter, configuration: object,
                 new_connection: NewConnection, settings: QuicSettings) -> None:
        self._lib = lib
        self._cid_length: int = configuration.connection_id_length  # type: ignore[attr-defined]
        self._versions: list[int] = list(configuration.supported_versions)  # type: ignore[attr-defined]
        self._new_connection = new_connection
        self._routes: dict[bytes, MoqtConnection] = {}
        self._pending: dict[MoqtConnection, None] = {}
        self._accepting = TokenBucket(settings.accept_rate, settings.accept_burst)
        self._max_connections = settings.max_connections
        self.connections = 0
        """Connections open now (made here and not ended)."""
        self.refused = 0
        """New clients' first datagrams dropped: past ``max_connections`` or the accept
        rate, or once the server is closing (a client whose handshake then succeeds may
        count more than once)."""
        self.udp: UdpSocket | None = None
        self._open = True

    def stop_accepting(self) -> None:
        """Drop new clients' first datagrams from now on (the server is closing): a client
        accepted while :meth:`Server.aclose` waits for the open connections would keep a
        session that nobody closes, to a socket about to close (an edge relay reconnecting
        to its stopping upstream hung until its idle timeout)."""
        self._open = False

    # CidRouter
    def add_cid(self, cid: bytes, conn: MoqtConnection) -> None:
        self._routes[cid] = conn

    def remove_cid(self, cid: bytes) -> None:
        self._routes.pop(cid, None)

    def forget(self, conn: MoqtConnection) -> None:
        """Drop every route to a connection that ended."""
        for cid in [cid for cid, c in self._routes.items() if c is conn]:
            del self._routes[cid]
        self.connections -= 1

    # DatagramReceiver
    def datagrams_received(self, datagrams: list[bytes], addr: NetworkAddress) -> None:
        """Route datagrams from ``addr``: runs of them to one connection are fed at once."""
        run: list[bytes] = []
        run_conn: MoqtConnection | None = None
        routes, end = self._routes, 1 + self._cid_length
        for data in datagrams:
            if data and not data[0] & 0x80:
                # short header (RFC 8999: the destination connection ID follows the first
                # byte), what every datagram after the handshake starts with: no parsing
                conn = routes.get(data[1:end])
            else:
                conn = self._route(data, addr)
            if conn is not run_conn and run:
                self._feed(run_conn, run, addr)  # type: ignore[arg-type]
                run = []
            run_conn = conn
            if conn is not None:
                run.append(data)
        if run:
            self._feed(run_conn, run, addr)  # type: ignore[arg-type]

    def segments_received(self, buffer: bytes, segment_size: int,
                          addr: NetworkAddress) -> None:
        """Route a GRO buffer from ``addr``: whole to its connection when every segment
        is a short-header packet to the same connection ID (the case of a connection's
        data), otherwise datagram by datagram (a handshake, or a peer that runs several
        connections from one socket)."""
        end = 1 + self._cid_length
        conn = (self._routes.get(buffer[1:end]) if buffer and not buffer[0] & 0x80
                else None)
        if conn is not None and same_destination(buffer, segment_size, end):
            conn.segments_received(buffer, segment_size, addr)
            self._pending[conn] = None
            return
        self.datagrams_received(split_segments(buffer, segment_size), addr)

    def receive_done(self) -> None:
        pending, self._pending = self._pending, {}
        for conn in pending:
            conn.receive_done()

    def _feed(self, conn: MoqtConnection, datagrams: list[bytes], addr: NetworkAddress) -> None:
        conn.datagrams_received(datagrams, addr)
        self._pending[conn] = None

    def _route(self, data: bytes, addr: NetworkAddress) -> MoqtConnection | None:
        """The connection a long-header datagram is for (``None``: dropped or answered
        here)."""
        header = self._lib.parse_header(data, self._cid_length)
        if header is None:
            return None
        if (header.version is not None and not header.version_negotiation
                and header.version not in self._versions):
            assert self.udp is not None
            self.udp.send([(self._lib.version_negotiation(header, self._versions), addr)])
            return None
        conn = self._routes.get(header.destination_cid)
        if conn is None:
            if not header.initial or len(data) < MIN_DATAGRAM_SIZE:
                return None
            if not self._open:
                self.refused += 1
                return None
            if self.connections >= self._max_connections or not self._accepting.take():
                # before any state or TLS work (a handshake costs ~1.5-2 ms)
                if not self.refused % 100:
                    logger.info("new connection from %s dropped (%d open, max %d; or past "
                                "the accept rate); %d dropped so far", addr, self.connections,
                                self._max_connections, self.refused + 1)
                self.refused += 1
                return None
            conn = self._new_connection(self, header.destination_cid, addr)
            self._routes[header.destination_cid] = conn
            self.connections += 1
        return conn


def same_destination(buffer: bytes, segment_size: int, end: int) -> bool:
    """Whether every segment of a GRO buffer is a short-header packet whose destination
    connection ID (bytes 1 to ``end``) is the first segment's. Strided slices: one C call
    per byte of the ID rather than a Python step per segment (5 vs 11 us for 45
    segments)."""
    heads = buffer[::segment_size]
    if max(heads) & 0x80:
        return False
    count = len(heads)
    return all(buffer[i::segment_size].count(buffer[i]) == count for i in range(1, end))


class Server:
    """A listening MOQT endpoint (raw QUIC + WebTransport on one UDP port)."""

    def __init__(self, udp: UdpSocket, library: str, listener: _Listener) -> None:
        self._udp = udp
        self._listener = listener
        self.connections: set[MoqtConnection] = set()
        sockname = udp.sockname
        self.host: str = sockname[0]
        self.port: int = sockname[1]
        self.library = library
        """The QUIC library of the server's connections."""
        self._reload: Callable[[], None] | None = None

    def reload_certificate(self) -> None:
        """Read the certificate and key files again: new connections get the new
        certificate, open ones keep theirs (``kvcs relay`` on SIGHUP). Raises what loading
        raises (ssl.SSLError, OSError), keeping the previous certificate then."""
        if self._reload is not None:
            self._reload()

    @property
    def refused_connections(self) -> int:
        """New clients' first datagrams dropped so far: past
        :attr:`QuicSettings.max_connections <kvcs.transport.QuicSettings.max_connections>`
        or :attr:`~kvcs.transport.QuicSettings.accept_rate`, or once the server is
        closing."""
        return self._listener.refused

    def _register(self, conn: MoqtConnection) -> None:
        self.connections.add(conn)
        conn.add_close_callback(lambda: self.connections.discard(conn))

    def close(self) -> None:
        """Close every connection (code 0) and the socket immediately."""
        self._listener.stop_accepting()
        for conn in list(self.connections):
            conn.close(0, "server shutdown")
        self.connections.clear()
        self._udp.close()

    async def aclose(self, timeout: float = 2.0) -> None:
        """Graceful shutdown: accept no new client, close sessions (code 0), wait for
        them, then the socket."""
        self._listener.stop_accepting()
        conns = list(self.connections)
        for conn in conns:
            conn.close(0, "server shutdown")
        if conns:
            await asyncio.wait(
                [asyncio.ensure_future(c.wait_closed()) for c in conns], timeout=timeout
            )
        self.connections.clear()
        self._udp.close()

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
    ``moqt-22``) and WebTransport (ALPN ``h3``) MOQT sessions, on the QUIC library of
    ``settings``."""
    if certfile is None:
        raise ValueError("serve() needs certfile (and keyfile unless the PEM holds the key)")
    settings = settings or QuicSettings()
    lib = adapter(settings.library)
    configurations: dict[int, object] = {}  # by datagram size: one per kind of peer

    def configuration_for(peer: NetworkAddress | None) -> object:
        size = settings.datagram_size_for(peer)
        found = configurations.get(size)
        if found is None:
            found = configurations[size] = settings.quic_configuration(
                is_client=False, alpn_protocols=[ALPN_MOQT, ALPN_H3], peer=peer)
            found.load_cert_chain(certfile, keyfile)  # type: ignore[attr-defined]
        return found

    configuration = configuration_for(None)  # checks the certificate before listening
    servers: list[Server] = []

    def new_connection(listener: _Listener, original_cid: bytes,
                       peer: NetworkAddress) -> MoqtConnection:
        quic = lib.server_connection(configuration_for(peer), settings, original_cid)
        conn = MoqtConnection(quic, lib, factory=factory, settings=settings,
                              on_session=on_session, udp=listener.udp, cid_router=listener)
        listener.add_cid(quic.host_cid, conn)
        conn.add_close_callback(lambda: listener.forget(conn))
        asyncio.get_running_loop().call_later(settings.handshake_timeout,
                                              conn.forget_if_unanswered)
        if servers:
            servers[0]._register(conn)
        return conn

    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = udp_socket(family, address, settings, dual_stack=family == socket.AF_INET6)
    listener = _Listener(lib, configuration, new_connection, settings)
    try:
        listener.udp = UdpSocket(sock, listener, batching=settings.gso,
                                 receive_size=settings.datagram_receive_buffer)
    except BaseException:
        sock.close()
        raise
    server = Server(listener.udp, lib.name, listener)
    servers.append(server)

    def reload() -> None:
        fresh = settings.quic_configuration(is_client=False,
                                            alpn_protocols=[ALPN_MOQT, ALPN_H3], peer=None)
        fresh.load_cert_chain(certfile, keyfile)  # type: ignore[attr-defined]  # raises first
        configurations.clear()  # made again from the files on the next connection

    server._reload = reload
    logger.info("MOQT server listening on %s:%d (%s)", server.host, server.port, lib.name)
    return server
