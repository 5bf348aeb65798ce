"""Profile the KV data path process by process: where each MiB's CPU time goes.

Starts one topology on 127.0.0.1, every party in its own OS process (as deployed), lets
each party finish its setup (handshake, a warm-up cache on the same sessions, discovery,
manifest), then attaches a profiler to each process and times the transfer::

    raw     sender -> receiver        one uni stream over kvcs.transport (the same-library
                                      ceiling of bench/bench_transport.py)
    direct  publisher -> consumer     the publisher serves (TrackHost), live
    relay   publisher -> relay -> consumer, live (the consumer subscribes before layer 0)
    fill    publisher -> relay -> consumer, the publication complete before the consumer
                                      asks: the relay subscribes upstream with a fill
                                      (what bench_e2e calls "completed cache pulled
                                      through the relay")
    cache   relay -> consumer         a relay cache hit: a first retrieval (not measured)
                                      filled the relay's cache; the consumer FETCHes again

KV runs move ``--mib`` MiB as consecutive publications of bench_e2e's shape (``--tokens``
1024: 32 KiB objects, 2 MiB layer arrays). Profilers (``--profiler``): ``none`` (CPU and
wall time only), ``pyspy`` (``py-spy record --native``; collapsed stacks, which speedscope
opens, and speedscope JSON), ``perf`` (``perf record`` per process: kernel, qh3's compiled
core, libpython, libc ...; with ``--perf-args="--call-graph dwarf"`` the page faults and
socket calls inclusive; ``perf stat`` of the socket system calls), ``cprofile`` (Python
calls per object). py-spy comes from PyPI, perf from the distribution (linux-perf).

Every run writes ``<out>/<topology>-<dgram>-<profiler><tag>/summary.json``: per process
the CPU time of the transfer windows (``/proc/<pid>/schedstat``) and its ms per MiB of
K/V, the goodput and the load average; ``analyze`` adds ``analysis.json`` (ms/MiB by
category, top kvcs functions, kernel split, calls per object); ``suite`` runs every
topology and datagram size with every profiler; ``tables`` prints a suite as Markdown::

    .venv/bin/python tools/profile_path.py run --topology relay --dgram 1452 --profiler pyspy
    .venv/bin/python tools/profile_path.py analyze profiles/relay-1452-pyspy
    .venv/bin/python tools/profile_path.py suite --out profiles/suite
    .venv/bin/python tools/profile_path.py tables profiles/suite/suite.json

Datagram sizes: ``60000`` is ``QuicSettings.loopback()`` on qh3; any other value is that
preset with ``max_datagram_size`` set (1452: a 1500-byte Ethernet MTU path).
See docs/perf-profile.md for the results and how to read them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

MiB = 1 << 20
LAYERS = 32
BLOCK_OBJECT = 32 * 1024  # one block of K (or V): 16 tokens x 8 heads x 128 x bfloat16
WARM_TOKENS = 256
SCOPE = bytes(range(32))
TOKEN_BASE = 11
PREFIX = "@@ "  # role -> orchestrator messages on stdout
LOOPBACK_DATAGRAM = 60000  # what QuicSettings.loopback() sends on qh3
ROOT = Path(__file__).resolve().parent.parent


# =========================================================================== roles
# Each role is this script run as ``role <name> --config <json>``; it reports with
# PREFIX + JSON lines on stdout and takes one-word commands on stdin.


class _Control:
    """The role's side of the pipe to the orchestrator."""

    def __init__(self, cprofile_path: str | None) -> None:
        self._profile = cProfile.Profile() if cprofile_path else None
        self._path = cprofile_path

    @staticmethod
    def say(**message: Any) -> None:
        print(PREFIX + json.dumps(message), flush=True)

    async def command(self) -> str:
        """The next command; ``prof-on`` / ``prof-off`` start and stop cProfile here (in
        the event loop thread) and are not returned."""
        loop = asyncio.get_running_loop()
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if not line:
                return "quit"
            if line == "prof-on" and self._profile is not None:
                self._profile.enable()
            elif line == "prof-off" and self._profile is not None and self._path:
                self._profile.disable()
                self._profile.dump_stats(self._path)
            elif line not in ("prof-on", "prof-off"):
                return line

    async def expect(self, word: str) -> None:
        got = await self.command()
        if got != word:
            raise SystemExit(f"expected {word!r}, got {got!r}")


def _settings(dgram: int, overrides: dict[str, Any] | None = None) -> Any:
    """``QuicSettings.loopback()`` (60000: its own datagram size on qh3), else that preset
    with ``max_datagram_size=dgram``; ``overrides``: more QuicSettings fields."""
    from kvcs.transport import QuicSettings

    extra = dict(overrides or {})
    if dgram != LOOPBACK_DATAGRAM:
        extra["max_datagram_size"] = dgram
    return QuicSettings.loopback(**extra)


def _desc() -> Any:
    from bench.bench_e2e import _desc as bench_descriptor

    return bench_descriptor()  # the e2e bench's model: 32 layers, 8 x 128, bfloat16


def _tokens(count: int, warm: bool = False, round_: int = 0) -> Any:
    """The prompt of the warm-up cache or of measured round ``round_`` (each round is
    another publication: other tokens, other Block Keys)."""
    import numpy as np

    base = 100_000 if warm else TOKEN_BASE + 1_000_000 * round_
    return np.arange(count, dtype=np.int64) + base


def _layer(i: int, tokens: int) -> tuple[Any, Any]:
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(i)
    k = rng.standard_normal((tokens, 8, 128), dtype=np.float32).astype(ml_dtypes.bfloat16)
    return k, (-k.astype(np.float32)).astype(ml_dtypes.bfloat16)


def publication_mib(tokens: int) -> float:
    """MiB of K and V of one publication of ``tokens`` tokens (32 layers, 8 x 128, bf16)."""
    return tokens * LAYERS * 2 * 8 * 128 * 2 / MiB


async def _role_relay(ctl: _Control, cfg: dict[str, Any]) -> None:
    from kvcs.relay import Relay
    from kvcs.relay.config import RelayConfig

    relay = Relay(RelayConfig(listen="127.0.0.1:0", anonymous=True, cert_dir=cfg["tmp"],
                              log_level="warning", quic_preset="loopback"),
                  settings=_settings(cfg["dgram"], cfg.get("quic")))
    await relay.start()
    ctl.say(port=relay.port, pin=relay.fingerprint)
    await ctl.expect("quit")
    await relay.stop()


async def _role_publisher(ctl: _Control, cfg: dict[str, Any]) -> None:
    """``cfg["url"]`` None: serve consumers directly. ``cfg["live"]``: per round, announce,
    report ready, wait for ``go``, then put the layers; else publish every round first."""
    from kvcs.endpoint import Endpoint
    from kvcs.hosting import TrackHost
    from kvcs.kv.ids import ScopeKey
    from kvcs.kvnet.publisher import KvPublisher, PublisherOptions

    options = PublisherOptions(codec=cfg.get("codec", "raw"))
    settings = _settings(cfg["dgram"], cfg.get("quic"))
    tokens = cfg["tokens"]
    target: Any
    port = 0
    if cfg["url"] is None:
        host = TrackHost()
        server = await host.listen("127.0.0.1", 0, certfile=cfg["cert"], keyfile=cfg["key"],
                                   settings=settings)
        target, port = host, server.port
    else:
        target = await Endpoint.connect(cfg["url"], pin_sha256=cfg["pin"], settings=settings)
    layers = [_layer(i, tokens) for i in range(LAYERS)]
    scope = ScopeKey.from_bytes(SCOPE)
    if cfg["warm"]:
        warm = KvPublisher(target, scope, _desc(), _tokens(WARM_TOKENS, warm=True))
        for i, (k, v) in enumerate(layers):
            await warm.put_layer(i, k[:WARM_TOKENS], v[:WARM_TOKENS])
        await warm.finish()
    for r in range(cfg["rounds"]):
        pub = KvPublisher(target, scope, _desc(), _tokens(tokens, round_=r), options)
        await pub.start()
        if cfg["live"]:
            ctl.say(ready=port)
            await ctl.expect("go")
        for i, (k, v) in enumerate(layers):
            await pub.put_layer(i, k, v)
        await pub.finish()
        if cfg["live"]:
            ctl.say(published=True)
    if not cfg["live"]:
        ctl.say(ready=port)
    await ctl.expect("quit")
    if isinstance(target, TrackHost):
        await target.aclose()
    else:
        target.close()
        await target.wait_closed()


async def _role_consumer(ctl: _Control, cfg: dict[str, Any]) -> None:
    """Warm up; per round: discover the round's publication and read its manifest (a
    ``prime`` retrieval first for a relay cache hit), report ready, and on ``go`` retrieve
    every layer (verified; live: subscribed before ``subscribed``) and report. The layers
    of every round are held to the end, as by a decode worker (and bench_e2e)."""
    from kvcs.endpoint import Endpoint
    from kvcs.kv.ids import ScopeKey
    from kvcs.kvnet.consumer import KvConsumer

    ep = await Endpoint.connect(cfg["url"], pin_sha256=cfg["pin"],
                                settings=_settings(cfg["dgram"], cfg.get("quic")))
    scope = ScopeKey.from_bytes(SCOPE)
    if cfg["warm"]:
        warm = KvConsumer(ep, scope, _desc(), _tokens(WARM_TOKENS, warm=True))
        wpub = await warm.discover()
        assert wpub is not None, "warm-up publication not found"
        async for _ in warm.layers(wpub):
            pass
    held: list[Any] = []
    into = None
    if cfg.get("into"):  # written once: their pages are faulted in before the transfer
        import numpy as np

        d = _desc()
        rows = cfg["tokens"]
        into = [(np.ones((rows, *d.k_shape()[1:]), d.dtype),
                 np.ones((rows, *d.v_shape()[1:]), d.dtype)) for _ in range(d.layers)]
    for r in range(cfg["rounds"]):
        c = KvConsumer(ep, scope, _desc(), _tokens(cfg["tokens"], round_=r),
                       codec=cfg.get("codec", "raw"))
        pub = await c.discover()
        assert pub is not None, f"publication of round {r} not found"
        manifest = await c.manifest(pub)
        if cfg.get("prime"):  # a first retrieval fills the relay's cache
            async for _ in c.layers(pub, manifest=manifest):
                pass
        ctl.say(ready=True)
        await ctl.expect("go")
        objects, rejected = c.stats.objects, c.stats.rejected  # the prime's not counted
        start = time.perf_counter()
        got: list[Any] = []

        async def take(c: Any = c, pub: Any = pub, manifest: Any = manifest,
                       got: list[Any] = got) -> None:
            async for layer in c.layers(pub, manifest=manifest, into=into):
                got.append(layer)

        task = asyncio.create_task(take())
        if cfg["live"]:
            await asyncio.sleep(0.3)  # SUBSCRIBE_OK long before this (as bench_e2e)
            ctl.say(subscribed=True)
        await task
        end = time.perf_counter()
        if into is None:
            held += got
        ctl.say(done=True, seconds=end - start, end=end,
                data_bytes=sum(x.k.nbytes + x.v.nbytes for x in got),
                objects=c.stats.objects - objects, rejected=c.stats.rejected - rejected,
                layers=len(got))
    await ctl.expect("quit")
    ep.close()
    await ep.wait_closed()


async def _role_raw_receiver(ctl: _Control, cfg: dict[str, Any]) -> None:
    from bench.bench_transport import CountingSink
    from kvcs.transport import serve

    sinks: list[CountingSink] = []

    def factory(opener: Any, info: Any) -> CountingSink:
        sinks.append(CountingSink(cfg["bytes"]))
        return sinks[-1]

    settings = _settings(cfg["dgram"], cfg.get("quic"))
    server = await serve("127.0.0.1", 0, factory, settings, cfg["cert"], cfg["key"])
    ctl.say(port=server.port)
    quit_ = asyncio.create_task(ctl.expect("quit"))  # takes prof-on / prof-off meanwhile
    while not sinks:
        await asyncio.sleep(0.001)
    end = await sinks[-1].done
    ctl.say(done=True, end=end, data_bytes=sinks[-1].received)
    await quit_
    await server.aclose()


async def _role_raw_sender(ctl: _Control, cfg: dict[str, Any]) -> None:
    """Send ``bytes`` in 1 MiB writes with back-pressure (as bench_transport) on one uni
    stream, or on a new stream every ``stream_mib`` MiB (KVCS opens one per layer)."""
    from bench.bench_transport import CountingSink
    from kvcs.moqt.actions import SendStreamData
    from kvcs.transport import connect

    settings = _settings(cfg["dgram"], cfg.get("quic"))
    async with connect(cfg["url"], lambda o, i: CountingSink(0), settings,
                       pin_sha256=cfg["pin"]) as quic:
        ctl.say(ready=True)
        await ctl.expect("go")
        sink = quic.session
        assert isinstance(sink, CountingSink)
        chunk = memoryview(bytes(MiB))
        per_stream = cfg.get("stream_mib") or 1 << 30
        start = time.perf_counter()
        sent = 0
        stream_id = quic.open_stream(unidirectional=True)
        for i in range(cfg["bytes"] // MiB):
            last = (i + 1) % per_stream == 0 or (i + 1) * MiB >= cfg["bytes"]
            sink.out.append(SendStreamData(stream_id, chunk, end=last))
            sent += MiB
            if last and sent < cfg["bytes"]:
                stream_id = quic.open_stream(unidirectional=True)
            quic.flush()
            await quic.drain(4 * MiB)
        ctl.say(start=start)
        await ctl.expect("quit")


ROLES: dict[str, Callable[[_Control, dict[str, Any]], Coroutine[Any, Any, None]]] = {
    "relay": _role_relay,
    "publisher": _role_publisher,
    "consumer": _role_consumer,
    "raw-receiver": _role_raw_receiver,
    "raw-sender": _role_raw_sender,
}


def run_role(name: str, cfg: dict[str, Any]) -> None:
    """Entry point of a role process."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    ctl = _Control(cfg.get("cprofile"))
    asyncio.run(ROLES[name](ctl, cfg))


# =========================================================================== orchestrator


class Role:
    """A running role process."""

    def __init__(self, name: str, cfg: dict[str, Any], log_dir: Path) -> None:
        self.name = name
        self._stderr = open(log_dir / f"{name}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "role", name, "--config", json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read(self, timeout: float = 300.0) -> dict[str, Any]:
        """The next message of the role (other stdout lines are skipped)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name} exited ({self.proc.poll()}); see its log")
            if line.startswith(PREFIX):
                return dict(json.loads(line[len(PREFIX):]))
        raise TimeoutError(f"{self.name} did not answer")

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.send("quit")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._stderr.close()


def cpu_ns(pid: int) -> tuple[int, int, int, int]:
    """(on-CPU ns of the event-loop thread, user ticks, system ticks, minor page faults of
    every thread) of ``pid``: ``/proc/<pid>/schedstat`` is the thread-group leader's alone
    (a worker thread's SHA-256 is not in it), ``/proc/<pid>/stat`` counts every thread.
    Page faults do not depend on the machine's load as CPU time does (each costs ~1-2 us
    on the development VM)."""
    with open(f"/proc/{pid}/schedstat") as f:
        ns = int(f.read().split()[0])
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return ns, int(fields[11]), int(fields[12]), int(fields[7])


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Profilers:
    """External profilers attached to role processes for the transfer window."""

    def __init__(self, kind: str, out: Path, rate: int, perf_args: str = "") -> None:
        self.kind = kind
        self.out = out
        self.rate = rate
        self.perf_args = perf_args.split()
        """Extra ``perf record`` options, e.g. ``--call-graph dwarf``."""
        self._procs: list[subprocess.Popen[bytes]] = []

    def attach(self, roles: Iterable[Role]) -> None:
        for role in roles:
            with contextlib.suppress(OSError):
                (self.out / f"{role.name}.maps").write_text(
                    Path(f"/proc/{role.pid}/maps").read_text())
            if self.kind == "pyspy":
                cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "--native",
                       "--rate", str(self.rate), "--format", "raw",
                       "-o", str(self.out / f"{role.name}.collapsed"), "--pid", str(role.pid)]
                self._spawn(cmd, role.name + ".py-spy")
            elif self.kind == "perf":
                self._spawn(["perf", "record", *self.perf_args, "-F", str(self.rate),
                             "-p", str(role.pid),
                             "-o", str(self.out / f"{role.name}.perf.data")],
                            role.name + ".perf-record")
                events = ",".join(f"syscalls:sys_enter_{s}" for s in (
                    "sendto", "recvfrom", "sendmsg", "recvmsg", "recvmmsg", "sendmmsg",
                    "epoll_wait", "write", "read"))
                self._spawn(["perf", "stat", "-x", ",", "-e", "task-clock," + events,
                             "-p", str(role.pid), "-o", str(self.out / f"{role.name}.stat")],
                            role.name + ".perf-stat")
        if self._procs:
            time.sleep(1.5)  # attached (py-spy reads the interpreter state first)

    def _spawn(self, cmd: list[str], log: str) -> None:
        with open(self.out / f"{log}.log", "wb") as sink:  # the child keeps its own fd
            self._procs.append(subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT))

    def stop(self) -> None:
        for p in self._procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)
        for p in self._procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


TOKENS = 1024
"""Tokens per publication: bench_e2e's cache (128 MiB: 32 layers of 2 x 2 MiB, one 1 MiB
subgroup stream per layer and component); ``--mib`` sets how many publications (rounds)."""


def run(topology: str, dgram: int, profiler: str, mib: int, out_root: Path,
        rate: int, tag: str = "", perf_args: str = "", stream_mib: int = 0,
        tokens: int = TOKENS, quic: dict[str, Any] | None = None,
        codec: str = "raw", into: bool = False) -> dict[str, Any]:
    """Run one topology once with ``profiler`` on every process; return the summary.

    KV topologies move ``mib`` MiB as consecutive publications of ``tokens`` tokens; the
    CPU time of each process is summed over the transfer windows only (from the first
    layer or request to the consumer's last verified layer). ``into``: the consumer
    assembles every round into the same arrays (``KvConsumer.layers(into=...)``, a decode
    worker's reused cache) instead of holding new ones."""
    name = f"{topology}-{dgram}-{profiler}{tag}"
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    rounds = max(1, round(mib / publication_mib(tokens)))
    tmp = tempfile.mkdtemp(prefix="kvcs-profile-")
    from kvcs.transport import ensure_dev_certificate

    cert = ensure_dev_certificate(tmp)
    base: dict[str, Any] = {"dgram": dgram, "tmp": tmp, "tokens": tokens, "warm": True,
                            "rounds": rounds, "cert": str(cert.certfile),
                            "key": str(cert.keyfile), "quic": quic or {}, "codec": codec,
                            "into": into}

    def cfg(role: str, **extra: Any) -> dict[str, Any]:
        c = dict(base, **extra)
        if profiler == "cprofile":
            c["cprofile"] = str(out / f"{role}.pstats")
        return c

    roles: dict[str, Role] = {}
    profilers = Profilers(profiler, out, rate, perf_args)
    load = [loadavg()]
    cpu: dict[str, list[int]] = {}
    seconds = 0.0
    data_bytes = 0
    consumer: dict[str, Any] = {"objects": 0, "rejected": 0, "layers": 0}

    def snapshot(sign: int) -> None:
        for r in roles.values():
            now = cpu_ns(r.pid)
            acc = cpu.setdefault(r.name, [0, 0, 0, 0])
            for i in range(4):
                acc[i] += sign * now[i]

    try:
        if topology == "raw":
            total = mib * MiB
            recv = roles["receiver"] = Role("raw-receiver", cfg("raw-receiver", bytes=total),
                                            out)
            port = recv.read()["port"]
            send = roles["sender"] = Role("raw-sender", cfg(
                "raw-sender", url=f"moqt://127.0.0.1:{port}/bench", pin=cert.sha256,
                bytes=total, stream_mib=stream_mib), out)
            send.read()
            profilers.attach([send, recv])
            load.append(loadavg())
            for r in roles.values():
                r.send("prof-on")
            snapshot(-1)
            send.send("go")
            done = recv.read()
            snapshot(+1)
            seconds = done["end"] - send.read()["start"]
            data_bytes = done["data_bytes"]
        else:
            live = topology in ("direct", "relay")
            if topology == "direct":
                pub = roles["publisher"] = Role("publisher", cfg(
                    "publisher", url=None, pin=None, live=True), out)
                url, pin = f"moqt://127.0.0.1:{pub.read()['ready']}/", cert.sha256
            else:
                relay = roles["relay"] = Role("relay", cfg("relay"), out)
                listening = relay.read()
                url, pin = f"moqt://127.0.0.1:{listening['port']}/", listening["pin"]
                pub = roles["publisher"] = Role("publisher", cfg(
                    "publisher", url=url, pin=pin, live=live), out)
                pub.read()  # live: round 0 announced; else every round published
            cons = roles["consumer"] = Role("consumer", cfg(
                "consumer", url=url, pin=pin, live=live, prime=topology == "cache"), out)
            for i in range(rounds):
                if live and i:
                    pub.read()  # round i announced
                cons.read()  # round i discovered (and primed)
                if i == 0:
                    profilers.attach([r for k, r in roles.items()
                                      if topology != "cache" or k != "publisher"])
                    load.append(loadavg())
                    for r in roles.values():
                        r.send("prof-on")
                snapshot(-1)
                t0 = time.perf_counter()
                cons.send("go")
                if live:
                    cons.read()  # subscribed
                    t0 = time.perf_counter()
                    pub.send("go")
                done = cons.read()
                snapshot(+1)
                if live:
                    pub.read()  # published
                seconds += done["end"] - t0
                data_bytes += done["data_bytes"]
                for k in consumer:
                    consumer[k] += done[k]
        for r in roles.values():
            r.send("prof-off")
        load.append(loadavg())
        profilers.stop()
    finally:
        for r in roles.values():
            r.stop()
        profilers.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    data_mib = data_bytes / MiB
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    procs = {}
    for role, (ns, user, system, minflt) in cpu.items():
        cpu_ms = ns / 1e6
        procs[role] = {"cpu_ms": round(cpu_ms, 1), "ms_per_mib": round(cpu_ms / data_mib, 3),
                       "user_ms": user * tick_ms, "sys_ms": system * tick_ms,
                       "all_threads_ms_per_mib": round((user + system) * tick_ms / data_mib, 3),
                       "page_faults_per_mib": round(minflt / data_mib, 1)}
    summary = {"run": name, "topology": topology, "dgram": dgram, "profiler": profiler,
               "perf_args": perf_args.split(), "rounds": rounds, "tokens": tokens,
               "mib": round(data_mib, 1), "seconds": round(seconds, 3),
               "mib_s": round(data_mib / seconds, 1), "loadavg": load, "processes": procs,
               "consumer": consumer}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


# =========================================================================== analysis
# py-spy collapsed stacks: "frame;frame;...;leaf count", root first. A frame is
# "function (file:line)" for Python, "symbol (library)" or "0xaddress (library)" natively.
# libc's internal symbols (memmove variants, malloc) are resolved from the debug file of
# its build id when installed (libc6-dbg), with the mappings saved at attach time.

_FRAME = re.compile(r"^(?P<fn>.*) \((?P<where>[^()]*)\)$")
_KVCS = re.compile(r"(^|/)kvcs/")
_QH3 = re.compile(r"(^|/)qh3/")
_SOCKET = re.compile(r"^sock_(sendto|recvfrom|sendmsg|recvmsg)|UdpSocketState")
_HASH = re.compile(r"sha256|SHA256|EVP_Digest|EVP_hash")
_COPY = re.compile(r"memmove|memcpy|memset")
_ALLOC = re.compile(r"malloc|free|_int_|realloc|arena|tcache|cfree")
_IDLE_LEAF = {"epoll_wait", "read", "select", "poll", "__futex_abstimed_wait_common",
              "pthread_cond_wait", "pthread_cond_timedwait", "sem_wait", "do_futex_wait",
              "__GI___futex_abstimed_wait_cancelable64"}
QH3_CALLS = {  # Python function calling into qh3's compiled core -> what the core does
    "datagrams_to_send": "qh3 core: build+encrypt packets (poll_transmit)",
    "receive_datagram": "qh3 core: decrypt+parse packets (receive_datagram)",
    "receive_many_datagrams": "qh3 core: decrypt+parse packets (receive_datagram)",
    "receive_gro_buffer": "qh3 core: decrypt+parse packets (receive_datagram)",
    "_drain_core": "qh3 core: hand out events (next_event)",
    "send_stream_data": "qh3 core: take stream data (send_stream)",
    "get_send_buffer_size": "qh3 core: get_send_buffer_size",
    "handle_timer": "qh3 core: timers",
    "get_timer": "qh3 core: timers",
}


class LibcSymbols:
    """Resolves ``0xaddress (libc.so.6)`` frames of one process (maps saved at attach)."""

    def __init__(self, maps: Path) -> None:
        self._ranges: list[tuple[int, int, int]] = []  # start, end, file offset
        self._syms: list[tuple[int, str]] = []
        path = None
        with contextlib.suppress(OSError):
            for line in maps.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 6 and parts[5].endswith("/libc.so.6"):
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    self._ranges.append((lo, hi, int(parts[2], 16)))
                    path = parts[5]
        if path is None:
            return
        debug = _debug_file(path)
        if debug is None:
            return
        out = subprocess.run(["nm", "-n", "--defined-only", str(debug)], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "tTwWiI":
                self._syms.append((int(parts[0], 16), parts[2]))
        self._bias = _load_bias(path)

    def name(self, addr: int) -> str | None:
        import bisect

        for lo, hi, off in self._ranges:
            if lo <= addr < hi and self._syms:
                vaddr = addr - lo + off + self._bias
                i = bisect.bisect_right(self._syms, (vaddr, "\uffff")) - 1
                return self._syms[i][1] if i >= 0 else None
        return None


def _debug_file(lib: str) -> Path | None:
    out = subprocess.run(["readelf", "-n", lib], capture_output=True, text=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    if not m:
        return None
    bid = m.group(1)
    f = Path("/usr/lib/debug/.build-id") / bid[:2] / f"{bid[2:]}.debug"
    return f if f.exists() else None


def _load_bias(lib: str) -> int:
    """p_vaddr - p_offset of the executable LOAD segment (file offset -> symbol address)."""
    out = subprocess.run(["readelf", "-lW", lib], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "LOAD" and "E" in parts[6:]:
            return int(parts[2], 16) - int(parts[1], 16)
    return 0


def _parse(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame)
    return (m.group("fn"), m.group("where")) if m else (frame, "")


def _short(where: str) -> str:
    """``kvcs/moqt/serving.py`` from a path (line number dropped)."""
    path = where.rsplit(":", 1)[0]
    for marker in ("kvcs/", "qh3/", "asyncio/", "bench/", "numpy/"):
        if path.startswith(marker):
            return path
        if "/" + marker in path:
            return marker + path.split("/" + marker, 1)[1]
    return path


def classify(frames: list[tuple[str, str]]) -> tuple[str, str | None]:
    """(category, innermost kvcs Python function) of one sampled stack (resolved frames,
    root first); category "idle" for a thread waiting (left out of the CPU scale)."""
    python = [(fn, w) for fn, w in frames if ".py" in w]
    kvcs_fn = next((f"{_short(w)}:{fn}" for fn, w in reversed(python) if _KVCS.search(w)),
                   None)
    leaf_fn, leaf_where = frames[-1]
    if leaf_fn in _IDLE_LEAF or any(fn == "Thread._bootstrap" for fn, _ in frames):
        return "idle", None
    libs = [w for _, w in frames]
    names = [fn for fn, _ in frames]
    in_libc = "libc.so" in leaf_where
    if any(_SOCKET.search(n) for n in names):
        return "socket syscalls (sendto/recvfrom)", kvcs_fn
    if any("_hazmat" in w for w in libs):
        caller = next((fn.rsplit(".", 1)[-1] for fn, _w in reversed(python)
                       if fn.rsplit(".", 1)[-1] in QH3_CALLS), "")
        what = QH3_CALLS.get(caller, "qh3 core: other")
        if in_libc and _COPY.search(leaf_fn):
            return what + " [memcpy]", kvcs_fn
        if in_libc and _ALLOC.search(leaf_fn):
            return what + " [malloc/free]", kvcs_fn
        return what, kvcs_fn
    if any(_HASH.search(n) for n in names):
        return "SHA-256 (hashlib)", kvcs_fn
    if in_libc and _COPY.search(leaf_fn):
        return "memcpy outside qh3", kvcs_fn
    if "_multiarray" in leaf_where or "numpy" in leaf_where:
        return "numpy", kvcs_fn
    inner = python[-1][1] if python else ""
    if _KVCS.search(inner):
        return "kvcs Python", kvcs_fn
    if _QH3.search(inner):
        return "qh3 Python layer", kvcs_fn
    if inner.startswith("asyncio/") or "/asyncio/" in inner or "selectors.py" in inner:
        return "asyncio", kvcs_fn
    return "other Python / interpreter", kvcs_fn


def read_collapsed(path: Path, libc: LibcSymbols | None = None,
                   ) -> list[tuple[list[str], int]]:
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        if libc is not None:
            for i, f in enumerate(frames):
                if f.startswith("0x") and f.endswith("(libc.so.6)"):
                    name = libc.name(int(f.split()[0], 16))
                    if name:
                        frames[i] = f"{name} (libc.so.6)"
        out.append((frames, int(count)))
    return out


def to_speedscope(samples: list[tuple[list[str], int]], name: str) -> dict[str, Any]:
    """A speedscope 'sampled' profile of collapsed stacks (weights = sample counts)."""
    index: dict[str, int] = {}
    frames: list[dict[str, str]] = []
    stacks, weights = [], []
    for stack, count in samples:
        ids = []
        for f in stack:
            if f not in index:
                index[f] = len(frames)
                frames.append({"name": f})
            ids.append(index[f])
        stacks.append(ids)
        weights.append(count)
    return {"$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": frames},
            "profiles": [{"type": "sampled", "name": name, "unit": "none", "startValue": 0,
                          "endValue": sum(weights), "samples": stacks, "weights": weights}]}


def analyze_pyspy(run_dir: Path, summary: dict[str, Any], top: int = 15,
                  scale_ms: dict[str, float] | None = None) -> dict[str, Any]:
    """Per role: ms/MiB by category, the top kvcs functions (self time in kvcs Python,
    numpy and memcpy outside qh3) and the Python callers of the memcpy samples, scaled
    from sample shares to the role's ms/MiB (``scale_ms``: from an unprofiled run, since
    py-spy's pauses add system time; default: this run's)."""
    result: dict[str, Any] = {}
    for path in sorted(run_dir.glob("*.collapsed")):
        role = path.name.removesuffix(".collapsed")
        samples = read_collapsed(path, LibcSymbols(run_dir / f"{role}.maps"))
        (run_dir / f"{role}.speedscope.json").write_text(
            json.dumps(to_speedscope(samples, f"{summary['run']} {role}")))
        cats: Counter[str] = Counter()
        funcs: Counter[str] = Counter()
        copies: Counter[str] = Counter()
        for stack, n in samples:
            frames = [_parse(f) for f in stack]
            cat, fn = classify(frames)
            cats[cat] += n
            if cat in ("kvcs Python", "numpy", "memcpy outside qh3") and fn:
                funcs[fn] += n
            if "memcpy" in cat:
                py = [f"{_short(w)}:{f}" for f, w in frames if ".py" in w]
                copies[" <- ".join(reversed(py[-2:]))] += n
        busy = sum(n for c, n in cats.items() if c != "idle")
        per_mib = (scale_ms or {}).get(role, summary["processes"][role]["ms_per_mib"])
        scale = per_mib / busy if busy else 0.0
        result[role] = {
            "samples": busy, "ms_per_mib": per_mib,
            "categories": {c: round(n * scale, 3) for c, n in cats.most_common()
                           if c != "idle"},
            "kvcs_functions": {f: round(n * scale, 3) for f, n in funcs.most_common(top)},
            "memcpy_callers": {f: round(n * scale, 3) for f, n in copies.most_common(8)},
        }
    return result


def analyze_perf(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Per role: ms/MiB by shared object (kernel, qh3 core, libpython ...), the top
    kernel and libc symbols, and socket system calls per MiB (perf stat)."""
    result: dict[str, Any] = {}
    mib = summary["mib"]
    for data in sorted(run_dir.glob("*.perf.data")):
        role = data.name.removesuffix(".perf.data")
        cpu = summary["processes"][role]["cpu_ms"]
        dsos = _perf_report(data, "dso")
        syms = _perf_report(data, "dso,sym")
        stat: dict[str, float] = {}
        with contextlib.suppress(OSError):
            for line in (run_dir / f"{role}.stat").read_text().splitlines():
                parts = line.split(",")
                if len(parts) > 3 and parts[0].replace(".", "").isdigit():
                    stat[parts[2].removeprefix("syscalls:sys_enter_")] = float(parts[0])
        kernel: dict[str, float] = {}
        if (run_dir / f"{role}.perf.data").stat().st_size and "call-graph" in " ".join(
                summary.get("perf_args", [])):
            for sym, pct in _perf_report(data, "sym", children=True):
                name = sym.split()[-1]
                if name in KERNEL_PATHS:
                    kernel[KERNEL_PATHS[name]] = round(pct / 100 * cpu / mib, 3)
        result[role] = {
            "ms_per_mib": summary["processes"][role]["ms_per_mib"],
            "kernel_inclusive": kernel,
            "dso": {d: round(p / 100 * cpu / mib, 3) for d, p in dsos[:12]},
            "symbols": {s: round(p / 100 * cpu / mib, 3) for s, p in syms[:25]},
            "syscalls_per_mib": {k: round(v / mib, 1) for k, v in stat.items()
                                 if k != "task-clock" and v},
        }
    return result


_PCT = re.compile(r"^\s*([\d.]+)%\s+(?:([\d.]+)%\s+)?(.*)$")


def _perf_report(data: Path, sort: str, children: bool = False) -> list[tuple[str, float]]:
    """(row, percent) of ``perf report``; ``children``: inclusive percentages (needs a
    call-graph recording)."""
    cmd = ["perf", "report", "-i", str(data), "--stdio", "--sort", sort, "-q", "-g", "none",
           "--children" if children else "--no-children"]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = _PCT.match(line)
        if m:
            rows.append((" ".join(m.group(3).split()), float(m.group(1))))
    return rows


KERNEL_PATHS = {  # inclusive kernel entry points -> what the process was doing there
    "asm_exc_page_fault": "page faults (first touch of fresh memory)",
    "__x64_sys_sendto": "sendto (UDP send + loopback delivery)",
    "__x64_sys_recvfrom": "recvfrom (UDP receive)",
    "__x64_sys_sendmsg": "sendmsg",
    "__x64_sys_recvmsg": "recvmsg",
    "__x64_sys_recvmmsg": "recvmmsg",
    "__x64_sys_epoll_wait": "epoll_wait",
    "__x64_sys_munmap": "munmap",
    "__x64_sys_madvise": "madvise",
    "__x64_sys_brk": "brk",
    "__x64_sys_mmap": "mmap",
}


def analyze_cprofile(run_dir: Path, summary: dict[str, Any], top: int = 25) -> dict[str, Any]:
    """Per role: Python calls per KV object (32 KiB), the most called functions, the kvcs
    functions by own time, and the asyncio futures, tasks and callbacks per object."""
    import pstats

    objects = summary["consumer"].get("objects") or summary["mib"] * MiB / BLOCK_OBJECT
    result: dict[str, Any] = {}
    for path in sorted(run_dir.glob("*.pstats")):
        try:
            st = pstats.Stats(str(path))
        except (TypeError, OSError, EOFError):  # nothing was recorded
            continue
        rows = []
        total_calls = 0
        for (file, _line, fn), (_cc, nc, tt, _ct, _callers) in \
                st.stats.items():  # type: ignore[attr-defined]
            total_calls += nc
            rows.append((nc, tt, f"{_short(file)}:{fn}"))
        per = {name: nc / objects for nc, _tt, name in rows}
        kvcs_rows = sorted((r for r in rows if r[2].startswith("kvcs/")),
                           key=lambda r: -r[1])
        asyncio_rows = {k: round(v, 2) for k, v in per.items() if any(
            x in k for x in ("create_future", "Task.__init__", "create_task", ":call_soon",
                             "Future.__init__", ":call_at", "queues.py:get", "put_nowait"))}
        result[path.name.removesuffix(".pstats")] = {
            "calls_per_object": round(total_calls / objects, 1),
            "top": {f: round(n / objects, 2) for n, _tt, f in sorted(rows, reverse=True)[:top]},
            "kvcs_by_own_time_us_per_object": {
                f: round(tt / objects * 1e6, 2) for _n, tt, f in kvcs_rows[:top]},
            "kvcs_calls_per_object": round(sum(r[0] for r in rows
                                               if r[2].startswith("kvcs/")) / objects, 1),
            "asyncio_per_object": asyncio_rows,
        }
    return result


def analyze(run_dir: Path, scale_from: Path | None = None) -> dict[str, Any]:
    """Analyze every profile of a run directory; ``scale_from``: an unprofiled run of the
    same topology whose ms/MiB scale the py-spy shares."""
    summary = json.loads((run_dir / "summary.json").read_text())
    report: dict[str, Any] = {"summary": summary}
    scale = None
    if scale_from is not None:
        clean = json.loads((scale_from / "summary.json").read_text())
        scale = {k: v["ms_per_mib"] for k, v in clean["processes"].items()}
        report["scaled_from"] = clean["run"]
    if any(run_dir.glob("*.collapsed")):
        report["pyspy"] = analyze_pyspy(run_dir, summary, scale_ms=scale)
    if any(run_dir.glob("*.perf.data")):
        report["perf"] = analyze_perf(run_dir, summary)
    if any(run_dir.glob("*.pstats")):
        report["cprofile"] = analyze_cprofile(run_dir, summary)
    (run_dir / "analysis.json").write_text(json.dumps(report, indent=1))
    return report


def print_report(report: dict[str, Any]) -> None:
    s = report["summary"]
    print(f"== {s['run']}: {s['mib']} MiB in {s['seconds']} s = {s['mib_s']} MiB/s, "
          f"load {s['loadavg']}")
    for role, p in s["processes"].items():
        every = p.get("all_threads_ms_per_mib")
        print(f"   {role:12s} {p['ms_per_mib']:7.2f} ms/MiB on the event-loop thread"
              + (f", {every:.2f} every thread" if every is not None else "")
              + f" (user {p['user_ms']:.0f} ms, sys {p['sys_ms']:.0f} ms"
              + (f", {p['page_faults_per_mib']:.0f} page faults per MiB)"
                 if "page_faults_per_mib" in p else ")"))
    for kind in ("pyspy", "perf", "cprofile"):
        for role, r in report.get(kind, {}).items():
            print(f"-- {kind} {role}")
            for section, rows in r.items():
                if isinstance(rows, dict):
                    print(f"   {section}:")
                    for k, v in rows.items():
                        print(f"      {v:9.3f}  {k}")
                else:
                    print(f"   {section}: {rows}")


# =========================================================================== suite

TOPOLOGIES = ("raw", "direct", "relay", "fill", "cache")


def suite(out_root: Path, dgrams: list[int], topologies: list[str], mib: int, repeats: int,
          profilers: list[str], cprofile_mib: int) -> dict[str, Any]:
    """Every topology x datagram size: ``repeats`` unprofiled runs (CPU per MiB and
    goodput: medians), then one run per profiler; writes ``<out>/suite.json``."""
    results: dict[str, Any] = {}
    suite_file = out_root / "suite.json"
    if suite_file.exists():
        results = json.loads(suite_file.read_text())
    for dgram in dgrams:
        for topo in topologies:
            size = mib if dgram >= 16000 else max(64, mib // 4)  # 1452: ~10x the CPU
            clean = [run(topo, dgram, "none", size, out_root, 0, tag=f"-{i}")
                     for i in range(repeats)]
            med = sorted(clean, key=lambda r: r["mib_s"])[len(clean) // 2]
            entry: dict[str, Any] = {
                "mib_s": [c["mib_s"] for c in clean],
                "loadavg": [c["loadavg"][1] for c in clean],
                "ms_per_mib": {role: sorted(c["processes"][role]["ms_per_mib"]
                                            for c in clean)[len(clean) // 2]
                               for role in med["processes"]},
                "median_run": med["run"],
            }
            for prof in profilers:
                args = "--call-graph dwarf,16384" if prof == "perf" else ""
                size_p = cprofile_mib if prof == "cprofile" else size
                rate = 499 if prof == "perf" else 250
                r = run(topo, dgram, prof, size_p, out_root, rate, perf_args=args)
                rdir = out_root / r["run"]
                entry[prof] = analyze(rdir, out_root / med["run"])
                print_report(entry[prof])
            results[f"{topo}-{dgram}"] = entry
            suite_file.write_text(json.dumps(results, indent=1))
            print(f"** {topo}-{dgram}: MiB/s {entry['mib_s']} load {entry['loadavg']} "
                  f"ms/MiB {entry['ms_per_mib']}", flush=True)
    return results


# =========================================================================== tables

GROUPS = [  # (row of the table, py-spy categories it sums)
    ("qh3 core: build + encrypt packets", ("qh3 core: build+encrypt",)),
    ("qh3 core: decrypt + parse packets", ("qh3 core: decrypt+parse",)),
    ("qh3 core: copy into stream send buffer", ("qh3 core: take stream data",)),
    ("qh3 core: stream data out (next_event)", ("qh3 core: hand out events",)),
    ("qh3 core: timers, other", ("qh3 core: timers", "qh3 core: other",
                                 "qh3 core: get_send_buffer_size")),
    ("qh3 Python wrapper", ("qh3 Python layer",)),
    ("socket system calls (sendto/recvfrom)", ("socket syscalls",)),
    ("SHA-256 (hashlib)", ("SHA-256",)),
    ("memcpy outside qh3 (kvcs copies)", ("memcpy outside qh3",)),
    ("numpy", ("numpy",)),
    ("kvcs Python", ("kvcs Python",)),
    ("asyncio", ("asyncio",)),
    ("interpreter, other", ("other Python",)),
]


def markdown_tables(suite_json: Path) -> str:
    """Markdown tables (ms per MiB by process) of a suite: the py-spy split, the perf
    kernel split and syscalls, and the top kvcs functions."""
    data = json.loads(suite_json.read_text())
    out: list[str] = []
    for key, e in data.items():
        roles = [r for r in e["ms_per_mib"] if e["ms_per_mib"][r] > 0.05]
        py = e.get("pyspy", {}).get("pyspy", {})
        pf = e.get("perf", {}).get("perf", {})
        out.append(f"#### {key}: {'/'.join(f'{x:.0f}' for x in e['mib_s'])} MiB/s "
                   f"(load {'/'.join(f'{x:.1f}' for x in e['loadavg'])})\n")
        out.append("| ms per MiB | " + " | ".join(roles) + " |")
        out.append("|---|" + "---:|" * len(roles))
        out.append("| **CPU, total (schedstat, median)** | " + " | ".join(
            f"**{e['ms_per_mib'][r]:.2f}**" for r in roles) + " |")
        for row, prefixes in GROUPS:
            vals = []
            for r in roles:
                cats = py.get(r, {}).get("categories", {})
                vals.append(sum(v for c, v in cats.items() if c.startswith(prefixes)))
            if any(v >= 0.01 for v in vals):
                out.append(f"| {row} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
        for label, name in () if not pf else (("kernel: page faults (perf)",
                             "page faults (first touch of fresh memory)"),
                            ("kernel: sendto (perf)", "sendto (UDP send + loopback delivery)"),
                            ("kernel: recvfrom (perf)", "recvfrom (UDP receive)")):
            vals = [pf.get(r, {}).get("kernel_inclusive", {}).get(name, 0.0) for r in roles]
            out.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
        if pf:
            sys_rows = [pf.get(r, {}).get("syscalls_per_mib", {}) for r in roles]
            out.append("| sendto + recvfrom calls per MiB | " + " | ".join(
                f"{x.get('sendto', 0):.0f} + {x.get('recvfrom', 0):.0f}" for x in sys_rows)
                + " |")
        cp = e.get("cprofile", {}).get("cprofile", {})
        if cp:
            out.append("| Python calls per 32 KiB object (kvcs's) | " + " | ".join(
                f"{cp[r]['calls_per_object']:.0f} ({cp[r]['kvcs_calls_per_object']:.0f})"
                if r in cp else "-" for r in roles) + " |")
        out.append("")
        for r in roles:
            funcs = py.get(r, {}).get("kvcs_functions", {})
            if funcs:
                top = ", ".join(f"`{f.split(':', 1)[1]}` {v:.2f}" for f, v in
                                list(funcs.items())[:15])
                out.append(f"- {r}, top kvcs functions (self, ms/MiB): {top}")
        out.append("")
    return "\n".join(out)


# =========================================================================== CLI


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one topology with one profiler")
    r.add_argument("--topology", choices=["raw", "direct", "relay", "fill", "cache"],
                   required=True)
    r.add_argument("--dgram", type=int, default=60000, help="max_datagram_size (60000, 1452)")
    r.add_argument("--profiler", choices=["none", "pyspy", "perf", "cprofile"], default="none")
    r.add_argument("--mib", type=int, default=512,
                   help="MiB of K/V (publications of --tokens tokens; raw: stream bytes)")
    r.add_argument("--tokens", type=int, default=TOKENS, help="tokens per publication")
    r.add_argument("--quic", action="append", default=[], metavar="FIELD=JSON",
                   help="a QuicSettings field for every process, e.g. gso=false")
    r.add_argument("--rate", type=int, default=250, help="samples per second (py-spy, perf)")
    r.add_argument("--out", default=str(ROOT / "profiles"))
    r.add_argument("--tag", default="", help="suffix of the run directory name")
    r.add_argument("--perf-args", default="", help="extra perf record options")
    r.add_argument("--codec", default="raw", help="codec of the k/v tracks (raw, q8)")
    r.add_argument("--into", action="store_true",
                   help="the consumer assembles into reused arrays (KvConsumer.layers(into=))")
    r.add_argument("--stream-mib", type=int, default=0,
                   help="raw: a new stream every N MiB (default: one stream)")
    a = sub.add_parser("analyze", help="tables of a run directory (also written as JSON)")
    a.add_argument("run_dir", nargs="+")
    a.add_argument("--scale", help="an unprofiled run directory: its ms/MiB scale py-spy")
    su = sub.add_parser("suite", help="every topology x datagram size x profiler")
    su.add_argument("--dgram", type=int, nargs="+", default=[60000, 1452])
    su.add_argument("--topology", nargs="+", default=list(TOPOLOGIES), choices=TOPOLOGIES)
    su.add_argument("--profiler", nargs="+", default=["perf", "pyspy", "cprofile"])
    su.add_argument("--mib", type=int, default=512)
    su.add_argument("--cprofile-mib", type=int, default=64)
    su.add_argument("--repeats", type=int, default=3)
    su.add_argument("--out", default=str(ROOT / "profiles"))
    tb = sub.add_parser("tables", help="Markdown tables of a suite.json")
    tb.add_argument("suite_json")
    ro = sub.add_parser("role", help=argparse.SUPPRESS)
    ro.add_argument("name", choices=sorted(ROLES))
    ro.add_argument("--config", required=True)
    args = p.parse_args(argv)
    if args.cmd == "role":
        run_role(args.name, json.loads(args.config))
    elif args.cmd == "run":
        summary = run(args.topology, args.dgram, args.profiler, args.mib, Path(args.out),
                      args.rate, args.tag, args.perf_args, args.stream_mib, args.tokens,
                      {k: json.loads(v) for k, v in (q.split("=", 1) for q in args.quic)},
                      args.codec, args.into)
        run_dir = Path(args.out) / summary["run"]
        print_report(analyze(run_dir) if args.profiler != "none" else {"summary": summary})
    elif args.cmd == "tables":
        print(markdown_tables(Path(args.suite_json)))
    elif args.cmd == "suite":
        suite(Path(args.out), args.dgram, args.topology, args.mib, args.repeats,
              args.profiler, args.cprofile_mib)
    else:
        for d in args.run_dir:
            print_report(analyze(Path(d), Path(args.scale) if args.scale else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
