"""Run one side of a benchmark in a separate process (loopback only, bounded).

The benchmarks put sender and receiver in different processes so that each has its own
CPU core. A child is started with the ``spawn`` method (no inherited event loop or
sockets) and talks to the parent over a :func:`multiprocessing.Pipe`. Timestamps are
:func:`time.perf_counter` values, which on Linux come from ``CLOCK_MONOTONIC`` and are
comparable across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import multiprocessing
import multiprocessing.connection
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

PROFILE_ENV = "KVCS_BENCH_PROFILE"
"""Environment variable: file to write the child's cProfile stats to."""

CHILD_TIMEOUT = 180.0
"""Seconds a benchmark child may run before it is killed."""


def process_stat(pid: int) -> tuple[int, float, float]:
    """Minor page faults, user and system CPU seconds of process ``pid`` so far, all its
    threads (Linux /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(fields[7]), int(fields[11]) / hz, int(fields[12]) / hz


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads (Linux /proc)."""
    _, user, system = process_stat(pid)
    return user + system


async def _message(conn: multiprocessing.connection.Connection, timeout: float) -> Any:
    """The next message on ``conn``. The event loop watches the pipe's descriptor instead
    of polling it: a poll every 2 ms cost the measured processes CPU time."""
    if not conn.poll():
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        fd = conn.fileno()

        def wake() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, wake)
        try:
            await asyncio.wait_for(readable, timeout)
        finally:
            loop.remove_reader(fd)
    return conn.recv()  # EOFError: the other side exited


class Child:
    """A benchmark child process plus its end of the pipe (parent side)."""

    def __init__(self, process: multiprocessing.process.BaseProcess,
                 conn: multiprocessing.connection.Connection) -> None:
        self.process = process
        self.conn = conn

    def send(self, message: Any) -> None:
        """Send a picklable message to the child."""
        self.conn.send(message)

    async def recv(self, timeout: float = CHILD_TIMEOUT) -> Any:
        """Receive the next message without blocking the event loop; raise on child death
        or when the child reported an exception."""
        try:
            message = await _message(self.conn, timeout)
        except EOFError:
            await asyncio.get_running_loop().run_in_executor(None, self.process.join, 5.0)
            raise RuntimeError(f"benchmark child exited with {self.process.exitcode}") from None
        except TimeoutError:
            raise TimeoutError("benchmark child did not answer") from None
        if isinstance(message, BaseException):
            raise RuntimeError("benchmark child failed") from message
        return message


@contextlib.asynccontextmanager
async def child_process(target: Callable[..., None], *args: Any) -> AsyncIterator[Child]:
    """Start ``target(conn, *args)`` in a spawned process; kill it on exit if still alive."""
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=target, args=(child_conn, *args), daemon=True)
    process.start()
    child_conn.close()
    try:
        yield Child(process, parent_conn)
    finally:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, process.join, 10.0)
        if process.is_alive():
            process.kill()
            process.join(5.0)
        parent_conn.close()


async def wait_message(conn: multiprocessing.connection.Connection,
                       timeout: float = CHILD_TIMEOUT) -> Any:
    """Child side: receive one message from the parent without blocking the event loop."""
    try:
        return await _message(conn, timeout)
    except TimeoutError:
        raise TimeoutError("benchmark parent did not answer") from None


def run_child(conn: multiprocessing.connection.Connection, main: Any) -> None:
    """Child side: run coroutine ``main`` with a deadline; report an exception to the parent.

    With ``KVCS_BENCH_PROFILE=path`` in the environment the child is profiled with cProfile
    and the stats are written to ``path`` (``python -m pstats path``).
    """
    profile_path = os.environ.get(PROFILE_ENV)
    profiler = cProfile.Profile() if profile_path else None
    try:
        if profiler is not None:
            profiler.enable()
        asyncio.run(asyncio.wait_for(main, CHILD_TIMEOUT))
    except BaseException as exc:  # report, then exit
        with contextlib.suppress(Exception):
            conn.send(RuntimeError(f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)
        conn.close()
