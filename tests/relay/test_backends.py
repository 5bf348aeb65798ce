"""``kvcs relay`` as deployed (its own process) on each QUIC library, with publisher and
subscribers in this process on the test run's library (aioquic, or qh3 in the second
leg of ``make test``): the two libraries interoperate through the relay."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kvcs.endpoint import Endpoint
from kvcs.quic_backend import BACKEND_ENV, resolve
from kvcs.transport.backend import BACKEND

from .conftest import NEXT, SETTINGS, WHOLE, end_track, payload, publish_group

NS = (b"kvcs-1", b"\x07" * 16, b"c" * 32, b"a" * 32, b"p" * 16)


async def _start(tmp: Path, backend: str) -> tuple[subprocess.Popen[str], str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop(BACKEND_ENV, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcs", "relay", "--anonymous", "--listen", "127.0.0.1:0",
         "--quic-preset", "loopback", "--quic-backend", backend, "--cert-dir", str(tmp),
         "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    loop = asyncio.get_running_loop()
    first = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 20)
    second = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 5)
    return proc, first, second.split()[-1]


@pytest.fixture(params=["auto", "aioquic"])
async def relay(request: pytest.FixtureRequest,
                tmp_path: Path) -> AsyncIterator[tuple[str, str, str, str]]:
    proc, line, pin = await _start(tmp_path, request.param)
    try:
        url = f"moqt://{line.split()[4]}/"
        yield url, pin, line, resolve(request.param)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
            proc.wait()


async def test_relay_process_on_each_library(relay: tuple[str, str, str, str]) -> None:
    url, pin, line, library = relay
    assert f"QUIC library {library}" in line
    pub = await Endpoint.connect(url, pin_sha256=pin, settings=SETTINGS, timeout=10)
    live = await Endpoint.connect(url, pin_sha256=pin, settings=SETTINGS, timeout=10)
    late = await Endpoint.connect(url, pin_sha256=pin, settings=SETTINGS, timeout=10)
    try:
        await pub.announce(NS)
        track = pub.create_track(NS, b"k.raw.s0")
        publish_group(pub, track, 0, 16, size=40_000)
        pub.flush()
        sub = await live.subscribe(NS, b"k.raw.s0", location_filter=NEXT, fill=WHOLE)
        for g in range(1, 4):
            publish_group(pub, track, g, 16, size=40_000)
        end_track(pub, track, 4)
        pub.flush()
        got = await sub.collect(timeout=20)
        # fill and live streams interleave: exactly once, in any order
        data = sorted((o.group_id, o.object_id, bytes(o.payload))
                      for o in got if o.payload.nbytes)
        assert data == [(g, o, payload(g, o, 40_000)) for g in range(4) for o in range(16)]
        # a completed track by FETCH from the relay's cache
        res = await late.fetch(NS, b"k.raw.s0", location_filter=WHOLE.location_filter)
        objs = [o for o in await res.collect(timeout=20) if o.payload.nbytes]
        assert [(o.group_id, o.object_id) for o in objs] == [
            (g, o) for g in range(4) for o in range(16)]
        assert all(bytes(o.payload) == payload(o.group_id, o.object_id, 40_000) for o in objs)
    finally:
        for ep in (pub, live, late):
            ep.close()
            await ep.wait_closed()


def test_this_process_library_is_the_requested_one() -> None:
    assert resolve(os.environ.get(BACKEND_ENV)) == BACKEND
