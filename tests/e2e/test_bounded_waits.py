"""Bounded waits (kvcs-draft "Verification and Recovery": consumers SHOULD bound recovery
by recompute time and not wait indefinitely), through a relay on real QUIC: a publisher
that stops sending with its session open, a FETCH that is never answered, a manifest that
never comes. Each ends in RecomputeRequired (or a discarded publication) within the budget,
naming exactly what is missing; a slow publication that keeps progressing is not cut."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvcs.endpoint import Endpoint
from kvcs.kv.errors import ManifestError
from kvcs.kvnet.consumer import KvConsumer, Publication, RecomputeRequired
from kvcs.kvnet.publisher import KvPublisher
from kvcs.moqt import events as ev
from kvcs.moqt.wire import Fetch, Subscribe
from kvcs.testing import LocalNet

from .conftest import BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .retrieval import layers_until_recompute

BUDGET = 0.5


async def discovered(consumer: KvConsumer) -> Publication:
    """The consumer's discovery, asked again while it finds nothing: under the 0.5 s budget
    one answer can come late on a loaded machine (a CI run at load 10-37 missed it once);
    these tests are about what follows discovery."""
    for _ in range(20):
        found = await consumer.discover()
        if found is not None:
            return found
    raise AssertionError("the publication was never discovered")


class Stalled(Endpoint):
    """A publisher whose process hangs for some tracks: their SUBSCRIBE and FETCH requests
    are never answered (the session stays open)."""

    silent: tuple[bytes, ...] = (b"k.", b"v.")

    def handle_request(self, e: ev.RequestReceived) -> None:
        m = e.message
        if isinstance(m, Subscribe | Fetch) and bytes(m.name).startswith(self.silent):
            return
        super().handle_request(e)


class StalledManifest(Stalled):
    silent = (b"manifest",)


async def test_live_publisher_that_stops_sending(net: LocalNet) -> None:
    relay = await net.relay()
    data = cache(50)
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT)
    for i in range(2):
        await pub.put_layer(i, *data[i])  # then nothing more; the session stays open
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT,
                          recompute_budget_s=BUDGET)
    found = await discovered(consumer)
    t0 = time.monotonic()
    got, short = await layers_until_recompute(consumer.prefix_layers(found))
    elapsed = time.monotonic() - t0
    # BUDGET without progress, then at most BUDGET of recovery (plus loopback slack)
    assert elapsed < 2 * BUDGET + 1.5, elapsed
    assert [x.index for x in got] == [0, 1]
    assert all(same(x.k, data[x.index][0]) for x in got)
    assert short.missing == {layer: list(range(BLOCKS)) for layer in range(2, LAYERS)}
    assert short.yielded == 2 and short.partial == {}


async def test_fetch_of_a_completed_segment_never_answered(net: LocalNet) -> None:
    relay = await net.relay()
    ep = await net.client(relay, endpoint_class=Stalled)
    pub = KvPublisher(ep, SCOPE, DESC, PROMPT)
    for i, (k, v) in enumerate(cache(51)):
        await pub.put_layer(i, k, v)
    await pub.finish()  # complete: the consumer FETCHes, the relay waits upstream forever
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT,
                          recompute_budget_s=BUDGET)
    found = await discovered(consumer)
    manifest = consumer.manifests[found.fields]  # checked by discovery
    assert manifest.segments[0].complete
    t0 = time.monotonic()
    with pytest.raises(RecomputeRequired) as info:
        # with the manifest discovery read: no second read within the 0.5 s budget (a
        # fresh-clone CI run on a starting xdist worker missed it once); the subject is
        # the FETCH that is never answered
        _ = [x async for x in consumer.layers(found, manifest=manifest)]
    assert time.monotonic() - t0 < 2 * BUDGET + 1.5
    assert info.value.missing == {layer: list(range(BLOCKS)) for layer in range(LAYERS)}
    assert info.value.yielded == 0


async def test_manifest_that_never_comes(net: LocalNet) -> None:
    relay = await net.relay()
    ep = await net.client(relay, endpoint_class=StalledManifest)
    pub = KvPublisher(ep, SCOPE, DESC, PROMPT)
    await pub.start()
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT,
                          recompute_budget_s=BUDGET)
    pubs = await consumer.discover_all()
    t0 = time.monotonic()
    with pytest.raises(ManifestError, match="recompute budget"):
        await consumer.manifest(pubs[0])
    assert time.monotonic() - t0 < BUDGET + 1.0
    assert await consumer.discover() is None  # discarded, shorter prefixes have nothing
    assert "no manifest version" in consumer.discarded[0][1]


async def test_slow_publication_that_keeps_progressing(net: LocalNet) -> None:
    """The budget counts from the last progress: a live publication producing a layer every
    0.3 s (1.8 s in all, more than two budgets of 0.8 s) is received whole."""
    budget = 0.8
    relay = await net.relay()
    data = cache(52)
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT)
    await pub.start()
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT,
                          recompute_budget_s=budget)
    found = await discovered(consumer)

    async def produce() -> None:
        for i, (k, v) in enumerate(data):
            await asyncio.sleep(0.3)
            await pub.put_layer(i, k, v)
        await pub.finish()

    task = asyncio.create_task(produce())
    t0 = time.monotonic()
    got = [x async for x in consumer.prefix_layers(found)]
    await task
    assert time.monotonic() - t0 > 2 * budget
    assert [x.index for x in got] == list(range(LAYERS))
    assert all(same(x.v, data[x.index][1]) for x in got)
