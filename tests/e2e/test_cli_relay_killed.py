"""A serving ``kvcs publish`` outlives a relay that is SIGKILLed and restarted on the same
port, with the CLI's default liveness settings (6 s idle timeout, a PING after 2 s of
quiet): it notices the dead session by itself, reconnects and announces again, so fetches
succeed again without anyone touching the publisher. Before, the CLI took the library's
30 s idle timeout (about 40 s to heal, measured). Real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

from kvcs.transport import DevCertificate

from .cli_run import ENV, cli_inputs, run_kvcs

HEAL_BOUND_S = 30.0
"""The restart must heal before the old 30 s idle timeout alone would have let it."""


class RelayProcess:
    """``python -m kvcs relay`` on 127.0.0.1 (anonymous, the test certificate): the first
    start takes an ephemeral port, a restart binds the same; :meth:`kill` is a SIGKILL."""

    def __init__(self, cert: DevCertificate) -> None:
        self.cert = cert
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"moqt://127.0.0.1:{self.port}/"

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvcs", "relay", "--listen", f"127.0.0.1:{self.port}",
            "--anonymous", "--tls-cert", str(self.cert.certfile), "--tls-key",
            str(self.cert.keyfile), "--log-level", "warning", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=ENV)
        assert self.proc.stdout is not None
        while b"listening on" not in (line := await asyncio.wait_for(
                self.proc.stdout.readline(), 30)):
            assert line, "the relay exited"
        self.port = int(line.decode().split("listening on ")[1].split()[0].rsplit(":", 1)[1])

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def test_serving_publisher_heals_after_the_relay_is_killed(cert: DevCertificate,
                                                                 tmp_path: Path) -> None:
    relay = RelayProcess(cert)
    await relay.start()
    f = cli_inputs(tmp_path)
    common = ["--relay", relay.url, "--cafile", str(cert.certfile), "--descriptor", f["desc"],
              "--scope-key", f["scope"], "--loopback"]
    # --no-hand-over: the relay holds nothing by itself; each fetch pulls from the publisher
    pub = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvcs", "publish", *common, "--tokens", f["tokens"], "--kv",
        f["kv"], "--no-hand-over", "--linger", "120", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=ENV)
    fetch = ["fetch", *common, "--tokens", f["tokens"], "--out", str(tmp_path / "got.npz"),
             "--recompute-budget", "5"]
    try:
        for _ in range(100):
            rc, _, err = await run_kvcs(*fetch)
            if rc == 0:
                break
            await asyncio.sleep(0.2)
        assert rc == 0, err
        await relay.kill()  # no CONNECTION_CLOSE, no GOAWAY: the publisher hears nothing
        await relay.start()  # same port, empty
        t0 = time.monotonic()
        while True:
            rc, out, err = await run_kvcs(*fetch)
            if rc == 0:
                break
            assert time.monotonic() - t0 < HEAL_BOUND_S, f"not healed: {err}"
            await asyncio.sleep(0.2)
        healed = time.monotonic() - t0
        print(f"healed {healed:.1f} s after the restart (fetches included)")
        assert "wrote 6 layers" in out
    finally:
        with contextlib.suppress(ProcessLookupError):
            pub.terminate()
        _, perr = await asyncio.wait_for(pub.communicate(), 30)
        await relay.kill()
    assert b"Traceback" not in perr, perr.decode()[-2000:]
