"""A loopback UDP impairment proxy for fault-injection tests (asyncio, standard library only).

    proxy = ImpairmentProxy("127.0.0.1", relay.port, seed=7,
                            up=Impairment(loss=0.01), down=Impairment(loss=0.01))
    await proxy.start()
    ep = await Endpoint.connect(f"moqt://127.0.0.1:{proxy.port}/", ...)
    proxy.down.delay_ms = 40        # settings change live
    proxy.blackhole(0.5)            # both directions drop everything for 0.5 s
    ...
    await proxy.aclose()

The proxy listens on its own UDP port. Each client address gets its own upstream socket,
connected to the target, so the target sees one address per client address (a QUIC
connection migration reaches the target as a new address, as it would without the proxy).
"up" is client -> target, "down" is target -> client. Each direction has its own
:class:`Impairment` settings, :class:`Counters`, ``random.Random`` and pipeline, shared by
every client (one link per direction, like a shared bottleneck):

    in -> blackhole -> loss -> corrupt -> duplicate -> reorder -> delay + jitter
       -> bandwidth cap -> out

Timers are event-loop timers (one per pipeline stage, plus one per datagram held back for
reordering); no task per datagram. With no impairment set and nothing queued, a datagram
is forwarded within the receive callback. Randomness comes only from the direction's
``random.Random``, drawn only for impairments that are set, so a seed and the same
sequence of datagrams and settings give the same decisions.

``python -m tests.faults.measure_impair`` measures the pass-through throughput.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from random import Random
from typing import Any, NamedTuple

KiB = 1024
MiB = 1024 * KiB

SOCKET_BUFFER = 4 * MiB
"""SO_RCVBUF/SO_SNDBUF of every proxy socket: what kvcs's loopback preset uses, so that
the proxy's sockets drop no more of a burst than the endpoints' own do."""

RECEIVE_BATCH = 64
"""Datagrams read per readiness event of a socket. Reading one per event halved the
pass-through rate (measured on a loaded host: 16-19 against 24-44 MiB/s with 1350-byte
datagrams, 190-270 against 410-510 MiB/s with 60000-byte ones)."""

SEND_BACKLOG = 4 * MiB
"""Bytes a socket may hold back while the kernel reports its send buffer full; beyond this
a datagram is counted in ``send_errors`` and dropped."""

_MAX_UDP = 65535
_TIME_TOLERANCE = 1e-6  # s: a timer may fire a clock tick before its due time

Deliver = Callable[[bytes], bool]
"""Sends one datagram onwards; False if the socket could not take it."""


def _probability(value: Any) -> bool:
    return isinstance(value, int | float) and 0.0 <= value <= 1.0


def _non_negative(value: Any) -> bool:
    return isinstance(value, int | float) and value >= 0


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "loss": (_probability, "a probability in [0, 1]"),
    "corrupt": (_probability, "a probability in [0, 1]"),
    "duplicate": (_probability, "a probability in [0, 1]"),
    "reorder": (_probability, "a probability in [0, 1]"),
    "reorder_depth": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "reorder_timeout_ms": (_non_negative, "a number >= 0"),
    "delay_ms": (_non_negative, "a number >= 0"),
    "jitter_ms": (_non_negative, "a number >= 0"),
    "bandwidth": (lambda v: v is None or (isinstance(v, int | float) and v > 0),
                  "None or a rate > 0 (bytes/s)"),
    "queue_bytes": (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0"),
    "burst_bytes": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "blackhole": (lambda v: isinstance(v, bool), "a bool"),
    "blackhole_until": (_non_negative, "a loop time >= 0"),
}


@dataclass
class Impairment:
    """What one direction does to its datagrams; every field may change while running
    (each assignment is validated: ValueError on a bad value)."""

    loss: float = 0.0
    """Probability that a datagram is dropped."""
    corrupt: float = 0.0
    """Probability that one byte of a datagram, at a random position, is changed (XOR
    with a random non-zero value): garbage in a QUIC packet, which its AEAD tag must
    catch."""
    duplicate: float = 0.0
    """Probability that a datagram is sent twice (the copy follows it)."""
    reorder: float = 0.0
    """Probability that a datagram is held back: it leaves right after the
    ``reorder_depth``-th later datagram that was not held back, or after
    ``reorder_timeout_ms`` if fewer come."""
    reorder_depth: int = 3
    reorder_timeout_ms: float = 50.0
    delay_ms: float = 0.0
    """One-way delay added to every datagram."""
    jitter_ms: float = 0.0
    """Each datagram's delay is ``delay_ms`` plus a uniform draw in +-``jitter_ms`` (at least
    0); datagrams keep their order (a datagram never leaves before an earlier one), so
    jitter alone does not reorder."""
    bandwidth: float | None = None
    """Rate cap in bytes/s (token bucket), None for none."""
    queue_bytes: int = 256 * KiB
    """Bottleneck queue in front of the rate cap: datagrams that would exceed it are
    dropped (counted in ``overflowed``), as a router's full queue drops them."""
    burst_bytes: int = 64 * KiB
    """Token bucket depth: bytes that may leave back to back after an idle period (a
    datagram larger than the bucket leaves once the bucket is full)."""
    blackhole: bool = False
    """Drop every datagram that arrives while True (those already delayed or queued still
    leave, as packets already on the wire do)."""
    blackhole_until: float = 0.0
    """Drop every datagram until this event-loop time (see
    :meth:`ImpairmentProxy.blackhole`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        check = _CHECKS.get(name)
        if check is not None and not check[0](value):
            raise ValueError(f"Impairment.{name} must be {check[1]}, got {value!r}")
        super().__setattr__(name, value)

    def impairs(self, now: float) -> bool:
        """True if any impairment is in effect at loop time ``now``."""
        return bool(self.loss or self.corrupt or self.duplicate or self.reorder or self.delay_ms
                    or self.jitter_ms or self.bandwidth is not None or self.blackhole
                    or self.blackhole_until > now)


@dataclass
class Counters:
    """What happened to one direction's datagrams. At rest (nothing held, delayed or
    queued): ``sent + send_errors == datagrams_in + duplicated - dropped``."""

    datagrams_in: int = 0
    bytes_in: int = 0
    lost: int = 0
    """Dropped by ``loss``."""
    corrupted: int = 0
    """Changed by ``corrupt`` (and sent on)."""
    blackholed: int = 0
    overflowed: int = 0
    """Dropped because the bottleneck queue was full."""
    duplicated: int = 0
    reordered: int = 0
    """Held back by ``reorder``."""
    delayed: int = 0
    """Given a delay > 0 by ``delay_ms``/``jitter_ms``."""
    queued: int = 0
    """Waited in the bottleneck queue for the rate cap."""
    sent: int = 0
    bytes_sent: int = 0
    send_errors: int = 0
    """Refused by the outgoing socket (error or backlog full)."""

    @property
    def dropped(self) -> int:
        """Every datagram the impairments dropped."""
        return self.lost + self.blackholed + self.overflowed


@dataclass(slots=True)
class _Held:
    data: bytes
    deliver: Deliver
    remaining: int
    timer: asyncio.TimerHandle | None = None


class _Link:
    """The pipeline of one direction."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: Impairment,
                 rng: Random) -> None:
        self.loop = loop
        self.settings = settings
        self.rng = rng
        self.counters = Counters()
        self._held: list[_Held] = []
        self._delay_line: deque[tuple[float, bytes, Deliver]] = deque()
        self._delay_timer: asyncio.TimerHandle | None = None
        self._queue: deque[tuple[bytes, Deliver]] = deque()
        self._queue_bytes = 0
        self._queue_timer: asyncio.Handle | None = None
        self._tokens = float(settings.burst_bytes)
        self._tokens_at = loop.time()

    @property
    def idle(self) -> bool:
        """Nothing held, delayed or queued."""
        return not (self._held or self._delay_line or self._queue)

    def push(self, data: bytes, deliver: Deliver) -> None:
        """One datagram enters the link."""
        c = self.counters
        c.datagrams_in += 1
        c.bytes_in += len(data)
        s = self.settings
        now = self.loop.time()
        if not s.impairs(now) and self.idle:
            self._send(data, deliver)
            return
        if s.blackhole or s.blackhole_until > now:
            c.blackholed += 1
            return
        rng = self.rng
        if s.loss and rng.random() < s.loss:
            c.lost += 1
            return
        if s.corrupt and data and rng.random() < s.corrupt:
            c.corrupted += 1
            spoiled = bytearray(data)
            spoiled[rng.randrange(len(spoiled))] ^= rng.randrange(1, 256)
            data = bytes(spoiled)
        self._reorder_stage(data, deliver, now)
        if s.duplicate and rng.random() < s.duplicate:
            c.duplicated += 1
            self._reorder_stage(data, deliver, now)

    def close(self) -> None:
        """Cancel the timers and forget what is in flight."""
        for held in self._held:
            if held.timer is not None:
                held.timer.cancel()
        for timer in (self._delay_timer, self._queue_timer):
            if timer is not None:
                timer.cancel()
        self._held.clear()
        self._delay_line.clear()
        self._queue.clear()
        self._queue_bytes = 0
        self._delay_timer = self._queue_timer = None

    # -- reorder ----------------------------------------------------------------------

    def _reorder_stage(self, data: bytes, deliver: Deliver, now: float) -> None:
        s = self.settings
        if s.reorder and self.rng.random() < s.reorder:
            self.counters.reordered += 1
            held = _Held(data, deliver, s.reorder_depth)
            held.timer = self.loop.call_later(s.reorder_timeout_ms / 1000,
                                              self._release, held)
            self._held.append(held)
            return
        self._delay_stage(data, deliver, now)
        if self._held:
            for held in list(self._held):
                held.remaining -= 1
                if held.remaining <= 0:
                    self._release(held)

    def _release(self, held: _Held) -> None:
        self._held.remove(held)
        if held.timer is not None:
            held.timer.cancel()
        self._delay_stage(held.data, held.deliver, self.loop.time())

    # -- delay and jitter ---------------------------------------------------------------

    def _delay_stage(self, data: bytes, deliver: Deliver, now: float) -> None:
        s = self.settings
        delay = s.delay_ms
        if s.jitter_ms:
            delay += self.rng.uniform(-s.jitter_ms, s.jitter_ms)
        line = self._delay_line
        if delay <= 0 and not line:
            self._queue_stage(data, deliver)
            return
        if delay > 0:
            self.counters.delayed += 1
        due = now + max(delay, 0.0) / 1000
        if line and line[-1][0] > due:
            due = line[-1][0]  # first in, first out
        line.append((due, data, deliver))
        if self._delay_timer is None:
            self._delay_timer = self.loop.call_at(due, self._delay_due)

    def _delay_due(self) -> None:
        self._delay_timer = None
        line = self._delay_line
        now = self.loop.time() + _TIME_TOLERANCE
        while line and line[0][0] <= now:
            _, data, deliver = line.popleft()
            self._queue_stage(data, deliver)
        if line:
            self._delay_timer = self.loop.call_at(line[0][0], self._delay_due)

    # -- bandwidth cap ------------------------------------------------------------------

    def _queue_stage(self, data: bytes, deliver: Deliver) -> None:
        rate = self.settings.bandwidth
        if not self._queue and (rate is None or self._take(len(data), rate)):
            self._send(data, deliver)
            return
        if rate is not None and self._queue_bytes + len(data) > self.settings.queue_bytes:
            self.counters.overflowed += 1
            return
        self.counters.queued += 1
        self._queue.append((data, deliver))
        self._queue_bytes += len(data)
        self._arm_queue()

    def _take(self, size: int, rate: float) -> bool:
        """Spend ``size`` tokens if the bucket holds them (or is full)."""
        now = self.loop.time()
        burst = self.settings.burst_bytes
        self._tokens = min(float(burst), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        if self._tokens + 1 >= min(size, burst):  # 1 byte of rounding slack
            self._tokens -= size
            return True
        return False

    def _arm_queue(self) -> None:
        if self._queue_timer is not None or not self._queue:
            return
        rate = self.settings.bandwidth
        if rate is None:  # the cap was lifted: empty the queue now
            self._queue_timer = self.loop.call_soon(self._queue_due)
            return
        need = min(len(self._queue[0][0]), self.settings.burst_bytes) - self._tokens
        self._queue_timer = self.loop.call_later(max(need, 0.0) / rate, self._queue_due)

    def _queue_due(self) -> None:
        self._queue_timer = None
        queue = self._queue
        while queue:
            data, deliver = queue[0]
            rate = self.settings.bandwidth
            if rate is not None and not self._take(len(data), rate):
                break
            queue.popleft()
            self._queue_bytes -= len(data)
            self._send(data, deliver)
        self._arm_queue()

    # -- out --------------------------------------------------------------------------

    def _send(self, data: bytes, deliver: Deliver) -> None:
        c = self.counters
        if deliver(data):
            c.sent += 1
            c.bytes_sent += len(data)
        else:
            c.send_errors += 1


class _Port:
    """A non-blocking UDP socket on the event loop: batched reads, buffered writes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 on_datagram: Callable[[bytes, Any], None]) -> None:
        self.loop = loop
        self.sock = sock
        self.on_datagram = on_datagram
        self._backlog: deque[tuple[bytes, Any]] = deque()
        self._backlog_bytes = 0
        loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        recvfrom, on_datagram = self.sock.recvfrom, self.on_datagram
        for _ in range(RECEIVE_BATCH):
            try:
                data, addr = recvfrom(_MAX_UDP)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionRefusedError:
                continue  # ICMP port unreachable for an earlier send: the target is gone
            except OSError:
                return
            on_datagram(data, addr)

    def _send_now(self, data: bytes, addr: Any) -> None:
        if addr is None:
            self.sock.send(data)
        else:
            self.sock.sendto(data, addr)

    def send(self, data: bytes, addr: Any = None) -> bool:
        """Send (to ``addr``, or the connected peer); False if refused."""
        if not self._backlog:
            try:
                self._send_now(data, addr)
                return True
            except (BlockingIOError, InterruptedError):
                self.loop.add_writer(self.sock.fileno(), self._writable)
            except OSError:
                return False
        if self._backlog_bytes + len(data) > SEND_BACKLOG:
            return False
        self._backlog.append((data, addr))
        self._backlog_bytes += len(data)
        return True

    def _writable(self) -> None:
        backlog = self._backlog
        while backlog:
            data, addr = backlog[0]
            try:
                self._send_now(data, addr)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                pass  # this datagram is lost, like a send error on the wire
            backlog.popleft()
            self._backlog_bytes -= len(data)
        self.loop.remove_writer(self.sock.fileno())

    def close(self) -> None:
        fd = self.sock.fileno()
        if fd >= 0:
            self.loop.remove_reader(fd)
            self.loop.remove_writer(fd)
        self.sock.close()
        self._backlog.clear()


def _udp_socket(family: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _Client(NamedTuple):
    """One client address's upstream socket (connected to the target)."""

    upstream: _Port
    to_target: Deliver


class ImpairmentProxy:
    """UDP proxy from its own port (``port`` after :meth:`start`) to ``target_host:port``,
    impairing each direction as ``up`` (client -> target) and ``down`` (target -> client)
    say. ``seed`` seeds one ``random.Random`` per direction."""

    def __init__(self, target_host: str, target_port: int, *, seed: int,
                 up: Impairment | None = None, down: Impairment | None = None,
                 listen_host: str = "127.0.0.1") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.seed = seed
        self.listen_host = listen_host
        self._up_settings = up or Impairment()
        self._down_settings = down or Impairment()
        self._target: Any = None
        self._family = socket.AF_INET
        self._listener: _Port | None = None
        self._clients: dict[Any, _Client] = {}
        self._up: _Link | None = None
        self._down: _Link | None = None
        self.port = 0

    # -- settings and counters ----------------------------------------------------------

    @property
    def up(self) -> Impairment:
        """Settings of client -> target (change fields, or assign a new Impairment)."""
        return self._up_settings

    @up.setter
    def up(self, settings: Impairment) -> None:
        self._up_settings = settings
        if self._up is not None:
            self._up.settings = settings

    @property
    def down(self) -> Impairment:
        """Settings of target -> client."""
        return self._down_settings

    @down.setter
    def down(self, settings: Impairment) -> None:
        self._down_settings = settings
        if self._down is not None:
            self._down.settings = settings

    @property
    def up_counters(self) -> Counters:
        return self._link("up").counters

    @property
    def down_counters(self) -> Counters:
        return self._link("down").counters

    @property
    def clients(self) -> int:
        """Client addresses seen (each has its own upstream socket)."""
        return len(self._clients)

    @property
    def idle(self) -> bool:
        """Nothing held, delayed or queued in either direction."""
        return self._link("up").idle and self._link("down").idle

    def blackhole(self, seconds: float, *, up: bool = True, down: bool = True) -> None:
        """Drop every datagram of the chosen directions for ``seconds`` from now (0 ends
        a period early); ``Impairment.blackhole = True`` drops until set back to False."""
        until = asyncio.get_running_loop().time() + seconds
        for wanted, settings in ((up, self.up), (down, self.down)):
            if wanted:
                settings.blackhole_until = until

    def _link(self, name: str) -> _Link:
        link = self._up if name == "up" else self._down
        if link is None:
            raise RuntimeError("ImpairmentProxy not started")
        return link

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve the target and bind the listening port (ephemeral: see ``port``)."""
        if self._listener is not None:
            raise RuntimeError("ImpairmentProxy already started")
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.target_host, self.target_port,
                                       type=socket.SOCK_DGRAM)
        self._family, _, _, _, self._target = infos[0]
        listen_family = socket.AF_INET6 if ":" in self.listen_host else socket.AF_INET
        sock = _udp_socket(listen_family)
        try:
            sock.bind((self.listen_host, 0))
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self._up = _Link(loop, self._up_settings, Random(f"{self.seed}:up"))
        self._down = _Link(loop, self._down_settings, Random(f"{self.seed}:down"))
        self._listener = _Port(loop, sock, self._from_client)

    async def aclose(self) -> None:
        """Close every socket and drop what is in flight (idempotent)."""
        for link in (self._up, self._down):
            if link is not None:
                link.close()
        for client in self._clients.values():
            client.upstream.close()
        self._clients.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def __aenter__(self) -> ImpairmentProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- forwarding -------------------------------------------------------------------

    def _from_client(self, data: bytes, addr: Any) -> None:
        client = self._clients.get(addr)
        if client is None:
            client = self._new_client(addr)
            if client is None:
                return
        assert self._up is not None
        self._up.push(data, client.to_target)

    def _new_client(self, addr: Any) -> _Client | None:
        assert self._listener is not None and self._down is not None
        listener, down = self._listener, self._down
        sock = _udp_socket(self._family)
        try:
            sock.connect(self._target)
        except OSError:
            sock.close()
            return None

        def to_client(data: bytes) -> bool:
            return listener.send(data, addr)

        def from_target(data: bytes, _source: Any) -> None:
            down.push(data, to_client)

        upstream = _Port(listener.loop, sock, from_target)
        client = self._clients[addr] = _Client(upstream, upstream.send)
        return client
