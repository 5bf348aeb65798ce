"""Concurrent whole-track fills against a relay, over real QUIC (issue 27): 8 sessions of a
client that stops reading, each with 100 SUBSCRIBEs whose FILL_PARAMETERS ask for a whole
cached track. Each session stays within ``Relay.session_memory_bound`` (accounted:
``RelaySession.held_bytes``; measured: the relay process's RSS growth), and once the
sessions leave their accounted bytes are zero and the memory is given back.

Before issue 27 every fill wrote its own 1 MiB window ahead of the peer's flow control:
the relay held ~265 MiB per session (about 2.6 MiB per fill), over the documented 182.6
MiB, and 8 sessions added 2.1 GiB. Fills and fetches now share the session's
``max_fetches_per_session`` streams written at once; the others wait their turn.

The client is a process of its own (``python -m tests.faults.test_fill_memory``, the
``__main__`` part below), frozen with SIGSTOP once subscribed, so that what the relay
holds is the relay's alone."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys

import pytest

from kvcs.endpoint import Endpoint
from kvcs.moqt.wire import LocationFilter, ObjectStatus, Parameters
from kvcs.relay.session import RelaySession
from kvcs.testing import LocalNet, until
from kvcs.transport import DevCertificate, QuicSettings

from .report import ScenarioRecord
from .test_flood_relay import ROOT, rss

NS = (b"fill", b"ns")
OBJECTS, OBJECT_SIZE = 128, 32 << 10  # a 4 MiB track: each fill is more than a window
SESSIONS, FILLS = 8, 100
WHOLE = Parameters(location_filter=LocationFilter.none())
HOLD_SECONDS = 3.0
CYCLES = 20
RSS_MARGIN = 64 << 20
"""RSS after the last connect/fill/leave cycle may exceed the first cycle's by this much
(allocator slack: freed memory is not always returned to the system)."""


async def _client(port: int, cafile: str, sessions: int) -> list[Endpoint]:
    eps = [await Endpoint.connect(f"moqt://127.0.0.1:{port}/", cafile=cafile,
                                  settings=QuicSettings()) for _ in range(sessions)]
    whole = LocationFilter.none()
    for ep in eps:
        await asyncio.gather(*(ep.subscribe(NS, b"big", location_filter=whole, fill=WHOLE)
                               for _ in range(FILLS)))
    return eps


async def _start_client(relay_port: int, cafile: str,
                        sessions: int) -> asyncio.subprocess.Process:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.faults.test_fill_memory", str(relay_port), cafile,
        str(sessions), cwd=ROOT, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 120)
    assert line.strip() == b"subscribed", line
    return child


async def _leave(child: asyncio.subprocess.Process) -> None:
    """Let the client go on, then close its sessions and exit."""
    assert child.stdin is not None
    if child.returncode is None:
        child.send_signal(signal.SIGCONT)
        child.stdin.write(b"leave\n")
        await child.stdin.drain()
    try:
        await asyncio.wait_for(child.wait(), 60)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


@pytest.mark.faults
@pytest.mark.timeout(300)
async def test_concurrent_fills_stay_within_the_session_bound(
        cert: DevCertificate, scenario: ScenarioRecord) -> None:
    async with LocalNet(cert) as net:
        relay = await net.relay()
        pub = await net.client(relay)
        await pub.announce(NS)
        big = pub.create_track(NS, b"big")
        for o in range(OBJECTS):
            big.append(0, o, os.urandom(OBJECT_SIZE))
        big.append(0, OBJECTS, b"", status=ObjectStatus.END_OF_TRACK)
        warm = await net.client(relay)
        res = await warm.fetch(NS, b"big", location_filter=LocationFilter.none())
        await res.collect(timeout=30)  # cached by the relay from now on
        base = len(relay.sessions)
        bound = relay.session_memory_bound

        gc.collect()
        memory_before = rss()
        child = await _start_client(relay.port, str(net.cert.certfile), SESSIONS)
        held: list[int] = []
        peak = memory_before
        try:
            await until(lambda: len(relay.sessions) == base + SESSIONS)
            child.send_signal(signal.SIGSTOP)  # stops reading: the relay holds what it can
            fillers = [p for p in relay.sessions.values() if isinstance(p, RelaySession)
                       and p.server.cursors != (0, 0)]
            assert len(fillers) == SESSIONS
            end = asyncio.get_running_loop().time() + HOLD_SECONDS
            while asyncio.get_running_loop().time() < end:
                held.append(max(p.held_bytes for p in fillers))
                peak = max(peak, rss())
                await asyncio.sleep(0.02)
            running = [p.server.cursors[0] for p in fillers]
        finally:
            await _leave(child)
        await until(lambda: len(relay.sessions) == base, timeout=30)
        gone = [p.held_bytes for p in fillers]
        parts = [(p.session.usage, p.conn.queued_bytes, p.server.cursors) for p in fillers]
        growth = peak - memory_before

        # 20 connect/fill/leave cycles of one session (in this process: a process per
        # cycle took too long on a loaded machine): RSS comes back
        after: list[int] = []
        for _ in range(CYCLES):
            (ep,) = await _client(relay.port, str(net.cert.certfile), 1)
            await until(lambda: any(isinstance(p, RelaySession) and p.server.cursors[0]
                                    for p in relay.sessions.values()))
            ep.close()
            await until(lambda: len(relay.sessions) == base, timeout=30)
            gc.collect()
            after.append(rss())

    print(f"\nper session: held at most {max(held) / 2**20:.1f} MiB accounted (bound "
          f"{bound / 2**20:.1f} MiB), cursors running {running}; RSS growth "
          f"{growth / 2**20:.0f} MiB for {SESSIONS} sessions ({growth / SESSIONS / 2**20:.1f} "
          f"MiB each); after they left {gone}; RSS over {CYCLES} cycles "
          f"{[round(x / 2**20) for x in after]} MiB")
    scenario.result = f"{SESSIONS}x{FILLS} fills held {growth / SESSIONS / 2**20:.0f} MiB/session"
    assert max(running) <= relay.config.max_fetches_per_session
    assert max(held) <= bound
    assert growth <= SESSIONS * bound, growth
    assert gone == [0] * SESSIONS, parts  # every accounted byte given back
    assert after[-1] <= after[0] + RSS_MARGIN, after


async def _main(port: int, cafile: str, sessions: int) -> None:
    eps = await _client(port, cafile, sessions)
    print("subscribed", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for ep in eps:
        ep.close()
    await asyncio.sleep(0.2)  # the CONNECTION_CLOSE goes out


if __name__ == "__main__":  # the client: PORT CAFILE SESSIONS; "leave" on stdin ends it
    asyncio.run(_main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
