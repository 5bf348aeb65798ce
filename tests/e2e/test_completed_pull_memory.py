"""A completed cache pulled, or a live one joined late, through a relay over real QUIC on
127.0.0.1: what the consumer holds waiting for verification stays within about
``fetch_window`` however slowly it verifies (the transport returns flow-control credit as
the session reads the bytes, so only the consumer's own FETCH pacing bounds it).
Bytes are counted, nothing is timed."""

from __future__ import annotations

import asyncio

import ml_dtypes
import numpy as np
import pytest

from kvcs.kv.payload import HEADER_SIZE
from kvcs.kvnet import moqt_source
from kvcs.kvnet.consumer import KvConsumer, KvLayer
from kvcs.kvnet.moqt_source import FETCHES_IN_FLIGHT
from kvcs.kvnet.publisher import KvPublisher
from kvcs.testing import LocalNet

from .conftest import SCOPE, descriptor
from .helpers import check_layers

LAYERS = 12
BLOCK = 16
BLOCKS = 32
DESC = descriptor("e2e-window", LAYERS, BLOCK)
PROMPT = np.arange(5000, 5000 + BLOCK * BLOCKS, dtype=np.int64)
OBJECT = HEADER_SIZE + BLOCK * 2 * 64 * 2  # one raw block of K (or V) with its header
LAYER = 2 * BLOCKS * OBJECT  # one layer of both tracks
WINDOW = 8 * LAYER  # a quarter of it: two layers per FETCH
CACHE = LAYERS * LAYER


def _cache() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [tuple(rng.standard_normal((BLOCK * BLOCKS, 2, 64), dtype=np.float32)
                  .astype(ml_dtypes.bfloat16) for _ in range(2))  # type: ignore[misc]
            for _ in range(LAYERS)]


@pytest.fixture
def slow_intake(monkeypatch: pytest.MonkeyPatch) -> None:
    """Verification that lags the network: each batch's SHA-256 waits 50 loop turns, while
    the relay's and the consumer's sessions go on moving bytes."""
    digests = moqt_source.sha256_digests

    async def slow(buffers: list) -> list[bytes]:
        for _ in range(50):
            await asyncio.sleep(0)
        return await digests(buffers)

    monkeypatch.setattr(moqt_source, "sha256_digests", slow)


def _check_whole(consumer: KvConsumer, got: list[KvLayer], data: list) -> None:
    """Every layer in order, every byte verified and in place, each object once."""
    assert [x.index for x in got] == list(range(LAYERS))
    check_layers(got, data)
    st = consumer.stats
    assert st.objects == LAYERS * BLOCKS * 2 and st.bytes == CACHE
    assert st.rejected == 0 and st.duplicates == 0


async def _pull(net: LocalNet, window: int | None) -> KvConsumer:
    relay = await net.relay()
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT)
    data = _cache()
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT, fetch_window=window)
    found = await consumer.discover()
    assert found is not None
    assert (await consumer.manifest(found)).segments[0].complete
    got = [layer async for layer in consumer.layers(found)]
    _check_whole(consumer, got, data)
    return consumer


async def test_completed_pull_held_bytes_within_window(net: LocalNet, slow_intake: None) -> None:
    c = await _pull(net, WINDOW)
    step = WINDOW // 4 // LAYER
    assert step == 2
    # half the window when the last FETCH went out, plus every FETCH open then
    bound = WINDOW // 2 + FETCHES_IN_FLIGHT * step * LAYER
    assert bound <= WINDOW
    assert 0 < c.stats.intake_peak_bytes <= bound


async def test_completed_pull_unbounded_holds_more(net: LocalNet, slow_intake: None) -> None:
    """Without the window (one FETCH of every layer per track) the same slow verification
    leaves more than the window queued: what the window is for."""
    c = await _pull(net, None)
    assert c.stats.intake_peak_bytes > WINDOW


async def test_window_smaller_than_a_layer(net: LocalNet, slow_intake: None) -> None:
    """One layer per FETCH when a quarter of the window holds less than a layer: half the
    window plus the open FETCHes' layers."""
    c = await _pull(net, LAYER)
    assert 0 < c.stats.intake_peak_bytes <= LAYER // 2 + FETCHES_IN_FLIGHT * LAYER


async def test_fetch_window_must_be_positive(net: LocalNet) -> None:
    ep = await net.client(await net.relay())
    with pytest.raises(ValueError, match="fetch_window"):
        KvConsumer(ep, SCOPE, DESC, PROMPT, fetch_window=0)


LIVE_WINDOW = 4 * LAYER  # a quarter of it: one layer per FETCH and in the fill
LIVE_PUBLISHED = 10  # layers published before the consumer joins; the last two come live


async def _join_live(net: LocalNet, window: int | None) -> KvConsumer:
    """A consumer joins a live segment whose first ten layers are published, and the
    publisher sends the last two once the consumer has its first layer."""
    relay = await net.relay()
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT)
    data = _cache()
    for i in range(LIVE_PUBLISHED):
        await pub.put_layer(i, *data[i])
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT, fetch_window=window)
    found = await consumer.discover()
    assert found is not None
    assert not (await consumer.manifest(found)).segments[0].complete
    got: list[KvLayer] = []
    async for layer in consumer.layers(found):
        got.append(layer)
        if layer.index == 0:
            for i in range(LIVE_PUBLISHED, LAYERS):
                await pub.put_layer(i, *data[i])
            await pub.finish()
    _check_whole(consumer, got, data)
    return consumer


async def test_live_join_of_a_mostly_finished_segment_within_window(
        net: LocalNet, slow_intake: None) -> None:
    """A live segment's earlier layers come through the fill (the first quarter window of
    them) and windowed FETCHes up to the SUBSCRIBE_OK's Largest Object, not through one
    fill at the relay's full speed."""
    c = await _join_live(net, LIVE_WINDOW)
    # half the window when the last FETCH went out, plus the FETCHes open then, the
    # fill's layer and the two live layers
    step = LIVE_WINDOW // 4 // LAYER
    assert step == 1
    bound = LIVE_WINDOW // 2 + (FETCHES_IN_FLIGHT + 1) * step * LAYER + 2 * LAYER
    assert bound < LIVE_PUBLISHED * LAYER
    assert 0 < c.stats.intake_peak_bytes <= bound


async def test_live_join_unbounded_takes_one_fill(net: LocalNet, slow_intake: None) -> None:
    """Without the window the fill brings every published layer (each object still once)."""
    c = await _join_live(net, None)
    assert c.stats.intake_peak_bytes > LIVE_WINDOW
