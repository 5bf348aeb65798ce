"""Two sites in two network namespaces joined by a veth pair (MTU 1500), one relay per
site (issue #25): a publication made at the edge site is discovered and retrieved at the
root site after its publisher left. Every process is a real ``kvcs`` / Python process
inside its namespace; the traffic stays between the test's own namespaces. Skipped, with
the reason, where network namespaces cannot be created (not root, no ``ip``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcs.testing import stop_process

PY = sys.executable
ROOT_IP, EDGE_IP = "10.251.0.1", "10.251.0.2"
GROUPS, PER_GROUP, SIZE = 4, 16, 32 * 1024

PUBLISHER = f"""
import asyncio, sys
from kvcs.endpoint import Endpoint
from kvcs.moqt.wire import ObjectStatus
from kvcs.transport import QuicSettings
NS = (b"kvcs-1", b"netns")
async def main():
    ep = await Endpoint.connect(sys.argv[1], verify=False,
                                settings=QuicSettings.for_path(mtu=1500))
    await ep.announce(NS)
    t = ep.create_track(NS, b"k.raw.s0")
    for g in range({GROUPS}):
        for o in range({PER_GROUP}):
            ep.publish(t, g, o, bytes([g, o]) * ({SIZE} // 2))
        ep.publish(t, g, {PER_GROUP}, b"", status=ObjectStatus.END_OF_GROUP)
    ep.publish(t, {GROUPS}, 0, b"", status=ObjectStatus.END_OF_TRACK)
    await ep.hand_over(NS, timeout=60)
    ep.close()
    await ep.wait_closed()
    print("published", flush=True)
asyncio.run(main())
"""

CONSUMER = """
import asyncio, hashlib, sys
from kvcs.endpoint import Endpoint
from kvcs.moqt.wire import LocationFilter, ObjectStatus
from kvcs.transport import QuicSettings
NS = (b"kvcs-1", b"netns")
async def main():
    ep = await Endpoint.connect(sys.argv[1], verify=False,
                                settings=QuicSettings.for_path(mtu=1500))
    watch = await ep.subscribe_namespace((b"kvcs-1",))
    assert await watch.next(60) == (True, NS)
    res = await ep.fetch(NS, b"k.raw.s0", location_filter=LocationFilter.none())
    got = [o for o in await res.collect(timeout=60) if o.status == ObjectStatus.NORMAL]
    h = hashlib.sha256(b"".join(bytes(o.payload) for o in got)).hexdigest()
    print(len(got), h, flush=True)
    ep.close()
asyncio.run(main())
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def sites() -> Iterator[tuple[str, str]]:
    """Two namespaces, ``root`` (10.251.0.1) and ``edge`` (10.251.0.2), joined by a veth
    pair with MTU 1500; deleted afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2): cannot create network namespaces")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"{os.getpid() % 100000}"
    root, edge = f"kvcsr{tag}", f"kvcse{tag}"
    made: list[str] = []
    try:
        for ns in (root, edge):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", f"vr{tag}", "type", "veth", "peer", "name", f"ve{tag}")
        for ns, dev, addr in ((root, f"vr{tag}", ROOT_IP), (edge, f"ve{tag}", EDGE_IP)):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "mtu", "1500", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as exc:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        err = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"cannot create network namespaces: {err.decode().strip() or exc}")
    try:
        yield root, edge
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _relay(ns: str, cwd: Path, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(["ip", "netns", "exec", ns, PY, "-m", "kvcs", "relay",
                             "--anonymous", "--mtu", "1500", "--cert-dir", str(cwd / "certs"),
                             *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "fingerprint" in line:
            return proc
    proc.kill()
    raise AssertionError(f"relay in {ns} did not start: "
                         f"{proc.stderr.read() if proc.stderr else ''}")


def _run(ns: str, script: str, url: str) -> str:
    p = subprocess.run(["ip", "netns", "exec", ns, PY, "-c", script, url],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_two_sites_over_veth(sites: tuple[str, str], tmp_path: Path) -> None:
    root_ns, edge_ns = sites
    procs = []
    try:
        procs.append(_relay(root_ns, tmp_path, "--listen", f"{ROOT_IP}:4443"))
        procs.append(_relay(edge_ns, tmp_path, "--listen", f"{EDGE_IP}:4443",
                            "--upstream", f"moqt://{ROOT_IP}:4443/", "--upstream-insecure"))
        # publish at the edge site, hand over, leave
        assert _run(edge_ns, PUBLISHER, f"moqt://{EDGE_IP}:4443/") == "published"
        # a consumer at the root site discovers and retrieves it over the veth link
        count, digest = _run(root_ns, CONSUMER, f"moqt://{ROOT_IP}:4443/").split()
        want = hashlib.sha256(b"".join(bytes([g, o]) * (SIZE // 2) for g in range(GROUPS)
                                       for o in range(PER_GROUP))).hexdigest()
        assert (int(count), digest) == (GROUPS * PER_GROUP, want)
    finally:
        for p in procs:
            stop_process(p, 10)
