"""Streams past the peer's stream limit wait for its credit (MAX_STREAMS), on both QUIC
libraries, raw QUIC and WebTransport: none is lost.

qh3 refuses to create a stream past the peer's limit (ValueError); the binding used to
drop such a stream and everything written on it (a flood test lost 22 requests of
1,500). Now its data waits in the send scheduler until the peer grants more streams."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kvcs.moqt.actions import ResetStream, SendStreamData
from kvcs.testing import until
from kvcs.transport import DevCertificate, MoqtConnection, QuicSettings, connect, serve

from .conftest import EchoSession, ServerHandle, echo_factory

LIMIT = 64
"""The server's stream limits on aioquic (qh3 grants 100 bidirectional, 103
unidirectional, whatever the settings)."""
STREAMS = 160
"""More than either library lets the client open at once."""


@pytest.fixture
async def limited(cert: DevCertificate) -> AsyncIterator[ServerHandle]:
    conns: list[MoqtConnection] = []
    settings = QuicSettings.loopback(max_streams_bidi=LIMIT, max_streams_uni=LIMIT)
    srv = await serve("127.0.0.1", 0, echo_factory, settings, str(cert.certfile),
                      str(cert.keyfile), on_session=conns.append)
    try:
        yield ServerHandle(srv, conns, cert)
    finally:
        await srv.aclose()


def _session(conn: MoqtConnection) -> EchoSession:
    assert isinstance(conn.session, EchoSession)
    return conn.session


@pytest.mark.parametrize("scheme", ["moqt", "https"])
@pytest.mark.parametrize("unidirectional", [False, True], ids=["bidi", "uni"])
async def test_streams_past_the_peer_limit_wait_for_credit(
        limited: ServerHandle, scheme: str, unidirectional: bool) -> None:
    async with connect(limited.url(scheme), echo_factory,
                       cafile=str(limited.cert.certfile)) as conn:
        client = _session(conn)
        sids = [conn.open_stream(unidirectional) for _ in range(STREAMS)]
        assert len(set(sids)) == STREAMS
        client.out += [SendStreamData(sid, b"%d|" % sid) for sid in sids]
        conn.flush()
        await until(lambda: bool(limited.conns))
        server = limited.session()
        await until(lambda: len(server.received) >= LIMIT - 8)
        open_now = len(server.received)
        assert open_now < STREAMS  # the peer's limit holds the others back
        # the streams the server has end; the credit they return lets the others through
        client.out += [SendStreamData(sid, b"end", end=True) for sid in sids]
        conn.flush()
        await until(lambda: len(server.ended) == STREAMS, timeout=10)
        assert {sid: bytes(server.received[sid]) for sid in sids} == {
            sid: b"%d|end" % sid for sid in sids}
        if not unidirectional:  # echoed back, FIN included
            await until(lambda: len(client.ended) == STREAMS, timeout=10)


async def test_a_stream_reset_while_it_waits_for_credit_is_reset_once_open(
        limited: ServerHandle) -> None:
    """A stream reset before the peer allowed it is reset when it may exist, so that the
    peer, which opens it implicitly with the later ones, does not keep it open forever."""
    async with connect(limited.url("moqt"), echo_factory,
                       cafile=str(limited.cert.certfile)) as conn:
        client = _session(conn)
        sids = [conn.open_stream(True) for _ in range(STREAMS)]
        client.out += [SendStreamData(sid, b"x") for sid in sids]
        client.out += [ResetStream(sids[-1], 7)]
        conn.flush()
        await until(lambda: bool(limited.conns))
        server = limited.session()
        await until(lambda: len(server.received) >= LIMIT - 8)
        client.out += [SendStreamData(sid, b"", end=True) for sid in sids[:-1]]
        conn.flush()
        await until(lambda: len(server.ended) == STREAMS - 1, timeout=10)
        await until(lambda: (sids[-1], 7) in server.resets, timeout=10)
