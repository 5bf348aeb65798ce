"""End-to-end KVCS benchmark: publisher -> relay -> consumer, every object verified.

Three processes on loopback (relay: ``kvcs relay``; publisher and consumer: spawned
children), the same QuicSettings everywhere (``QuicSettings.loopback()``). Measured in one
run, as ratios to the raw aioquic single-hop stream throughput with the same settings:

* e2e goodput: verified K/V bytes per second at the consumer through the relay,
* direct goodput: the same without a relay (the publisher serves the consumer itself),
* time to first verified layer as a fraction of the whole transfer (target <= 1.5/L),
* consumer peak memory (RSS growth) as a ratio to the bytes of the layers it holds.
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

import ml_dtypes
import numpy as np

from bench._proc import child_process, run_child, wait_message
from kvcs.endpoint import Endpoint
from kvcs.hosting import TrackHost
from kvcs.kv.consumer import KvConsumer
from kvcs.kv.ids import CompatDescriptor, ScopeKey
from kvcs.kv.publisher import KvPublisher
from kvcs.transport import QuicSettings, ensure_dev_certificate

MiB = 1 << 20
LAYERS = 32
TOKENS = 1024
SCOPE = bytes(range(32))


def _desc() -> CompatDescriptor:
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": "bench", "revision": "0", "tokenizer": "t", "layers": LAYERS,
        "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "block_tokens": 16,
        "layout": "tnd", "rope": "post"})


def _tokens() -> np.ndarray:
    return np.arange(TOKENS, dtype=np.int64) + 11


def _layer(i: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    k = rng.standard_normal((TOKENS, 8, 128), dtype=np.float32).astype(ml_dtypes.bfloat16)
    return k, (-k.astype(np.float32)).astype(ml_dtypes.bfloat16)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --------------------------------------------------------------------------- children


async def _publish(target: Any) -> KvPublisher:
    pub = KvPublisher(target, ScopeKey.from_bytes(SCOPE), _desc(), _tokens())
    await pub.start()
    for i in range(LAYERS):
        k, v = _layer(i)
        await pub.put_layer(i, k, v)
    await pub.finish()
    return pub


async def _publisher_main(conn: Connection, url: str | None, pin: str, cert: tuple[str, str],
                          ) -> None:
    settings = QuicSettings.loopback()
    if url is None:  # direct: serve consumers ourselves
        host = TrackHost()
        server = await host.listen("127.0.0.1", 0, certfile=cert[0], keyfile=cert[1],
                                   settings=settings)
        await _publish(host)
        conn.send(server.port)
        await wait_message(conn)
        await host.aclose()
        return
    ep = await Endpoint.connect(url, pin_sha256=pin, settings=settings)
    await _publish(ep)
    conn.send(0)
    await wait_message(conn)
    ep.close()
    await ep.wait_closed()


def _publisher_process(conn: Connection, url: str | None, pin: str,
                       cert: tuple[str, str]) -> None:
    run_child(conn, _publisher_main(conn, url, pin, cert))


async def _consumer_main(conn: Connection, url: str, pin: str) -> None:
    ep = await Endpoint.connect(url, pin_sha256=pin, settings=QuicSettings.loopback())
    c = KvConsumer(ep, ScopeKey.from_bytes(SCOPE), _desc(), _tokens())
    pub = await c.discover()
    assert pub is not None, "publication not found"
    manifest = await c.manifest(pub)
    held: list[Any] = []
    base = _rss()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    first = None
    sampled = base
    async for layer in c.layers(pub, manifest=manifest):
        first = first or time.perf_counter()
        held.append(layer)
        sampled = max(sampled, _rss())
    t1 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if peak > peak_before:  # the lifetime peak happened during the retrieval
        sampled = max(sampled, peak)
    held_bytes = sum(x.k.nbytes + x.v.nbytes for x in held)
    # check a few layers bit for bit
    for i in (0, LAYERS // 2, LAYERS - 1):
        k, v = _layer(i)
        assert np.array_equal(held[i].k.view(np.uint16), k.view(np.uint16))
        assert np.array_equal(held[i].v.view(np.uint16), v.view(np.uint16))
    conn.send({"seconds": t1 - t0, "ttfl": (first or t1) - t0, "bytes": c.stats.bytes,
               "data_bytes": held_bytes, "rss_growth": sampled - base,
               "rejected": c.stats.rejected, "layers": len(held)})
    ep.close()
    await ep.wait_closed()


def _consumer_process(conn: Connection, url: str, pin: str) -> None:
    run_child(conn, _consumer_main(conn, url, pin))


# --------------------------------------------------------------------------- parent


def _start_relay(tmp: str) -> tuple[subprocess.Popen[str], int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcs", "relay", "--anonymous", "--listen", "127.0.0.1:0",
         "--quic-preset", "loopback", "--log-level", "warning", "--cert-dir", tmp],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[4].rpartition(":")[2])
    pin = proc.stdout.readline().strip().rsplit(" ", 1)[1]
    return proc, port, pin


async def _run(url: str | None, relay_pin: str, cert: Any) -> dict[str, Any]:
    certs = (str(cert.certfile), str(cert.keyfile))
    async with child_process(_publisher_process, url, relay_pin, certs) as pub:
        port = await pub.recv()
        if url is None:
            target, pin = f"moqt://127.0.0.1:{port}/", cert.sha256
        else:
            target, pin = url, relay_pin
        async with child_process(_consumer_process, target, pin) as cons:
            result: dict[str, Any] = await cons.recv()
        pub.send("done")
    return result


def main() -> dict[str, Any]:
    """Run the end-to-end benchmark; print a table and return the figures."""
    from bench.bench_transport import raw_stream_throughput

    settings = QuicSettings.loopback()
    total = LAYERS * TOKENS * 8 * 128 * 2 * 2
    raw = asyncio.run(raw_stream_throughput(settings, 256 * MiB))
    with tempfile.TemporaryDirectory() as tmp:
        cert = ensure_dev_certificate(tmp)
        proc, port, pin = _start_relay(tmp)
        try:
            e2e = asyncio.run(_run(f"moqt://127.0.0.1:{port}/", pin, cert))
        finally:
            proc.terminate()
            proc.wait(timeout=15)
        direct = asyncio.run(_run(None, "", cert))
    e2e_mib = e2e["data_bytes"] / MiB / e2e["seconds"]
    direct_mib = direct["data_bytes"] / MiB / direct["seconds"]
    res = {
        "raw_ceiling_mib_s": round(raw, 1),
        "e2e_goodput_mib_s": round(e2e_mib, 1),
        "e2e_goodput_ratio": round(e2e_mib / raw, 3),
        "direct_goodput_mib_s": round(direct_mib, 1),
        "direct_goodput_ratio": round(direct_mib / raw, 3),
        "ttfl_fraction": round(e2e["ttfl"] / e2e["seconds"], 4),
        "ttfl_target": round(1.5 / LAYERS, 4),
        "consumer_mem_ratio": round(e2e["rss_growth"] / e2e["data_bytes"], 3),
        "layers": LAYERS,
        "cache_mib": round(total / MiB, 1),
    }
    print(f"end to end ({LAYERS} layers, {res['cache_mib']} MiB of K/V, 32 KiB objects, "
          "loopback, 3 processes):")
    print(f"  raw aioquic single-hop stream   {raw:8.1f} MiB/s")
    print(f"  publisher -> relay -> consumer  {e2e_mib:8.1f} MiB/s  ratio "
          f"{res['e2e_goodput_ratio']:.2f} (target >= 0.6)")
    print(f"  publisher -> consumer (direct)  {direct_mib:8.1f} MiB/s  ratio "
          f"{res['direct_goodput_ratio']:.2f} (target >= 0.8)")
    print(f"  time to first verified layer    {res['ttfl_fraction']:.4f} of the transfer "
          f"(target <= {res['ttfl_target']:.4f} = 1.5/L)")
    print(f"  consumer peak memory / held     {res['consumer_mem_ratio']:.2f} "
          "(target <= 1.3)")
    return res


if __name__ == "__main__":
    main()
