"""Live and completed retrieval through relays (real QUIC on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from kvcs.endpoint import Endpoint
from kvcs.kvnet.consumer import KvConsumer, KvLayer
from kvcs.kvnet.publisher import KvPublisher, PublicationError, PublisherOptions
from kvcs.testing import LocalNet, reached

from .conftest import BLOCK, BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .helpers import check_layers, produce_slowly, publish_cache


async def test_live_consumer_mid_production(net: LocalNet, hashing: str) -> None:
    relay = await net.relay()
    pub_ep = await net.client(relay)
    cons_ep = await net.client(relay)
    data = cache(1)
    pub = KvPublisher(pub_ep, SCOPE, DESC, PROMPT)
    await pub.start()
    task, started = produce_slowly(pub, data, started_after=1, pause=0.15)
    await reached(started, task)  # the consumer joins while layers 2.. are still to come
    consumer = KvConsumer(cons_ep, SCOPE, DESC, PROMPT)
    found = await consumer.discover()
    assert found is not None and found.prefix_blocks == BLOCKS
    assert not (await consumer.manifest(found)).segments[0].complete
    order, first_at = [], None
    async for layer in consumer.layers(found):
        first_at = first_at or time.perf_counter()
        order.append(layer.index)
        k, v = data[layer.index]
        assert same(layer.k, k) and same(layer.v, v)
    finished_at = await task
    assert order == list(range(LAYERS))
    assert first_at is not None and first_at < finished_at  # layer 0 before the end
    st = consumer.stats
    assert st.objects == LAYERS * BLOCKS * 2  # every object exactly once
    assert st.duplicates == 0 and st.rejected == 0 and st.retries == 0


async def test_completed_layer_range_and_first_blocks(net: LocalNet) -> None:
    relay = await net.relay()
    _, data = await publish_cache(net, relay, 2)
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT)
    found = await consumer.discover()
    assert found is not None
    assert (await consumer.manifest(found)).segments[0].complete
    got = [layer async for layer in consumer.layers(found, range(2, 5), blocks=5)]
    assert [x.index for x in got] == [2, 3, 4]
    for layer in got:
        k, v = data[layer.index]
        assert same(layer.k, k[: 5 * BLOCK]) and same(layer.v, v[: 5 * BLOCK])
    # OBJECTID_FILTER was used (our relay allows range filters): nothing in excess
    assert consumer.stats.excess == 0
    assert consumer.stats.objects == 3 * 5 * 2


async def test_completed_through_two_relays(net: LocalNet) -> None:
    relay_a = await net.relay()
    relay_b = await net.relay(upstream=relay_a)
    pub, data = await publish_cache(net, relay_a, 3)
    consumer = KvConsumer(await net.client(relay_b), SCOPE, DESC, PROMPT)
    found = await consumer.discover()
    assert found is not None
    got = [layer async for layer in consumer.layers(found, range(1, 4), blocks=7)]
    assert [x.index for x in got] == [1, 2, 3]
    for layer in got:
        assert same(layer.k, data[layer.index][0][: 7 * BLOCK])
        assert same(layer.v, data[layer.index][1][: 7 * BLOCK])
    # a second consumer is served from relay B's cache after the publisher left
    pub.endpoint.close()
    await pub.endpoint.wait_closed()
    again = KvConsumer(await net.client(relay_b), SCOPE, DESC, PROMPT)
    got2 = [layer async for layer in again.layers(found, range(1, 4), blocks=7)]
    assert [x.index for x in got2] == [1, 2, 3]
    assert all(np.array_equal(a.k, b.k) for a, b in zip(got, got2, strict=True))


async def test_joint_tracks_q8_and_zstd(net: LocalNet, hashing: str) -> None:
    """The optional joint ``kv.<codec>`` track: zstd is lossless, q8 within its bound."""
    from kvcs.kvnet.publisher import PublisherOptions

    relay = await net.relay()
    data = cache(7)
    for codec in ("zstd", "q8"):
        pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT,
                          PublisherOptions(joint_codec=codec))
        for i, (k, v) in enumerate(data):
            await pub.put_layer(i, k, v)
        await pub.finish()
        consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT, codec=codec)
        found = next(p for p in await consumer.discover_all()
                     if p.namespace.publication_id == pub.publication_id)
        m = await consumer.manifest(found)
        assert f"kv.{codec}.s0" in m.segments[0].tracks
        got = [x async for x in consumer.layers(found, manifest=m)]
        assert [x.index for x in got] == list(range(LAYERS))
        for layer in got:
            k, v = data[layer.index]
            if codec == "zstd":
                assert same(layer.k, k) and same(layer.v, v)
            else:
                for a, b in ((layer.k, k), (layer.v, v)):
                    a32, b32 = a.astype(np.float32), b.astype(np.float32)
                    # per row: |error| <= scale/2 plus bfloat16/float16 rounding
                    scale = np.abs(b32).max(axis=-1, keepdims=True) / 127
                    assert np.all(np.abs(a32 - b32) <= scale * 0.51 + np.abs(b32) / 128)
        assert consumer.stats.rejected == 0


async def test_over_webtransport(net: LocalNet) -> None:
    """Publisher on raw QUIC, consumer on WebTransport (https://) to the same relay port."""
    relay = await net.relay()
    data = cache(8)
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT)
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()
    ep = await net.client(relay, scheme="https")
    assert ep.conn.is_webtransport
    consumer = KvConsumer(ep, SCOPE, DESC, PROMPT)
    found = await consumer.discover()
    assert found is not None
    got = [x async for x in consumer.layers(found)]
    assert [x.index for x in got] == list(range(LAYERS))
    for layer in got:
        assert same(layer.k, data[layer.index][0]) and same(layer.v, data[layer.index][1])


async def test_concurrent_put_layer_never_publishes_a_location_twice(net: LocalNet) -> None:
    """put_layer yields while it publishes: concurrent calls are serialized, layers in
    the order called go through, and a repeated layer is refused, never published twice."""
    relay = await net.relay()
    data = cache(11)
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT)
    await pub.start()
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT)
    found = await consumer.discover()
    assert found is not None
    got: list[KvLayer] = []

    async def take() -> None:
        async for layer in consumer.layers(found):
            got.append(layer)

    reader = asyncio.create_task(take())
    await asyncio.sleep(0.2)  # subscribed
    first = [asyncio.create_task(pub.put_layer(i, *data[i])) for i in (0, 1)]
    again = asyncio.create_task(pub.put_layer(0, *data[0]))
    await asyncio.gather(*first)
    with pytest.raises(PublicationError, match="expected layer 2, got 0"):
        await again
    for i in range(2, LAYERS):
        await pub.put_layer(i, *data[i])
    await pub.finish()
    await asyncio.wait_for(reader, 10)
    assert [x.index for x in got] == list(range(LAYERS))
    for layer in got:
        assert same(layer.k, data[layer.index][0]) and same(layer.v, data[layer.index][1])
    assert consumer.stats.duplicates == 0 and consumer.stats.rejected == 0


class _NeverDrained(Endpoint):
    """An endpoint whose transport never reports its queue empty (as qh3 did after a path
    outage: 261,688 unsent bytes counted with no stream left open)."""

    async def drain(self, limit: int = 4 << 20) -> None:
        if limit == 0:
            await asyncio.Event().wait()
        await super().drain(limit)


async def test_finish_waits_for_the_transport_a_bounded_time(net: LocalNet) -> None:
    """finish() waits for the transport to send what is queued at most
    PublisherOptions.flush_s, then goes on: the publication is complete on the relay."""
    relay = await net.relay()
    ep = await net.client(relay, endpoint_class=_NeverDrained)
    pub = KvPublisher(ep, SCOPE, DESC, PROMPT, PublisherOptions(flush_s=0.5))
    data = cache(5)
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await asyncio.wait_for(pub.finish(), 30)
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT)
    found = await consumer.discover()
    assert found is not None
    check_layers([x async for x in consumer.layers(found)], data)
