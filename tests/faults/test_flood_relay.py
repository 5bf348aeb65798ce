"""A flooding client against a relay over real QUIC, while two good consumers pull a cached
track through it: each consumer keeps at least half of its goodput, the flooder alone is
limited (its requests wait their turn and get the draft's answers, its extra sessions are
not accepted), and the relay's memory stays within its cache budget plus the stated bound
per session.

The flood: 8 sessions keeping 64 requests open each (SUBSCRIBEs for tracks nobody
publishes, FETCH and TRACK_STATUS of a cached track, SUBSCRIBEs with 32-field namespaces
of 4 KiB), a session opening data streams for Track Aliases that do not exist as fast
as the relay takes them, and 16 tasks opening and closing sessions in a loop. It runs
in a process of its own (``python -m tests.faults.test_flood_relay``, the ``__main__``
part below), as a flooding client on another host would: in the test's process it would
take the event loop from the relay it floods, and it runs niced for the same reason.
Goodput is measured in alternating quiet and flooded phases of the same test (the
flooder frozen with SIGSTOP, then let go), and the ratio is the median over rounds, so
that load changing on the shared machine hits both alike."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvcs.endpoint import SETUP_TIMEOUT, Endpoint
from kvcs.moqt.actions import StreamOpener
from kvcs.moqt.session import Session, SessionConfig
from kvcs.moqt.wire import (
    LocationFilter,
    ObjectStatus,
    Parameters,
    SubgroupHeader,
    SubgroupWriter,
)
from kvcs.testing import LocalNet, until
from kvcs.transport import ConnectionInfo, DevCertificate, QuicSettings, connect

from .hostile import HostileSession
from .report import ScenarioRecord

NS = (b"good", b"ns")
BIG_OBJECTS, OBJECT_SIZE = 512, 32 << 10  # the good consumers' track: 16 MiB
PHASE_SECONDS = 1.0
ROUNDS = 5
"""Quiet and flooded phases, alternated (the flooder process is frozen, then let go), so
that load changing on a shared machine hits both alike; the ratio is their median."""
REQUEST_SESSIONS, IN_FLIGHT = 8, 64
"""Flooding sessions making requests, and the requests each keeps open (qh3 lets a
client open 100 request streams at once)."""
CHURN_TASKS = 16
ACCEPT_RATE = 20.0
"""The relay's new sessions per second in this test."""
"""Tasks of the flooder that open and close sessions in a loop."""
ROOT = Path(__file__).resolve().parents[2]


def rss() -> int:
    """This process's resident set size, in bytes (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


# ---------------------------------------------------------------------------- flooder


class _Flooder(HostileSession):
    """A hostile session that wakes its task whenever something arrives."""

    wake: asyncio.Event

    def session_changed(self) -> None:
        super().session_changed()
        self.wake.set()


async def _session(port: int, cafile: str, timeout: float = 10.0) -> tuple[Any, _Flooder]:
    made: list[_Flooder] = []

    def factory(opener: StreamOpener, info: ConnectionInfo) -> _Flooder:
        cfg = SessionConfig(is_client=True, path=b"/", authority=b"")
        made.append(_Flooder(opener, Session(cfg, opener)))
        made[0].wake = asyncio.Event()
        return made[0]

    conn = await connect(f"moqt://127.0.0.1:{port}/", factory, QuicSettings(), cafile=cafile,
                         timeout=timeout)
    flooder = made[0]
    conn.attach(flooder)
    try:
        while flooder.session.peer_setup is None:
            flooder.wake.clear()
            await asyncio.wait_for(flooder.wake.wait(), timeout)
    except BaseException:
        # closed, not abandoned: a session whose SETUP answer came late (load 12) was
        # left open, and the relay kept it until its idle timeout (60 s)
        conn.close()
        raise
    return conn, flooder


async def _requests(conn: Any, h: _Flooder, stop: asyncio.Event) -> int:
    """Keep IN_FLIGHT requests open: SUBSCRIBEs for tracks nobody publishes, FETCHes and
    TRACK_STATUS of a cached track, SUBSCRIBEs with the largest namespace the draft
    allows (32 fields of 127 bytes)."""
    s = h.session
    huge = tuple(bytes([65 + i % 26]) * 127 for i in range(32))
    sent = 0
    while not stop.is_set() and s.closed is None:
        while s.open_requests < IN_FLIGHT:
            kind = sent % 4
            if kind == 0:
                s.subscribe((b"nobody", b"%d" % sent), b"t")
            elif kind == 1:
                s.fetch(NS, b"small", Parameters(location_filter=LocationFilter.none()))
            elif kind == 2:
                s.subscribe(huge, b"")
            else:
                s.track_status(NS, b"small", Parameters())
            sent += 1
        conn.flush()
        h.wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(h.wake.wait(), 1.0)
    return sent


async def _junk_streams(conn: Any, h: _Flooder, stop: asyncio.Event) -> int:
    """Data streams for Track Aliases the relay never gave, as fast as its stream credit
    lets them through."""
    sent = 0
    while not stop.is_set() and h.session.closed is None:
        for _ in range(64):
            w = SubgroupWriter(SubgroupHeader(1000 + sent, 0, 0, None))
            h.write(w.header_bytes() + w.object_prefix(0, 100) + b"j" * 100,
                    unidirectional=True, end=True)
            sent += 1
        conn.flush()
        await asyncio.sleep(0.01)  # FINed: their credit comes back once the relay read them
    return sent


async def _churn(port: int, cafile: str, stop: asyncio.Event, made: Counter[str]) -> None:
    """Open sessions and close them again, as fast as the relay lets them in."""
    while not stop.is_set():
        try:
            conn, _ = await _session(port, cafile, timeout=1.0)
        except (ConnectionError, TimeoutError, OSError):
            made["refused"] += 1
            continue
        made["accepted"] += 1
        conn.close()


async def _flood(port: int, cafile: str) -> dict[str, Any]:
    """Flood until SIGTERM; then report what happened, as JSON."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    sessions = [await _session(port, cafile) for _ in range(REQUEST_SESSIONS + 1)]
    print("ready", flush=True)
    made: Counter[str] = Counter()
    *requesters, streamer = sessions
    results = await asyncio.gather(
        *(_requests(conn, h, stop) for conn, h in requesters),
        _junk_streams(*streamer, stop),
        *(_churn(port, cafile, stop, made) for _ in range(CHURN_TASKS)))
    answered = sum(h.answered for _, h in requesters)
    codes: Counter[int] = Counter()
    for _, h in requesters:
        codes.update(h.rejected)
    report = {
        "requests": sum(results[:REQUEST_SESSIONS]), "answered": answered,
        "fetches_ok": sum(h.events["FetchAccepted"] for _, h in requesters),
        "rejected": {str(k): v for k, v in codes.items()},
        "closed": [h.session.closed for _, h in sessions if h.session.closed],
        "junk_streams": results[REQUEST_SESSIONS],
        "sessions_accepted": made["accepted"], "sessions_refused": made["refused"],
    }
    for conn, _ in sessions:
        conn.close()
    return report


# ---------------------------------------------------------------------------- the test


async def _consume(ep: Endpoint, seconds: float) -> float:
    """FETCH the big track again and again for ``seconds``; goodput in bytes/s."""
    got = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        res = await ep.fetch(NS, b"big", location_filter=LocationFilter.none())
        async for obj in res:
            got += len(obj.payload)
    return got / (time.perf_counter() - start)


async def _goodput(consumers: list[Endpoint]) -> list[float]:
    return list(await asyncio.gather(*(_consume(c, PHASE_SECONDS) for c in consumers)))


async def _sample(probe: Callable[[], int], into: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        into.append(probe())
        await asyncio.sleep(0.05)


@pytest.mark.faults
async def test_a_flood_leaves_good_consumers_half_their_goodput(
        cert: DevCertificate, scenario: ScenarioRecord) -> None:
    async with LocalNet(cert) as net:
        # new sessions at 20/s (default 100/s): the niced flooder's 16 churning tasks
        # reach 40-80 handshakes/s here, depending on the machine's load, so its extra
        # sessions are refused in every run, not only when the machine is idle
        relay = await net.relay(accept_rate=ACCEPT_RATE)
        pacer = relay.admission.pacer
        assert pacer is not None
        pub = await net.client(relay)
        await pub.announce(NS)
        big = pub.create_track(NS, b"big")
        for o in range(BIG_OBJECTS):
            big.append(0, o, os.urandom(OBJECT_SIZE))
        big.append(0, BIG_OBJECTS, b"", status=ObjectStatus.END_OF_TRACK)
        small = pub.create_track(NS, b"small")
        for o in range(4):
            small.append(0, o, b"s" * 1000)
        small.append(0, 4, b"", status=ObjectStatus.END_OF_TRACK)
        consumers = [await net.client(relay) for _ in range(2)]
        for name in (b"big", b"small"):  # cached by the relay from now on
            res = await consumers[0].fetch(NS, name, location_filter=LocationFilter.none())
            await res.collect(timeout=30)
        await _goodput(consumers)  # warm-up

        memory_before = rss()
        flooder = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.faults.test_flood_relay", str(relay.port),
            str(net.cert.certfile), cwd=ROOT, stdout=asyncio.subprocess.PIPE)
        assert flooder.stdout is not None
        samples: list[int] = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample(rss, samples, stop))
        quiet: list[list[float]] = []
        flooded: list[list[float]] = []
        sessions = 0
        try:
            assert (await asyncio.wait_for(flooder.stdout.readline(), 30)).strip() == b"ready"
            flood_start = time.perf_counter()
            for _ in range(ROUNDS):
                # the flooder frozen (its requests the relay still holds answered first)...
                flooder.send_signal(signal.SIGSTOP)
                await until(lambda: pacer.waiting == 0, timeout=10)
                await asyncio.sleep(0.2)
                quiet.append(await _goodput(consumers))
                # ... and flooding
                flooder.send_signal(signal.SIGCONT)
                await asyncio.sleep(0.3)
                sessions = max(sessions, len(relay.sessions))
                flooded.append(await _goodput(consumers))
                sessions = max(sessions, len(relay.sessions))
            flooder.terminate()
            report = json.loads(await asyncio.wait_for(flooder.stdout.readline(), 60))
            flood_seconds = time.perf_counter() - flood_start
        finally:
            if flooder.returncode is None:
                flooder.send_signal(signal.SIGCONT)
                flooder.kill()
            await flooder.wait()
            stop.set()
            await sampler

        ratios = [statistics.median(f[i] / q[i] for q, f in zip(quiet, flooded, strict=True))
                  for i in range(len(consumers))]
        print(f"\ngoodput MiB/s quiet {[[round(x / 2**20) for x in q] for q in quiet]}, "
              f"flooded {[[round(x / 2**20) for x in f] for f in flooded]}; median ratios "
              f"{[round(r, 2) for r in ratios]}; flooder {report}")
        scenario.result = "consumers complete, flooder limited"
        scenario.goodput_ratio = min(ratios)
        assert min(ratios) >= 0.5, (ratios, report)
        # the flooder alone was limited, with the draft's answers, and never closed
        assert report["answered"] >= report["requests"] - REQUEST_SESSIONS * IN_FLIGHT
        assert set(report["rejected"]) <= {"16"}, report  # DOES_NOT_EXIST only
        assert report["fetches_ok"] > 0 and not report["closed"]
        # its requests waited their turn once past the pacer's rate (a niced flooder on a
        # busy machine may never reach it: one make faults run beside make test sent too
        # few, and then none was due)
        cfg = relay.config
        due = report["requests"] > cfg.request_rate * flood_seconds + cfg.request_burst
        assert pacer.delayed > 0 or not due, (report, flood_seconds)
        assert report["junk_streams"] > 0
        # its extra sessions were not accepted: past the accept rate they were refused (a
        # flooder slowed by a busy machine may never reach the rate: then none was due)
        allowed = ACCEPT_RATE * flood_seconds + relay.settings.accept_burst
        assert report["sessions_refused"] > 0 or report["sessions_accepted"] <= allowed, (
            report, allowed)
        # memory: within the cache budget plus the bound per session
        growth = max(samples) - memory_before
        bound = relay.origin.budget + sessions * relay.session_memory_bound
        print(f"RSS growth during the flood {growth / 2**20:.1f} MiB with up to {sessions} "
              f"sessions (bound {bound / 2**20:.0f} MiB)")
        assert growth <= bound
        # and it forgets them once they are gone (a session whose client gave up during
        # the handshake goes when no SETUP came: SETUP_TIMEOUT; one whose CONNECTION_CLOSE
        # was lost, as the relay's socket overflows during the flood, at the QUIC idle
        # timeout: 7 flooder sessions were still there SETUP_TIMEOUT + 25 s after the
        # flood beside make faults and two helpers, load 6; a generous deadline past
        # both: at load 13 five seconds more than SETUP_TIMEOUT were not enough)
        try:
            await until(lambda: len(relay.sessions) == 3 and pacer.waiting == 0,
                        timeout=max(SETUP_TIMEOUT, relay.settings.idle_timeout) + 25)
        except AssertionError:
            raise AssertionError(("sessions left", pacer.waiting, [
                (p.id, p.is_closed, p.peer_setup is not None, p.session.usage)
                for p in relay.sessions.values()])) from None


if __name__ == "__main__":  # the flooder process: PORT CAFILE, until SIGTERM
    # A flooder elsewhere takes no CPU from the relay; on a shared 2-core test machine it
    # would (its 16 handshaking tasks alone took a quarter of the relay's goodput): it
    # yields the CPU to the relay's process when both want it.
    os.nice(10)
    print(json.dumps(asyncio.run(_flood(int(sys.argv[1]), sys.argv[2]))), flush=True)
