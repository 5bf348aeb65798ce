"""Issue #16: sessions that publish or serve stay up while nothing happens on them.

A publisher's client connection pings the relay after a third of the negotiated idle
timeout without a packet from it (QuicSettings.keep_alive_s), so the relay keeps its
publication. A 2 s idle timeout keeps the test short; the libraries' own floor (three
probe timeouts) is a few milliseconds on loopback. (With 1 s, a relay beside a loaded
pytest worker, load 6, once let the quiet publisher's session expire: its event loop
went past the 0.67 s a ping leaves.)
"""

from __future__ import annotations

import asyncio

import pytest

from kvcs.endpoint import Endpoint
from kvcs.moqt.wire import LocationFilter, ObjectStatus
from kvcs.testing import LocalNet, until
from kvcs.transport import DevCertificate, QuicSettings

IDLE_TIMEOUT = 2.0
NS = (b"keep-alive",)


async def _publisher(net: LocalNet, settings: QuicSettings) -> Endpoint:
    relay = await net.relay()
    pub = await Endpoint.connect(f"moqt://127.0.0.1:{relay.port}/", settings=settings,
                                 cafile=str(net.cert.certfile))
    net.endpoints.append(pub)
    await pub.announce(NS)
    track = pub.create_track(NS, b"t")
    for o in range(4):
        pub.publish(track, 0, o, bytes([o]) * 3000)
    pub.publish(track, 1, 0, b"", status=ObjectStatus.END_OF_TRACK)
    return pub


async def test_idle_publisher_still_serves_a_fetch(cert: DevCertificate) -> None:
    net_settings = QuicSettings.loopback(idle_timeout=IDLE_TIMEOUT)
    async with LocalNet(cert, net_settings) as net:
        pub = await _publisher(net, net_settings)
        await asyncio.sleep(2.5 * IDLE_TIMEOUT)  # quiet for longer than the idle timeout
        assert not pub.is_closed
        consumer = await net.client(net.relays[0])
        res = await consumer.fetch(NS, b"t", location_filter=LocationFilter.none())
        got = [o for o in await res.collect(timeout=10) if o.payload.nbytes]
        assert [(o.group_id, o.object_id, bytes(o.payload)) for o in got] == [
            (0, o, bytes([o]) * 3000) for o in range(4)]


async def test_without_keep_alive_the_idle_timeout_applies(cert: DevCertificate) -> None:
    """The control: a client told not to ping (keep_alive_s=0) loses its quiet session,
    and the relay its publication, after the idle timeout; servers do not ping unless
    told (the relay here is not)."""
    async with LocalNet(cert, QuicSettings.loopback(idle_timeout=IDLE_TIMEOUT)) as net:
        pub = await _publisher(net, QuicSettings.loopback(idle_timeout=IDLE_TIMEOUT,
                                                          keep_alive_s=0.0))
        await until(lambda: pub.is_closed, timeout=3 * IDLE_TIMEOUT)
        await until(lambda: not net.relays[0].publishers, timeout=IDLE_TIMEOUT)


async def test_a_server_told_to_ping_keeps_a_quiet_client(cert: DevCertificate) -> None:
    async with LocalNet(cert, QuicSettings.loopback(idle_timeout=IDLE_TIMEOUT,
                                                    keep_alive_s=IDLE_TIMEOUT / 3)) as net:
        pub = await _publisher(net, QuicSettings.loopback(idle_timeout=IDLE_TIMEOUT,
                                                          keep_alive_s=0.0))
        await asyncio.sleep(2.5 * IDLE_TIMEOUT)
        assert not pub.is_closed and net.relays[0].publishers


def test_keep_alive_interval() -> None:
    auto, off = QuicSettings(), QuicSettings(keep_alive_s=0)
    assert auto.keep_alive_interval(is_client=True, idle_timeout=30) == 10
    assert auto.keep_alive_interval(is_client=False, idle_timeout=30) is None
    assert off.keep_alive_interval(is_client=True, idle_timeout=30) is None
    assert QuicSettings(keep_alive_s=5).keep_alive_interval(is_client=False,
                                                            idle_timeout=30) == 5
    with pytest.raises(ValueError, match="keep_alive_s"):
        QuicSettings(keep_alive_s=-1)
