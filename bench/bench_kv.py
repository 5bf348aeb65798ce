"""Micro-benchmarks of the KV object model.

Run ``.venv/bin/python -m bench.bench_kv``. Reports payload verification throughput for
32 KiB objects against bare ``hashlib.sha256`` in the same run (target ratio >= 0.9), and
codec encode/decode throughput on a 16 x 8 x 128 bfloat16 block.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvcs.kv.codecs import decode_section, encode_section, zstd_available
from kvcs.kv.dtypes import dtype_for
from kvcs.kv.payload import build_payload_bytes, verify_payload

MIB = 1024 * 1024


def _best(fn: Callable[[], Any], number: int, repeat: int) -> float:
    """Best seconds per call over ``repeat`` rounds of ``number`` calls."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def bench_verify(size: int = 32 * 1024, number: int = 2000, rounds: int = 15) -> dict[str, float]:
    """Payload verify vs bare SHA-256 (interleaved rounds, best of each)."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    payload = memoryview(build_payload_bytes("k", 3, 7, 112, 16, "raw", data))
    sha256 = hashlib.sha256

    def verify() -> None:
        verify_payload(payload, group=3, object_id=7)

    def bare() -> None:
        sha256(data).digest()

    t_verify = t_bare = float("inf")
    for _ in range(rounds):  # interleave so both see the same machine state
        t_bare = min(t_bare, _best(bare, number, 1))
        t_verify = min(t_verify, _best(verify, number, 1))
    return {
        "object_bytes": float(size),
        "verify_mib_s": size / t_verify / MIB,
        "sha256_mib_s": size / t_bare / MIB,
        "verify_us": t_verify * 1e6,
        "sha256_us": t_bare * 1e6,
        "ratio": t_bare / t_verify,
    }


def bench_codecs(number: int = 200, repeat: int = 5) -> dict[str, dict[str, float]]:
    """Encode/decode MiB/s (of raw tensor bytes) for a 16 x 8 x 128 bfloat16 block."""
    shape = (16, 8, 128)
    dt = dtype_for("bfloat16")
    rng = np.random.default_rng(1)
    block = rng.standard_normal(shape).astype(np.float32).astype(dt)
    nbytes = block.nbytes
    out: dict[str, dict[str, float]] = {}
    codecs = ["raw", "q8"] + (["zstd"] if zstd_available() else [])
    for codec in codecs:
        data = encode_section(codec, block)
        t_enc = _best(lambda c=codec: encode_section(c, block), number, repeat)
        t_dec = _best(lambda c=codec, d=data: decode_section(c, d, dt, shape), number, repeat)
        out[codec] = {
            "encoded_bytes": float(len(data)),
            "ratio": nbytes / len(data),
            "encode_mib_s": nbytes / t_enc / MIB,
            "decode_mib_s": nbytes / t_dec / MIB,
        }
    return out


def main() -> dict[str, Any]:
    """Run all benchmarks, print a summary and return the figures."""
    results = {"verify_32k": bench_verify(), "codecs_16x8x128_bf16": bench_codecs()}
    v = results["verify_32k"]
    print(
        f"payload verify 32 KiB: {v['verify_mib_s']:.0f} MiB/s; bare sha256 "
        f"{v['sha256_mib_s']:.0f} MiB/s; ratio {v['ratio']:.3f} (target >= 0.9)"
    )
    for codec, r in results["codecs_16x8x128_bf16"].items():
        print(
            f"{codec:5s} encode {r['encode_mib_s']:9.0f} MiB/s  decode {r['decode_mib_s']:9.0f}"
            f" MiB/s  size {int(r['encoded_bytes'])} B (x{r['ratio']:.2f})"
        )
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
