"""What every ``kvcs`` command shares: the command registry, :class:`UsageError` (a user
mistake: one line, status 2), the transport options and the stop-on-signal event."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import logging
import signal
from collections.abc import Callable
from typing import Any


class UsageError(Exception):
    """A user mistake: printed as one line, exit status 2."""


Builder = Callable[[Any], argparse.ArgumentParser]
COMMANDS: dict[str, Builder] = {}
"""Subcommand name -> builder adding its subparser (insertion order = help order)."""


def command(name: str) -> Callable[[Builder], Builder]:
    """Register a subcommand builder."""

    def deco(fn: Builder) -> Builder:
        COMMANDS[name] = fn
        return fn

    return deco


def add_quic_options(p: argparse.ArgumentParser) -> None:
    """The transport options every networked command takes: ``--mtu``, ``--event-loop``,
    ``--quic-backend``, ``--congestion-control``."""
    p.add_argument("--mtu", type=int, metavar="BYTES",
                   help="path MTU of a LAN, for datagrams of MTU-48 bytes to every peer: "
                        "1500 (Ethernet), 9000 (jumbo frames); default: the QUIC library's "
                        "largest datagrams to a peer on loopback, 1350 bytes to others")
    p.add_argument("--event-loop", choices=["asyncio", "uvloop"],
                   help="event loop (default: $KVCS_EVENT_LOOP, else asyncio); uvloop needs "
                        "pip install uvloop")
    p.add_argument("--quic-backend", choices=["auto", "aioquic", "qh3"],
                   help="QUIC library (default: $KVCS_QUIC_BACKEND, else auto = qh3 "
                   "(compiled core) when installed, else aioquic)")
    p.add_argument("--congestion-control", choices=["reno", "cubic", "bbr"],
                   help="congestion controller of what this side sends (aioquic only: "
                        "--quic-backend aioquic; default reno); bbr for long lossy paths "
                        "(docs/perf-profile.md, Long-haul)")


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (call inside the running loop): servers wait on
    it, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message (and the
    traceback as ``exc``)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
                 .isoformat(timespec="milliseconds"),
                 "level": record.levelname.lower(), "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_relay_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at ``level``: one text line per event, or one JSON object (``json``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
