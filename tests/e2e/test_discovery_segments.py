"""Discovery by prefix and appended segments (real QUIC through a relay)."""

from __future__ import annotations

import numpy as np

from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher
from kvcs.testing import LocalNet

from .conftest import BLOCK, BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same


async def _publish(net: LocalNet, relay: object, tokens: np.ndarray, seed: int) -> KvPublisher:
    ep = await net.client(relay)  # type: ignore[arg-type]
    pub = KvPublisher(ep, SCOPE, DESC, tokens)
    for i, (k, v) in enumerate(cache(seed, len(tokens))):
        await pub.put_layer(i, k, v)
    await pub.finish()
    return pub


async def test_discovery_exact_shorter_and_none(net: LocalNet) -> None:
    relay = await net.relay()
    pub = await _publish(net, relay, PROMPT, 4)
    ep = await net.client(relay)
    # exact: the consumer's prompt is the published one (plus a partial block)
    exact = KvConsumer(ep, SCOPE, DESC, np.concatenate([PROMPT, [7, 8]]))
    found = await exact.discover()
    assert found is not None and found.prefix_blocks == BLOCKS
    assert found.namespace.publication_id == pub.publication_id
    # shorter: the consumer's prompt goes on for 5 more blocks; the published prefix is
    # found through successively shorter prefixes
    longer = np.concatenate([PROMPT, np.arange(5 * BLOCK) + 50_000])
    c2 = KvConsumer(ep, SCOPE, DESC, longer)
    found2 = await c2.discover()
    assert found2 is not None and found2.prefix_blocks == BLOCKS
    got = [x async for x in c2.layers(found2, range(0, 2))]
    assert same(got[0].k, cache(4)[0][0])
    # nothing: a different prompt (and a different scope) finds nothing
    other = KvConsumer(ep, SCOPE, DESC, PROMPT + 1)
    assert await other.discover() is None
    from kvcs.kv.ids import ScopeKey

    stranger = KvConsumer(ep, ScopeKey.from_bytes(bytes(32)), DESC, PROMPT)
    assert await stranger.discover() is None


async def test_appended_segment_found_through_the_manifest(net: LocalNet) -> None:
    relay = await net.relay()
    ep = await net.client(relay)
    pub = KvPublisher(ep, SCOPE, DESC, PROMPT)
    seg0 = cache(5)
    for i, (k, v) in enumerate(seg0):
        await pub.put_layer(i, k, v)
    extra = np.arange(3 * BLOCK, dtype=np.int64) + 90_000
    assert pub.add_segment(extra) == 1
    seg1 = cache(6, 3 * BLOCK)
    for i, (k, v) in enumerate(seg1):
        await pub.put_layer(i, k, v, segment=1)
    await pub.finish()

    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, np.concatenate([PROMPT, extra]))
    found = await consumer.discover()
    assert found is not None and found.prefix_blocks == BLOCKS  # anchored at segment 0
    m = await consumer.manifest(found)
    assert [s.segment for s in m.segments] == [0, 1]
    assert m.segments[1].first_block == BLOCKS and m.segments[1].blocks == 3
    assert m.segments[1].tracks == ["k.raw.s1", "v.raw.s1"] and m.segments[1].complete
    got = [x async for x in consumer.layers(found, segment=1, manifest=m)]
    assert [x.index for x in got] == list(range(LAYERS))
    for layer in got:
        assert same(layer.k, seg1[layer.index][0]) and same(layer.v, seg1[layer.index][1])
