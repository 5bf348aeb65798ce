"""The event loop kvcs programs run on: asyncio's own or uvloop (issue #18).

``kvcs ... --event-loop uvloop`` (or ``KVCS_EVENT_LOOP=uvloop``) makes every
``asyncio.run`` of the process, and of the processes it starts, use uvloop, when the
``uvloop`` extra is installed (``pip install kvcs[uvloop]``). The default stays asyncio's
loop: measured with qh3 on the 2-core development machines (raw QUIC and MOQT, sender and
receiver in two processes, medians of 4 alternating runs), uvloop did not help: raw QUIC
at 1452-byte datagrams 207 MiB/s against 353 (sender CPU 2.9 against 2.4 ms per MiB), at
60000 552 against 443 MiB/s with equal CPU per MiB; MOQT goodput 215 against 244 MiB/s at
1452 and 382 against 431 at 60000. Without GSO, at 1452 bytes, uvloop fell to 26 MiB/s
(asyncio 64). Issue #18 reports that it hurt aioquic as well.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os

EVENT_LOOP_ENV = "KVCS_EVENT_LOOP"
"""Environment variable naming the event loop: ``asyncio`` (default) or ``uvloop``."""

EVENT_LOOPS = ("asyncio", "uvloop")


def resolve_event_loop(name: str | None) -> str:
    """Check an event loop name (``None``/empty: ``$KVCS_EVENT_LOOP``, else asyncio);
    ValueError with a one-line reason for an unknown or missing one."""
    value = (name or os.environ.get(EVENT_LOOP_ENV) or "asyncio").strip().lower()
    if value not in EVENT_LOOPS:
        raise ValueError(f"unknown event loop {value!r}: use asyncio or uvloop")
    if value == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ValueError("event loop uvloop is not installed (pip install uvloop)")
    return value


def use_event_loop(name: str | None = None) -> str:
    """Make ``name`` (see :func:`resolve_event_loop`) the loop of every later
    ``asyncio.run`` in this process and, through ``KVCS_EVENT_LOOP``, in the processes it
    starts. Returns the loop chosen."""
    value = resolve_event_loop(name)
    if value == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    else:
        asyncio.set_event_loop_policy(None)
    os.environ[EVENT_LOOP_ENV] = value
    return value


def running_event_loop() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop running now (call inside it)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
