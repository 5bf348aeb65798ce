"""``KvConsumer.layers`` and ``prefix_layers`` with ``into=``: the layers are assembled in
the caller's arrays, straight from a publisher (TrackHost, real QUIC on 127.0.0.1) whose
endpoint records every request, so "refused before any request" is checked as such."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import numpy as np
import pytest

from kvcs.hosting import TrackHost
from kvcs.kvnet.consumer import KvConsumer, Publication
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.transport import DevCertificate

from .conftest import BLOCK, BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .recording import Requests, connect, direct_host

ROWS = BLOCKS * BLOCK
SPARE = 3  # rows beyond the prefix, which must stay as the caller left them


@pytest.fixture
async def direct(cert: DevCertificate) -> AsyncIterator[tuple[TrackHost, str, Requests]]:
    async with direct_host(cert) as d:
        yield d


async def _publish(host: TrackHost, seed: int, codec: str) -> list:
    options = PublisherOptions(joint_codec=None if codec == "raw" else codec)
    pub = KvPublisher(host, SCOPE, DESC, PROMPT, options)
    data = cache(seed)
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()
    return data


@contextlib.asynccontextmanager
async def _found(direct: tuple[TrackHost, str, Requests], cert: DevCertificate,
                 seed: int) -> AsyncIterator[tuple[KvConsumer, Publication]]:
    """Publish the raw cache ``seed``, connect a consumer to the publisher and discover it;
    the consumer's endpoint is closed on exit."""
    host, url, _ = direct
    await _publish(host, seed, "raw")
    consumer = KvConsumer(await connect(url, cert), SCOPE, DESC, PROMPT)
    try:
        found = await consumer.discover()
        assert found is not None
        yield consumer, found
    finally:
        consumer.endpoint.close()
        await consumer.endpoint.wait_closed()


def _buffers(tokens: int = ROWS + SPARE) -> list[tuple[np.ndarray, np.ndarray]]:
    """A decode worker's (K, V) arrays of every layer, filled with a marker (bfloat16 1.0)."""
    return [(np.full((tokens, 2, 64), 1, DESC.dtype), np.full((tokens, 2, 64), 1, DESC.dtype))
            for _ in range(LAYERS)]


def _untouched(a: np.ndarray) -> bool:
    return bool((a.view(np.uint16) == np.array(1, DESC.dtype).view(np.uint16)).all())


@pytest.mark.parametrize("codec", ["raw", "q8", "zstd"])
async def test_the_callers_arrays_hold_what_was_published(
        direct: tuple[TrackHost, str, Requests], cert: DevCertificate, codec: str) -> None:
    """Each layer is decoded into its rows of the caller's arrays (the yielded K and V are
    views of them): bit for bit what was published (``raw``, ``zstd``) or what the same
    consumer decodes into new arrays (``q8``, lossy); the rows beyond are untouched."""
    host, url, _ = direct
    data = await _publish(host, 80, codec)
    consumer = KvConsumer(await connect(url, cert), SCOPE, DESC, PROMPT, codec=codec)
    try:
        found = await consumer.discover()
        assert found is not None
        fresh = {x.index: x async for x in consumer.layers(found)}
        for name, read in (("layers", consumer.layers), ("prefix_layers", consumer.prefix_layers)):
            buffers = _buffers()
            got = [x async for x in read(found, into=buffers)]
            assert [x.index for x in got] == list(range(LAYERS)), name
            for x in got:
                own_k, own_v = buffers[x.index]
                assert x.blocks == BLOCKS
                assert np.shares_memory(x.k, own_k) and np.shares_memory(x.v, own_v)
                assert same(own_k[:ROWS], fresh[x.index].k)
                assert same(own_v[:ROWS], fresh[x.index].v)
                if codec != "q8":
                    assert same(own_k[:ROWS], data[x.index][0])
                    assert same(own_v[:ROWS], data[x.index][1])
                assert _untouched(own_k[ROWS:]) and _untouched(own_v[ROWS:])
        # a range of layers and a prefix of blocks: only those rows of those layers written
        buffers = _buffers()
        got = [x async for x in consumer.layers(found, range(2, 4), blocks=5, into=buffers)]
        assert [(x.index, x.blocks) for x in got] == [(2, 5), (3, 5)]
        for i, (own_k, own_v) in enumerate(buffers):
            if i in (2, 3):
                assert same(own_k[:5 * BLOCK], fresh[i].k[:5 * BLOCK])
                assert same(own_v[:5 * BLOCK], fresh[i].v[:5 * BLOCK])
                assert _untouched(own_k[5 * BLOCK:]) and _untouched(own_v[5 * BLOCK:])
            else:
                assert _untouched(own_k) and _untouched(own_v)
        assert consumer.stats.rejected == 0
    finally:
        consumer.endpoint.close()
        await consumer.endpoint.wait_closed()


BAD = {
    "layers": (lambda: _buffers()[:3], r"^into: 3 layers given, layer 5 is wanted$"),
    "heads": (lambda: [(np.zeros((ROWS, 4, 64), DESC.dtype),) * 2] * LAYERS,
              r"^into\[0\]: K has shape \(64, 4, 64\), expected \[tokens, 2, 64\]$"),
    "dtype": (lambda: [(np.zeros((ROWS, 2, 64), np.float16),) * 2] * LAYERS,
              r"^into\[0\]: K dtype float16, the descriptor says bfloat16$"),
    "read-only": (lambda: [(np.broadcast_to(np.zeros((1, 2, 64), DESC.dtype), (ROWS, 2, 64)),
                            np.zeros((ROWS, 2, 64), DESC.dtype))] * LAYERS,
                  r"^into\[0\]: K is read-only$"),
    "pair": (lambda: [(np.zeros((ROWS, 2, 64), DESC.dtype),)] * LAYERS,
             r"^into\[0\]: a \(K, V\) pair of arrays is needed$"),
    "list": (lambda: [([0.0] * 64, np.zeros((ROWS, 2, 64), DESC.dtype))] * LAYERS,
             r"^into\[0\]: K is a list, not a numpy array$"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
async def test_arrays_of_the_wrong_kind_are_refused_before_any_request(
        direct: tuple[TrackHost, str, Requests], cert: DevCertificate, bad: str) -> None:
    """Wrong layer count, head shape, dtype, a read-only array, not a pair: a one-line
    ValueError before the consumer sends a single request (not even the manifest's)."""
    log = direct[2]
    async with _found(direct, cert, 81) as (consumer, found):
        make, match = BAD[bad]
        for read in (consumer.layers, consumer.prefix_layers):
            log.seen.clear()
            with pytest.raises(ValueError, match=match):
                _ = [x async for x in read(found, into=make())]  # type: ignore[operator]
            assert log.seen == []
        assert consumer.stats.objects == 0


async def test_too_few_tokens_refused_before_any_layer_is_requested(
        direct: tuple[TrackHost, str, Requests], cert: DevCertificate) -> None:
    """How many tokens are needed is known from the manifest: it is read, nothing else."""
    log = direct[2]
    async with _found(direct, cert, 82) as (consumer, found):
        for read in (consumer.layers, consumer.prefix_layers):
            log.seen.clear()
            with pytest.raises(ValueError, match=r"^into\[0\]: K has shape \(63, 2, 64\), "
                                                 r"expected \[>= 64, 2, 64\]$"):
                _ = [x async for x in read(found, into=_buffers(ROWS - 1))]
            assert {n.split(b".")[0] for n in log.names()} == {b"manifest"}
        # four blocks fit in 63 rows
        got = [x async for x in consumer.layers(found, blocks=4, into=_buffers(ROWS - 1))]
        assert [x.blocks for x in got] == [4] * LAYERS
