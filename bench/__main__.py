"""``make bench``: every benchmark in one run; figures and ratios, bench-results.json.

Targets are stated next to each figure; they are checked here (not in the test suite),
since these machines are shared and noisy: compare ratios within one run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def main(argv: list[str]) -> int:
    """Run the selected benchmarks (default: all) and write bench-results.json (a run of
    some suites replaces their figures and keeps the others')."""
    from bench import (
        bench_codec,
        bench_e2e,
        bench_kv,
        bench_moqt,
        bench_relay,
        bench_secure,
        bench_transport,
    )

    suites: dict[str, Any] = {
        "codec": bench_codec.main,
        "kv": bench_kv.main,
        "transport": bench_transport.main,
        "moqt": bench_moqt.main,
        "relay": bench_relay.main,
        "e2e": bench_e2e.main,
        "secure": bench_secure.main,
    }
    chosen = argv or list(suites)
    unknown = [x for x in chosen if x not in suites]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(suites)}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    for name in chosen:
        _section(name)
        results[name] = suites[name]()
    path = ROOT / "bench-results.json"
    suites_out = dict(results)
    if argv:  # one suite: keep the other suites' figures from the last run
        try:
            previous = json.loads(path.read_text()).get("suites", {})
        except (OSError, ValueError, AttributeError):
            previous = {}
        suites_out = {**previous, **results}
    out: dict[str, Any] = {"suites": suites_out}
    if "e2e" in suites_out:  # the headline keys at the top level
        out.update({k: suites_out["e2e"][k] for k in (
            "raw_ceiling_mib_s", "e2e_goodput_ratio", "direct_goodput_ratio", "ttfl_fraction",
            "consumer_mem_ratio", "layers")})
    if "kv" in suites_out:  # the q8 codec's headline figures (issue #18)
        out.update({k: suites_out["kv"][k] for k in ("q8_encode_mib_s", "q8_decode_mib_s")
                    if k in suites_out["kv"]})
    if "secure" in suites_out:  # protection's and q8's end-to-end ratios (issues #14, #18)
        out.update({k: suites_out["secure"][k] for k in (
            "e2e_secure_ratio", "q8_effective_ratio", "kv_q8_effective_ratio")})
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nwrote {path.name} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
