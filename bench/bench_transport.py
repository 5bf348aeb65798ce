"""Raw transport ceiling: one unidirectional stream over the kvcs QUIC binding on loopback.

The sending client runs in a child process and the receiving server in the calling one
(each has its own CPU core, like the reference aioquic figures), through
:mod:`kvcs.transport` (scheduler included) with a sink session that only counts bytes;
``separate=False`` puts both in one event loop.
MOQT benchmarks compare against :func:`raw_stream_throughput` with the same settings.

Run: ``.venv/bin/python -m bench.bench_transport``
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from bench._proc import CHILD_TIMEOUT, child_process, run_child, wait_message
from bench._quic import ETHERNET_DATAGRAM, LIBRARY_ENV, QUIC_LIBRARY, quic_settings
from kvcs.moqt.actions import Action, SendStreamData, StreamOpener
from kvcs.transport import (
    ConnectionInfo,
    MoqtConnection,
    QuicSettings,
    connect,
    ensure_dev_certificate,
    serve,
)
from kvcs.transport.config import INTERNET_DATAGRAM_SIZE

logger = logging.getLogger(__name__)

MiB = 1024 * 1024

JUMBO_DATAGRAM = 8952
"""UDP payload of a 9000-byte jumbo-frame MTU over IPv6 (9000 - 40 - 8)."""

SETTINGS: dict[str, QuicSettings] = {
    "aioquic": QuicSettings.aioquic_defaults(),
    "default": QuicSettings(max_datagram_size=INTERNET_DATAGRAM_SIZE),  # off loopback
    "loopback": quic_settings(),
    "ethernet": quic_settings(ETHERNET_DATAGRAM),
    "ethernet-no-gso": dataclasses.replace(quic_settings(ETHERNET_DATAGRAM), gso=False),
    "jumbo": quic_settings(JUMBO_DATAGRAM),
    "jumbo-no-gso": dataclasses.replace(quic_settings(JUMBO_DATAGRAM), gso=False),
}
"""Named settings: aioquic's own defaults, kvcs's defaults (1350-byte datagrams), the
loopback preset, and the loopback preset with Ethernet-sized (1452-byte) and jumbo-frame
(8952-byte) datagrams, each with and without packet batching (UDP GSO/GRO)."""


CPU_US_PER_MIB: dict[str, dict[str, float]] = {}
"""CPU microseconds per MiB moved, by benchmark and role (sender, receiver), from the
last separate-process run: a measure that a busy machine disturbs less than MiB/s."""


def record_cpu(run: str, payload: int, **roles: float) -> None:
    """Store CPU seconds per role of a run that moved ``payload`` bytes."""
    mib = payload / MiB
    CPU_US_PER_MIB[run] = {k: round(v / mib * 1e6) for k, v in roles.items()}


class CountingSink:
    """Sans-IO stand-in session that counts received stream bytes. ``done`` is the time
    ``total`` bytes had arrived (on any number of streams), or, without ``total``, the
    time of the first FIN. The sending side appends its actions to ``out``."""

    def __init__(self, total: int | None = None) -> None:
        self.total = total
        self.received = 0
        self.done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.out: list[Action] = []

    def stream_data(self, stream_id: int, data: bytes, end: bool) -> None:
        self.received += len(data)
        finished = end if self.total is None else self.received >= self.total
        if finished and not self.done.done():
            self.done.set_result(time.perf_counter())

    def stream_reset(self, stream_id: int, code: int) -> None:
        pass

    def stop_sending(self, stream_id: int, code: int) -> None:
        pass

    def datagram(self, data: bytes) -> None:
        pass

    def connection_lost(self, code: int | None, reason: str) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"lost: {code} {reason}"))
            self.done.exception()  # the client-side sink is never awaited

    def actions(self) -> list[Action]:
        out, self.out = self.out, []
        return out


async def _send(conn: MoqtConnection, total_bytes: int) -> float:
    """Write ``total_bytes`` on a new uni stream with back-pressure; return the start time."""
    stream_id = conn.open_stream(unidirectional=True)
    client = conn.session
    assert isinstance(client, CountingSink)
    chunk = bytes(1 * MiB)
    sent = 0
    start = time.perf_counter()
    while sent < total_bytes:
        n = min(len(chunk), total_bytes - sent)
        sent += n
        client.out.append(
            SendStreamData(stream_id, memoryview(chunk)[:n], end=sent >= total_bytes)
        )
        conn.flush()
        await conn.drain(4 * MiB)
    return start


def _sink_factory(
    sinks: list[CountingSink],
) -> Callable[[StreamOpener, ConnectionInfo], CountingSink]:
    def factory(opener: StreamOpener, info: ConnectionInfo) -> CountingSink:
        sink = CountingSink()
        sinks.append(sink)
        return sink

    return factory


async def _sender_main(
    conn: Connection, url: str, settings: QuicSettings, pin: str, total_bytes: int
) -> None:
    sinks: list[CountingSink] = []
    async with connect(url, _sink_factory(sinks), settings, pin_sha256=pin) as quic:
        cpu = time.process_time()
        start = await _send(quic, total_bytes)
        await wait_message(conn)  # the receiver saw FIN
        conn.send((start, time.process_time() - cpu))


def _sender_process(
    conn: Connection, url: str, settings: QuicSettings, pin: str, total_bytes: int
) -> None:
    run_child(conn, _sender_main(conn, url, settings, pin, total_bytes))


async def raw_stream_throughput(
    settings: QuicSettings,
    total_bytes: int = 256 * MiB,
    webtransport: bool = False,
    *,
    separate: bool = True,
) -> float:
    """Send ``total_bytes`` on one uni stream client->server; return MiB/s (first write to
    the server seeing FIN).

    ``separate`` (default): the sending client runs in a child process and the receiving
    server in this one (one CPU core each). ``separate=False``: both in this event loop.
    """
    with tempfile.TemporaryDirectory() as tmp:
        cert = ensure_dev_certificate(tmp)
        sinks: list[CountingSink] = []
        server = await serve(
            "127.0.0.1", 0, _sink_factory(sinks), settings, str(cert.certfile),
            str(cert.keyfile)
        )
        try:
            scheme = "https" if webtransport else "moqt"
            url = f"{scheme}://127.0.0.1:{server.port}/bench"
            if separate:
                async with child_process(
                    _sender_process, url, settings, cert.sha256, total_bytes
                ) as child:
                    cpu = time.process_time()
                    while not sinks:
                        await asyncio.sleep(0.001)
                    finished = await asyncio.wait_for(sinks[-1].done, CHILD_TIMEOUT)
                    cpu = time.process_time() - cpu
                    child.send("done")
                    start, sender_cpu = await child.recv()
                    record_cpu("raw", total_bytes, sender=sender_cpu, receiver=cpu)
            else:
                async with connect(
                    url, _sink_factory([]), settings, pin_sha256=cert.sha256
                ) as conn:
                    start = await _send(conn, total_bytes)
                    while not sinks:
                        await asyncio.sleep(0.001)
                    finished = await asyncio.wait_for(sinks[-1].done, 120)
            assert sinks[-1].received == total_bytes
        finally:
            await server.aclose()
    return total_bytes / MiB / (finished - start)


@dataclasses.dataclass(frozen=True)
class RawRun:
    """One raw single-stream run: MiB/s and each side's CPU milliseconds per MiB moved."""

    mib_s: float
    sender_ms_per_mib: float
    receiver_ms_per_mib: float


def raw_run(library: str, settings_name: str = "loopback",
            total_bytes: int = 256 * MiB) -> RawRun:
    """Raw stream MiB/s and CPU per MiB of sender and receiver on QUIC library
    ``library`` (``aioquic`` or ``qh3``), measured in a fresh process (the library is
    bound per process), with the named settings."""
    env = dict(os.environ, **{LIBRARY_ENV: library})
    out = subprocess.run(
        [sys.executable, "-m", "bench.bench_transport", "--raw", settings_name,
         str(total_bytes)], env=env, capture_output=True, text=True, check=True,
        timeout=CHILD_TIMEOUT)
    mib_s, sender_us, receiver_us = out.stdout.strip().splitlines()[-1].split()
    return RawRun(float(mib_s), float(sender_us) / 1000, float(receiver_us) / 1000)


def raw_ceiling(library: str, settings_name: str = "loopback",
                total_bytes: int = 256 * MiB) -> float:
    """Raw stream MiB/s (:func:`raw_run`)."""
    return raw_run(library, settings_name, total_bytes).mib_s


def main(settings_name: str | None = None, total_bytes: int = 256 * MiB) -> dict[str, float]:
    """Measure raw-QUIC stream throughput for one or all named settings; print and return
    ``{name: MiB/s}`` (on this process's QUIC library)."""
    names = [settings_name] if settings_name else list(SETTINGS)
    results: dict[str, float] = {}
    for name in names:
        size = total_bytes if name != "aioquic" else min(total_bytes, 64 * MiB)
        results[name] = asyncio.run(raw_stream_throughput(SETTINGS[name], size))
        print(f"raw QUIC uni stream ({QUIC_LIBRARY}), {name:15s} settings: "
              f"{results[name]:8.1f} MiB/s")
    for size in ("ethernet", "jumbo"):
        if size in results and f"{size}-no-gso" in results:
            speedup = results[size] / results[f"{size}-no-gso"]
            results["gso_speedup" if size == "ethernet" else f"gso_speedup_{size}"] = speedup
            print(f"UDP GSO/GRO speedup at {size} size: {speedup:.2f}x")
    return results


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--raw":  # used by raw_run()
        mib_s = asyncio.run(raw_stream_throughput(SETTINGS[sys.argv[2]], int(sys.argv[3])))
        cpu = CPU_US_PER_MIB["raw"]
        print(mib_s, cpu["sender"], cpu["receiver"])
    else:
        main()
