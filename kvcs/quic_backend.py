"""Which QUIC library :mod:`kvcs.transport` binds to: qh3 or aioquic.

The choice is made once per process, before :mod:`kvcs.transport` is first imported,
from the environment variable ``KVCS_QUIC_BACKEND``:

- ``auto`` (the default): qh3 when it is installed (it is a kvcs dependency), else
  aioquic.
- ``qh3``: the aioquic fork with a compiled connection core. On the 2-core development
  machines it moves 2-3x more bytes per CPU second than aioquic, which is what a relay
  (it receives and re-sends every byte) and a decode worker (it verifies every byte) need.
- ``aioquic``: pure-Python QUIC; every kvcs tuning applies (per-stream flow-control
  parking, receive batching, congestion controller choice).

Both speak the same wire protocol and interoperate; ``make test`` runs the network suites
on each. ``kvcs relay --quic-backend`` overrides the variable for the relay. This module
imports nothing heavy, so a command line can call :func:`choose` first.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Literal

BACKEND_ENV = "KVCS_QUIC_BACKEND"
"""Environment variable naming the QUIC library (``aioquic``, ``qh3`` or ``auto``)."""

CHOICES = ("auto", "aioquic", "qh3")
"""Accepted names."""

Backend = Literal["aioquic", "qh3"]


def resolve(name: str | None) -> Backend:
    """Map a name (``None``/empty = ``auto``) to the library to use.

    Raises :class:`ValueError` for an unknown name or when ``qh3`` is asked for but not
    installed."""
    value = (name or "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"unknown QUIC backend {name!r}: use one of {', '.join(CHOICES)}")
    has_qh3 = importlib.util.find_spec("qh3") is not None
    if value == "auto":
        return "qh3" if has_qh3 else "aioquic"
    if value == "qh3" and not has_qh3:
        raise ValueError("QUIC backend 'qh3' is not installed (pip install qh3)")
    return "qh3" if value == "qh3" else "aioquic"


def choose(name: str) -> Backend:
    """Select the backend for this process (and its child processes) by name.

    Must run before :mod:`kvcs.transport` is imported; afterwards it only succeeds if the
    name resolves to the library already bound. Returns the library in use."""
    backend = resolve(name)
    loaded = sys.modules.get("kvcs.transport.backend")
    if loaded is not None and backend != loaded.BACKEND:
        raise ValueError(f"QUIC backend already bound to {loaded.BACKEND}; "
                         f"choose {name!r} before importing kvcs.transport")
    os.environ[BACKEND_ENV] = backend
    return backend
