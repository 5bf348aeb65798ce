"""Processes that the fault scenarios kill: a ``python -m kvcs relay`` and any small
script, each in its own process group, killed with SIGKILL (no goodbye: no GOAWAY, no
CONNECTION_CLOSE, sockets dropped by the kernel), restarted on the same UDP port.

    relay = RelayProcess(cert, tmp_path)
    await relay.start()                # ephemeral port, then always the same one
    ...
    await relay.kill()                 # SIGKILL
    await relay.start()                # same port: peers' packets reach the new process
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

from kvcs.transport import DevCertificate

ROOT = Path(__file__).resolve().parents[2]
"""The repository: children run from there (``python -m tests.faults.<module>``)."""
READY_TIMEOUT = 30.0
"""Seconds a child may take to say it is ready (importing kvcs takes ~0.5 s idle, several
times that on a loaded 2-core host)."""


class ChildProcess:
    """A child process whose stdout lines are read until a ready line; stderr goes to a
    log file (shown when a start fails)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self._reader: asyncio.Task[None] | None = None
        self._line = asyncio.Event()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def spawn(self, *args: str, ready: str) -> str:
        """Start ``python args...`` and return its first stdout line containing ``ready``."""
        if self.running:
            raise RuntimeError("already running")
        self.lines = []
        with open(self.log, "ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=err,
                start_new_session=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._reader = asyncio.create_task(self._read())
        try:
            return await asyncio.wait_for(self.wait_line(ready), READY_TIMEOUT)
        except BaseException:
            await self.kill()
            raise AssertionError(f"{args[:3]} did not get ready: "
                                 f"{self.log.read_text()[-2000:]}") from None

    async def wait_line(self, text: str) -> str:
        """The first stdout line containing ``text`` (waits for it)."""
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if text in line:
                    return line
            seen = len(self.lines)
            if not self.running and self._reader is not None and self._reader.done():
                raise AssertionError(f"child exited before printing {text!r}")
            self._line.clear()
            await self._line.wait()

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            async for raw in self.proc.stdout:
                self.lines.append(raw.decode(errors="replace").rstrip())
                self._line.set()
        finally:
            self._line.set()

    async def kill(self) -> None:
        """SIGKILL the child's process group and reap it (idempotent)."""
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader
        self.proc = None


class RelayProcess(ChildProcess):
    """``python -m kvcs relay`` (anonymous, the test certificate) on 127.0.0.1; the first
    start takes an ephemeral port, every later one binds the same."""

    def __init__(self, cert: DevCertificate, workdir: Path, *, name: str = "relay",
                 upstream: str | None = None, extra: tuple[str, ...] = ()) -> None:
        super().__init__(workdir / f"{name}.log")
        self.cert = cert
        self.upstream = upstream
        self.extra = extra
        self.port = 0
        self.starts = 0

    @property
    def url(self) -> str:
        return f"moqt://127.0.0.1:{self.port}/"

    async def start(self) -> None:
        args = ["-m", "kvcs", "relay", "--listen", f"127.0.0.1:{self.port}", "--anonymous",
                "--tls-cert", str(self.cert.certfile), "--tls-key", str(self.cert.keyfile),
                "--log-level", "warning", *self.extra]
        if self.upstream is not None:
            args += ["--upstream", self.upstream, "--upstream-cafile", str(self.cert.certfile)]
        line = await self.spawn(*args, ready="listening on")
        port = int(line.split("listening on ", 1)[1].split()[0].rsplit(":", 1)[1])
        assert self.port in (0, port), (self.port, port)
        self.port = port
        self.starts += 1
