"""The listening side: :func:`serve` and :class:`Server`.

One UDP socket accepts raw QUIC (ALPN ``moqt-22``) and HTTP/3 WebTransport (ALPN ``h3``,
extended CONNECT offering ``moqt-22``) MOQT sessions. :class:`_Listener` routes datagrams
to connections by destination connection ID, as the QUIC libraries' own servers do, and
reads every queued datagram per readiness event (up to
:data:`~kvcs.transport.connection.RECEIVE_BATCH`) before each connection that received
any transmits once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from .config import ALPN_H3, ALPN_MOQT, MIN_DATAGRAM_SIZE, QuicSettings
from .connection import RECEIVE_BATCH, MoqtConnection, ReceiveBatch
from .interfaces import SessionFactory, SessionHook
from .quic import adapter
from .quic.base import NetworkAddress, QuicAdapter

logger = logging.getLogger(__name__)


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


class _Listener(asyncio.DatagramProtocol):
    """The datagram protocol of a server socket: routes datagrams by destination
    connection ID, opens a connection for each new client Initial, answers unknown QUIC
    versions with Version Negotiation."""

    def __init__(self, lib: QuicAdapter, configuration: object,
                 new_connection: Callable[[_Listener, bytes], MoqtConnection],
                 sock: socket.socket, max_size: int) -> None:
        self._lib = lib
        self._cid_length: int = configuration.connection_id_length  # type: ignore[attr-defined]
        self._versions: list[int] = list(configuration.supported_versions)  # type: ignore[attr-defined]
        self._new_connection = new_connection
        self._sock = sock
        self._max_size = max_size
        self.batch = ReceiveBatch()
        self._routes: dict[bytes, MoqtConnection] = {}
        self.transport: asyncio.DatagramTransport | None = None

    # CidRouter
    def add_cid(self, cid: bytes, conn: MoqtConnection) -> None:
        self._routes[cid] = conn

    def remove_cid(self, cid: bytes) -> None:
        self._routes.pop(cid, None)

    def forget(self, conn: MoqtConnection) -> None:
        """Drop every route to a connection that ended."""
        for cid in [cid for cid, c in self._routes.items() if c is conn]:
            del self._routes[cid]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """:meta private:"""
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        """:meta private: route every datagram queued on the socket, then transmit once
        per connection that received any."""
        batch = self.batch
        batch.active = True
        try:
            self._route(data, addr)  # type: ignore[arg-type]
            for _ in range(RECEIVE_BATCH - 1):
                try:
                    data, addr = self._sock.recvfrom(self._max_size)
                except OSError:  # BlockingIOError: nothing queued; or closed / ICMP error
                    break
                self._route(data, addr)  # type: ignore[arg-type]
        finally:
            batch.active = False
            pending, batch.pending = batch.pending, {}
            for conn in pending:
                conn.transmit()

    def _route(self, data: bytes, addr: NetworkAddress) -> None:
        if data and not data[0] & 0x80:
            # short header (RFC 8999: the destination connection ID follows the first
            # byte), what every datagram after the handshake starts with: no parsing
            conn = self._routes.get(data[1 : 1 + self._cid_length])
            if conn is not None:
                conn.datagram_received(data, addr)
            return
        header = self._lib.parse_header(data, self._cid_length)
        if header is None:
            return
        if (header.version is not None and not header.version_negotiation
                and header.version not in self._versions):
            assert self.transport is not None
            self.transport.sendto(self._lib.version_negotiation(header, self._versions), addr)
            return
        conn = self._routes.get(header.destination_cid)
        if conn is None:
            if not header.initial or len(data) < MIN_DATAGRAM_SIZE:
                return
            conn = self._new_connection(self, header.destination_cid)
            conn.connection_made(self.transport)  # type: ignore[arg-type]
            self._routes[header.destination_cid] = conn
        conn.datagram_received(data, addr)


class Server:
    """A listening MOQT endpoint (raw QUIC + WebTransport on one UDP port)."""

    def __init__(self, transport: asyncio.DatagramTransport, library: str) -> None:
        self._transport = transport
        self.connections: set[MoqtConnection] = set()
        sockname = transport.get_extra_info("sockname")
        self.host: str = sockname[0]
        self.port: int = sockname[1]
        self.library = library
        """The QUIC library of the server's connections."""

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
    ``moqt-22``) and WebTransport (ALPN ``h3``) MOQT sessions, on the QUIC library of
    ``settings``."""
    if certfile is None:
        raise ValueError("serve() needs certfile (and keyfile unless the PEM holds the key)")
    settings = settings or QuicSettings()
    lib = adapter(settings.library)
    configuration = settings.quic_configuration(
        is_client=False, alpn_protocols=[ALPN_MOQT, ALPN_H3]
    )
    configuration.load_cert_chain(certfile, keyfile)
    loop = asyncio.get_running_loop()
    servers: list[Server] = []

    def new_connection(listener: _Listener, original_cid: bytes) -> MoqtConnection:
        quic = lib.server_connection(configuration, settings, original_cid)
        conn = MoqtConnection(quic, lib, factory=factory, settings=settings,
                              on_session=on_session, receive_batch=listener.batch,
                              cid_router=listener)
        listener.add_cid(quic.host_cid, conn)
        conn.add_close_callback(lambda: listener.forget(conn))
        if servers:
            servers[0]._register(conn)
        return conn

    sock = _udp_socket(host, port, settings)
    transport, _ = await loop.create_datagram_endpoint(
        lambda: _Listener(lib, configuration, new_connection, sock,
                          settings.datagram_receive_buffer),
        sock=sock,
    )
    transport.max_size = settings.datagram_receive_buffer  # type: ignore[attr-defined]
    server = Server(transport, lib.name)
    servers.append(server)
    logger.info("MOQT server listening on %s:%d (%s)", server.host, server.port, lib.name)
    return server
