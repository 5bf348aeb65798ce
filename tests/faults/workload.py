"""The KV cache the fault scenarios move, and how a retrieval is judged against it.

Every scenario publishes a :class:`Workload`'s cache with a
:class:`~kvcs.kvnet.publisher.KvPublisher` and retrieves it with a
:class:`~kvcs.kvnet.consumer.KvConsumer`; :func:`consume` runs the retrieval and
:class:`Result` compares what the consumer yielded (and what it reported missing, and the
partial layers it handed back) with the publisher's arrays:

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
from functools import cached_property

import ml_dtypes
import numpy as np

from kvcs.kv.ids import CompatDescriptor, ScopeKey
from kvcs.kvnet.consumer import KvConsumer, KvLayer, Publication, RecomputeRequired
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions, PublishTarget

SCOPE = ScopeKey.from_bytes(bytes(range(32)))
Layers = list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Workload:
    """A model shape and a prompt: ``layers`` layers of ``blocks`` blocks of 16 tokens,
    ``kv_heads`` heads of 64 bfloat16 values; the prompt's tokens count up from
    ``first_token``."""

    layers: int = 8
    blocks: int = 16
    kv_heads: int = 4
    block_tokens: int = 16
    first_token: int = 5000

    @cached_property
    def desc(self) -> CompatDescriptor:
        return CompatDescriptor.from_dict({
            "kvsp": 1, "model": "faults-tiny", "revision": "0", "tokenizer": "t0",
            "layers": self.layers, "kv_heads": self.kv_heads, "head_dim": 64,
            "dtype": "bfloat16", "block_tokens": self.block_tokens, "layout": "tnd",
            "rope": "post"})

    @cached_property
    def prompt(self) -> np.ndarray:
        start = self.first_token
        return np.arange(start, start + self.block_tokens * self.blocks, dtype=np.int64)

    @property
    def block_bytes(self) -> int:
        """K and V bytes of one block of one layer."""
        return 2 * self.block_tokens * self.kv_heads * 64 * 2

    @property
    def cache_bytes(self) -> int:
        return self.layers * self.blocks * self.block_bytes

    def cache(self, seed: int) -> Layers:
        """Deterministic per-layer (K, V), [tokens, kv_heads, 64] bfloat16."""
        rng = np.random.default_rng(seed)
        shape = (self.block_tokens * self.blocks, self.kv_heads, 64)
        return [(rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16),
                 rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16))
                for _ in range(self.layers)]

    def publisher(self, target: PublishTarget,
                  options: PublisherOptions | None = None) -> KvPublisher:
        return KvPublisher(target, SCOPE, self.desc, self.prompt, options)


SMALL = Workload()
"""2 MiB of K/V: 8 layers of 16 blocks of 8 KiB (K) + 8 KiB (V)."""
LARGE = Workload(kv_heads=16)
"""8 MiB of K/V: goodput measured over seconds, not tenths."""

LAYERS, BLOCKS, BLOCK = SMALL.layers, SMALL.blocks, SMALL.block_tokens
DESC, PROMPT = SMALL.desc, SMALL.prompt


def kv_cache(seed: int) -> Layers:
    """The :data:`SMALL` workload's cache."""
    return SMALL.cache(seed)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint16), b.view(np.uint16))


async def publish(target: PublishTarget, data: Layers, *, finish: bool = True,
                  pause_s: float = 0.0, options: PublisherOptions | None = None,
                  workload: Workload = SMALL) -> KvPublisher:
    """Publish ``data`` layer by layer (``pause_s`` after each layer: a live
    publication); ``data`` may hold only the first layers."""
    pub = workload.publisher(target, options)
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

    workload: Workload = SMALL
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
        return self.error is None and len(self.yielded) == self.workload.layers

    @property
    def missing(self) -> dict[int, list[int]]:
        return {} if self.error is None else self.error.missing

    @property
    def goodput(self) -> float:
        """Delivered K/V bytes per second."""
        return self.bytes_delivered / max(self.seconds, 1e-9)

    def judge(self, data: Layers) -> Result:
        """Compare with ``data``: fills ``wrong_tensors``, ``bytes_lost`` and
        ``bytes_delivered``; returns self."""
        w = self.workload
        wrong = lost = delivered = 0
        got = {x.index: x for x in self.yielded}
        partial = self.error.partial if self.error is not None else {}
        for layer in range(w.layers):
            k, v = data[layer]
            if layer in got:
                x = got[layer]
                if not (_same(x.k, k) and _same(x.v, v)):
                    wrong += 1
                delivered += w.block_bytes * x.blocks
                continue
            reported = set(self.missing.get(layer, ()))
            part = partial.get(layer)
            for b in range(w.blocks):
                if b in reported:
                    continue
                rows = slice(b * w.block_tokens, (b + 1) * w.block_tokens)
                if part is None:
                    lost += w.block_bytes  # neither delivered nor reported
                elif not (_same(part.k[rows], k[rows]) and _same(part.v[rows], v[rows])):
                    wrong += 1
        self.wrong_tensors, self.bytes_lost, self.bytes_delivered = wrong, lost, delivered
        return self


def consumer(endpoints: object, workload: Workload = SMALL, **options: object) -> KvConsumer:
    """A consumer of ``workload``'s prompt (``options``: KvConsumer keywords)."""
    return KvConsumer(endpoints, SCOPE, workload.desc, workload.prompt,  # type: ignore[arg-type]
                      **options)  # type: ignore[arg-type]


async def consume(kv: KvConsumer, pub: Publication | None = None, *,
                  source: AsyncIterator[KvLayer] | None = None, timeout: float = 60.0,
                  workload: Workload = SMALL) -> Result:
    """Discover (unless ``pub`` or ``source`` is given) and retrieve every layer; a
    RecomputeRequired is kept in the result, not raised."""
    out = Result(workload)
    t0 = time.monotonic()

    async def run() -> None:
        nonlocal source
        if source is None:
            found = pub if pub is not None else await kv.discover()
            assert found is not None, f"nothing discovered ({kv.discarded})"
            source = kv.layers(found)
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


def layers_from(first: int, workload: Workload = SMALL) -> dict[int, list[int]]:
    """``missing`` for every block of layers ``first`` to the last."""
    return {layer: list(range(workload.blocks)) for layer in range(first, workload.layers)}


def indexes(layers: Sequence[KvLayer]) -> list[int]:
    return [x.index for x in layers]
