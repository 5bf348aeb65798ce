"""A KV cache of any size and object size moved by kvcs between two child processes, every
byte checked: the parties of the ``wan`` and ``mooncake`` suites.

The cache is ``LAYERS`` layers of ``tokens`` tokens, 8 KV heads of 128 bfloat16 values: 4 KiB
per token and layer, so 1024 tokens are 128 MiB. An object is one block of one layer's K or
V: ``block_tokens`` x 2 KiB (16 tokens: 32 KiB, as the e2e suite; 512: 1 MiB). The
consumer hashes every K and V byte it is handed (SHA-256, in layer order) after the clock
stops; the parent compares it with the digest of the arrays the publisher made, on top of
kvcs's own per-object verification.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import ml_dtypes
import numpy as np

from bench._proc import CHILD_TIMEOUT, child_process, run_child, wait_message
from bench._quic import quic_settings
from bench.bench_e2e import LAYERS, SCOPE, Transfer, _close
from kvcs.endpoint import Endpoint
from kvcs.kv.ids import CompatDescriptor, ScopeKey
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher

MiB = 1 << 20
TOKEN_LAYER_BYTES = 2 * 8 * 128 * 2
"""K and V bytes of one token in one layer."""


def tokens_for(mib: float, block_tokens: int) -> int:
    """Tokens of a cache of about ``mib`` MiB (at least one block)."""
    tokens = int(mib * MiB) // (LAYERS * TOKEN_LAYER_BYTES)
    return max(block_tokens, tokens // block_tokens * block_tokens)


@dataclass(frozen=True)
class CacheSpec:
    """One cache and how it travels (picklable: children get it)."""

    tokens: int
    block_tokens: int = 16
    live: bool = True
    """The consumer subscribes first (live); else it pulls the finished cache."""
    interop: bool = False
    """moq-dev/moq-compatible traffic (docs/interop.md), for either relay."""
    datagram_size: int | None = None
    first_token: int = 7_000_000
    """Prompts of different runs differ by this (a relay may hold an earlier run's)."""

    @property
    def nbytes(self) -> int:
        return LAYERS * self.tokens * TOKEN_LAYER_BYTES

    @property
    def object_bytes(self) -> int:
        return self.block_tokens * TOKEN_LAYER_BYTES // 2

    def desc(self) -> CompatDescriptor:
        return CompatDescriptor.from_dict({
            "kvsp": 1, "model": "bench", "revision": "0", "tokenizer": "t", "layers": LAYERS,
            "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16",
            "block_tokens": self.block_tokens, "layout": "tnd", "rope": "post"})

    def prompt(self) -> np.ndarray:
        return np.arange(self.tokens, dtype=np.int64) + self.first_token

    def layer(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(i)
        k = rng.standard_normal((self.tokens, 8, 128), dtype=np.float32)
        k16 = k.astype(ml_dtypes.bfloat16)
        return k16, (-k).astype(ml_dtypes.bfloat16)

    def digest(self) -> str:
        """SHA-256 of every layer's K then V bytes, in layer order."""
        h = hashlib.sha256()
        for i in range(LAYERS):
            for a in self.layer(i):
                h.update(a.tobytes())
        return h.hexdigest()

    def transfer(self) -> Transfer:
        """The e2e suite's options of the same traffic (interop, datagram size)."""
        return Transfer(live=self.live, warm=False, interop=self.interop,
                        datagram_size=self.datagram_size)


async def _publisher_main(conn: Connection, url: str, pin: str,
                          specs: tuple[CacheSpec, ...]) -> None:
    """Publish each of ``specs`` in turn on one session (one publisher each)."""
    ep = await Endpoint.connect(url, pin_sha256=pin,
                                settings=quic_settings(specs[0].datagram_size))
    for spec in specs:
        layers = [spec.layer(i) for i in range(LAYERS)]
        pub = KvPublisher(ep, ScopeKey.from_bytes(SCOPE), spec.desc(), spec.prompt(),
                          spec.transfer().publisher_options())
        await pub.start()

        async def publish(pub: KvPublisher = pub,
                          layers: list[tuple[np.ndarray, np.ndarray]] = layers) -> float:
            go = time.perf_counter()
            for i, (k, v) in enumerate(layers):
                await pub.put_layer(i, k, v)
            await pub.finish()
            return go

        if not spec.live:
            await publish()
            conn.send("published")
        else:
            conn.send("ready")
            await wait_message(conn)  # go: the consumer is subscribed
            conn.send(await publish())
        del layers
    await wait_message(conn)  # done
    await _close(ep)


def _publisher_process(conn: Connection, url: str, pin: str,
                       specs: tuple[CacheSpec, ...]) -> None:
    run_child(conn, _publisher_main(conn, url, pin, specs))


async def _consumer_main(conn: Connection, url: str, pin: str,
                         specs: tuple[CacheSpec, ...]) -> None:
    """Retrieve each of ``specs`` in turn on one session (one consumer each), each when
    the parent says its publisher is ready."""
    ep = await Endpoint.connect(url, pin_sha256=pin,
                                settings=quic_settings(specs[0].datagram_size))
    for spec in specs:
        await wait_message(conn)  # next: its publisher is ready
        conn.send(await _retrieve(conn, ep, spec))
    await _close(ep)


async def _retrieve(conn: Connection, ep: Endpoint, spec: CacheSpec) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if spec.interop:  # as bench_e2e.Transfer.consumer
        kw.update(hex_namespace=True, relay_profile="moq-dev", discovery_timeout=0.5)
    # a long, lossy path is slow, not broken: no recompute within the child's deadline
    async with KvConsumer(ep, ScopeKey.from_bytes(SCOPE), spec.desc(), spec.prompt(),
                          recompute_budget_s=CHILD_TIMEOUT, **kw) as c:
        pub = await c.discover()
        assert pub is not None, "publication not found"
        manifest = await c.manifest(pub)
        held = []
        arrivals: list[float] = []
        # completed pull: the clock starts here, as the e2e suite's (discovery and the
        # manifest are the same small cost at any size)
        cpu, start = time.process_time(), time.perf_counter()

        async def take() -> None:
            async for layer in c.layers(pub, manifest=manifest):
                held.append(layer)
                arrivals.append(time.perf_counter())

        task = asyncio.create_task(take())
        if spec.live:
            await asyncio.sleep(0.3)  # subscribed (SUBSCRIBE_OK) long before this
        conn.send("subscribed")
        await task
        end, cpu = time.perf_counter(), time.process_time() - cpu
        h = hashlib.sha256()
        for layer in sorted(held, key=lambda x: x.index):
            h.update(layer.k.tobytes())
            h.update(layer.v.tobytes())
        return {"start": start, "end": end, "arrivals": arrivals, "cpu_s": cpu,
                "layers": len(held), "digest": h.hexdigest(),
                "data_bytes": sum(x.k.nbytes + x.v.nbytes for x in held),
                "rejected": c.stats.rejected}


def _consumer_process(conn: Connection, url: str, pin: str,
                      specs: tuple[CacheSpec, ...]) -> None:
    run_child(conn, _consumer_main(conn, url, pin, specs))


async def move(relay_url: str, pin: str, consumer_url: str, spec: CacheSpec,
               timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:
    """Publish ``spec``'s cache to the relay at ``relay_url`` and retrieve it from
    ``consumer_url`` (the relay, or a forwarder in front of it), each party in its own
    process: ``seconds`` (live: from the publisher's first layer; completed: from the
    consumer's first request), ``mib_s``, ``identical`` (every byte) and the consumer's
    report."""
    return (await move_series(relay_url, pin, consumer_url, (spec,), timeout))[0]


async def move_series(relay_url: str, pin: str, consumer_url: str,
                      specs: tuple[CacheSpec, ...], timeout: float = CHILD_TIMEOUT,
                      results: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """:func:`move` for each of ``specs`` one after another on the SAME two sessions (the
    publisher's to ``relay_url``, the consumer's to ``consumer_url``): the later ones
    find every session and the relays' own links warm. One result per spec, appended to
    ``results`` (if given) as each completes: a later failure keeps the earlier ones."""
    results = [] if results is None else results
    async with child_process(_publisher_process, relay_url, pin, specs) as pub:
        await pub.recv(timeout)  # ready (live) or published (completed)
        async with child_process(_consumer_process, consumer_url, pin, specs) as cons:
            for n, spec in enumerate(specs):
                if n:
                    await pub.recv(timeout)  # the next one's ready or published
                cons.send("next")
                await cons.recv(timeout)  # subscribed
                go = None
                if spec.live:
                    pub.send("go")
                    go = await pub.recv(timeout)
                got = await cons.recv(timeout)
                seconds = got["end"] - (go if go is not None else got["start"])
                results.append({
                    **got, "seconds": seconds, "mib_s": got["data_bytes"] / MiB / seconds,
                    "identical": got["layers"] == LAYERS and got["digest"] == _digest(spec)})
        pub.send("done")
    return results


@functools.lru_cache(maxsize=8)
def _digest(spec: CacheSpec) -> str:
    return spec.digest()
