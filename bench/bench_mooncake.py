"""What a user might pick instead, side by side (issue #28): Mooncake Store over TCP against
kvcs's completed pull from a relay, the same cache bytes to a separate consumer process.

* Mooncake (``mooncake-transfer-engine-non-cuda``, installed by ``make bench``; it needs
  Debian's ``libibverbs1`` even for TCP): a ``mooncake_master`` process (with its HTTP
  metadata server), a producer process whose ``MooncakeDistributedStore`` (protocol
  "tcp") holds every object in its own memory segment, and a consumer process that reads
  them with ``batch_get_into`` (one batch per layer) into a registered buffer. Mooncake
  verifies nothing; the bytes are compared after the clock stops, to report whether they
  arrived intact. The producer must stay alive: the data lives in its memory.
* kvcs: the publisher finishes the cache on a kvcs relay (its own process, loopback
  preset) and leaves it there; a separate consumer process pulls it (FETCH), every object
  verified by kvcs (KVSP digests), and every K and V byte is hashed and compared after.

Both move :data:`CACHE_MIB` MiB (32 layers of K and V) as objects of 32 KiB (16-token
blocks, kvcs's default) and 1 MiB (512-token blocks). Figures: MiB/s of each, the
consumer's CPU ms per MiB, and ``mooncake_ratio`` = kvcs / Mooncake at 32 KiB
(``mooncake_ratio_1mib`` at 1 MiB). ``KVCS_BENCH_MOONCAKE_MIB`` sets a smaller cache (a
smoke run).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from bench._kvcache import CacheSpec, move, tokens_for
from bench._proc import child_process, process_cpu_seconds
from bench._relays import relay_process
from bench.bench_e2e import LAYERS
from kvcs.testing import stop_process
from kvcs.transport import ensure_dev_certificate

MiB = 1 << 20
CACHE_MIB = 128.0
SIZE_ENV = "KVCS_BENCH_MOONCAKE_MIB"
OBJECT_BLOCKS = {"32k": 16, "1mib": 512}
"""Object size name -> tokens per block (one object: a block of one layer's K or V)."""
PACKAGE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"


def unavailable() -> str | None:
    """Why Mooncake cannot run here (None: it can)."""
    if importlib.util.find_spec("mooncake") is None:
        return f"{PACKAGE} is not installed (make bench installs it where it can)"
    if _master_binary() is None:
        return "mooncake_master not found beside the Python interpreter"
    try:
        from mooncake.store import MooncakeDistributedStore  # noqa: F401
    except ImportError as exc:  # libibverbs.so.1: Debian's libibverbs1
        return f"mooncake.store does not load ({exc}); install Debian's libibverbs1"
    return None


def _master_binary() -> str | None:
    here = Path(sys.executable).parent / "mooncake_master"
    return str(here) if here.exists() else shutil.which("mooncake_master")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _master() -> Iterator[tuple[int, int, int]]:
    """A mooncake_master on loopback: (rpc port, metadata port, pid)."""
    rpc, meta = _free_port(), _free_port()
    binary = _master_binary()
    assert binary is not None
    proc = subprocess.Popen(
        [binary, f"--rpc_port={rpc}", "--rpc_address=127.0.0.1",
         "--enable_http_metadata_server=true", f"--http_metadata_server_port={meta}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        for port in (rpc, meta):
            while True:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mooncake_master did not start ({proc.poll()})")
                time.sleep(0.1)
        yield rpc, meta, proc.pid
    finally:
        stop_process(proc, 10)


def _keys(spec: CacheSpec, layer: int) -> list[str]:
    blocks = spec.tokens // spec.block_tokens
    return [f"bench-{spec.block_tokens}-{layer}-{kv}-{b}" for kv in "kv" for b in range(blocks)]


def _objects(spec: CacheSpec, layer: int) -> list[np.ndarray]:
    """The layer's objects in :func:`_keys` order: K blocks, then V blocks."""
    k, v = spec.layer(layer)
    bt = spec.block_tokens
    return [np.ascontiguousarray(a[b * bt:(b + 1) * bt]).view(np.uint8).reshape(-1)
            for a in (k, v) for b in range(spec.tokens // bt)]


MOONCAKE_ENV = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}
"""Children's environment: the transfer engine listens on loopback only (by default its
RPC port is on the first non-loopback interface)."""


def _store(rpc: int, meta: int, segment: int, local: int) -> Any:
    os.environ.update(MOONCAKE_ENV)
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    code = store.setup("127.0.0.1", f"http://127.0.0.1:{meta}/metadata", segment, local,
                       "tcp", "", f"127.0.0.1:{rpc}")
    if code != 0:
        raise RuntimeError(f"MooncakeDistributedStore.setup returned {code}")
    return store


def _quiet(conn: Connection, target: Any, *args: Any) -> None:
    """Child: run ``target(conn, *args)`` with standard error closed (the C++ library logs
    every connection at INFO level before glog is set up, whatever GLOG_minloglevel says);
    an exception is reported to the parent."""
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        target(conn, *args)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))
        raise


def _producer(conn: Connection, rpc: int, meta: int, spec: CacheSpec) -> None:
    """Child: hold every object in this process's segment; stay until told."""
    store = _store(rpc, meta, spec.nbytes + 64 * MiB, 64 * MiB)
    for layer in range(LAYERS):
        keys, objects = _keys(spec, layer), _objects(spec, layer)
        for key, obj in zip(keys, objects, strict=True):
            code = store.put(key, obj)
            if code != 0:
                raise RuntimeError(f"put {key}: {code}")
    conn.send("ready")
    conn.recv()  # done
    store.close()


def _consumer(conn: Connection, rpc: int, meta: int, spec: CacheSpec) -> None:
    """Child: batch_get_into every layer's objects (timed), then compare the bytes."""
    store = _store(rpc, meta, 0, 64 * MiB)
    buf = np.empty(spec.nbytes, dtype=np.uint8)
    if store.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
        raise RuntimeError("register_buffer failed")
    size = spec.object_bytes
    per_layer = 2 * (spec.tokens // spec.block_tokens)
    conn.send("ready")
    conn.recv()  # go
    cpu, start = time.process_time(), time.perf_counter()
    for layer in range(LAYERS):
        base = buf.ctypes.data + layer * per_layer * size
        got = store.batch_get_into(_keys(spec, layer),
                                   [base + i * size for i in range(per_layer)],
                                   [size] * per_layer)
        bad = [x for x in got if x != size]
        if bad:
            raise RuntimeError(f"batch_get_into layer {layer}: {bad[:3]}")
    end, cpu = time.perf_counter(), time.process_time() - cpu
    identical = all(
        np.array_equal(buf[(layer * per_layer + i) * size:(layer * per_layer + i + 1) * size],
                       obj)
        for layer in range(LAYERS) for i, obj in enumerate(_objects(spec, layer)))
    store.close()
    conn.send({"seconds": end - start, "cpu_s": cpu, "identical": identical})


def _mooncake(spec: CacheSpec) -> dict[str, Any]:
    """One Mooncake transfer of ``spec``'s cache: producer and consumer processes."""
    async def run() -> dict[str, Any]:
        with _master() as (rpc, meta, master_pid):
            async with child_process(_quiet, _producer, rpc, meta, spec) as prod:
                await prod.recv()
                async with child_process(_quiet, _consumer, rpc, meta, spec) as cons:
                    await cons.recv()
                    pids = (master_pid, prod.process.pid)
                    others = [process_cpu_seconds(p) for p in pids]
                    cons.send("go")
                    got = await cons.recv()
                    others = [process_cpu_seconds(p) - c for p, c in zip(pids, others,
                                                                          strict=True)]
                prod.send("done")
        mib = spec.nbytes / MiB
        return {"mib_s": round(mib / got["seconds"], 1), "identical": got["identical"],
                "consumer_cpu_ms_per_mib": round(got["cpu_s"] * 1000 / mib, 2),
                "cpu_ms_per_mib": round((got["cpu_s"] + sum(others)) * 1000 / mib, 2)}

    return asyncio.run(run())


def _kvcs(spec: CacheSpec, cert_dir: str) -> dict[str, Any]:
    """One completed pull of ``spec``'s cache from a fresh kvcs relay."""
    with relay_process("kvcs", cert_dir) as relay:
        cpu = relay.cpu_seconds()
        got = asyncio.run(move(relay.url, relay.pin, relay.url, spec))
        relay_cpu = relay.cpu_seconds() - cpu  # publishing included: an upper bound
    mib = spec.nbytes / MiB
    return {"mib_s": round(got["mib_s"], 1), "identical": got["identical"],
            "consumer_cpu_ms_per_mib": round(got["cpu_s"] * 1000 / mib, 2),
            "relay_cpu_ms_per_mib": round(relay_cpu * 1000 / mib, 2)}


def main() -> dict[str, Any]:
    """Both stores at both object sizes; print and return the figures."""
    reason = unavailable()
    mib = float(os.environ.get(SIZE_ENV) or CACHE_MIB)
    res: dict[str, Any] = {"mooncake_cache_mib": mib, "mooncake_package": PACKAGE}
    if reason is not None:
        print(f"  Mooncake skipped: {reason}")
        res["mooncake_note"] = f"skipped: {reason}"
    with tempfile.TemporaryDirectory() as cert_dir:
        ensure_dev_certificate(cert_dir)
        for name, block_tokens in OBJECT_BLOCKS.items():
            spec = CacheSpec(tokens=tokens_for(mib, block_tokens), block_tokens=block_tokens,
                             live=False, first_token=9_000_000 + block_tokens)
            row: dict[str, Any] = {"object_bytes": spec.object_bytes,
                                   "mib": round(spec.nbytes / MiB, 1),
                                   "kvcs": _kvcs(spec, cert_dir)}
            if reason is None:
                try:
                    row["mooncake"] = _mooncake(spec)
                except Exception as exc:  # reported, the kvcs figure stands
                    row["mooncake_error"] = f"{type(exc).__name__}: {exc}"[:300]
            res[f"mooncake_{name}"] = row
            line = (f"  {spec.object_bytes // 1024:5d} KiB objects, {row['mib']:.0f} MiB: kvcs "
                    f"pull {row['kvcs']['mib_s']:7.1f} MiB/s (verified: "
                    f"{row['kvcs']['identical']})")
            if "mooncake" in row:
                m = row["mooncake"]
                ratio = round(row["kvcs"]["mib_s"] / m["mib_s"], 2)
                res["mooncake_ratio" if name == "32k" else f"mooncake_ratio_{name}"] = ratio
                line += (f", Mooncake TCP {m['mib_s']:7.1f} MiB/s (bytes intact: "
                         f"{m['identical']}), kvcs / Mooncake {ratio:.2f}")
            elif "mooncake_error" in row:
                line += f", Mooncake failed: {row['mooncake_error']}"
            print(line, flush=True)
    return res
