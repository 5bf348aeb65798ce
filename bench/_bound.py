"""What two cores can carry: the CPU bound of a KVCS topology from same-run measurements.

Every byte of a live KVCS transfer is sent and received over QUIC and hashed twice
(SHA-256: the publisher writes the Data Digest, the consumer checks it); a relay receives
and sends it once more without hashing. With the raw single-stream sender's and
receiver's CPU milliseconds per MiB (:func:`bench.bench_transport.raw_run`) and hashlib's
SHA-256 milliseconds per MiB (:func:`sha256_ms_per_mib`), measured in the same run, the
most two cores can move is ``2000 / (sum of the per-MiB costs)`` MiB/s: the
``*_bound_ratio`` figures are KVCS goodput over that bound.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

MiB = 1 << 20
CORES = 2
OBJECT = 32 * 1024  # the bench cache's objects: one 16-token block of K or V


def sha256_ms_per_mib(total: int = 128 * MiB, chunk: int = OBJECT) -> float:
    """CPU milliseconds hashlib's SHA-256 spends per MiB, hashing ``chunk``-byte pieces of
    ``total`` bytes (best of 3: the machine is shared, the lowest is the cost)."""
    data = memoryview(np.random.default_rng(0).integers(0, 256, total, dtype=np.uint8).data)
    sha256 = hashlib.sha256
    best = float("inf")
    for _ in range(3):
        cpu = time.process_time()
        for i in range(0, total, chunk):
            sha256(data[i:i + chunk]).digest()
        best = min(best, time.process_time() - cpu)
    return best * 1000 / (total / MiB)


def direct_bound_mib_s(send_ms: float, recv_ms: float, sha_ms: float) -> float:
    """Publisher -> consumer: one QUIC send and receive and two SHA-256 passes per MiB."""
    return CORES * 1000 / (send_ms + recv_ms + 2 * sha_ms)


def relay_bound_mib_s(send_ms: float, recv_ms: float, sha_ms: float) -> float:
    """Publisher -> relay -> consumer: the relay adds a receive and a send, no hashing."""
    return CORES * 1000 / (2 * (send_ms + recv_ms) + 2 * sha_ms)
