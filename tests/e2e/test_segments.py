"""Segments through a relay (real QUIC): every segment is checked against the consumer's
own Block Keys, and prefix_layers joins all covering segments in token order."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kvcs.kv.errors import ManifestError
from kvcs.kvnet.consumer import KvConsumer, RecomputeRequired
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.testing import LocalNet

from .conftest import BLOCK, BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .test_tampering import TamperingRelay

EXTRA = np.arange(3 * BLOCK, dtype=np.int64) + 90_000  # segment 1: three blocks
OTHER = EXTRA + 1  # another prompt's appended tokens


async def two_segments(net: LocalNet, relay: object, seed: int = 40,
                       opts: PublisherOptions | None = None) -> tuple[list, list]:
    """Publish segment 0 (PROMPT) and segment 1 (EXTRA) of seeded caches; their layers."""
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT,  # type: ignore[arg-type]
                      opts)
    seg0, seg1 = cache(seed), cache(seed + 1, len(EXTRA))
    for i, (k, v) in enumerate(seg0):
        await pub.put_layer(i, k, v)
    pub.add_segment(EXTRA)
    for i, (k, v) in enumerate(seg1):
        await pub.put_layer(i, k, v, segment=1)
    await pub.finish()
    return seg0, seg1


def _joined(seg0: list, seg1: list, layer: int, seg1_blocks: int = 3) -> tuple:
    rows = seg1_blocks * BLOCK
    return (np.concatenate([seg0[layer][0], seg1[layer][0][:rows]]),
            np.concatenate([seg0[layer][1], seg1[layer][1][:rows]]))


async def test_another_prompts_segment_is_never_received(net: LocalNet) -> None:
    """A consumer whose appended tokens differ gets segment 0 only: segment 1's Block Keys
    are another prompt's (before: it received segment 1 unchecked)."""
    relay = await net.relay()
    seg0, _ = await two_segments(net, relay)
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, np.concatenate([PROMPT, OTHER]))
    found = await consumer.discover()
    assert found is not None and found.prefix_blocks == BLOCKS
    m = consumer.manifests[found.fields]
    assert consumer.covered_blocks(found, m.segments[0]) == BLOCKS
    assert consumer.covered_blocks(found, m.segments[1]) == 0
    with pytest.raises(ManifestError, match="segment 1 does not cover this prompt"):
        _ = [x async for x in consumer.layers(found, segment=1)]
    got = [x async for x in consumer.prefix_layers(found)]
    assert [x.index for x in got] == list(range(LAYERS))
    for x in got:
        assert x.blocks == BLOCKS and same(x.k, seg0[x.index][0]) and same(x.v, seg0[x.index][1])
    assert consumer.stats.objects == LAYERS * BLOCKS * 2  # not one object of segment 1


async def test_prefix_layers_join_every_covering_segment(net: LocalNet) -> None:
    relay = await net.relay()
    seg0, seg1 = await two_segments(net, relay, 42)
    full = np.concatenate([PROMPT, EXTRA, [5, 6]])  # and a partial block
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, full)
    found = await consumer.discover()
    assert found is not None
    got = [x async for x in consumer.prefix_layers(found)]
    assert [x.index for x in got] == list(range(LAYERS))
    for x in got:
        k, v = _joined(seg0, seg1, x.index)
        assert x.blocks == BLOCKS + 3 and same(x.k, k) and same(x.v, v)
    # the first 18 blocks: all of segment 0 and two blocks of segment 1
    part = [x async for x in consumer.prefix_layers(found, range(2, 4), blocks=BLOCKS + 2)]
    for x in part:
        k, v = _joined(seg0, seg1, x.index, 2)
        assert same(x.k, k) and same(x.v, v)
    # a prompt that ends inside segment 1 cannot check its Block Keys: segment 0 only
    short = KvConsumer(await net.client(relay), SCOPE, DESC,
                       np.concatenate([PROMPT, EXTRA[: 2 * BLOCK]]))
    found2 = await short.discover()
    assert found2 is not None
    got2 = [x async for x in short.prefix_layers(found2, range(0, 1))]
    assert got2[0].blocks == BLOCKS and same(got2[0].k, seg0[0][0])


@pytest.mark.parametrize("into", [False, True])
async def test_missing_blocks_named_within_the_prefix(net: LocalNet, into: bool) -> None:
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    evil.drop = {(b"k.raw.s1", 3, 1), (b"v.raw.s0", 4, 2)}  # type: ignore[misc]
    seg0, seg1 = await two_segments(net, clean, 44)
    consumer = KvConsumer(await net.client(evil), SCOPE, DESC, np.concatenate([PROMPT, EXTRA]),
                          recompute_budget_s=1)
    found = await consumer.discover()
    assert found is not None
    got = []
    buffers = _arrays((BLOCKS + 3) * BLOCK) if into else None
    with pytest.raises(RecomputeRequired) as info:
        async for layer in consumer.prefix_layers(found, into=buffers):
            got.append(layer)
    assert [x.index for x in got] == [0, 1, 2]
    assert info.value.missing == {3: [BLOCKS + 1], 4: [2]}  # block 1 of segment 1 = 17
    if buffers is not None:  # the partial layers are the caller's arrays too
        assert all(np.shares_memory(x.k, buffers[i][0])
                   for i, x in info.value.partial.items())
    # what was verified is kept: layer 3 lacks only block 17 (zero rows), layer 5 is whole
    partial = info.value.partial
    assert sorted(partial) == [3, 4, 5]
    k3, v3 = _joined(seg0, seg1, 3)
    gap = slice((BLOCKS + 1) * BLOCK, (BLOCKS + 2) * BLOCK)
    for got_x, want in ((partial[3].k, k3), (partial[3].v, v3)):
        assert not got_x[gap].astype(np.float32).any()
        assert same(np.delete(got_x, np.r_[gap], 0), np.delete(want, np.r_[gap], 0))
    k5, v5 = _joined(seg0, seg1, 5)
    assert same(partial[5].k, k5) and same(partial[5].v, v5)


async def test_live_segments_followed_through_the_manifest(net: LocalNet) -> None:
    """Segment 0 complete, segment 1 still produced: the consumer reads both while the
    manifest subscription brings the newer versions (object digests, completion)."""
    relay = await net.relay()
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT)
    seg0, seg1 = cache(46), cache(47, len(EXTRA))
    for i, (k, v) in enumerate(seg0):
        await pub.put_layer(i, k, v)
    pub.add_segment(EXTRA)
    await pub.put_layer(0, *seg1[0], segment=1)
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, np.concatenate([PROMPT, EXTRA]))
    found = await consumer.discover()
    assert found is not None
    assert not consumer.manifests[found.fields].segments[1].complete

    async def produce() -> None:
        for i in range(1, LAYERS):
            await asyncio.sleep(0.05)
            await pub.put_layer(i, *seg1[i], segment=1)
        await pub.finish()

    task = asyncio.create_task(produce())
    got = [x async for x in consumer.prefix_layers(found)]
    await task
    assert [x.index for x in got] == list(range(LAYERS))
    for x in got:
        k, v = _joined(seg0, seg1, x.index)
        assert same(x.k, k) and same(x.v, v)
    assert consumer.stats.manifest_versions >= 3  # discovery, the retrieval's, newer ones
    assert consumer.manifests[found.fields].segments[1].complete
    assert consumer.stats.rejected == 0 and consumer.stats.duplicates == 0


def _arrays(tokens: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """A decode worker's own (K, V) buffers of every layer, with room to spare."""
    return [(np.full((tokens, 2, 64), 7, DESC.dtype), np.full((tokens, 2, 64), 7, DESC.dtype))
            for _ in range(LAYERS)]


async def test_layers_assembled_into_the_callers_arrays(net: LocalNet) -> None:
    """``into``: each segment is written straight into its rows of the caller's arrays; the
    yielded layers are views of them (no join), the rows beyond the prefix untouched."""
    relay = await net.relay()
    seg0, seg1 = await two_segments(net, relay, 48)
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, np.concatenate([PROMPT, EXTRA]))
    found = await consumer.discover()
    assert found is not None
    rows = (BLOCKS + 3) * BLOCK
    buffers = _arrays(rows + 5)
    got = [x async for x in consumer.prefix_layers(found, into=buffers)]
    assert [x.index for x in got] == list(range(LAYERS))
    for x in got:
        k, v = _joined(seg0, seg1, x.index)
        assert same(x.k, k) and same(x.v, v)
        own_k, own_v = buffers[x.index]
        assert np.shares_memory(x.k, own_k) and np.shares_memory(x.v, own_v)
        assert (own_k[rows:].view(np.uint16) == own_k[rows:][0].view(np.uint16)).all()
    # one segment, a layer range, into transposed (strided) views of [heads, tokens, dim]
    heads_first = [np.zeros((2, BLOCKS * BLOCK, 64), DESC.dtype) for _ in range(2 * LAYERS)]
    views = [(heads_first[2 * i].transpose(1, 0, 2), heads_first[2 * i + 1].transpose(1, 0, 2))
             for i in range(LAYERS)]
    part = [x async for x in consumer.layers(found, range(1, 3), into=views)]
    assert [x.index for x in part] == [1, 2]
    for x in part:
        assert same(np.ascontiguousarray(x.k), seg0[x.index][0])
        assert same(heads_first[2 * x.index + 1].transpose(1, 0, 2), seg0[x.index][1])


@pytest.mark.parametrize(("into", "match"), [
    (lambda: _arrays(BLOCKS * BLOCK)[:3], "3 layers given, layer 5 is wanted"),
    (lambda: _arrays(BLOCKS * BLOCK - 1), r"into\[0\]: K has shape \(63, 2, 64\), "
                                           r"expected \[>= 64, 2, 64\]"),
    (lambda: [(np.zeros((64, 2, 64), np.float32),) * 2] * LAYERS, "dtype float32"),
    (lambda: [(np.zeros((64, 2, 64), DESC.dtype),)] * LAYERS, "a \\(K, V\\) pair"),
])
async def test_arrays_that_do_not_fit_are_refused_before_any_request(
        net: LocalNet, into: object, match: str) -> None:
    relay = await net.relay()
    await two_segments(net, relay, 50)
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT)
    found = await consumer.discover()
    assert found is not None
    with pytest.raises(ValueError, match=match):
        _ = [x async for x in consumer.layers(found, into=into())]  # type: ignore[operator]
    assert consumer.stats.objects == 0
