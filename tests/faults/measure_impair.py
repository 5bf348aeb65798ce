"""Pass-through throughput of the impairment proxy (no impairment set), against the same
traffic without it: ``.venv/bin/python -m tests.faults.measure_impair``.

1. UDP: a sender and a sink in a child process (own CPU core), the proxy in this one; the
   sender offers more than the proxy forwards, so the delivered rate is its ceiling.
2. QUIC: a kvcs publish/subscribe through a local relay, everything in one process as in
   the tests, the subscriber directly or through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kvcs.moqt.wire import LocationFilter, ObjectStatus, Parameters
from kvcs.transport import QuicSettings

from .conftest import FaultNet
from .impair import SOCKET_BUFFER, ImpairmentProxy

KiB = 1024
MiB = 1024 * KiB
_MAX_UDP = 65535


def _blast(size: int, seconds: float, conn: Any) -> None:
    """Child process: bind a sink, tell the parent its port, get the port to send to,
    send ``size``-byte datagrams as fast as the socket takes them for ``seconds`` while a
    thread counts what reaches the sink; report (offered bytes, received bytes, seconds
    from first to last received)."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(0.5)
    conn.send(sink.getsockname()[1])
    port = conn.recv()
    got = [0, 0.0, 0.0]  # bytes, first, last

    def receive() -> None:
        with contextlib.suppress(OSError):  # TimeoutError: the sender stopped
            while True:
                n = len(sink.recv(_MAX_UDP))
                now = time.perf_counter()
                if not got[0]:
                    got[1] = now
                got[0] += n
                got[2] = now

    reader = threading.Thread(target=receive)
    reader.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.connect(("127.0.0.1", port))
    payload = b"x" * size
    offered, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(64):
            sock.send(payload)
        offered += 64 * size
    reader.join()
    sock.close()
    sink.close()
    conn.send((offered, got[0], got[2] - got[1]))


async def _udp_pass_through(size: int, seconds: float, *, via_proxy: bool) -> tuple[float, float]:
    """(MiB/s delivered, share of the offered bytes delivered) from a sender to a sink,
    both in another process, directly or through an unimpaired proxy in this one."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_blast, args=(size, seconds, child))
    proc.start()

    async def recv() -> Any:
        while not parent.poll():
            await asyncio.sleep(0.005)
        return parent.recv()

    sink_port = await recv()
    proxy = ImpairmentProxy("127.0.0.1", sink_port, seed=0)
    await proxy.start()
    try:
        parent.send(proxy.port if via_proxy else sink_port)
        offered, received, elapsed = await recv()
    finally:
        proc.join(5)
        await proxy.aclose()
    return received / MiB / max(elapsed, 1e-9), received / max(offered, 1)


async def _quic_transfer(mib: int, *, via_proxy: bool, loopback: bool) -> float:
    """MiB/s of a kvcs publish/subscribe through a local relay (one process, as in the
    tests; QUIC loopback or internet preset), the subscriber directly or through an
    unimpaired proxy."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = QuicSettings.loopback() if loopback else QuicSettings()
        async with FaultNet(Path(tmp), settings) as net:
            relay = await net.relay()
            pub = await net.client(relay)
            if via_proxy:
                sub_ep = await net.client_via(await net.proxy(relay, seed=0))
            else:
                sub_ep = await net.client(relay)
            ns = (b"bench",)
            await pub.announce(ns)
            track = pub.create_track(ns, b"t")
            sub = await sub_ep.subscribe(
                ns, b"t", location_filter=LocationFilter.next_object(),
                fill=Parameters(location_filter=LocationFilter.none()))
            collected = asyncio.create_task(sub.collect(timeout=120))
            chunk = bytes(256 * KiB)
            start = time.perf_counter()
            for g in range(mib):
                for o in range(4):
                    pub.publish(track, g, o, chunk)
                await pub.drain(4 * MiB)
            pub.publish(track, mib, 0, b"", status=ObjectStatus.END_OF_TRACK)
            got = sum(len(o.payload) for o in await collected)
            elapsed = time.perf_counter() - start
    assert got == mib * MiB, got
    return mib / elapsed


async def _main() -> None:
    for size in (1350, 60000):
        for via in (False, True):
            rate, share = await _udp_pass_through(size, 2.0, via_proxy=via)
            route = "through the proxy" if via else "direct (no proxy)"
            print(f"UDP {size:5d}-byte datagrams, {route}: {rate:7.1f} MiB/s delivered "
                  f"({share:.0%} of offered)")
    for loopback in (True, False):
        preset = "loopback preset" if loopback else "internet preset (1350 bytes)"
        for via in (False, True, False, True):
            route = "subscriber through the proxy" if via else "direct"
            rate = await _quic_transfer(32, via_proxy=via, loopback=loopback)
            print(f"QUIC relay publish/subscribe, {preset}, {route}: {rate:6.1f} MiB/s")

if __name__ == "__main__":
    asyncio.run(_main())
