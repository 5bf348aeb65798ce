"""Every row of the bad-input table in docs/cli.md, run as a user runs it: the real
``kvcs`` command against a relay on 127.0.0.1 that requires a token. Each must print the
row's message in one line on stderr (no traceback) and exit with the row's status."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvcs.auth import Authorizer
from kvcs.testing import LocalNet

from .cli_run import ENV, cli_inputs, run_kvcs
from .conftest import cache

TABLE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
TOKEN = "good-token"


def table_rows() -> list[tuple[str, str, str, int]]:
    """(input, command, message, status) of each row of the bad-input table."""
    text = TABLE.read_text().split("## Bad input table", 1)[1]
    rows = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| Input") or line.startswith("|---"):
            continue
        cells = [c.strip().replace("\\|", "|")
                 for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        what, command, message, status = cells
        rows.append((what, command.strip("`"), message, int(status)))
    return rows


def closed_port() -> int:
    """A UDP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_closed_stdout(*args: str) -> tuple[int, str]:
    """``kvcs ARGS | true``: stdout is a pipe whose reader has gone."""
    r, w = os.pipe()
    os.close(r)  # the reader exits before reading anything
    try:
        proc = subprocess.run([sys.executable, "-m", "kvcs", *args], stdout=w,
                              stderr=subprocess.PIPE, env=ENV, timeout=60, check=False)
    finally:
        os.close(w)
    return proc.returncode, proc.stderr.decode()


# about 20 kvcs processes, each ~1 s of Python start-up on an idle core: 48 s at load 13,
# past the suite's 120 s hang guard at load 20 beside another pytest-xdist worker
@pytest.mark.timeout(300)
async def test_every_row_of_the_bad_input_table(net: LocalNet, tmp_path: Path) -> None:
    rows = table_rows()
    assert len(rows) >= 15
    grants = {"tokens": [{"token": TOKEN, "publish": ["kvcs-1"], "subscribe": ["kvcs-1"]}]}
    relay = await net.relay(authorizer=Authorizer.from_mapping(grants))
    f = cli_inputs(tmp_path)
    data = cache(21)
    np.savez(tmp_path / "kv16.npz", k=np.stack([k for k, _ in data]).astype(np.float16),
             v=np.stack([v for _, v in data]).astype(np.float16))
    scope_file = str(tmp_path / "scope.json")
    rc, _, err = await run_kvcs("keygen", scope_file, "--scope-key", f["scope"],
                                "--no-signing-key")
    assert rc == 0, err
    rc, _, err = await run_kvcs("publish", "--relay", f"moqt://127.0.0.1:{relay.port}/",
                                "--cafile", str(net.cert.certfile), "--descriptor", f["desc"],
                                "--scope-key", f["scope"], "--tokens", f["tokens"], "--kv",
                                f["kv"], "--token", TOKEN, "--loopback")
    assert rc == 0, err
    values = {
        "scopefile": scope_file,
        "relay": f"moqt://127.0.0.1:{relay.port}/", "cert": str(net.cert.certfile),
        "closed": f"moqt://127.0.0.1:{closed_port()}/", "kv": f["kv"],
        "kv16": str(tmp_path / "kv16.npz"), "out": str(tmp_path / "got.npz"), "token": TOKEN,
        "id": f"--descriptor {f['desc']} --scope-key {f['scope']} --tokens {f['tokens']}",
    }
    failures = []
    for what, command, message, status in rows:
        line = command.format(**values)
        for name in ("desc.json", "scope.key", "prompt.npy", "missing.pem", "nodir/got.npz"):
            line = re.sub(rf"(?<![\w/.]){re.escape(name)}", str(tmp_path / name), line)
        if line.endswith("| true"):
            rc, err = await asyncio.to_thread(run_closed_stdout,
                                              *shlex.split(line[:-len("| true")]))
        else:
            client = line.split()[0] in ("publish", "fetch", "inspect")
            rc, _, err = await run_kvcs(*shlex.split(line), *(["--loopback"] if client else []))
        lines = err.strip().splitlines()
        if rc != status or message not in err or len(lines) != 1 or "Traceback" in err:
            failures.append(f"{what}: `kvcs {line}` -> status {rc}, stderr {err[-600:]!r}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "got.npz").exists()
    assert not list(tmp_path.glob(".*.tmp"))
