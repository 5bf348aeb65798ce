"""SHA-256 of many buffers off the event-loop thread (kvcs.kvnet.offload)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading

from kvcs.kvnet.offload import INLINE_BYTES, sha256_digests


def test_small_batches_inline_large_ones_in_the_worker_thread() -> None:
    small = [os.urandom(1000) for _ in range(3)]
    large = [memoryview(os.urandom(32 * 1024)) for _ in range(INLINE_BYTES // (32 * 1024))]

    async def main() -> tuple[list[bytes], list[bytes], set[str]]:
        got_small = await sha256_digests(small)
        got_large = await sha256_digests(large)
        return got_small, got_large, {t.name for t in threading.enumerate()}

    got_small, got_large, threads = asyncio.run(main())
    assert got_small == [hashlib.sha256(x).digest() for x in small]
    assert got_large == [hashlib.sha256(x).digest() for x in large]
    assert any(name.startswith("kvcs-sha256") for name in threads)


def test_the_event_loop_runs_while_the_worker_hashes() -> None:
    buffers = [os.urandom(1 << 20) for _ in range(16)]  # ~10 ms of hashing

    async def main() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        before = ticks
        digests = await sha256_digests(buffers)
        ticker.cancel()
        assert digests == [hashlib.sha256(x).digest() for x in buffers]
        return ticks - before

    assert asyncio.run(main()) > 1


def test_worker_affinity_moves_the_hashing_thread() -> None:
    """A hashing thread started by a pinned thread inherits its pin; worker_affinity()
    widens it again (the vLLM connector's transfer thread is pinned to one core)."""
    import pytest

    from kvcs.kvnet import offload

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    every = os.sched_getaffinity(0)
    one = {min(every)}

    def affinity() -> set[int]:
        return offload._worker().submit(os.sched_getaffinity, 0).result()

    offload.worker_affinity(one)
    assert affinity() == one
    offload.worker_affinity(every)
    assert affinity() == every
