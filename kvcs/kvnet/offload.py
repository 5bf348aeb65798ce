"""SHA-256 off the event-loop thread: many buffers hashed in one worker-thread call.

A KV process spends ~0.55 ms of CPU per MiB on SHA-256 (the publisher writes every Data
Digest, the consumer checks it; docs/perf-profile.md). hashlib releases the GIL while it
hashes a buffer above 2 KiB, so one worker thread hashes a layer's sections (publisher)
or a batch of received objects (consumer) on the other core while the event loop keeps
moving bytes. Handing a batch to the thread and back costs ~40 us (measured on the
2-core development machine), more than hashing a few KiB: batches under
:data:`INLINE_BYTES` are hashed on the calling thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..kv.codecs import Buffer
from ..kv.payload import data_digests

__all__ = ["INLINE_BYTES", "sha256_digests", "worker_affinity"]

INLINE_BYTES = 128 * 1024
"""Batches smaller than this are hashed inline (four 32 KiB objects hash in ~75 us)."""

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    """The process's hashing thread (one: a second would compete for the same two cores
    with the event loops)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvcs-sha256")
        return _executor


async def sha256_digests(buffers: Sequence[Buffer]) -> list[bytes]:
    """SHA-256 of each buffer, in the worker thread when they add up to
    :data:`INLINE_BYTES` or more (the buffers must not change until this returns)."""
    if sum(memoryview(b).nbytes for b in buffers) < INLINE_BYTES:
        return data_digests(buffers)
    return await asyncio.get_running_loop().run_in_executor(_worker(), data_digests, buffers)


def worker_affinity(cpus: Collection[int]) -> None:
    """Let the hashing thread run on ``cpus`` (Linux; elsewhere nothing changes). It starts
    with the CPU affinity of the thread that first hashes in it: a pinned event loop's
    (the vLLM connector's transfer thread) makes it share that loop's core, where hashing
    aside gains nothing."""
    if hasattr(os, "sched_setaffinity"):
        _worker().submit(os.sched_setaffinity, 0, set(cpus)).result()
