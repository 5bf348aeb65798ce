"""Real QUIC on 127.0.0.1: raw QUIC and WebTransport, verification, scheduler, close,
datagram sizes."""

from __future__ import annotations

import logging

import pytest

from kvcs.moqt.actions import (
    CloseSession,
    ResetStream,
    SendDatagram,
    SendStreamData,
    SetStreamPriority,
    StopSending,
)
from kvcs.testing import until
from kvcs.transport import (
    DevCertificate,
    MoqtConnection,
    QuicSettings,
    connect,
    max_datagram_size_limit,
)

from .conftest import EchoSession, ServerHandle, echo_factory, echo_server

SCHEMES = ["moqt", "https"]


def client_session(conn: MoqtConnection) -> EchoSession:
    assert isinstance(conn.session, EchoSession)
    return conn.session


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_connect_echo(server: ServerHandle, scheme: str) -> None:
    async with connect(
        server.url(scheme, "/moq?x=1"), echo_factory, cafile=str(server.cert.certfile)
    ) as conn:
        session = client_session(conn)
        assert session.info.is_client
        assert session.info.transport == ("quic" if scheme == "moqt" else "webtransport")
        assert session.info.path == "/moq?x=1"
        assert session.info.authority == f"127.0.0.1:{server.server.port}"
        await until(lambda: bool(server.conns))
        sinfo = server.session().info
        if scheme == "https":
            assert (sinfo.transport, sinfo.path) == ("webtransport", "/moq?x=1")
            assert sinfo.authority == f"127.0.0.1:{server.server.port}"
        else:
            assert (sinfo.transport, sinfo.path, sinfo.authority) == ("quic", None, None)

        payload = bytes(range(256)) * 1000
        sid = conn.open_stream(unidirectional=False)
        sid2 = conn.open_stream(unidirectional=False)
        assert sid != sid2
        session.out += [
            SendStreamData(sid, payload[:1000]),
            SendStreamData(sid, memoryview(payload)[1000:], end=True),
            SendStreamData(sid2, b"second", end=True),
        ]
        conn.flush()
        await until(lambda: sid in session.ended and sid2 in session.ended)
        assert bytes(session.received[sid]) == payload
        assert bytes(session.received[sid2]) == b"second"


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_datagram_round_trip(server: ServerHandle, scheme: str) -> None:
    async with connect(server.url(scheme), echo_factory, pin_sha256=server.cert.sha256) as conn:
        session = client_session(conn)
        session.out.append(SendDatagram(b"ping-1"))
        conn.flush()
        await until(lambda: session.datagrams == [b"ping-1"])


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_reset_and_stop_sending_propagate(server: ServerHandle, scheme: str) -> None:
    async with connect(server.url(scheme), echo_factory, verify=False) as conn:
        session = client_session(conn)
        uni = conn.open_stream(unidirectional=True)
        bidi = conn.open_stream(unidirectional=False)
        session.out += [SendStreamData(uni, b"abc"), SendStreamData(bidi, b"def")]
        conn.flush()
        await until(lambda: bool(server.conns))
        remote = server.session()
        await until(lambda: uni in remote.received and bidi in remote.received)
        session.out += [ResetStream(uni, 7), StopSending(bidi, 9)]
        conn.flush()
        await until(lambda: remote.resets == [(uni, 7)] and remote.stops == [(bidi, 9)])
        # the server's echo direction was reset by aioquic in answer to STOP_SENDING
        await until(lambda: session.resets == [(bidi, 9)])


async def test_default_verification_rejects_self_signed(server: ServerHandle) -> None:
    with pytest.raises(ConnectionError):
        await connect(server.url("moqt"), echo_factory, timeout=5)


async def test_wrong_pin_fails(server: ServerHandle) -> None:
    wrong = "00:" * 31 + "00"
    with pytest.raises(ConnectionError, match="pin"):
        await connect(server.url("https"), echo_factory, pin_sha256=wrong)


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_verify_modes_that_work(server: ServerHandle, scheme: str) -> None:
    for kwargs in (
        {"cafile": str(server.cert.certfile)},
        {"pin_sha256": server.cert.sha256},
        {"verify": False},
    ):
        conn = await connect(server.url(scheme), echo_factory, **kwargs)  # type: ignore[arg-type]
        conn.close()
        await conn.wait_closed()


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_close_session_code_reaches_peer(server: ServerHandle, scheme: str) -> None:
    conn = await connect(server.url(scheme), echo_factory, verify=False)
    session = client_session(conn)
    await until(lambda: bool(server.conns))
    remote = server.session()
    session.out.append(CloseSession(0x10, "goaway timeout"))
    conn.flush()
    await until(lambda: remote.lost is not None)
    assert remote.lost == (0x10, "goaway timeout")
    await conn.wait_closed()
    assert session.lost == (0x10, "goaway timeout")


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_scheduler_priority_order(server: ServerHandle, scheme: str) -> None:
    size = 4 * 1024 * 1024
    async with connect(
        server.url(scheme), echo_factory, QuicSettings.loopback(), verify=False
    ) as conn:
        session = client_session(conn)
        await until(lambda: bool(server.conns))
        sconn = server.conns[-1]
        remote = server.session()
        low = sconn.open_stream(unidirectional=True)  # written first, worse key
        high = sconn.open_stream(unidirectional=True)
        remote.out += [
            SetStreamPriority(low, (1, 5)),
            SetStreamPriority(high, (1, 1)),
            SendStreamData(low, b"L" * size, end=True),
            SendStreamData(high, b"H" * size, end=True),
        ]
        sconn.flush()
        assert sconn.buffered_bytes > size  # held back in the scheduler
        await until(lambda: len(session.ended) == 2, timeout=20)
        assert session.ended == [high, low]
        assert len(session.received[low]) == len(session.received[high]) == size
        await sconn.drain(0)
        assert sconn.buffered_bytes == 0


async def test_unknown_webtransport_path_method_rejected(server: ServerHandle) -> None:
    # A CONNECT without moqt-22 in wt-available-protocols is refused.
    from kvcs.transport import webtransport

    original = webtransport.sf_string
    webtransport.sf_string = lambda value: '"other-proto"'  # type: ignore[assignment]
    try:
        with pytest.raises(ConnectionError, match="status 400"):
            await connect(server.url("https"), echo_factory, verify=False)
    finally:
        webtransport.sf_string = original


async def test_max_datagram_size_is_observable(server: ServerHandle,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="kvcs.transport.connection")
    settings = QuicSettings(max_datagram_size=1280)
    async with connect(server.url("moqt"), echo_factory, settings, verify=False) as conn:
        await until(lambda: bool(server.conns))
        assert server.conns[-1].max_datagram_size == QuicSettings.loopback().max_datagram_size
        if conn.library == "aioquic":  # aioquic sends what it is configured for
            assert conn.max_datagram_size == 1280
            return
        # qh3 probes the path for up to 1472 bytes above a smaller size: loopback
        # carries every probe, and the binding logs the change
        await until(lambda: conn.max_datagram_size > 1280)
        assert conn.max_datagram_size <= 1472
        await until(lambda: "client connection: datagram size 1280 -> " in caplog.text)


async def test_loopback_peers_get_large_datagrams_by_default(cert: DevCertificate) -> None:
    """Issue #16: default settings on both ends, a peer on loopback: both directions use
    the library's largest datagrams without any option."""
    settings = QuicSettings()
    async with echo_server(cert, settings) as server, connect(
            f"moqt://localhost:{server.server.port}/", echo_factory, settings,
            verify=False) as conn:
        await until(lambda: bool(server.conns))
        limit = max_datagram_size_limit(settings.library)
        assert conn.max_datagram_size == server.conns[0].max_datagram_size == limit
