"""Relays for the benchmarks, each in its own process: the kvcs relay and moq-dev/moq's.

A relay runs as ``python -m bench._relays {kvcs|moq-dev} --cert-dir DIR
[--datagram-size N] [--congestion-control NAME] [--upstream URL [--upstream-transport
LIBRARY[:CONTROLLER]]]`` so that its QUIC library is chosen by
the environment before kvcs is imported, and so that its CPU time is its own
(``/proc/<pid>/stat``, every thread, which counts moq-dev's tokio threads too). It prints
``<port> <certificate sha256>`` once listening and stops on SIGTERM or when its standard
input closes (the parent is gone).

* ``kvcs``: :class:`kvcs.relay.Relay` (what ``kvcs relay`` runs), anonymous, with the
  bench's loopback settings or ``--datagram-size``-byte datagrams, and the aioquic
  congestion controller ``--congestion-control``
  (:attr:`kvcs.transport.QuicSettings.congestion_control`).
* ``moq-dev``: ``moq.Server`` from moq-ffi (the ``interop`` extra) without origins, which
  relays between its sessions (docs/interop.md). Its QUIC stack (noq, a quinn fork)
  chooses its own datagram size: :data:`MOQDEV_DATAGRAM`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench._proc import process_cpu_seconds

KINDS = ("kvcs", "moq-dev")

MOQDEV_DATAGRAM = 1200
"""Largest datagram moq-ffi 0.4.18's relay sends: a UDP proxy between it and a kvcs
consumer saw none above 1200 bytes in a 128 MiB transfer (no path MTU discovery;
MOQ_SERVER_QUIC_MTU_DISCOVERY in its environment changed nothing). Comparisons give the
kvcs parties this size too, so that both relays carry the same datagrams."""
ROOT = Path(__file__).resolve().parent.parent


def moqdev_available() -> bool:
    """Whether moq-ffi (the ``interop`` extra) is installed."""
    return importlib.util.find_spec("moq") is not None


@dataclass(frozen=True)
class RelayProcess:
    """A running relay: where to connect and how to read its CPU time."""

    kind: str
    url: str
    pin: str
    pid: int

    def cpu_seconds(self) -> float:
        """CPU seconds the relay process has used so far (all threads)."""
        return process_cpu_seconds(self.pid)


@contextlib.contextmanager
def relay_process(kind: str, cert_dir: str, datagram_size: int | None = None,
                  library: str | None = None, congestion_control: str | None = None,
                  upstream: str | None = None,
                  upstream_transport: str | None = None) -> Iterator[RelayProcess]:
    """Start a relay of ``kind`` (certificate in ``cert_dir``); stop it on exit.

    ``library`` runs the kvcs relay on another QUIC library than this process,
    ``congestion_control`` names its aioquic congestion controller; ``upstream`` (a URL
    with the same certificate) chains it below another relay, its link on
    ``upstream_transport`` (``library[:controller]``; None: the relay's)."""
    from bench._quic import LIBRARY_ENV
    from kvcs.testing import stop_process

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if library is not None:
        env[LIBRARY_ENV] = library
    size = ["--datagram-size", str(datagram_size)] if datagram_size else []
    if congestion_control is not None:
        size += ["--congestion-control", congestion_control]
    if upstream is not None:
        size += ["--upstream", upstream]
    if upstream_transport is not None:
        size += ["--upstream-transport", upstream_transport]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench._relays", kind, "--cert-dir", cert_dir, *size],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if len(line) != 2:
            raise RuntimeError(f"{kind} relay did not start (exit code {proc.wait(10)})")
        yield RelayProcess(kind, f"moqt://127.0.0.1:{line[0]}/", line[1], proc.pid)
    finally:
        stop_process(proc, 15)


# --------------------------------------------------------------------------- child side


def _stop_event() -> asyncio.Event:
    """Set on SIGTERM/SIGINT or at the end of standard input (the parent exited)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stdin = sys.stdin.fileno()

    def stdin_readable() -> None:
        if not os.read(stdin, 4096):
            loop.remove_reader(stdin)
            stop.set()

    loop.add_reader(stdin, stdin_readable)
    return stop


async def _run_kvcs(cert_dir: str, datagram_size: int | None,
                    congestion_control: str | None, upstream: str | None,
                    upstream_transport: str | None) -> None:
    from bench._quic import quic_settings
    from kvcs.relay import Relay, RelayConfig
    from kvcs.transport import ensure_dev_certificate

    settings = quic_settings(datagram_size)
    if congestion_control is not None:
        settings = dataclasses.replace(settings, congestion_control=congestion_control)
    library, _, controller = (upstream_transport or "").partition(":")
    config = RelayConfig(listen="127.0.0.1:0", anonymous=True, cert_dir=cert_dir,
                         log_level="warning", upstream=upstream,
                         upstream_quic_backend=library or None,
                         upstream_congestion_control=controller or None)
    if upstream:
        config.upstream_cafile = str(ensure_dev_certificate(cert_dir).certfile)
    relay = Relay(config, settings=settings)
    stop = _stop_event()
    await relay.start()
    print(relay.port, relay.fingerprint, flush=True)
    await stop.wait()
    await relay.stop(grace=0)


async def _run_moqdev(cert_dir: str) -> None:
    import moq

    from kvcs.transport import ensure_dev_certificate

    cert = ensure_dev_certificate(cert_dir)
    sessions: set[asyncio.Task[None]] = set()

    async def hold(request: moq.Request) -> None:
        # a session lives as long as its handle; a clean close raises too (code 0)
        with contextlib.suppress(moq.Error):
            session = await request.accept()
            async with session:
                await session.closed()

    async def accept(server: moq.Server) -> None:
        with contextlib.suppress(moq.Error):
            async for request in server:
                task = asyncio.create_task(hold(request))
                sessions.add(task)
                task.add_done_callback(sessions.discard)

    stop = _stop_event()
    async with moq.Server("127.0.0.1:0", tls_cert=[str(cert.certfile)],
                          tls_key=[str(cert.keyfile)]) as server:
        accepting = asyncio.create_task(accept(server))
        print(server.local_addr.rpartition(":")[2], cert.sha256, flush=True)
        await stop.wait()
        for task in (accepting, *sessions):
            task.cancel()
        await asyncio.gather(accepting, *sessions, return_exceptions=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._relays")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--cert-dir", required=True)
    parser.add_argument("--datagram-size", type=int)
    parser.add_argument("--congestion-control")
    parser.add_argument("--upstream")
    parser.add_argument("--upstream-transport", metavar="LIBRARY[:CONTROLLER]")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    run = (_run_kvcs(args.cert_dir, args.datagram_size, args.congestion_control,
                     args.upstream, args.upstream_transport)
           if args.kind == "kvcs"
           else _run_moqdev(args.cert_dir))
    asyncio.run(run)


if __name__ == "__main__":
    main(sys.argv[1:])
