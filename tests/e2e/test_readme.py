"""The README as a new user runs it: the "First five minutes" commands, then the Python
snippets of "Using the library", each in a temporary directory against a relay on
127.0.0.1. The only change made to them is the relay's port (4443 -> a free one)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvcs.testing import stop_process

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent  # the venv `source .venv/bin/activate` puts on PATH
TIMEOUT = 120


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1"}


def _start_relay(command: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(shlex.split(command), cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until it listens
        if "kvcs relay listening on" in line:
            return proc
    raise AssertionError(f"the relay did not start: {command}")


def _stop(proc: subprocess.Popen[str]) -> None:
    stop_process(proc, 15)


def test_first_five_minutes(tmp_path: Path) -> None:
    (block,) = _blocks(_section("First five minutes"), "sh")
    port = str(_free_udp_port())
    env, cwd = _env(), tmp_path
    background: list[subprocess.Popen[str]] = []
    ran = []
    try:
        for raw in block.splitlines():
            line = shlex.split(raw.replace("4443", port), comments=True)
            if not line or line[:2] == ["make", "install"] or line[0] == "source":
                continue  # installed already; `source` puts BIN on PATH, as _env does
            if line[-1] == "&":
                background.append(_start_relay(shlex.join(line[:-1]), cwd, env))
                continue
            if line[:2] == ["kill", "%1"]:
                _stop(background.pop(0))
                continue
            if "&&" in line:  # mkdir -p try && cd try
                assert line == ["mkdir", "-p", "try", "&&", "cd", "try"], raw
                cwd = cwd / "try"
                cwd.mkdir(parents=True, exist_ok=True)
                continue
            done = subprocess.run(line, cwd=cwd, env=env, text=True, capture_output=True,
                                  timeout=TIMEOUT)
            assert done.returncode == 0, f"{raw}\n{done.stdout}\n{done.stderr}"
            ran.append((line[1], done.stdout))
    finally:
        for proc in background:
            _stop(proc)
    out = dict(ran)
    assert "the relay holds the whole publication" in out["publish"]
    assert "1 publication(s)" in out["inspect"] and "protected" in out["inspect"]
    assert "wrote 32 layers x 1024 tokens" in out["fetch"]
    assert [name for name, _ in ran] == ["keygen", "descriptor", "sample", "publish",
                                         "inspect", "fetch"]


@pytest.mark.timeout(240)
def test_library_snippets(tmp_path: Path) -> None:
    prefill, decode = _blocks(_section("Using the library"), "python")
    port = str(_free_udp_port())
    env = _env()
    kvcs = [str(BIN / "kvcs")]
    for args in (["keygen", "scope.json"], ["descriptor", "--out", "model.json"],
                 ["sample", "--descriptor", "model.json", "--tokens", "512", "--tokens-out",
                  "prompt.npy", "--kv-out", "cache.npz"]):
        subprocess.run(kvcs + args, cwd=tmp_path, env=env, check=True, capture_output=True)
    relay = _start_relay(f"{kvcs[0]} relay --listen 127.0.0.1:{port} --anonymous "
                         "--cert-dir certs", tmp_path, env)
    try:
        outputs = []
        for snippet in (prefill, decode):
            done = subprocess.run([sys.executable, "-c", snippet.replace("4443", port)],
                                  cwd=tmp_path, env=env, text=True, capture_output=True,
                                  timeout=TIMEOUT)
            assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
            outputs.append(done.stdout)
    finally:
        _stop(relay)
    assert "reusing 32 blocks of 16 tokens" in outputs[1]
    assert "layer 31: K (512, 8, 128), V (512, 8, 128)" in outputs[1]
    assert "recompute" not in outputs[1]
