"""The KV cache the fault scenarios move, and how a retrieval is judged against it.

Every scenario publishes :func:`kv_cache` with a :class:`~kvcs.kvnet.publisher.KvPublisher`
and retrieves it with a :class:`~kvcs.kvnet.consumer.KvConsumer`; :func:`consume` runs the
retrieval and :class:`Result` compares what the consumer yielded (and what it reported
missing, and the partial layers it handed back) with the publisher's arrays:

* ``wrong_tensors``: yielded layers (and verified blocks of partial layers) whose bytes
  differ from the publisher's; must be 0;
* ``bytes_lost``: K/V bytes of the wanted blocks that were neither delivered (yielded, or
  verified in a partial layer) nor reported missing in ``RecomputeRequired.missing``:
  what the consumer silently dropped; must be 0.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from kvcs.kv.ids import CompatDescriptor, ScopeKey
from kvcs.kvnet.consumer import KvConsumer, KvLayer, Publication, RecomputeRequired
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions, PublishTarget

LAYERS = 8
BLOCK = 16
BLOCKS = 16
DESC = CompatDescriptor.from_dict({
    "kvsp": 1, "model": "faults-tiny", "revision": "0", "tokenizer": "t0", "layers": LAYERS,
    "kv_heads": 4, "head_dim": 64, "dtype": "bfloat16", "block_tokens": BLOCK,
    "layout": "tnd", "rope": "post",
})
"""8 layers of 16 blocks; one block of K (or V) is 8 KiB: 2 MiB of K/V in all."""
SCOPE = ScopeKey.from_bytes(bytes(range(32)))
PROMPT = np.arange(5000, 5000 + BLOCK * BLOCKS, dtype=np.int64)
BLOCK_BYTES = 2 * BLOCK * 4 * 64 * 2
"""K and V bytes of one block of one layer."""
CACHE_BYTES = LAYERS * BLOCKS * BLOCK_BYTES

Layers = list[tuple[np.ndarray, np.ndarray]]


def kv_cache(seed: int, layers: int = LAYERS) -> Layers:
    """Deterministic per-layer (K, V), [BLOCK*BLOCKS, 4, 64] bfloat16."""
    rng = np.random.default_rng(seed)
    shape = (BLOCK * BLOCKS, 4, 64)
    return [(rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16),
             rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16))
            for _ in range(layers)]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint16), b.view(np.uint16))


async def publish(target: PublishTarget, data: Layers, *, finish: bool = True,
                  pause_s: float = 0.0, options: PublisherOptions | None = None,
                  ) -> KvPublisher:
    """Publish ``data`` layer by layer (``pause_s`` between layers: a live publication)."""
    pub = KvPublisher(target, SCOPE, DESC, PROMPT, options)
    await pub.start()
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
        if pause_s:
            await asyncio.sleep(pause_s)
    if finish:
        await pub.finish()
    return pub


@dataclass
class Result:
    """One retrieval, judged against the publisher's arrays."""

    yielded: list[KvLayer] = field(default_factory=list)
    error: RecomputeRequired | None = None
    seconds: float = 0.0
    """From the first request to the last layer or to RecomputeRequired."""
    wrong_tensors: int = 0
    bytes_lost: int = 0
    bytes_delivered: int = 0
    """K/V bytes of the yielded layers."""

    @property
    def complete(self) -> bool:
        return self.error is None and len(self.yielded) == LAYERS

    @property
    def missing(self) -> dict[int, list[int]]:
        return {} if self.error is None else self.error.missing

    @property
    def goodput(self) -> float:
        """Delivered K/V bytes per second."""
        return self.bytes_delivered / max(self.seconds, 1e-9)

    def judge(self, data: Layers, layers: range = range(LAYERS)) -> Result:
        """Compare with ``data``: fills ``wrong_tensors``, ``bytes_lost`` and
        ``bytes_delivered``; returns self."""
        wrong = lost = delivered = 0
        got = {x.index: x for x in self.yielded}
        partial = self.error.partial if self.error is not None else {}
        for layer in layers:
            k, v = data[layer]
            if layer in got:
                x = got[layer]
                if not (_same(x.k, k) and _same(x.v, v)):
                    wrong += 1
                delivered += BLOCK_BYTES * x.blocks
                continue
            reported = set(self.missing.get(layer, ()))
            part = partial.get(layer)
            for b in range(BLOCKS):
                if b in reported:
                    continue
                rows = slice(b * BLOCK, (b + 1) * BLOCK)
                if part is None:
                    lost += BLOCK_BYTES  # neither delivered nor reported
                elif not (_same(part.k[rows], k[rows]) and _same(part.v[rows], v[rows])):
                    wrong += 1
        self.wrong_tensors, self.bytes_lost, self.bytes_delivered = wrong, lost, delivered
        return self


async def consume(consumer: KvConsumer, pub: Publication | None = None,
                  *, source: AsyncIterator[KvLayer] | None = None,
                  timeout: float = 60.0) -> Result:
    """Discover (unless ``pub`` or ``source`` is given) and retrieve every layer; a
    RecomputeRequired is kept in the result, not raised."""
    out = Result()
    t0 = time.monotonic()

    async def run() -> None:
        nonlocal source
        if source is None:
            found = pub if pub is not None else await consumer.discover()
            assert found is not None, f"nothing discovered ({consumer.discarded})"
            source = consumer.layers(found)
        try:
            async for layer in source:
                out.yielded.append(layer)
        except RecomputeRequired as exc:
            out.error = exc

    await asyncio.wait_for(run(), timeout)
    out.seconds = time.monotonic() - t0
    return out


def blocks_of(missing: dict[int, list[int]]) -> int:
    """How many (layer, block) pairs ``missing`` names."""
    return sum(len(b) for b in missing.values())


def layers_from(first: int, last: int = LAYERS) -> dict[int, list[int]]:
    """``missing`` for every block of layers first..last-1."""
    return {layer: list(range(BLOCKS)) for layer in range(first, last)}


def indexes(layers: Sequence[KvLayer]) -> list[int]:
    return [x.index for x in layers]
