"""``make bench``: every benchmark in one run; the summary table and bench-results.json.

Each suite prints its own figures; the end of the run prints ONE table of the headline
figures with their targets (:mod:`bench.summary`). Targets are checked here (not in the
test suite), since these machines are shared and noisy: compare ratios within one run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.summary import headline, rows, table

ROOT = Path(__file__).resolve().parent.parent


def _section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def main(argv: list[str]) -> int:
    """Run the selected benchmarks (default: all) and write bench-results.json (a run of
    some suites replaces their figures and keeps the others')."""
    from bench import (
        bench_codec,
        bench_discovery,
        bench_e2e,
        bench_hf,
        bench_kv,
        bench_mooncake,
        bench_moqt,
        bench_relay,
        bench_secure,
        bench_transport,
        bench_tree,
        bench_vllm,
        bench_wan,
    )

    suites: dict[str, Any] = {
        "codec": bench_codec.main,
        "kv": bench_kv.main,
        "transport": bench_transport.main,
        "moqt": bench_moqt.main,
        "relay": bench_relay.main,
        "e2e": bench_e2e.main,
        "discovery": bench_discovery.main,
        "hf": bench_hf.main,
        "vllm": bench_vllm.main,
        "secure": bench_secure.main,
        "tree": bench_tree.main,
        "wan": bench_wan.main,
        "mooncake": bench_mooncake.main,
    }
    chosen = argv or list(suites)
    unknown = [x for x in chosen if x not in suites]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(suites)}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    load_before = os.getloadavg()[0]  # the host is shared: its load explains much spread
    t0 = time.perf_counter()
    for name in chosen:
        _section(name)
        results[name] = suites[name]()
    seconds = time.perf_counter() - t0
    path = ROOT / "bench-results.json"
    suites_out = dict(results)
    if argv:  # some suites: keep the other suites' figures from the last run
        try:
            previous = json.loads(path.read_text()).get("suites", {})
        except (OSError, ValueError, AttributeError):
            previous = {}
        suites_out = {**previous, **results}
    figures = headline(suites_out)
    summary = rows(figures, suites_out)
    load = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    _section(f"summary: {', '.join(chosen)} ({seconds:.0f} s)")
    print(f"{os.cpu_count()} CPUs, 1-minute load average {load[0]} at the start, {load[1]} at "
          "the end")
    print(table(summary))
    kept = [name for name in suites_out if name not in results]
    if kept:
        print(f"(figures of {', '.join(kept)}: from the previous bench-results.json)")
    out = {**figures, "summary": summary, "suites": suites_out,
           "run": {"suites": chosen, "seconds": round(seconds, 1), "cpus": os.cpu_count(),
                   "load_average": load, "date": time.strftime("%Y-%m-%d %H:%M:%S")}}
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nwrote {path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
