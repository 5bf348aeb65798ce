"""A client whose packets never decrypt (garbage Initials, or Initials corrupted on the
way) makes the server create a connection it can never answer: that connection is
forgotten after ``QuicSettings.handshake_timeout``, not after the idle timeout (30 s), and
clients whose Initials decrypt are not affected."""

from __future__ import annotations

import asyncio
import os
import socket

from kvcs.testing import until
from kvcs.transport import DevCertificate, QuicSettings, connect, serve

from .conftest import echo_factory

HANDSHAKE_TIMEOUT = 0.3


def _garbage_initial() -> bytes:
    """A long-header Initial of QUIC v1 (routable: a new connection ID) whose protected
    part is random bytes, padded to the 1200 bytes a client Initial needs."""
    dcid, scid = os.urandom(8), os.urandom(8)
    head = bytes([0xC0]) + (1).to_bytes(4, "big") + bytes([8]) + dcid + bytes([8]) + scid
    head += b"\x00"  # no token
    rest = 1200 - len(head) - 2
    return head + (0x4000 | rest).to_bytes(2, "big") + os.urandom(rest)


async def test_a_connection_that_decrypts_nothing_is_forgotten_soon(
        cert: DevCertificate) -> None:
    settings = QuicSettings.loopback(handshake_timeout=HANDSHAKE_TIMEOUT, idle_timeout=30.0)
    server = await serve("127.0.0.1", 0, echo_factory, settings, str(cert.certfile),
                         str(cert.keyfile))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _ in range(3):
            sock.sendto(_garbage_initial(), ("127.0.0.1", server.port))
        await until(lambda: len(server.connections) == 3)
        started = asyncio.get_running_loop().time()
        await until(lambda: not server.connections, timeout=10 * HANDSHAKE_TIMEOUT)
        assert asyncio.get_running_loop().time() - started < 3 * HANDSHAKE_TIMEOUT
        # a client whose Initial decrypts is answered at once and outlives the timeout
        conn = await connect(f"moqt://127.0.0.1:{server.port}/", echo_factory, settings,
                             cafile=str(cert.certfile))
        await asyncio.sleep(2 * HANDSHAKE_TIMEOUT)
        assert not conn.is_closed and len(server.connections) == 1
        conn.close()
        await conn.wait_closed()
    finally:
        sock.close()
        await server.aclose()


async def test_a_closing_server_accepts_no_new_client(cert: DevCertificate) -> None:
    """While ``Server.aclose`` waits for its open connections (here one whose client never
    answers), a new client is not accepted: before, it got a session that nobody closed,
    to a socket about to close, and hung until its idle timeout (an edge relay
    reconnecting to its stopping upstream)."""
    settings = QuicSettings.loopback(handshake_timeout=5.0, idle_timeout=30.0)
    server = await serve("127.0.0.1", 0, echo_factory, settings, str(cert.certfile),
                         str(cert.keyfile))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.sendto(_garbage_initial(), ("127.0.0.1", server.port))
        await until(lambda: len(server.connections) == 1)
        closing = asyncio.ensure_future(server.aclose(timeout=3.0))
        await asyncio.sleep(0.05)
        assert not closing.done()  # waiting for the connection that never answers
        refused = server.refused_connections
        client = asyncio.ensure_future(connect(f"moqt://127.0.0.1:{server.port}/",
                                               echo_factory, settings,
                                               cafile=str(cert.certfile)))
        await until(lambda: server.refused_connections > refused)
        assert not client.done() or client.exception() is not None
        client.cancel()
        await asyncio.wait({client})
        await closing
    finally:
        sock.close()
