"""Protected vs plaintext, and kv.q8 vs raw, end to end through the relay (issues #14, #18).

The runs of :mod:`bench.bench_e2e` (three processes on loopback: ``kvcs relay``, publisher,
consumer; warm sessions; each run on a fresh relay; live: the consumer is subscribed
before the first layer) with three setups, interleaved so that the machine's load drifts
through all of them alike:

* plaintext ``raw`` tracks (the reference);
* the same publication protected with MOQT Secure Objects (AES-128-GCM, every data object
  and the manifest), decrypted and verified by the consumer: ``e2e_secure_ratio`` is its
  goodput over the reference's (target >= 0.85); and with the in-band carriage (no object
  properties for the sessions and the relay to parse and re-encode):
  ``e2e_secure_in_band_ratio``;
* ``q8`` k/v tracks: ``q8_effective_ratio`` is the tensor bytes per second the consumer
  assembles (decoded K/V, bfloat16) over the reference's (target >= 1.6); q8 sends about
  0.51 of the raw bytes;
* raw k/v tracks plus the joint ``kv.q8`` track, which the consumer takes (one object per
  block instead of two): ``kv_q8_effective_ratio``, the same measure.

``RUNS`` rounds (more than the e2e suite's: one run moves 128 MiB in about a second, and
other work on the machine moves single runs by 2x); a round runs every setup once, back
to back. Goodputs are medians over the rounds, ranges printed; each ratio is the median
of the rounds' ratios (a setup against the plaintext run of its own round, so that load
that drifts between rounds cancels out). Beside
the goodputs, the CPU seconds all three processes spent per run (start-up and warm-up
included, the same for every setup): on a machine shared with other work the goodput
ratios are noisy, the CPU cost is not.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import tempfile
from typing import Any

from bench._quic import QUIC_LIBRARY
from bench._relays import relay_process
from bench.bench_e2e import LAYERS, Transfer, _median, _run
from kvcs.kv.secure import ContentKey
from kvcs.transport import ensure_dev_certificate

RUNS = 5
CONTENT_KEY = ContentKey(1, 4, bytes(range(100, 132)))  # AES_128_GCM_SHA256_128
SETUPS = {
    "plaintext": Transfer(),
    "protected": Transfer(content_keys=(CONTENT_KEY,)),
    "protected_in_band": Transfer(content_keys=(CONTENT_KEY,), in_band=True),
    "q8": Transfer(codec="q8"),
    "kv_q8": Transfer(joint_codec="q8", take="q8"),
}


def _children_cpu_s() -> float:
    """CPU seconds of the terminated child processes (publisher, consumer, relay)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> dict[str, Any]:
    """Run every setup ``RUNS`` times, interleaved; print and return the figures."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETUPS}
    cpu: dict[str, list[float]] = {name: [] for name in SETUPS}
    with tempfile.TemporaryDirectory() as tmp:
        cert = ensure_dev_certificate(tmp)
        for _ in range(RUNS):
            for name, setup in SETUPS.items():
                before = _children_cpu_s()
                with relay_process("kvcs", tmp) as relay:
                    runs[name].append(asyncio.run(_run(relay, cert, setup)))
                cpu[name].append(_children_cpu_s() - before)
    mib = {name: _median([r["mib_s"] for r in rs]) for name, rs in runs.items()}

    def ratio(name: str) -> float:
        """Median over the rounds of the setup's goodput over that round's plaintext."""
        return _median([r["mib_s"] / p["mib_s"] for r, p in
                        zip(runs[name], runs["plaintext"], strict=True)])

    ranges = {name: [round(min(r["mib_s"] for r in rs), 1), round(max(r["mib_s"] for r in rs), 1)]
              for name, rs in runs.items()}
    res: dict[str, Any] = {
        "quic_library": QUIC_LIBRARY,
        "plaintext_goodput_mib_s": round(mib["plaintext"], 1),
        "protected_goodput_mib_s": round(mib["protected"], 1),
        "protected_in_band_goodput_mib_s": round(mib["protected_in_band"], 1),
        "q8_tensor_mib_s": round(mib["q8"], 1),
        "kv_q8_tensor_mib_s": round(mib["kv_q8"], 1),
        "e2e_secure_ratio": round(ratio("protected"), 3),
        "e2e_secure_in_band_ratio": round(ratio("protected_in_band"), 3),
        "q8_effective_ratio": round(ratio("q8"), 3),
        "kv_q8_effective_ratio": round(ratio("kv_q8"), 3),
        "q8_wire_fraction": round(runs["q8"][0]["bytes"] / runs["plaintext"][0]["bytes"], 3),
        "cpu_s_per_run": {name: round(_median(xs), 2) for name, xs in cpu.items()},
        "rejected_objects": sum(r["rejected"] for rs in runs.values() for r in rs),
        "ranges_mib_s": ranges,
        "runs": RUNS,
        "layers": LAYERS,
    }

    def rng(name: str) -> str:
        lo, hi = ranges[name]
        return f"[{lo:.0f}-{hi:.0f}]"

    print(f"live publisher -> relay -> consumer ({LAYERS} layers, 128 MiB of K/V, kvcs on "
          f"{QUIC_LIBRARY}; medians of {RUNS} runs on fresh relays, ranges in brackets):")
    print(f"  plaintext raw tracks                     {mib['plaintext']:7.1f} MiB/s "
          f"{rng('plaintext')}")
    print(f"  protected (Secure Objects, AES-128-GCM)  {mib['protected']:7.1f} MiB/s "
          f"{rng('protected')} ratio {res['e2e_secure_ratio']:.2f} (target >= 0.85)")
    print(f"  protected, in-band carriage              {mib['protected_in_band']:7.1f} MiB/s "
          f"{rng('protected_in_band')} ratio {res['e2e_secure_in_band_ratio']:.2f}")
    print(f"  q8 tracks, tensor bytes assembled        {mib['q8']:7.1f} MiB/s {rng('q8')} "
          f"ratio {res['q8_effective_ratio']:.2f} (target >= 1.6; "
          f"{res['q8_wire_fraction']:.2f} of the raw bytes on the wire)")
    print(f"  raw k/v + joint kv.q8 track, kv.q8 taken {mib['kv_q8']:7.1f} MiB/s "
          f"{rng('kv_q8')} ratio {res['kv_q8_effective_ratio']:.2f}")
    per_run = res["cpu_s_per_run"]
    print("  CPU seconds per run, 3 processes: " + ", ".join(
        f"{name} {seconds:.2f}" for name, seconds in per_run.items()))
    return res


if __name__ == "__main__":
    main()
    sys.exit(0)
