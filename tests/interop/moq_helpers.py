"""Helpers for interop tests against moq-dev/moq through its Python bindings (moq-ffi 0.4.18).

The ``moq`` package (PyPI ``moq-rs``) wraps the UniFFI bindings in ``moq_ffi``. Every
network call is an ``async`` coroutine that must run inside a running asyncio loop (UniFFI
resolves Rust futures via ``loop.call_soon_threadsafe`` on the loop that awaited them);
writes (``write_frame``, ``finish``) are plain synchronous, non-blocking calls. The Rust
side runs its own tokio threads, so nothing here blocks the event loop.

Import this module only after ``pytest.importorskip("moq")``.

Facts these helpers encode (see docs/interop.md for details):

* ``moq.Server`` needs TLS: ``tls_generate=[hostnames]`` (self-signed) or
  ``tls_cert=[pem]``/``tls_key=[pem]``.  Bind ``127.0.0.1:0`` and read ``local_addr``
  for the ephemeral port.  Raw QUIC (``moqt://``) and WebTransport (``https://``) share it.
* ``Server.serve()`` leaves "Task exception was never retrieved" noise when a session ends
  with an error, so :class:`FfiServer` runs its own accept loop and swallows session errors.
* A subscription's default ``max_age_us=0`` drops every group but the newest, and the
  publisher's default track max age is 5 s: both are raised here.
* Finishing a track while a large group is still in transit silently drops that group,
  so :func:`publish_track` only finishes after the subscriber says it is done (or a grace
  period passes).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

import moq

#: Max age used for both the published track and the subscription (60 s).
DEFAULT_MAX_AGE_US = 60_000_000


# --------------------------------------------------------------------------- payloads


def object_payload(group: int, obj: int, size: int) -> bytes:
    """Deterministic payload of ``size`` bytes for object ``obj`` of group ``group``.

    The bytes repeat an 8-byte big-endian ``(group, obj)`` stamp, so a misplaced or
    truncated object is detectable and a 1 MiB payload is cheap to build.
    """
    if size <= 0:
        return b""
    stamp = struct.pack(">II", group & 0xFFFFFFFF, obj & 0xFFFFFFFF)
    return (stamp * (size // 8 + 1))[:size]


def make_groups(
    groups: int,
    objects: int,
    size: int | Callable[[int, int], int] = 256,
    overrides: Mapping[tuple[int, int], int] | None = None,
) -> list[list[bytes]]:
    """Build ``groups`` x ``objects`` payloads.

    ``size`` is a fixed size or a function ``(group, obj) -> size``; ``overrides`` maps
    ``(group, obj)`` to a size that wins over ``size`` (e.g. ``{(40, 10): 1 << 20}``).
    """
    overrides = overrides or {}
    out: list[list[bytes]] = []
    for g in range(groups):
        row: list[bytes] = []
        for o in range(objects):
            n = overrides.get((g, o), size(g, o) if callable(size) else size)
            row.append(object_payload(g, o, n))
        out.append(row)
    return out


# --------------------------------------------------------------------------- server


class FfiServer:
    """A moq-ffi relay (``moq.Server`` with its own origin) on an ephemeral loopback port.

    Use ``async with FfiServer() as srv`` or ``await srv.start()`` / ``await srv.stop()``.
    With no origins given, ``moq.Server`` relays: whatever one session publishes, any
    other session can subscribe to.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls_generate: Sequence[str] = ("localhost",),
        tls_cert: Sequence[str] = (),
        tls_key: Sequence[str] = (),
    ) -> None:
        self._bind = f"{host}:{port}"
        self._tls_generate = list(tls_generate) if not tls_cert else []
        self._tls_cert = list(tls_cert)
        self._tls_key = list(tls_key)
        self._server: moq.Server | None = None
        self._accept_task: asyncio.Task[None] | None = None
        self._session_tasks: set[asyncio.Task[None]] = set()
        #: Errors that ended sessions other than a clean close (handshake failures, protocol
        #: violations). A clean client close surfaces as ``Protocol`` code 0 and is dropped.
        self.session_errors: list[BaseException] = []
        #: Number of sessions accepted so far.
        self.accepted = 0

    @property
    def addr(self) -> str:
        """The bound ``host:port``."""
        if self._server is None:
            raise RuntimeError("server not started")
        return self._server.local_addr

    @property
    def port(self) -> int:
        """The bound UDP port."""
        return int(self.addr.rsplit(":", 1)[1])

    @property
    def quic_url(self) -> str:
        """URL for raw QUIC (the client offers ALPNs ``moq-lite-*``, ``moql``, ``moqt-*``)."""
        return f"moqt://{self.addr}"

    @property
    def webtransport_url(self) -> str:
        """URL for WebTransport over HTTP/3 (ALPN ``h3``; ``wt-available-protocols`` header)."""
        return f"https://{self.addr}"

    def fingerprints(self) -> list[str]:
        """Hex SHA-256 fingerprints of the server certificate(s) (for ``tls_fingerprints``)."""
        if self._server is None:
            raise RuntimeError("server not started")
        return self._server.cert_fingerprints()

    async def start(self) -> FfiServer:
        """Bind the socket and start accepting sessions."""
        if self._server is not None:
            raise RuntimeError("server already started")
        server = moq.Server(
            self._bind,
            tls_generate=self._tls_generate,
            tls_cert=self._tls_cert,
            tls_key=self._tls_key,
        )
        await server.__aenter__()
        self._server = server
        self._accept_task = asyncio.create_task(self._accept_loop(server))
        return self

    async def stop(self) -> None:
        """Stop accepting, close the socket, and end every held session."""
        server, self._server = self._server, None
        if server is not None:
            await server.__aexit__(None, None, None)
        tasks = list(self._session_tasks)
        if self._accept_task is not None:
            tasks.append(self._accept_task)
            self._accept_task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> FfiServer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _accept_loop(self, server: moq.Server) -> None:
        with contextlib.suppress(moq.Error):
            async for request in server:
                task = asyncio.create_task(self._hold(request))
                self._session_tasks.add(task)
                task.add_done_callback(self._session_tasks.discard)

    async def _hold(self, request: moq.Request) -> None:
        try:
            session = await request.accept()
            self.accepted += 1
            async with session:
                await session.closed()
        except moq.Error as err:
            proto = moq.protocol_error(err)
            if proto is None or proto.code != 0:  # code 0 ("no error") is a clean close
                self.session_errors.append(err)


# --------------------------------------------------------------------------- publisher


def _client(url: str) -> moq.Client:
    # No reconnect: a test should see a dropped connection, not ride it out. No WebSocket
    # fallback: the servers under test are QUIC only.
    return moq.Client(url, tls_verify=False, reconnect=False, websocket_enabled=False)


async def publish_track(
    url: str,
    broadcast: str,
    track: str,
    groups: Sequence[Sequence[bytes]],
    *,
    wait_for_subscriber: bool = True,
    release: asyncio.Event | None = None,
    linger: float = 1.0,
    max_age_us: int = DEFAULT_MAX_AGE_US,
    timeout: float = 15.0,
) -> None:
    """Connect a moq-ffi client, publish ``groups`` on ``broadcast``/``track``, finish.

    ``broadcast`` is a ``/``-separated path (= MOQT namespace fields); each entry of
    ``groups`` becomes one group (sequence 0, 1, ...) whose objects are the given payloads.

    With ``wait_for_subscriber`` the groups are written only once a subscriber is attached,
    so they are delivered live rather than from the relay cache. The track is finished
    only after ``release`` is set (typically the subscriber's ``done`` event) or, without
    ``release``, after ``linger`` seconds: finishing while a large group is in transit drops
    it. The connection is then held until the subscriber lets go (at most ``linger`` s),
    because the relay forgets the broadcast when the publisher disconnects.
    """
    async with asyncio.timeout(timeout), _client(url) as client:
        bc = client.create_broadcast(broadcast)
        producer = bc.publish_track(track, moq.TrackInfo(max_age_us=max_age_us))
        bc.announce()
        if wait_for_subscriber:
            await producer.used()
        for payloads in groups:
            group = producer.append_group()
            for payload in payloads:
                group.write_frame(payload)
            group.finish()
            await asyncio.sleep(0)  # let the FFI side drain between groups
        if release is not None:
            await release.wait()
        else:
            await asyncio.sleep(linger)
        producer.finish()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(producer.unused(), linger)
        bc.close()


# --------------------------------------------------------------------------- subscriber


@dataclass
class ReceivedGroup:
    """One group as received: its sequence number and object payloads in order."""

    sequence: int
    objects: list[bytes] = field(default_factory=list)


class CollectTimeout(TimeoutError):
    """:func:`collect_track` timed out; ``partial`` holds what had arrived."""

    def __init__(self, partial: list[ReceivedGroup]) -> None:
        super().__init__(f"timed out after {len(partial)} complete group(s)")
        self.partial = partial


async def collect_track(
    url: str,
    broadcast: str,
    track: str,
    *,
    expected_groups: int | None = None,
    subscribed: asyncio.Event | None = None,
    done: asyncio.Event | None = None,
    max_age_us: int = DEFAULT_MAX_AGE_US,
    timeout: float = 15.0,
) -> list[ReceivedGroup]:
    """Subscribe with a moq-ffi client and collect every group of a track.

    Waits for ``broadcast`` to be announced, subscribes to ``track`` and reads groups in
    arrival order, each group's objects on its own task (so one large group does not hold
    up the others). Returns the complete groups sorted by sequence when the track ends,
    or as soon as ``expected_groups`` groups are complete. ``subscribed`` is set once the
    subscription is in place and ``done`` once collection is over (pass it as the
    publisher's ``release``). Raises :class:`CollectTimeout` after ``timeout`` seconds.
    """
    complete: dict[int, ReceivedGroup] = {}
    finished = asyncio.Event()

    async def read_group(group: moq.GroupConsumer) -> None:
        received = ReceivedGroup(group.sequence)
        async for frame in group:
            received.objects.append(frame.payload)
        complete[received.sequence] = received
        if expected_groups is not None and len(complete) >= expected_groups:
            finished.set()

    async def run(client: moq.Client) -> None:
        consumer = await client.announced_broadcast(broadcast)
        sub = await consumer.subscribe_track(track, moq.Subscription(max_age_us=max_age_us))
        if subscribed is not None:
            subscribed.set()
        async with asyncio.TaskGroup() as readers:
            async for group in sub.groups_as_arrived():
                readers.create_task(read_group(group))
        finished.set()

    try:
        async with _client(url) as client:
            task = asyncio.create_task(run(client))
            waiter = asyncio.create_task(finished.wait())
            try:
                await asyncio.wait(
                    {task, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if task.done():
                    task.result()  # surface a subscriber error
                elif not waiter.done():
                    raise CollectTimeout(sorted(complete.values(), key=_seq))
            finally:
                for t in (task, waiter):
                    t.cancel()
                await asyncio.gather(task, waiter, return_exceptions=True)
    finally:
        if done is not None:
            done.set()
    return sorted(complete.values(), key=_seq)


def _seq(group: ReceivedGroup) -> int:
    return group.sequence
