"""aiopquic weighed against qh3 (issue #28): raw one-stream throughput and CPU per MiB, on
loopback and through the long-haul forwarder (:class:`bench.wanem.WanForwarder`), in one run.

aiopquic (picoquic in C on its own network thread, asyncio over rings) owns its UDP sockets
and timers, so it cannot sit behind kvcs's sans-IO adapter (kvcs/transport/quic/base.py):
it is measured standalone, through its own ``connect``/``serve``; qh3 through the kvcs
binding (scheduler included), as ``bench.bench_transport`` does. One unidirectional stream,
client -> server; the sender in a spawned child process, the receiver in this one (a core
each). CPU is process CPU time (every thread: picoquic's network thread included), from
the first write (sender) or from before the handshake (receiver) to the last byte, per MiB
moved: a figure a loaded machine distorts less than MiB/s.

Needs Python >= 3.12 with aiopquic installed (not a kvcs dependency)::

    /root/.pyenv/versions/3.12.1/bin/python3.12 -m venv .venv312
    .venv312/bin/pip install -e '.[test]' aiopquic==0.6.1
    .venv312/bin/python -m bench.bench_aiopquic [--mib 128] [--wan-mib 16] [--json out.json]

The results and the decision are in docs/perf-profile.md ("aiopquic, weighed").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

from bench._proc import CHILD_TIMEOUT, child_process, run_child, wait_message
from bench._quic import ETHERNET_DATAGRAM, quic_settings
from bench.bench_transport import CountingSink, _send, _sink_factory
from bench.wanem import Link, WanForwarder, build
from kvcs.transport import QuicSettings, connect, ensure_dev_certificate, serve

MiB = 1 << 20
ALPN = "kvcs-bench"
CHUNK = 1 * MiB
"""Bytes per write (aiopquic refuses one write above its 4 MiB stream ring)."""


# ------------------------------------------------------------------------------ aiopquic


def _aiopquic_config(is_client: bool, cc: str, **extra: Any) -> Any:
    from aiopquic.quic.configuration import QuicConfiguration

    return QuicConfiguration(is_client=is_client, alpn_protocols=[ALPN],
                             congestion_control_algorithm=cc, idle_timeout=60.0, **extra)


async def _aiopquic_sender(conn: Connection, port: int, total: int, cc: str) -> None:
    from aiopquic.asyncio import connect as pconnect

    config = _aiopquic_config(True, cc, verify_mode=ssl.CERT_NONE, server_name="localhost")
    async with pconnect("127.0.0.1", port, configuration=config) as proto:
        quic = proto._quic  # the protocol's connection: aiopquic's documented raw path
        sid = quic.get_next_available_stream_id(is_unidirectional=True)
        chunk = bytes(CHUNK)
        cpu = time.process_time()
        start = time.perf_counter()
        sent = 0
        while sent < total:
            n = min(CHUNK, total - sent)
            sent += n
            await quic.send_stream_data_drained(sid, chunk[:n] if n < CHUNK else chunk,
                                                end_stream=sent >= total)
        await wait_message(conn)  # the receiver has every byte
        conn.send((start, time.process_time() - cpu))


def _aiopquic_sender_process(conn: Connection, port: int, total: int, cc: str) -> None:
    run_child(conn, _aiopquic_sender(conn, port, total, cc))


async def aiopquic_run(total: int, cc: str = "bbr1", wan: Link | None = None,
                       seed: int = 28) -> dict[str, Any]:
    """One aiopquic stream of ``total`` bytes (through the forwarder when ``wan``)."""
    from aiopquic.asyncio import QuicConnectionProtocol
    from aiopquic.asyncio import serve as pserve
    from aiopquic.quic.events import StreamDataReceived

    loop = asyncio.get_running_loop()
    state = {"received": 0}
    done: asyncio.Future[float] = loop.create_future()

    class Sink(QuicConnectionProtocol):  # type: ignore[misc]
        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, StreamDataReceived):
                state["received"] += len(event.data)
                if state["received"] >= total and not done.done():
                    done.set_result(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        cert = ensure_dev_certificate(tmp)
        config = _aiopquic_config(False, cc, certificate_file=str(cert.certfile),
                                  private_key_file=str(cert.keyfile),
                                  ip_family=socket.AF_INET)
        port = _free_port()
        server = await pserve("127.0.0.1", port, configuration=config, create_protocol=Sink)
        try:
            return await _run_pair(_aiopquic_sender_process, port, total, cc, wan, seed,
                                   done, state)
        finally:
            server.close()


def _free_port() -> int:
    """A UDP port free on 127.0.0.1 now: aiopquic's ``serve`` ignores its host and binds
    the wildcard address on the port it is given, and does not say which port 0 picked
    (run this module under ``unshare -n`` to keep it off every other interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------ qh3 (kvcs)


async def _qh3_sender(conn: Connection, url: str, settings: QuicSettings, pin: str,
                      total: int) -> None:
    sinks: list[CountingSink] = []
    async with connect(url, _sink_factory(sinks), settings, pin_sha256=pin) as quic:
        cpu = time.process_time()
        start = await _send(quic, total)
        await wait_message(conn)
        conn.send((start, time.process_time() - cpu))


def _qh3_sender_process(conn: Connection, url: str, settings: QuicSettings, pin: str,
                        total: int) -> None:
    run_child(conn, _qh3_sender(conn, url, settings, pin, total))


async def qh3_run(total: int, settings: QuicSettings, wan: Link | None = None,
                  seed: int = 28) -> dict[str, Any]:
    """One stream of ``total`` bytes over the kvcs binding (qh3 unless ``settings`` name
    another library)."""
    with tempfile.TemporaryDirectory() as tmp:
        cert = ensure_dev_certificate(tmp)
        sinks: list[CountingSink] = []
        server = await serve("127.0.0.1", 0, _sink_factory(sinks), settings,
                             str(cert.certfile), str(cert.keyfile))
        loop = asyncio.get_running_loop()
        done: asyncio.Future[float] = loop.create_future()
        state = {"received": 0}

        async def watch() -> None:
            while not sinks:
                await asyncio.sleep(0.001)
            sinks[-1].total = total
            finished = await sinks[-1].done
            state["received"] = sinks[-1].received
            done.set_result(finished)

        watcher = asyncio.create_task(watch())
        try:
            def target(port: int) -> tuple[Any, ...]:
                return (f"moqt://127.0.0.1:{port}/bench", settings, cert.sha256, total)
            return await _run_pair(_qh3_sender_process, server.port, None, None, wan, seed,
                                   done, state, args=target)
        finally:
            watcher.cancel()
            await server.aclose()


# ------------------------------------------------------------------------------ common


async def _run_pair(sender: Any, port: int, total: int | None, cc: str | None,
                    wan: Link | None, seed: int, done: asyncio.Future[float],
                    state: dict[str, int], args: Any = None) -> dict[str, Any]:
    """Start the sender child against ``port`` (or the forwarder in front of it), wait for
    every byte, return MiB/s and CPU ms per MiB of both sides."""
    forwarder = WanForwarder("127.0.0.1", port, seed=seed, up=wan, down=wan) if wan else None
    if forwarder is not None:
        await forwarder.start()
    try:
        target = forwarder.port if forwarder is not None else port
        child_args = args(target) if args is not None else (target, total, cc)
        async with child_process(sender, *child_args) as child:
            cpu = time.process_time()
            finished = await asyncio.wait_for(done, CHILD_TIMEOUT)
            receiver_cpu = time.process_time() - cpu
            child.send("done")
            start, sender_cpu = await child.recv()
    finally:
        if forwarder is not None:
            await forwarder.aclose()
    moved = state["received"] / MiB
    out: dict[str, Any] = {
        "mib": round(moved, 1), "mib_s": round(moved / (finished - start), 1),
        "sender_cpu_ms_per_mib": round(sender_cpu / moved * 1e3, 2),
        "receiver_cpu_ms_per_mib": round(receiver_cpu / moved * 1e3, 2)}
    if forwarder is not None:
        out["lost_up"] = forwarder.up_counters.lost
        out["lost_down"] = forwarder.down_counters.lost
        out["datagrams_up"] = forwarder.up_counters.datagrams_in
        out["bytes_per_datagram_up"] = round(forwarder.up_counters.bytes_in
                                             / max(1, forwarder.up_counters.datagrams_in))
    return out


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_aiopquic")
    parser.add_argument("--mib", type=int, default=128,
                        help="loopback stream size (0: no loopback runs)")
    parser.add_argument("--wan-mib", type=int, default=16, help="long-haul stream size")
    parser.add_argument("--profiles", default="80:0.001",
                        help="long-haul RTT_ms:loss list, comma-separated ('' for none)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--wan-cases", default="aiopquic_bbr1,aiopquic_newreno,qh3_1452",
                        help="long-haul runs, comma-separated (also: aioquic_cubic_1452)")
    parser.add_argument("--json", help="write the figures here")
    opts = parser.parse_args(argv)
    import aiopquic

    results: dict[str, Any] = {"python": sys.version.split()[0],
                               "aiopquic": getattr(aiopquic, "__version__", "?"),
                               "load_average_start": [round(x, 2) for x in os.getloadavg()],
                               "loopback": {}, "wan": {}}
    loop_total = opts.mib * MiB
    cases: dict[str, Any] = {
        "aiopquic_bbr1": lambda t, w: aiopquic_run(t, "bbr1", w),
        "aiopquic_newreno": lambda t, w: aiopquic_run(t, "newreno", w),
        "qh3_loopback": lambda t, w: qh3_run(t, quic_settings(), w),
        "qh3_1452": lambda t, w: qh3_run(t, quic_settings(ETHERNET_DATAGRAM), w),
        # aioquic's cubic: the best controller the kvcs adapters offer today
        "aioquic_cubic_1452": lambda t, w: qh3_run(t, QuicSettings.loopback(
            library="aioquic", max_datagram_size=ETHERNET_DATAGRAM, congestion_control="cubic"),
            w),
    }
    wan_cases = opts.wan_cases.split(",")
    if unknown := set(wan_cases) - set(cases):
        parser.error(f"unknown --wan-cases {sorted(unknown)}: choose from {sorted(cases)}")
    for _rep in range(opts.repeat if opts.mib else 0):
        for name in ("aiopquic_bbr1", "qh3_loopback", "qh3_1452"):
            r = asyncio.run(cases[name](loop_total, None))
            r["load_average"] = round(os.getloadavg()[0], 2)
            results["loopback"].setdefault(name, []).append(r)
            print(f"loopback {name:17s} {json.dumps(r)}", flush=True)
    if opts.profiles:
        build()
        wan_total = opts.wan_mib * MiB
        for profile in opts.profiles.split(","):
            rtt, loss = profile.split(":")
            link = Link.profile(float(rtt), float(loss))
            key = f"rtt{rtt}_loss{float(loss):g}"
            for _rep in range(opts.repeat):
                for name in wan_cases:
                    try:
                        r = asyncio.run(cases[name](wan_total, link))
                    except Exception as exc:  # a library failing a profile is a result
                        r = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    r["load_average"] = round(os.getloadavg()[0], 2)
                    results["wan"].setdefault(key, {}).setdefault(name, []).append(r)
                    print(f"{key} {name:17s} {json.dumps(r)}", flush=True)
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
