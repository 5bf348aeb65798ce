"""Packet batching (issue #18) over real QUIC on 127.0.0.1: UDP GSO and GRO on and off
give the same transfers, and a kernel that refuses them leaves a working connection.

The refusals are the kernel's own: after the sockets exist, the tests make the binding
ask for a socket option the kernel does not know, which it answers with EINVAL (GSO send)
or ENOPROTOOPT (GRO), as a kernel or device without the offload would."""

from __future__ import annotations

import asyncio
import os

import pytest

from kvcs.moqt.actions import SendDatagram, SendStreamData
from kvcs.testing import until
from kvcs.transport import DevCertificate, QuicSettings, connect, udp
from kvcs.transport.eventloop import EVENT_LOOP_ENV, running_event_loop, use_event_loop

from .conftest import EchoSession, echo_factory, echo_server

ETHERNET = 1452  # the datagram size of a 1500-byte MTU: runs of these are what GSO sends
UNKNOWN_OPTION = 0xFFF


async def _transfer(settings: QuicSettings, cert: DevCertificate) -> tuple[bool, ...]:
    """Send 2 MiB each way on one bidi stream (the server echoes it) plus a datagram;
    once every byte came back intact, return (GSO, GRO) of the client's connection, then
    of the server's."""
    async with echo_server(cert, settings) as server, connect(
            server.url("moqt", "/"), echo_factory, settings, verify=False) as conn:
        session = conn.session
        assert isinstance(session, EchoSession)
        payload = os.urandom(2 << 20)
        sid = conn.open_stream(unidirectional=False)
        session.out += [SendStreamData(sid, payload, end=True), SendDatagram(b"dgram")]
        conn.flush()
        await until(lambda: sid in session.ended, timeout=30)
        assert bytes(session.received[sid]) == payload
        await until(lambda: session.datagrams == [b"dgram"])
        return conn.gso, conn.gro, server.conns[0].gso, server.conns[0].gro


@pytest.mark.parametrize("gso", [True, False])
async def test_batching_on_and_off_transfer_the_same(cert: DevCertificate, gso: bool) -> None:
    offloads = await _transfer(QuicSettings(max_datagram_size=ETHERNET, gso=gso), cert)
    assert offloads == (gso,) * 4  # these machines' kernel has both offloads


async def test_gso_refused_by_the_kernel_falls_back(cert: DevCertificate,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that takes the socket option but refuses the GSO send (as one whose device
    lacks checksum offload does, with EIO): the first run is sent again one datagram at a
    time, and every later send too."""
    monkeypatch.setattr(udp, "gso_available", lambda sock: True)
    monkeypatch.setattr(udp, "UDP_SEGMENT", UNKNOWN_OPTION)  # the kernel: EINVAL
    client_gso, client_gro, server_gso, server_gro = await _transfer(
        QuicSettings(max_datagram_size=ETHERNET), cert)
    assert not client_gso and not server_gso  # each fell back on its first refused send
    assert client_gro and server_gro


async def test_gro_refused_reads_one_datagram_per_call(cert: DevCertificate,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(udp, "UDP_GRO", UNKNOWN_OPTION)  # the kernel: ENOPROTOOPT
    client_gso, client_gro, server_gso, server_gro = await _transfer(
        QuicSettings(max_datagram_size=ETHERNET), cert)
    assert (client_gro, server_gro) == (False, False)
    assert client_gso and server_gso


def test_uvloop_transfers_the_same(cert: DevCertificate) -> None:
    """``--event-loop uvloop`` / ``KVCS_EVENT_LOOP=uvloop``: the binding (GSO, GRO,
    keep-alive timers) on uvloop, with batching on and off."""
    previous = os.environ.get(EVENT_LOOP_ENV)
    try:
        assert use_event_loop("uvloop") == "uvloop" == os.environ[EVENT_LOOP_ENV]

        async def both() -> str:
            for gso in (True, False):
                settings = QuicSettings(max_datagram_size=ETHERNET, gso=gso)
                assert await _transfer(settings, cert) == (gso,) * 4
            return running_event_loop()

        assert asyncio.run(both()) == "uvloop"
    finally:
        use_event_loop(previous or "asyncio")
        if previous is None:
            del os.environ[EVENT_LOOP_ENV]
    with pytest.raises(ValueError, match="unknown event loop"):
        use_event_loop("trio")
