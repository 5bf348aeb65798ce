"""``kvcs relay`` flags of the relay tree (issue #25): several ``--upstream`` (the one in
use is printed), ``--store`` / ``--store-bytes``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvcs.cli import build_parser, main, relay_config

from .processes import start_relay


def _port(lines: list[str]) -> int:
    line = next(s for s in lines if "listening on" in s)
    return int(line.split("listening on ")[1].split()[0].rpartition(":")[2])


def test_edge_prints_the_upstream_it_uses(tmp_path: Path) -> None:
    root, seen = start_relay(["--store", str(tmp_path / "store")], tmp_path, "fingerprint")
    procs = [root]
    try:
        url = f"moqt://127.0.0.1:{_port(seen)}/"
        edge, seen = start_relay(["--upstream", url, "--upstream", "moqt://127.0.0.1:9/",
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
    root, seen = start_relay(["--idle-timeout", "1"], tmp_path, "fingerprint")
    procs = [root]
    try:
        url = f"moqt://127.0.0.1:{_port(seen)}/"
        edge, _ = start_relay(["--idle-timeout", "1", "--upstream", url, "--upstream-insecure",
                          "--log-level", "info"], tmp_path, "upstream:")
        procs.append(edge)
        time.sleep(5)
    finally:
        for p in reversed(procs):  # the edge first: its upstream is not lost by the stop
            p.terminate()
            p.wait(timeout=10)
    err = edge.stderr.read() if edge.stderr else ""
    assert "Idle timeout" not in err and "reconnecting" not in err, err
