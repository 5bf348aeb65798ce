"""The two QUIC libraries side by side. The library is a QuicSettings field, so one process
runs a relay on one library and its clients on the other (every pairing, through the
relay); ``kvcs relay --quic-backend`` as deployed (its own process) still picks the
relay's library."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kvcs.endpoint import Endpoint
from kvcs.testing import LocalNet, stop_process
from kvcs.transport import DevCertificate, QuicSettings, default_library
from kvcs.transport.quic import LIBRARIES, LIBRARY_ENV, resolve

from .conftest import NEXT, SETTINGS, WHOLE, end_track, payload, publish_group

NS = (b"kvcs-1", b"\x07" * 16, b"c" * 32, b"a" * 32, b"p" * 16)


async def _publish_subscribe_fetch(pub: Endpoint, live: Endpoint, late: Endpoint) -> None:
    """A live subscriber gets a track whole (fill and live streams), a late one FETCHes it
    from the relay's cache: exactly the published bytes."""
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
    data = sorted((o.group_id, o.object_id, bytes(o.payload)) for o in got if o.payload.nbytes)
    assert data == [(g, o, payload(g, o, 40_000)) for g in range(4) for o in range(16)]
    # a completed track by FETCH from the relay's cache
    res = await late.fetch(NS, b"k.raw.s0", location_filter=WHOLE.location_filter)
    objs = [o for o in await res.collect(timeout=20) if o.payload.nbytes]
    assert [(o.group_id, o.object_id) for o in objs] == [
        (g, o) for g in range(4) for o in range(16)]
    assert all(bytes(o.payload) == payload(o.group_id, o.object_id, 40_000) for o in objs)


@pytest.mark.parametrize("client_library", LIBRARIES)
@pytest.mark.parametrize("relay_library", LIBRARIES)
async def test_libraries_interoperate_through_a_relay(
        cert: DevCertificate, relay_library: str, client_library: str) -> None:
    async with LocalNet(cert, QuicSettings.loopback(library=relay_library)) as net:
        relay = await net.relay()
        assert relay.server is not None and relay.server.library == relay_library
        settings = QuicSettings.loopback(library=client_library)
        eps = [await Endpoint.connect(f"moqt://127.0.0.1:{relay.port}/", settings=settings,
                                      cafile=str(cert.certfile), timeout=10)
               for _ in range(3)]
        net.endpoints.extend(eps)
        assert {ep.conn.library for ep in eps} == {client_library}
        await _publish_subscribe_fetch(*eps)


async def _start(tmp: Path, backend: str) -> tuple[subprocess.Popen[str], str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop(LIBRARY_ENV, None)
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
        stop_process(proc, 10)


async def test_relay_process_on_each_library(relay: tuple[str, str, str, str]) -> None:
    url, pin, line, library = relay
    assert f"QUIC library {library}" in line
    eps = [await Endpoint.connect(url, pin_sha256=pin, settings=SETTINGS, timeout=10)
           for _ in range(3)]
    try:
        await _publish_subscribe_fetch(*eps)
    finally:
        for ep in eps:
            ep.close()
            await ep.wait_closed()


def test_this_process_library_is_the_requested_one() -> None:
    assert resolve(os.environ.get(LIBRARY_ENV)) == default_library() == SETTINGS.library
