"""Process death: a relay SIGKILLed in the middle of a live transfer (restarted on the same
port, or not) and a prefill worker SIGKILLed in the middle of its publication.

The relays and the killed publisher are real processes (``python -m kvcs relay``,
tests/faults/publisher_child.py); clients use a 1.5 s QUIC idle timeout, so that a dead
peer is noticed within 1.5 s (with the default 30 s the consumer's budget would cut in
first and it would report the rest for recompute, which is also correct, just not this
test). Each scenario checks every yielded layer against the publisher's arrays and that
what was neither yielded nor verified was reported missing, exactly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from random import Random

import pytest

from kvcs.endpoint import Endpoint
from kvcs.kv.store import BlockStore, store_cache
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.kvsp_http import KvspClient
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.kvnet.reconnect import ReconnectingTarget
from kvcs.testing import LocalNet, reached
from kvcs.transport import DevCertificate, QuicSettings

from .processes import ChildProcess, RelayProcess
from .report import ScenarioRecord
from .workload import (
    BLOCKS,
    DESC,
    LAYERS,
    PROMPT,
    SCOPE,
    Layers,
    consume,
    indexes,
    kv_cache,
    layers_from,
)

QUICK = QuicSettings.loopback(idle_timeout=1.5)
"""Clients notice a dead relay after 1.5 s of silence."""
BUDGET = 5.0
"""The consumers' recompute budget: longer than noticing the death (1.5 s) plus
reconnecting, so that the transfers can go on."""
RESTART_BUDGET = 20.0
"""The budget when the relay is restarted in place: a new relay process must start
within it (at load 20 on two cores a Python process took several seconds to start; the
transfer then went 5.9 s without progress)."""
PAUSE = 0.15
"""Seconds between two layers of the live publications (8 layers: 1.2 s)."""


@pytest.fixture
async def net(cert: DevCertificate) -> AsyncIterator[LocalNet]:
    async with LocalNet(cert, QUICK) as n:
        yield n


@pytest.fixture
async def procs() -> AsyncIterator[list[ChildProcess]]:
    """Child processes of a test, killed at its end."""
    started: list[ChildProcess] = []
    try:
        yield started
    finally:
        for p in started:
            await p.kill()


def _connect(cert: DevCertificate):  # type: ignore[no-untyped-def]
    async def connect(url: str) -> Endpoint:
        return await Endpoint.connect(url, cafile=str(cert.certfile), settings=QUICK)
    return connect


async def _publisher_and_consumer_endpoint(net: LocalNet,
                                          relay: RelayProcess) -> tuple[KvPublisher, Endpoint]:
    """A started publisher and a consumer's endpoint, both connected to ``relay`` (a relay
    process) and closed with ``net``."""
    connect = _connect(net.cert)
    pub_ep, cons_ep = await connect(relay.url), await connect(relay.url)
    net.endpoints += [pub_ep, cons_ep]
    pub = KvPublisher(pub_ep, SCOPE, DESC, PROMPT)
    await pub.start()
    return pub, cons_ep


class Kill:
    """Calls ``action`` (once) when the consumer has yielded layer ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.reached = asyncio.Event()
        self.killed_at = 0.0

    def on_progress(self, what: str, index: int, _stop: int) -> None:
        if what == "layer" and index == self.at:
            self.reached.set()

    async def run(self, action) -> None:  # type: ignore[no-untyped-def]
        await reached(self.reached)  # bounded: a retrieval may end before it
        self.killed_at = time.monotonic()
        await action()


async def _live(pub: KvPublisher, data: Layers, *, finish: bool = True) -> None:
    await pub.start()
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
        await asyncio.sleep(PAUSE)
    if finish:
        await pub.finish()


async def test_relay_killed_and_restarted_mid_transfer(
        cert: DevCertificate, tmp_path: Path, procs: list[ChildProcess],
        scenario: ScenarioRecord) -> None:
    """The relay dies after layer 2 and comes back on its port at once: the publisher
    reconnects and announces again by itself, the consumer goes on on the restarted relay
    and gets every layer; the publication is then whole on the restarted relay: another
    consumer, idle during all this (its session died too), reconnects by itself and gets
    it after the publisher has left."""
    relay = RelayProcess(cert, tmp_path)
    procs.append(relay)
    await relay.start()
    cafile = str(cert.certfile)
    target = await ReconnectingTarget.connect(relay.url, settings=QUICK, cafile=cafile,
                                              rng=Random(7))
    data = kv_cache(21)
    pub = KvPublisher(target, SCOPE, DESC, PROMPT, PublisherOptions(hand_over_s=20))
    await pub.start()
    kill = Kill(at=2)
    ep = await Endpoint.connect(relay.url, cafile=cafile, settings=QUICK)
    consumer = KvConsumer(ep, SCOPE, DESC, PROMPT, recompute_budget_s=RESTART_BUDGET,
                          connect=_connect(cert), on_progress=kill.on_progress)
    idle_ep = await Endpoint.connect(relay.url, cafile=cafile, settings=QUICK)
    idle = KvConsumer(idle_ep, SCOPE, DESC, PROMPT, recompute_budget_s=RESTART_BUDGET,
                      connect=_connect(cert))

    async def restart() -> None:
        await relay.kill()
        await relay.start()

    try:
        found = await consumer.discover()
        assert found is not None
        producing = asyncio.create_task(_live(pub, data))
        chaos = asyncio.create_task(kill.run(restart))
        got = (await consume(consumer, found)).judge(data)
        await chaos
        await producing  # finish() handed the publication over to the restarted relay
        scenario.record(got)
        assert got.complete and got.wrong_tensors == 0 and got.bytes_lost == 0
        assert relay.starts == 2 and target.sessions == 2 and target.attempts >= 1
        assert consumer.stats.resumes >= 1
        # the consumer's budget was never exhausted: it went on within it
        assert time.monotonic() - kill.killed_at < RESTART_BUDGET
        await target.aclose()  # the publisher leaves
        assert idle_ep.is_closed  # noticed the dead relay long ago (1.5 s)
        again = (await consume(idle)).judge(data)
        assert again.complete and again.wrong_tensors == 0 and again.bytes_lost == 0
        assert idle.endpoint is not idle_ep and not idle.endpoint.is_closed
    finally:
        await consumer.aclose()
        await idle.aclose()
        await target.aclose()
        ep.close()


@pytest.mark.faults
async def test_relay_killed_second_relay_available(
        net: LocalNet, tmp_path: Path, procs: list[ChildProcess],
        scenario: ScenarioRecord) -> None:
    """Two edge relays below one origin; the consumer's first edge dies after layer 2
    (and stays dead): the transfer goes on through the second edge, whole."""
    origin = await net.relay()
    edge_a = RelayProcess(net.cert, tmp_path, name="edge-a",
                          upstream=f"moqt://127.0.0.1:{origin.port}/")
    procs.append(edge_a)
    await edge_a.start()
    edge_b = await net.relay(upstream=origin)
    data = kv_cache(22)
    pub = KvPublisher(await net.client(origin), SCOPE, DESC, PROMPT)
    await pub.start()
    kill = Kill(at=2)
    ep_a = await Endpoint.connect(edge_a.url, cafile=str(net.cert.certfile), settings=QUICK)
    net.endpoints.append(ep_a)
    consumer = KvConsumer([ep_a, await net.client(edge_b)], SCOPE, DESC, PROMPT,
                          recompute_budget_s=BUDGET, on_progress=kill.on_progress)
    found = await consumer.discover()
    assert found is not None and found.endpoint is ep_a
    producing = asyncio.create_task(_live(pub, data))
    chaos = asyncio.create_task(kill.run(edge_a.kill))
    got = (await consume(consumer, found)).judge(data)
    await chaos
    await producing
    scenario.record(got)
    assert got.complete and got.wrong_tensors == 0 and got.bytes_lost == 0
    assert consumer.stats.resumes >= 1 and ep_a.is_closed


@pytest.mark.faults
async def test_relay_killed_http_holder_available(
        net: LocalNet, tmp_path: Path, procs: list[ChildProcess],
        scenario: ScenarioRecord) -> None:
    """The only relay dies after layer 2; the publisher also stored its cache with a KVSP
    HTTP holder: the consumer gets the rest from there, within its budget."""
    relay = RelayProcess(net.cert, tmp_path)
    procs.append(relay)
    await relay.start()
    data = kv_cache(23)
    store = BlockStore(tmp_path / "store")
    store_cache(store, DESC, SCOPE, PROMPT, [k for k, _ in data], [v for _, v in data])
    pub, cons_ep = await _publisher_and_consumer_endpoint(net, relay)
    kill = Kill(at=2)
    budget = 2.0
    holder = await net.kvsp_server(store)
    async with KvspClient(holder.url, None, pin_sha256=net.cert.sha256) as http:
        consumer = KvConsumer(cons_ep, SCOPE, DESC, PROMPT, recompute_budget_s=budget,
                              http=http, on_progress=kill.on_progress)
        found = await consumer.discover()
        assert found is not None
        producing = asyncio.create_task(_live(pub, data, finish=False))
        chaos = asyncio.create_task(kill.run(relay.kill))
        got = (await consume(consumer, found)).judge(data)
        await chaos
        producing.cancel()
    scenario.record(got)
    assert got.complete and got.wrong_tensors == 0 and got.bytes_lost == 0
    assert consumer.stats.http_blocks > 0
    # the budget without progress, then recovery: HTTP answered well within the second one
    assert time.monotonic() - kill.killed_at < 2 * budget + 1.0


@pytest.mark.faults
async def test_relay_killed_no_other_source(
        net: LocalNet, tmp_path: Path, procs: list[ChildProcess],
        scenario: ScenarioRecord) -> None:
    """The only relay dies after layer 2, nothing else holds the cache: the consumer
    reports exactly the layers it did not yield, one budget after its last progress."""
    relay = RelayProcess(net.cert, tmp_path)
    procs.append(relay)
    await relay.start()
    data = kv_cache(24)
    pub, cons_ep = await _publisher_and_consumer_endpoint(net, relay)
    kill = Kill(at=2)
    budget = 2.0
    consumer = KvConsumer(cons_ep, SCOPE, DESC, PROMPT, recompute_budget_s=budget,
                          connect=_connect(net.cert), on_progress=kill.on_progress)
    found = await consumer.discover()
    assert found is not None
    producing = asyncio.create_task(_live(pub, data, finish=False))
    chaos = asyncio.create_task(kill.run(relay.kill))
    got = (await consume(consumer, found)).judge(data)
    answered = time.monotonic() - kill.killed_at
    await chaos
    producing.cancel()
    scenario.record(got)
    assert got.error is not None and got.wrong_tensors == 0 and got.bytes_lost == 0
    n = len(got.yielded)
    assert indexes(got.yielded) == list(range(n)) and n >= 3
    assert sorted(got.missing) == list(range(n, LAYERS))
    assert got.missing[LAYERS - 1] == list(range(BLOCKS))
    # no progress since the kill: one budget, then a recovery with nothing reachable
    assert answered < budget + 1.0, answered


@pytest.mark.parametrize("blocks", [pytest.param(0, marks=pytest.mark.faults), 7])
async def test_publisher_killed_mid_publication(
        net: LocalNet, procs: list[ChildProcess], scenario: ScenarioRecord,
        tmp_path: Path, blocks: int) -> None:
    """The prefill worker is SIGKILLed after 3 layers (and, with ``blocks``, the first 7
    blocks of layer 3): consumers get those layers, give up on the rest within the budget
    and report exactly the missing layers and blocks; the verified blocks of the
    partial layer come back in ``partial``."""
    relay = await net.relay()
    child = ChildProcess(tmp_path / "publisher.log")
    procs.append(child)
    seed, published = 25, 3
    await child.spawn("-m", "tests.faults.publisher_child", str(relay.port),
                      str(net.cert.certfile), str(seed), str(published), str(blocks),
                      ready="published")
    data = kv_cache(seed)
    budget = 2.0
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT,
                          recompute_budget_s=budget)
    found = await consumer.discover()
    assert found is not None
    retrieval = asyncio.create_task(consume(consumer, found))
    await asyncio.sleep(0.3)  # the consumer is receiving
    killed_at = time.monotonic()
    await child.kill()
    got = (await retrieval).judge(data)
    answered = time.monotonic() - killed_at
    scenario.record(got)
    assert got.wrong_tensors == 0 and got.bytes_lost == 0
    assert indexes(got.yielded) == list(range(published))
    want = layers_from(published)
    if blocks:
        want[published] = list(range(blocks, BLOCKS))
        part = got.error.partial[published]  # type: ignore[union-attr]
        k, v = data[published]
        assert part.k[: blocks * 16].tobytes() == k[: blocks * 16].tobytes()
        assert part.v[: blocks * 16].tobytes() == v[: blocks * 16].tobytes()
    assert got.missing == want
    assert answered < budget + 1.0, answered


@pytest.mark.faults
async def test_relay_killed_answer_within_the_promised_budgets(
        cert: DevCertificate, tmp_path: Path, procs: list[ChildProcess],
        scenario: ScenarioRecord) -> None:
    """The only relay dies after layer 2 while the consumer's QUIC idle timeout (30 s) is
    far longer than its budget, so its session looks alive: the transfer gives up one
    budget after the last progress, recovery within a second one, and the answer comes
    within those two budgets of the last verified object (issue #27: 20.1-21 s after the
    kill with 2 x 10 s)."""
    relay = RelayProcess(cert, tmp_path)
    procs.append(relay)
    await relay.start()
    data = kv_cache(26)
    settings = QuicSettings.loopback()  # idle timeout 30 s: the death goes unnoticed
    async with LocalNet(cert, settings) as net:
        pub_ep = await Endpoint.connect(relay.url, cafile=str(cert.certfile), settings=settings)
        cons_ep = await Endpoint.connect(relay.url, cafile=str(cert.certfile),
                                         settings=settings)
        net.endpoints += [pub_ep, cons_ep]
        pub = KvPublisher(pub_ep, SCOPE, DESC, PROMPT)
        await pub.start()
        kill = Kill(at=2)
        budget = 1.5
        consumer = KvConsumer(cons_ep, SCOPE, DESC, PROMPT, recompute_budget_s=budget,
                              on_progress=kill.on_progress)
        found = await consumer.discover()
        assert found is not None
        producing = asyncio.create_task(_live(pub, data, finish=False))
        chaos = asyncio.create_task(kill.run(relay.kill))
        got = (await consume(consumer, found)).judge(data)
        answered = time.monotonic()
        await chaos
        producing.cancel()
        last = consumer.stats.last_progress_at
        scenario.record(got)
        assert got.error is not None and got.wrong_tensors == 0 and got.bytes_lost == 0
        assert last is not None and last <= kill.killed_at + 1.0
        # the promise: one budget without progress, then recovery within a second one
        # (slack for a loaded machine: what matters is that nothing waits past them)
        assert answered - last < 2 * budget + 1.0, (answered - last, 2 * budget)
