"""Relay throughput: one subscriber through the relay vs direct, and fan-out 1 -> 8.

Every party has its own process: the kvcs relay (:mod:`bench._relays`), the publisher (a
child process) and the subscribers (the calling process; direct: its server endpoint
subscribes to the publishing client). 32 KiB objects, 64 per group, the loopback preset.
``relay_fanout8_ratio``: the aggregate egress to 8 subscribers / 8x the one-subscriber
rate (1.0: the relay serves 8 as fast as one each).
Run: ``.venv/bin/python -m bench.bench_relay``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

from bench._proc import CHILD_TIMEOUT, child_process, run_child, wait_message
from bench._quic import quic_settings
from bench._relays import RelayProcess, relay_process
from kvcs.endpoint import Endpoint, serve_endpoints
from kvcs.moqt.wire import LocationFilter, ObjectStatus, Parameters
from kvcs.transport import DevCertificate, ensure_dev_certificate

OBJECT_SIZE = 32 * 1024
PER_GROUP = 64
NS = (b"kvcs-1", b"\x42" * 16)
SETTINGS = quic_settings()
WHOLE = Parameters(location_filter=LocationFilter.none())


CPU_US_PER_MIB: dict[str, dict[str, float]] = {}
"""CPU microseconds per MiB of track payload, by run and role (publisher, subscribers,
relay), filled by :func:`direct` and :func:`via_relay`. Robust to a busy machine: on 2
cores the 3 processes of the relay run compete for CPU, the 2 of the direct run do not."""


def _record_cpu(run: str, payload: int, publisher: float, subscribers: float,
                relay: float | None = None) -> None:
    mib = payload / 2**20
    roles = {"publisher": publisher, "subscribers": subscribers}
    if relay is not None:
        roles["relay"] = relay
    CPU_US_PER_MIB[run] = {k: round(v / mib * 1e6) for k, v in roles.items()}


async def _produce(pub: Endpoint, track: Any, groups: int, flush_ep: Endpoint) -> None:
    payload = memoryview(bytes(OBJECT_SIZE))
    for g in range(groups):
        for o in range(PER_GROUP):
            pub.publish(track, g, o, payload)
        # like the KV publisher: the subgroup stream ends with its group
        pub.publish(track, g, PER_GROUP, b"", status=ObjectStatus.END_OF_GROUP)
        flush_ep.schedule_flush()
        await flush_ep.drain(8 << 20)
    pub.publish(track, groups, 0, b"", status=ObjectStatus.END_OF_TRACK)
    flush_ep.flush()


async def _consume(sub_ep: Endpoint, name: bytes) -> int:
    sub = await sub_ep.subscribe(NS, name, location_filter=LocationFilter.next_object(),
                                 fill=WHOLE)
    n = 0
    async for obj in sub:
        n += len(obj.payload)
    return n


async def _publisher_main(conn: Connection, url: str, pin: str, groups: int, name: bytes,
                          announce: bool) -> None:
    """Child: connect (and announce to a relay), wait for "go", publish, report the start."""
    pub = await Endpoint.connect(url, pin_sha256=pin, settings=SETTINGS)
    if announce:
        await pub.announce(NS)
    track = pub.create_track(NS, name)
    conn.send("ready")
    await wait_message(conn)
    start, cpu = time.perf_counter(), time.process_time()
    await _produce(pub, track, groups, pub)
    conn.send((start, time.process_time() - cpu))
    await wait_message(conn)  # the subscribers got everything
    pub.close()
    await pub.wait_closed()


def _publisher_process(conn: Connection, url: str, pin: str, groups: int, name: bytes,
                       announce: bool) -> None:
    run_child(conn, _publisher_main(conn, url, pin, groups, name, announce))


async def direct(cert: DevCertificate, groups: int) -> float:
    """Publisher (child process, client) serving this process's server endpoint; MiB/s."""
    eps: list[Endpoint] = []
    server = await serve_endpoints("127.0.0.1", 0, eps.append, certfile=str(cert.certfile),
                                   keyfile=str(cert.keyfile), settings=SETTINGS)
    try:
        url = f"moqt://127.0.0.1:{server.port}/"
        async with child_process(_publisher_process, url, cert.sha256, groups, b"direct",
                                 False) as child:
            await child.recv()  # ready
            while not eps or eps[-1].peer_setup is None:
                await asyncio.sleep(0.001)
            consumer = asyncio.create_task(_consume(eps[-1], b"direct"))
            await asyncio.sleep(0.05)
            cpu = time.process_time()
            child.send("go")
            n = await asyncio.wait_for(consumer, CHILD_TIMEOUT)
            t1 = time.perf_counter()
            t0, pub_cpu = await child.recv()
            _record_cpu("direct", n, pub_cpu, time.process_time() - cpu)
            child.send("done")
    finally:
        await server.aclose()
    return n / (t1 - t0) / 2**20


async def via_relay(relay: RelayProcess, groups: int, subscribers: int, name: bytes) -> float:
    """Publisher (child process) -> relay (own process) -> N subscribers (this process);
    aggregate subscriber MiB/s; the relay's CPU time is recorded too."""
    url = relay.url
    async with child_process(_publisher_process, url, relay.pin, groups, name, True) as child:
        await child.recv()  # ready (announced)
        subs = [await Endpoint.connect(url, pin_sha256=relay.pin, settings=SETTINGS)
                for _ in range(subscribers)]
        consumers = [asyncio.create_task(_consume(s, name)) for s in subs]
        await asyncio.sleep(0.2)
        cpu, relay_cpu = time.process_time(), relay.cpu_seconds()
        child.send("go")
        total = sum(await asyncio.wait_for(asyncio.gather(*consumers), CHILD_TIMEOUT))
        t1 = time.perf_counter()
        t0, pub_cpu = await child.recv()
        _record_cpu(f"relay_{subscribers}sub", total // subscribers, pub_cpu,
                    time.process_time() - cpu, relay.cpu_seconds() - relay_cpu)
        child.send("done")
        for ep in subs:
            ep.close()
        for ep in subs:
            await ep.wait_closed()
    return total / (t1 - t0) / 2**20


def main(groups: int = 40, relay_library: str | None = None) -> dict[str, Any]:
    """Print and return the relay figures (MiB/s and ratios).

    ``relay_library`` runs the relay process on another QUIC library than the endpoints
    (``KVCS_QUIC_BACKEND`` of this process).
    """
    with tempfile.TemporaryDirectory() as tmp:
        cert = ensure_dev_certificate(tmp)
        with relay_process("kvcs", tmp, library=relay_library) as relay:
            d = asyncio.run(direct(cert, groups))
            r = asyncio.run(via_relay(relay, groups, 1, b"one"))
            f = asyncio.run(via_relay(relay, max(groups // 2, 8), 8, b"fan"))
    res = {"direct_mib_s": round(d, 1), "relay_1sub_mib_s": round(r, 1),
           "relay_ratio": round(r / d, 3), "fanout_8_egress_mib_s": round(f, 1),
           "relay_fanout8_ratio": round(f / (8 * r), 3)}
    print(f"relay bench ({OBJECT_SIZE // 1024} KiB objects, {PER_GROUP}/group, loopback): "
          f"direct {d:.1f} MiB/s, via relay {r:.1f} MiB/s (ratio {r / d:.2f}, target >= 0.7); "
          f"fan-out 1->8 aggregate relay egress {f:.1f} MiB/s = "
          f"{res['relay_fanout8_ratio']:.2f} of 8x one subscriber")
    for run, roles in CPU_US_PER_MIB.items():
        print(f"  CPU us per MiB of track payload, {run:11s}: "
              + ", ".join(f"{role} {us:,.0f}" for role, us in roles.items()))
    return res


if __name__ == "__main__":
    main(relay_library=sys.argv[1] if len(sys.argv) > 1 else None)
