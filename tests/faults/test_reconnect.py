"""The publisher's reconnecting target (kvcs.kvnet.reconnect) against in-process relays on
one fixed port: it notices a closed session, reconnects with bounded backoff (each attempt
logged at INFO), announces its namespaces again and serves every object it ever published;
and the backoff itself."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from random import Random

import pytest

from kvcs.backoff import Backoff
from kvcs.endpoint import Endpoint
from kvcs.kvnet.reconnect import ReconnectingTarget
from kvcs.moqt.wire import LocationFilter, ObjectStatus
from kvcs.relay import Relay, RelayConfig
from kvcs.testing import until
from kvcs.transport import DevCertificate, QuicSettings

SETTINGS = QuicSettings.loopback()
NS = (b"reconnect", b"test")


class Relays:
    """In-process relays started one after the other on the same UDP port."""

    def __init__(self, cert: DevCertificate) -> None:
        self.cert = cert
        self.port = 0
        self.running: Relay | None = None

    async def start(self) -> Relay:
        cfg = RelayConfig(listen=f"127.0.0.1:{self.port}", tls_cert=str(self.cert.certfile),
                          tls_key=str(self.cert.keyfile), anonymous=True, goaway_grace=0)
        relay = Relay(cfg, settings=SETTINGS)
        await relay.start()
        self.port, self.running = relay.port, relay
        return relay

    async def stop(self) -> None:
        if self.running is not None:
            await self.running.stop(grace=0)
            self.running = None


@pytest.fixture
async def relays(cert: DevCertificate) -> AsyncIterator[Relays]:
    r = Relays(cert)
    try:
        yield r
    finally:
        await r.stop()


def test_backoff_is_bounded_and_jittered() -> None:
    b = Backoff(initial=0.1, maximum=1.0, factor=2.0, jitter=0.5)
    delays = b.delays(Random(3))
    got = [next(delays) for _ in range(8)]
    caps = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert all(c / 2 <= d <= c for d, c in zip(got, caps, strict=True)), got
    exact = Backoff(initial=0.05, maximum=0.2, jitter=0).delays()
    assert [next(exact) for _ in range(4)] == [0.05, 0.1, 0.2, 0.2]
    for bad in ({"initial": 0}, {"initial": 2, "maximum": 1}, {"factor": 0.5},
                {"jitter": 1.5}):
        with pytest.raises(ValueError):
            Backoff(**bad)  # type: ignore[arg-type]


async def test_backoff_retry_until_success_and_only_on_the_given_errors() -> None:
    b = Backoff(initial=0.001, maximum=0.002)
    tries: list[int] = []

    async def flaky(n: int) -> str:
        tries.append(n)
        if n < 3:
            raise ConnectionError("refused")
        return "up"

    assert await b.retry(flaky, what="test", retry_on=(ConnectionError,)) == "up"
    assert tries == [1, 2, 3]

    async def broken(n: int) -> str:
        raise ValueError("not retried")

    with pytest.raises(ValueError):
        await b.retry(broken, what="test", retry_on=(ConnectionError,))


async def test_reconnects_announces_again_and_serves_everything(
        relays: Relays, cert: DevCertificate, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kvcs.backoff")  # logs each attempt
    relay = await relays.start()
    url = f"moqt://127.0.0.1:{relays.port}/"
    target = await ReconnectingTarget.connect(
        url, settings=SETTINGS, cafile=str(cert.certfile), connect_timeout=0.5,
        backoff=Backoff(initial=0.05, maximum=0.2), rng=Random(1))
    try:
        await target.announce(NS)
        track = target.create_track(NS, b"t")
        for o in range(3):
            target.publish(track, 0, o, b"before %d" % o)
        await target.drain(0)
        await until(lambda: NS in relay.publishers)
        await relays.stop()  # the relay goes: CONNECTION_CLOSE, noticed at once
        await until(lambda: not target.connected)
        for o in range(3, 6):  # published while away: stored, nothing blocks
            target.publish(track, 0, o, b"away %d" % o)
        await target.drain(0)
        target.publish(track, 0, 6, b"", status=ObjectStatus.END_OF_TRACK)
        await until(lambda: target.attempts >= 2)  # nobody listens: attempts fail
        relay = await relays.start()
        ep = await target.wait_connected(5)
        assert target.sessions == 2 and NS in ep.announced
        await until(lambda: NS in relay.publishers)
        async with await Endpoint.connect(url, cafile=str(cert.certfile),
                                          settings=SETTINGS) as consumer:
            res = await consumer.fetch(NS, b"t", location_filter=LocationFilter.none())
            got = [bytes(o.payload) for o in await res.collect(timeout=5)
                   if o.status == ObjectStatus.NORMAL]
        assert got == [b"before 0", b"before 1", b"before 2", b"away 3", b"away 4",
                       b"away 5"]
        assert target.forget(NS) == 1 and not target.origin.tracks
        await until(lambda: NS not in relay.publishers)
    finally:
        await target.aclose()
    attempts = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("reconnecting to")]
    assert len(attempts) == target.attempts >= 2
    delays = [float(m.rsplit("after ", 1)[1].split()[0]) for m in attempts]
    assert max(delays) <= 0.2  # bounded by Backoff.maximum
    assert not target.connected and target.endpoint is None


async def test_namespaces_announced_or_withdrawn_while_away(
        relays: Relays, cert: DevCertificate) -> None:
    await relays.start()
    url = f"moqt://127.0.0.1:{relays.port}/"
    target = await ReconnectingTarget.connect(
        url, settings=SETTINGS, cafile=str(cert.certfile), connect_timeout=0.5,
        backoff=Backoff(initial=0.05, maximum=0.1))
    try:
        await target.announce(NS)
        await relays.stop()
        await until(lambda: not target.connected)
        other = (b"reconnect", b"other")
        await target.announce(other)  # no session: announced by the next one
        target.withdraw(NS)
        relay = await relays.start()
        await target.wait_connected(5)
        await until(lambda: other in relay.publishers)
        assert NS not in relay.publishers
    finally:
        await target.aclose()
    tasks = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
    assert not any("_supervise" in repr(t) for t in tasks)


async def test_first_connection_failure_is_reported(cert: DevCertificate) -> None:
    """A wrong address shows at once: the first attempt raises, nothing retries."""
    with pytest.raises((ConnectionError, OSError, TimeoutError)):
        await ReconnectingTarget.connect("moqt://127.0.0.1:9/", settings=SETTINGS,
                                         cafile=str(cert.certfile), connect_timeout=0.3)
