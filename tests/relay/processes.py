"""``kvcs relay`` as a process, for the tests of its command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable


def start_relay(args: list[str], cwd: Path, until: str,
                timeout: float = 30.0) -> tuple[subprocess.Popen[str], list[str]]:
    """Run ``kvcs relay --anonymous --listen 127.0.0.1:0 *args`` in ``cwd`` and read its
    lines until one contains ``until``: the process and the lines; the process is killed
    and AssertionError raised if no such line comes within ``timeout`` s."""
    proc = subprocess.Popen([PY, "-m", "kvcs", "relay", "--anonymous", "--listen",
                             "127.0.0.1:0", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if until in line:
            return proc, seen
    proc.kill()
    raise AssertionError(f"no {until!r} in {seen} {proc.stderr.read() if proc.stderr else ''}")
