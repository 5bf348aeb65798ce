"""The long-haul path: ``kvcs-wanem`` (tools/wanem.c), a compiled UDP forwarder that adds
one-way delay, random loss and an optional rate limit, run as a subprocess.

    with WanForwarder("127.0.0.1", relay_port, seed=7, up=Link(delay_ms=40, loss=0.001),
                      down=Link(delay_ms=40, loss=0.001)) as wan:
        ... connect to 127.0.0.1:{wan.port} instead of the relay ...
    wan.down_counters.lost

The shape follows :class:`tests.faults.impair.ImpairmentProxy` (target, ``seed``, ``up``
client -> target and ``down`` target -> client, ``port``, ``start``/``aclose``, per-direction
counters), but settings are fixed once started and the counters are read when it stops.
The Python proxy does much more (corruption, duplication, blackholes, live changes) and
forwards ~40 MiB/s; this one does delay, loss, reordering on request and a rate limit, at
several hundred MiB/s (``python -m bench.wanem blast`` measures it), which the long-haul
profiles need: netem is not in this kernel.

The forwarder is compiled on first use with the system C compiler (``$CC``, else ``cc``)
into ``build/wanem/`` and rebuilt when tools/wanem.c changes; ``python -m bench.wanem
build`` does it beforehand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tools" / "wanem.c"
BINARY = ROOT / "build" / "wanem" / "kvcs-wanem"
CFLAGS = ("-O2", "-Wall", "-Wextra")
MiB = 1 << 20

PROFILES: tuple[tuple[int, float], ...] = tuple(
    (rtt, loss) for rtt in (20, 80) for loss in (0.0, 0.001, 0.01))
"""The long-haul profiles of issue #28: (round-trip time in ms, loss per direction)."""


class ForwarderUnavailable(RuntimeError):
    """The forwarder cannot be built here (no C compiler, or the build failed)."""


@dataclass(frozen=True)
class Link:
    """What one direction does to its datagrams."""

    delay_ms: float = 0.0
    """One-way delay added to every datagram."""
    loss: float = 0.0
    """Probability that a datagram is dropped."""
    rate: float | None = None
    """Bottleneck rate in bytes/s (None: none); datagrams beyond :attr:`queue_bytes`
    waiting in front of it are dropped."""
    queue_bytes: int = 1 * MiB
    reorder: float = 0.0
    """Probability that a datagram gets :attr:`reorder_ms` more delay (and so arrives
    after later ones); 0: order is kept."""
    reorder_ms: float = 1.0

    def __post_init__(self) -> None:
        for name in ("loss", "reorder"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"Link.{name} must be a probability in [0, 1]")
        for name in ("delay_ms", "reorder_ms", "queue_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"Link.{name} must be >= 0")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("Link.rate must be None or > 0 (bytes/s)")

    @classmethod
    def profile(cls, rtt_ms: float, loss: float) -> Link:
        """One direction of a symmetric path: half the round trip, ``loss`` each way."""
        return cls(delay_ms=rtt_ms / 2, loss=loss)

    def options(self, prefix: str) -> list[str]:
        """Command-line options of one direction (``prefix`` "up" or "down")."""
        out = [f"--{prefix}-delay-ms", repr(self.delay_ms), f"--{prefix}-loss", repr(self.loss),
               f"--{prefix}-queue-bytes", str(self.queue_bytes),
               f"--{prefix}-reorder", repr(self.reorder),
               f"--{prefix}-reorder-ms", repr(self.reorder_ms)]
        if self.rate is not None:
            out += [f"--{prefix}-rate", repr(float(self.rate))]
        return out


@dataclass(frozen=True)
class Counters:
    """One direction's datagrams, as the forwarder counted them (datagrams, not GRO runs):
    ``datagrams_in == lost + overflowed + datagrams_out + send_errors + pending``."""

    datagrams_in: int = 0
    bytes_in: int = 0
    lost: int = 0
    overflowed: int = 0
    """Dropped: the bottleneck queue (or the forwarder's memory bound) was full."""
    reordered: int = 0
    datagrams_out: int = 0
    bytes_out: int = 0
    send_errors: int = 0
    pending: int = 0
    """Still queued when the forwarder stopped (not sent)."""

    @property
    def dropped(self) -> int:
        """Every datagram the impairments dropped."""
        return self.lost + self.overflowed


def build(force: bool = False) -> Path:
    """The forwarder's executable, compiled first if missing or older than its source."""
    if (not force and BINARY.exists()
            and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime):
        return BINARY
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise ForwarderUnavailable("no C compiler (cc, gcc or $CC) to build tools/wanem.c")
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=BINARY.parent, prefix=".kvcs-wanem-")
    os.close(fd)
    try:
        done = subprocess.run([compiler, *CFLAGS, "-o", tmp, str(SOURCE)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise ForwarderUnavailable(f"{compiler} failed on tools/wanem.c: "
                                       f"{done.stderr.strip()[:500]}")
        os.replace(tmp, BINARY)  # atomic: another process may be building it too
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return BINARY


class WanForwarder:
    """``kvcs-wanem`` from its own port on ``listen_host`` (``port`` once started) to
    ``target_host:target_port``. ``gro=False`` makes it handle each datagram alone (for
    comparisons; a rate limit does so anyway)."""

    def __init__(self, target_host: str, target_port: int, *, seed: int = 1,
                 up: Link | None = None, down: Link | None = None,
                 listen_host: str = "127.0.0.1", gro: bool = True) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.seed = seed
        self.up = up or Link()
        self.down = down or Link()
        self.listen_host = listen_host
        self.gro = gro
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None
        self._counters: dict[str, Counters] | None = None

    def command(self) -> list[str]:
        """The forwarder's command line."""
        host = f"[{self.target_host}]" if ":" in self.target_host else self.target_host
        listen = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return [str(build()), "--target", f"{host}:{self.target_port}",
                "--listen", f"{listen}:0", "--seed", str(self.seed), "--exit-on-stdin-eof",
                *self.up.options("up"), *self.down.options("down"),
                *([] if self.gro else ["--no-gro"])]

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("WanForwarder not started")
        return self._proc.pid

    def open(self) -> None:
        """Start the forwarder and wait until it listens (blocking)."""
        if self._proc is not None:
            raise RuntimeError("WanForwarder already started")
        proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        words = proc.stdout.readline().split()
        if len(words) != 3 or words[0] != "listening":
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise RuntimeError(f"kvcs-wanem did not start: {err.strip()}")
        self.port = int(words[2])
        self._proc = proc

    def close(self) -> None:
        """Stop the forwarder (SIGTERM) and read its counters; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate(timeout=5)
        last = out.strip().splitlines()[-1:] if out else []
        if proc.returncode != 0 or not last:
            raise RuntimeError(f"kvcs-wanem exited with {proc.returncode}: {err.strip()}")
        data = json.loads(last[0])
        names = {f.name for f in fields(Counters)}
        self._counters = {side: Counters(**{k: v for k, v in data[side].items() if k in names})
                          for side in ("up", "down")}

    def _side(self, side: str) -> Counters:
        if self._counters is None:
            raise RuntimeError("the counters are read when the forwarder stops")
        return self._counters[side]

    @property
    def up_counters(self) -> Counters:
        """Client -> target, once stopped."""
        return self._side("up")

    @property
    def down_counters(self) -> Counters:
        """Target -> client, once stopped."""
        return self._side("down")

    def cpu_seconds(self) -> float:
        """CPU seconds the forwarder has used so far."""
        from bench._proc import process_cpu_seconds

        return process_cpu_seconds(self.pid)

    async def start(self) -> None:
        await asyncio.to_thread(self.open)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> WanForwarder:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> WanForwarder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# --------------------------------------------------------------------------- capacity

UDP_SEGMENT = 103  # linux/udp.h
UDP_GRO = 104
BLAST_DATAGRAM = 1452
BLAST_SEGMENTS = 44  # 44 x 1452 = 63,888 bytes per sendmsg: under the 64 KiB UDP limit


def _sink(conn: Any) -> None:
    """Child: count bytes arriving on a GRO socket until 1 s of silence after the first."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    sock.bind(("127.0.0.1", 0))
    conn.send(sock.getsockname()[1])
    got, first, last = 0, 0.0, 0.0
    sock.settimeout(30.0)
    buf = bytearray(65536)
    with contextlib.suppress(TimeoutError):
        while True:
            n = sock.recv_into(buf)
            last = time.perf_counter()
            if not got:
                first = last
                sock.settimeout(1.0)
            got += n
    conn.send((got, first, last))


def _sender(conn: Any, port: int, seconds: float, gso: bool) -> None:
    """Child: send 1452-byte datagrams to ``port`` for ``seconds``, as fast as the socket
    takes them (GSO runs of 44, or one per call); report bytes offered."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MiB)
    sock.connect(("127.0.0.1", port))
    run = bytes(BLAST_DATAGRAM * BLAST_SEGMENTS)
    one = run[:BLAST_DATAGRAM]
    ancillary = [(socket.SOL_UDP, UDP_SEGMENT, BLAST_DATAGRAM.to_bytes(2, sys.byteorder))]
    sent = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(64):
            with contextlib.suppress(BlockingIOError):
                sent += sock.sendmsg([run], ancillary) if gso else sock.send(one)
    conn.send(sent)


def blast(seconds: float = 2.0, gso: bool = True, gro: bool = True,
          delay_ms: float = 0.0) -> dict[str, Any]:
    """The forwarder's own capacity: a sender and a sink (each in its own process) push
    1452-byte datagrams through it (no loss) for ``seconds``; MiB/s delivered, the
    forwarder's CPU ms per MiB, and the machine's load."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    sink_conn, child = ctx.Pipe()
    sink = ctx.Process(target=_sink, args=(child,), daemon=True)
    sink.start()
    sink_port = sink_conn.recv()
    load = os.getloadavg()[0]
    link = Link(delay_ms=delay_ms)
    with WanForwarder("127.0.0.1", sink_port, up=link, down=link, gro=gro) as wan:
        cpu0 = wan.cpu_seconds()
        send_conn, child = ctx.Pipe()
        sender = ctx.Process(target=_sender, args=(child, wan.port, seconds, gso), daemon=True)
        sender.start()
        offered = send_conn.recv()
        sender.join()
        got, first, last = sink_conn.recv()
        cpu = wan.cpu_seconds() - cpu0
    sink.join()
    mib = got / MiB
    return {"offered_mib": round(offered / MiB, 1), "delivered_mib": round(mib, 1),
            "mib_s": round(mib / (last - first), 1) if last > first else 0.0,
            "forwarder_cpu_ms_per_mib": round(cpu * 1000 / mib, 3) if mib else None,
            "sender_gso": gso, "forwarder_gro": gro, "delay_ms": delay_ms,
            "datagram_size": BLAST_DATAGRAM, "counters": asdict(wan.up_counters),
            "load_average": [round(load, 1), round(os.getloadavg()[0], 1)],
            "cpus": os.cpu_count()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wanem")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="compile tools/wanem.c into build/wanem/")
    b = sub.add_parser("blast", help="measure the forwarder's own capacity")
    b.add_argument("--seconds", type=float, default=2.0)
    b.add_argument("--delay-ms", type=float, default=0.0)
    b.add_argument("--no-gso", action="store_true", help="the sender sends one datagram a call")
    b.add_argument("--no-gro", action="store_true", help="the forwarder reads one at a time")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build(force=True))
            return 0
        print(json.dumps(blast(args.seconds, not args.no_gso, not args.no_gro,
                               args.delay_ms), indent=2))
    except ForwarderUnavailable as exc:
        print(f"kvcs-wanem: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
