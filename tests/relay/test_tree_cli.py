"""``kvcs relay`` flags of the relay tree (issue #25): several ``--upstream`` (the one in
use is printed), ``--store`` / ``--store-bytes``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvcs.cli import build_parser, main, relay_config

PY = sys.executable


def _start(args: list[str], cwd: Path, until: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([PY, "-m", "kvcs", "relay", "--anonymous", "--listen",
                             "127.0.0.1:0", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if until in line:
            return proc, seen
    proc.kill()
    raise AssertionError(f"no {until!r} in {seen} {proc.stderr.read() if proc.stderr else ''}")


def _port(lines: list[str]) -> int:
    line = next(s for s in lines if "listening on" in s)
    return int(line.split("listening on ")[1].split()[0].rpartition(":")[2])


def test_edge_prints_the_upstream_it_uses(tmp_path: Path) -> None:
    root, seen = _start(["--store", str(tmp_path / "store")], tmp_path, "fingerprint")
    procs = [root]
    try:
        url = f"moqt://127.0.0.1:{_port(seen)}/"
        edge, seen = _start(["--upstream", url, "--upstream", "moqt://127.0.0.1:9/",
                             "--upstream-insecure"], tmp_path, "upstream:")
        procs.append(edge)
        assert seen[-1].strip() == f"upstream: {url}"
        assert (tmp_path / "store").is_dir()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def test_tree_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    c = relay_config(build_parser().parse_args([
        "relay", "--anonymous", "--upstream", "moqt://a:1/", "--upstream", "https://b:2/x",
        "--store", str(tmp_path), "--store-bytes", "2GiB"]))
    assert c.upstreams() == ["moqt://a:1/", "https://b:2/x"]
    assert (c.store, c.store_bytes) == (str(tmp_path), 2 << 30)
    (tmp_path / "file").write_text("")
    for argv in (["relay", "--anonymous", "--store-bytes", "lots"],
                 ["relay", "--anonymous", "--store", str(tmp_path / "file")],
                 ["relay", "--anonymous", "--upstream", "moqt://a:1/", "--upstream", "ftp://x"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("kvcs relay: error:"), err


def test_edge_keeps_its_upstream_session_alive(tmp_path: Path) -> None:
    """Without --keep-alive an edge still PINGs its upstream (a client session): quiet
    for five idle timeouts, it never loses it."""
    root, seen = _start(["--idle-timeout", "1"], tmp_path, "fingerprint")
    procs = [root]
    try:
        url = f"moqt://127.0.0.1:{_port(seen)}/"
        edge, _ = _start(["--idle-timeout", "1", "--upstream", url, "--upstream-insecure",
                          "--log-level", "info"], tmp_path, "upstream:")
        procs.append(edge)
        time.sleep(5)
    finally:
        for p in reversed(procs):  # the edge first: its upstream is not lost by the stop
            p.terminate()
            p.wait(timeout=10)
    err = edge.stderr.read() if edge.stderr else ""
    assert "Idle timeout" not in err and "reconnecting" not in err, err
