"""End-to-end KVCS benchmark: publisher -> relay -> consumer, every object verified.

Three processes on loopback (relay: ``kvcs relay``; publisher and consumer: spawned
children), the same QuicSettings everywhere (``QuicSettings.loopback()``). Measured in one
run, as ratios to the raw aioquic single-hop stream throughput with the same settings:

* e2e goodput: verified K/V bytes per second at the consumer through the relay,
* direct goodput: the same without a relay (the publisher serves the consumer itself),
* time to first verified layer as a fraction of the whole transfer (target <= 1.5/L),
* consumer peak memory (RSS growth) as a ratio to the bytes of the layers it holds.

The headline runs use warm sessions: before the measured cache, the publisher's session
publishes and the consumer's session retrieves a smaller cache (other tokens), as the
long-lived session of a prefill or decode worker to its local relay has. One more run on
fresh sessions and a fresh relay reports the cold figures (QUIC slow start on both hops
and the relay's first-use costs are in them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import ml_dtypes
import numpy as np

from bench._proc import child_process, run_child, wait_message
from kvcs.endpoint import Endpoint
from kvcs.hosting import TrackHost
from kvcs.kv.ids import CompatDescriptor, ScopeKey
from kvcs.kv.secure import ContentKey, SecureObjects
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.transport import QuicSettings, ensure_dev_certificate
from kvcs.transport.backend import BACKEND

MiB = 1 << 20
LAYERS = 32
TOKENS = 1024
SCOPE = bytes(range(32))
WARM_TOKENS = 256  # the warm-up cache: 1/4 of the measured one, other tokens
RUNS = 3  # runs per headline figure: the median is reported and the range printed


def _desc() -> CompatDescriptor:
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": "bench", "revision": "0", "tokenizer": "t", "layers": LAYERS,
        "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "block_tokens": 16,
        "layout": "tnd", "rope": "post"})


def _tokens(warm_up: bool = False) -> np.ndarray:
    if warm_up:
        return np.arange(WARM_TOKENS, dtype=np.int64) + 100_000
    return np.arange(TOKENS, dtype=np.int64) + 11


def _layer(i: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    k = rng.standard_normal((TOKENS, 8, 128), dtype=np.float32).astype(ml_dtypes.bfloat16)
    return k, (-k.astype(np.float32)).astype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class Setup:
    """What the publisher and the consumer of a run use beyond the defaults (picklable: it
    goes to the child processes): the codec of the k/v tracks, a joint ``kv`` track
    (``joint_codec``), the codec the consumer asks for (``take``: default ``codec``; it
    takes the joint track when there are no k/v tracks of it), and content keys to protect
    the publication with (MOQT Secure Objects; none: plaintext), in object properties or
    ``in_band``."""

    codec: str = "raw"
    joint_codec: str | None = None
    take: str | None = None
    content_keys: tuple[ContentKey, ...] = ()
    in_band: bool = False

    def _secure(self) -> SecureObjects | None:
        return SecureObjects(self.content_keys) if self.content_keys else None

    def publisher_options(self) -> PublisherOptions:
        return PublisherOptions(codec=self.codec, joint_codec=self.joint_codec,
                                secure=self._secure(), secure_in_band=self.in_band)

    def consumer(self, ep: Endpoint, tokens: np.ndarray) -> KvConsumer:
        return KvConsumer(ep, ScopeKey.from_bytes(SCOPE), _desc(), tokens,
                          codec=self.take or self.codec, secure=self._secure())


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------- children


async def _publisher_main(conn: Connection, url: str | None, pin: str, cert: tuple[str, str],
                          live: bool, warm: bool, setup: Setup) -> None:
    """Publish the cache to the relay at ``url`` (or serve it: ``url`` None).

    ``live``: announce and publish the manifest, report ready, wait for "go", then put
    the 32 layers as fast as the session takes them (layers are made beforehand, so the
    figure is the transfer, not the synthetic data). Otherwise publish everything first.
    ``warm``: first publish the warm-up cache (completed) on the same session.
    """
    settings = QuicSettings.loopback()
    host: TrackHost | None = None
    ep: Endpoint | None = None
    if url is None:  # direct: serve consumers ourselves
        host = TrackHost()
        server = await host.listen("127.0.0.1", 0, certfile=cert[0], keyfile=cert[1],
                                   settings=settings)
        port = server.port
    else:
        ep = await Endpoint.connect(url, pin_sha256=pin, settings=settings)
        port = 0
    layers = [_layer(i) for i in range(LAYERS)]
    if warm:
        warm_pub = KvPublisher(host or ep, ScopeKey.from_bytes(SCOPE), _desc(),
                               _tokens(warm_up=True), setup.publisher_options())
        for i, (k, v) in enumerate(layers):
            await warm_pub.put_layer(i, k[:WARM_TOKENS], v[:WARM_TOKENS])
        await warm_pub.finish()
    pub = KvPublisher(host or ep, ScopeKey.from_bytes(SCOPE), _desc(), _tokens(),
                      setup.publisher_options())
    await pub.start()
    if live:
        conn.send(port)
        await wait_message(conn)  # go: the consumer is subscribed
    t_go = time.perf_counter()
    for i, (k, v) in enumerate(layers):
        await pub.put_layer(i, k, v)
    await pub.finish()
    conn.send(port if not live else t_go)
    await wait_message(conn)
    if host is not None:
        await host.aclose()
    if ep is not None:
        ep.close()
        await ep.wait_closed()


def _publisher_process(conn: Connection, url: str | None, pin: str,
                       cert: tuple[str, str], live: bool, warm: bool, setup: Setup) -> None:
    run_child(conn, _publisher_main(conn, url, pin, cert, live, warm, setup))


async def _consumer_main(conn: Connection, url: str, pin: str, live: bool,
                         warm: bool, setup: Setup) -> None:
    """Discover, read the manifest, then take every layer (verified) and report times as
    perf_counter values (CLOCK_MONOTONIC: comparable with the publisher's). ``warm``: first
    retrieve the whole warm-up cache on the same session."""
    ep = await Endpoint.connect(url, pin_sha256=pin, settings=QuicSettings.loopback())
    if warm:
        warm_c = setup.consumer(ep, _tokens(warm_up=True))
        warm_pub = await warm_c.discover()
        assert warm_pub is not None, "warm-up publication not found"
        got = 0
        async for _ in warm_c.layers(warm_pub):
            got += 1
        assert got == LAYERS
    c = setup.consumer(ep, _tokens())
    pub = await c.discover()
    assert pub is not None, "publication not found"
    manifest = await c.manifest(pub)
    held: list[Any] = []
    base = _rss()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times: dict[str, float] = {}
    arrivals: list[float] = []
    sampled = base

    async def take() -> None:
        nonlocal sampled
        async for layer in c.layers(pub, manifest=manifest):
            now = time.perf_counter()
            times.setdefault("first", now)
            arrivals.append(now)
            held.append(layer)
            sampled = max(sampled, _rss())
        times["end"] = time.perf_counter()

    times["start"] = time.perf_counter()
    task = asyncio.create_task(take())
    if live:
        await asyncio.sleep(0.3)  # subscribed (SUBSCRIBE_OK) long before this
        conn.send("ready")
    await task
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if peak > peak_before:  # the lifetime peak happened during the retrieval
        sampled = max(sampled, peak)
    held_bytes = sum(x.k.nbytes + x.v.nbytes for x in held)
    # check a few layers: bit for bit (raw), within q8's rounding (|x| < 5: steps < 0.04)
    for i in (0, LAYERS // 2, LAYERS - 1):
        for got, want in zip((held[i].k, held[i].v), _layer(i), strict=True):
            if (setup.take or setup.codec) == "raw":
                assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
            else:
                assert np.abs(got.astype(np.float32) - want.astype(np.float32)).max() < 0.05
    conn.send({**times, "bytes": c.stats.bytes, "data_bytes": held_bytes,
               "rss_growth": sampled - base, "rejected": c.stats.rejected,
               "layers": len(held), "arrivals": arrivals})
    ep.close()
    await ep.wait_closed()


def _consumer_process(conn: Connection, url: str, pin: str, live: bool, warm: bool,
                      setup: Setup) -> None:
    run_child(conn, _consumer_main(conn, url, pin, live, warm, setup))


# --------------------------------------------------------------------------- parent


@contextlib.contextmanager
def _relay(tmp: str, backend: str | None = None) -> Iterator[tuple[str, str]]:
    """A fresh ``kvcs relay`` process; yields its URL and certificate pin."""
    extra = ["--quic-backend", backend] if backend else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcs", "relay", "--anonymous", "--listen", "127.0.0.1:0",
         "--quic-preset", "loopback", "--log-level", "warning", "--cert-dir", tmp, *extra],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[4].rpartition(":")[2])
        pin = proc.stdout.readline().strip().rsplit(" ", 1)[1]
        yield f"moqt://127.0.0.1:{port}/", pin
    finally:
        proc.terminate()
        proc.wait(timeout=15)


async def _run(url: str | None, relay_pin: str, cert: Any, live: bool,
               warm: bool = True, setup: Setup = Setup()) -> dict[str, Any]:
    """One retrieval; returns the consumer's report plus ``seconds``, ``ttfl`` and
    ``first_layer_ms`` / ``mean_layer_ms``.

    live: publisher and consumer run at the same time (the clock starts at the
    publisher's first layer); else the consumer pulls the completed cache (the clock
    starts at its first request). warm: both sessions carry the warm-up cache first.
    setup: codec and protection of both sides."""
    certs = (str(cert.certfile), str(cert.keyfile))
    async with child_process(_publisher_process, url, relay_pin, certs, live, warm,
                             setup) as pub:
        port = await pub.recv()
        if url is None:
            target, pin = f"moqt://127.0.0.1:{port}/", cert.sha256
        else:
            target, pin = url, relay_pin
        async with child_process(_consumer_process, target, pin, live, warm, setup) as cons:
            if live:
                await cons.recv()  # ready
                pub.send("go")
                t0 = await pub.recv()
            result: dict[str, Any] = await cons.recv()
            if not live:
                t0 = result["start"]
        pub.send("done")
    result["seconds"] = result["end"] - t0
    result["ttfl"] = result["first"] - t0
    result["first_layer_ms"] = result["ttfl"] * 1000
    result["mean_layer_ms"] = result["seconds"] * 1000 / len(result["arrivals"])
    return result


def _mib_s(r: dict[str, Any]) -> float:
    return float(r["data_bytes"] / MiB / r["seconds"])


def _ttfl(r: dict[str, Any]) -> float:
    return float(r["ttfl"] / r["seconds"])


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main(relay_backend: str | None = None) -> dict[str, Any]:
    """Run the end-to-end benchmark; print a table and return the figures.

    ``relay_backend`` runs the relay on another QUIC library than the endpoints."""
    from bench.bench_transport import raw_ceiling

    total = LAYERS * TOKENS * 8 * 128 * 2 * 2
    # the ceiling: raw aioquic, same settings (median of RUNS, like the figures)
    raws = [raw_ceiling("aioquic") for _ in range(RUNS)]
    raw = _median(raws)
    raw_lib = raw if BACKEND == "aioquic" else _median(
        [raw_ceiling(BACKEND) for _ in range(RUNS)])
    with tempfile.TemporaryDirectory() as tmp:
        cert = ensure_dev_certificate(tmp)
        with _relay(tmp, relay_backend) as (url, pin):
            cold = asyncio.run(_run(url, pin, cert, live=True, warm=False))  # fresh relay
            cached = asyncio.run(_run(url, pin, cert, live=False))
        e2es = []
        for _ in range(RUNS):  # each on a fresh relay: independent samples
            with _relay(tmp, relay_backend) as (url, pin):
                e2es.append(asyncio.run(_run(url, pin, cert, live=True)))
        directs = [asyncio.run(_run(None, "", cert, live=True)) for _ in range(RUNS)]
    e2e_mib = _median([_mib_s(r) for r in e2es])
    direct_mib = _median([_mib_s(r) for r in directs])
    cached_mib = _mib_s(cached)
    e2e = sorted(e2es, key=_ttfl)[RUNS // 2]  # the run of median time to first layer
    res = {
        "quic_library": BACKEND,
        "raw_ceiling_mib_s": round(raw, 1),
        "raw_same_library_mib_s": round(raw_lib, 1),
        "e2e_goodput_mib_s": round(e2e_mib, 1),
        "e2e_goodput_ratio": round(e2e_mib / raw, 3),
        "e2e_same_library_ratio": round(e2e_mib / raw_lib, 3),
        "direct_goodput_mib_s": round(direct_mib, 1),
        "direct_goodput_ratio": round(direct_mib / raw, 3),
        "direct_same_library_ratio": round(direct_mib / raw_lib, 3),
        "relay_cache_pull_mib_s": round(cached_mib, 1),
        "ttfl_fraction": round(_ttfl(e2e), 4),
        "ttfl_fraction_cache_pull": round(cached["ttfl"] / cached["seconds"], 4),
        "ttfl_fraction_direct": round(_median([_ttfl(r) for r in directs]), 4),
        "ttfl_fraction_cold": round(cold["ttfl"] / cold["seconds"], 4),
        "first_layer_ms": round(e2e["first_layer_ms"], 1),
        "mean_layer_ms": round(e2e["mean_layer_ms"], 1),
        "e2e_cold_goodput_mib_s": round(_mib_s(cold), 1),
        "ttfl_target": round(1.5 / LAYERS, 4),
        "consumer_mem_ratio": round(max(r["rss_growth"] / r["data_bytes"] for r in e2es), 3),
        "rejected_objects": sum(r["rejected"] for r in (cold, cached, *e2es, *directs)),
        "runs": RUNS,
        "raw_ceiling_range_mib_s": [round(min(raws), 1), round(max(raws), 1)],
        "e2e_goodput_range_mib_s": [round(min(map(_mib_s, e2es)), 1),
                                    round(max(map(_mib_s, e2es)), 1)],
        "direct_goodput_range_mib_s": [round(min(map(_mib_s, directs)), 1),
                                       round(max(map(_mib_s, directs)), 1)],
        "ttfl_fraction_range": [round(min(map(_ttfl, e2es)), 4),
                                round(max(map(_ttfl, e2es)), 4)],
        "layers": LAYERS,
        "cache_mib": round(total / MiB, 1),
    }
    def rng(key: str) -> str:
        lo, hi = res[key]
        return f"[{lo:.0f}-{hi:.0f}]"

    print(f"end to end ({LAYERS} layers, {res['cache_mib']} MiB of K/V, 32 KiB objects, "
          f"loopback, every object verified; kvcs on {BACKEND}; warm sessions; medians of "
          f"{RUNS} runs, ranges in brackets):")
    print(f"  raw aioquic single-hop stream    {raw:8.1f} MiB/s {rng('raw_ceiling_range_mib_s')}"
          " (the targets' ceiling)")
    if BACKEND != "aioquic":
        print(f"  raw {BACKEND} single-hop stream {raw_lib:11.1f} MiB/s  (same library)")
    print(f"  live: publisher -> relay -> consumer (3 processes) {e2e_mib:7.1f} MiB/s "
          f"{rng('e2e_goodput_range_mib_s')} ratio {res['e2e_goodput_ratio']:.2f} (target "
          f">= 0.6; same library {res['e2e_same_library_ratio']:.2f})")
    print(f"  live: publisher -> consumer (direct)               {direct_mib:7.1f} MiB/s "
          f"{rng('direct_goodput_range_mib_s')} ratio {res['direct_goodput_ratio']:.2f} "
          f"(target >= 0.8; same library {res['direct_same_library_ratio']:.2f})")
    print(f"  completed cache pulled from the relay              {cached_mib:7.1f} MiB/s")
    lo, hi = res["ttfl_fraction_range"]
    print(f"  time to first verified layer (live, via relay)     {res['ttfl_fraction']:.4f} "
          f"[{lo:.4f}-{hi:.4f}] of the transfer (target <= {res['ttfl_target']:.4f} = "
          f"1.5/L); completed cache pull {res['ttfl_fraction_cache_pull']:.4f}; direct "
          f"{res['ttfl_fraction_direct']:.4f}")
    print(f"    first layer {res['first_layer_ms']:.1f} ms, mean layer "
          f"{res['mean_layer_ms']:.1f} ms")
    print(f"  cold sessions and a fresh relay: live via relay      "
          f"{res['e2e_cold_goodput_mib_s']:7.1f} MiB/s, time to first layer "
          f"{res['ttfl_fraction_cold']:.4f} of the transfer")
    print(f"  consumer peak memory / held (highest run)          "
          f"{res['consumer_mem_ratio']:.2f} (target <= 1.3)")
    return res


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
