"""The UDP sockets of the binding, read and written in batches (issue #18).

asyncio's datagram transport makes one system call per datagram each way. At Ethernet
sizes (1452-byte datagrams) that is ~35,000 calls per second and direction for 48 MiB/s.
:class:`UdpSocket` replaces it:

* reads: every datagram queued on the socket per readiness event (up to
  :data:`RECEIVE_BATCH` calls), handed over in runs from one address, so that a QUIC
  library that takes batches processes them in one call;
* GRO (Linux ``UDP_GRO``): the kernel coalesces datagrams of one flow into one buffer
  with their segment size; one ``recvmsg`` brings up to 64 KiB, handed over whole (a QUIC
  library that takes such a buffer splits it in compiled code);
* GSO (Linux ``UDP_SEGMENT``): a run of equal-size datagrams to one address (the last
  may be shorter) leaves in one ``sendmsg``, which the kernel splits.

Where the platform lacks either offload, or the kernel refuses a GSO send (a device
without checksum offload answers EIO), the socket falls back to a system call per
datagram for good, logged at DEBUG. Datagrams the kernel cannot take now (EAGAIN) wait
in a queue sent when the socket is writable, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import struct
import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .quic.base import NetworkAddress

if TYPE_CHECKING:
    from .config import QuicSettings

logger = logging.getLogger(__name__)

SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = 103
"""Linux ``setsockopt``/cmsg: GSO segment size."""
UDP_GRO = 104
"""Linux ``setsockopt``/cmsg: receive coalesced datagrams with their segment size."""

GSO_MAX_SEGMENTS = 64
"""Most segments the kernel splits one send into (``UDP_MAX_SEGMENTS``)."""
GSO_MAX_BYTES = 65000
"""Largest GSO send: it is one IP datagram until the kernel splits it (65535 bytes less
headers): 44 segments of 1452 bytes, 7 of 8952, one of 60000 (no gain at loopback
sizes)."""

GRO_BUFFER = 65535
"""``recvmsg`` size with GRO on: the largest coalesced buffer."""

RECEIVE_BATCH = 32
"""Reads per readiness event. Reading what is queued first and transmitting once per
connection afterwards saves a ``datagrams_to_send`` pass (which visits every stream) per
datagram and lets ACKs cover more packets."""

_GSO_REFUSED = frozenset({errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT})
"""What a kernel or device that cannot segment answers a GSO send."""
_SEGMENT_SIZE = struct.Struct("=H")
_GRO_SIZE = struct.Struct("=i")
_CMSG_SPACE = socket.CMSG_SPACE(_GRO_SIZE.size) if hasattr(socket, "CMSG_SPACE") else 0
_LINUX = sys.platform == "linux"
_MSG_TRUNC = int(getattr(socket, "MSG_TRUNC", 0))  # an int: IntFlag's & costs ~7 us
_IP_RECVERR, _IPV6_RECVERR = 11, 25  # linux/in.h, linux/in6.h (not in the socket module)
_MSG_ERRQUEUE = int(getattr(socket, "MSG_ERRQUEUE", 0x2000))


class DatagramReceiver(Protocol):
    """Where a :class:`UdpSocket` delivers what it reads."""

    def datagrams_received(self, datagrams: list[bytes], addr: NetworkAddress) -> None:
        """Datagrams that arrived in a row from ``addr``, in order."""
        ...

    def segments_received(self, buffer: bytes, segment_size: int,
                          addr: NetworkAddress) -> None:
        """A GRO buffer from ``addr``: datagrams of ``segment_size`` bytes back to back
        (the last may be shorter), in order, after the datagrams delivered before it."""
        ...

    def receive_done(self) -> None:
        """The socket has been read for this readiness event: time to handle what arrived
        and transmit."""
        ...


def enable_gro(sock: socket.socket) -> bool:
    """Turn UDP GRO on for ``sock``; False where the platform refuses."""
    if not _LINUX:
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        return sock.getsockopt(SOL_UDP, UDP_GRO) == 1
    except OSError:
        return False


def gso_available(sock: socket.socket) -> bool:
    """Whether the kernel knows UDP GSO on ``sock`` (the socket option is set and reset:
    segmentation is asked per send, by cmsg)."""
    if not _LINUX:
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, 1200)
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
    except OSError:
        return False
    return True


class UdpSocket:
    """A non-blocking UDP socket on the event loop, read and written in batches (see the
    module docstring). ``batching=False`` (``QuicSettings.gso``) keeps a system call per
    datagram each way."""

    __slots__ = ("_closed", "_closing", "_fd", "_loop", "_on_error", "_queue",
                 "_receive_size", "_receiver", "_writer", "gro", "gso", "sock")

    def __init__(self, sock: socket.socket, receiver: DatagramReceiver, *,
                 batching: bool, receive_size: int,
                 on_error: Callable[[OSError], None] | None = None) -> None:
        """``on_error``: called with each error the socket reports (an ICMP port
        unreachable as ConnectionRefusedError, on a socket made with ``report_errors``)."""
        self._loop = asyncio.get_running_loop()
        self.sock = sock
        self._on_error = on_error
        self._fd = sock.fileno()
        self._receiver = receiver
        self.gso = batching and gso_available(sock)
        """Sends use GSO (cleared for good when the kernel refuses one)."""
        self.gro = batching and enable_gro(sock)
        """Reads take coalesced buffers."""
        self._receive_size = max(receive_size, GRO_BUFFER) if self.gro else receive_size
        self._queue: deque[tuple[bytes, NetworkAddress]] = deque()
        self._writer = False
        self._closing = False
        self._closed = False
        logger.debug("UDP socket %s: GSO %s, GRO %s", sock.getsockname(),
                      "on" if self.gso else "off", "on" if self.gro else "off")
        self._loop.add_reader(self._fd, self._read_ready)

    @property
    def sockname(self) -> NetworkAddress:
        """The local address."""
        return self.sock.getsockname()

    @property
    def is_closing(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closing

    def set_receiver(self, receiver: DatagramReceiver) -> None:
        """Deliver what is read from now on to ``receiver``."""
        self._receiver = receiver

    def close(self) -> None:
        """Stop reading; close the socket once the queued datagrams are sent."""
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if not self._queue:
            self._close_now()

    def _close_now(self) -> None:
        self._closed = True
        if self._writer:
            self._loop.remove_writer(self._fd)
            self._writer = False
        self._queue.clear()
        self.sock.close()

    # -- receiving ------------------------------------------------------------------

    def _read_ready(self) -> None:
        sock, receiver = self.sock, self._receiver
        size, gro = self._receive_size, self.gro
        run: list[bytes] = []
        run_addr: NetworkAddress = None
        for _ in range(RECEIVE_BATCH):
            try:
                if gro:
                    data, ancillary, flags, addr = sock.recvmsg(size, _CMSG_SPACE)
                else:
                    data, addr = sock.recvfrom(size)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # an ICMP error queued on the socket: next read
                logger.debug("UDP receive: %s", exc)
                self._socket_error(exc)
                continue
            if run and addr != run_addr:
                receiver.datagrams_received(run, run_addr)
                run = []
            run_addr = addr
            if gro:
                if flags & _MSG_TRUNC:
                    logger.debug("UDP receive: %d-byte buffer truncated", size)
                    continue
                segment = _gro_segment_size(ancillary)
                if 0 < segment < len(data):
                    if run:
                        receiver.datagrams_received(run, addr)
                        run = []
                    receiver.segments_received(data, segment, addr)
                    continue
            run.append(data)
        if run:
            receiver.datagrams_received(run, run_addr)
        if not self._closing:
            receiver.receive_done()

    def _socket_error(self, exc: OSError) -> None:
        if self._on_error is None:
            return
        # with IP_RECVERR the kernel also queues each error with its details: read them,
        # or the socket stays readable (EPOLLERR) for good
        while True:
            try:
                self.sock.recvmsg(512, 512, _MSG_ERRQUEUE)
            except OSError:
                break
        self._on_error(exc)

    # -- sending --------------------------------------------------------------------

    def send(self, datagrams: list[tuple[bytes, NetworkAddress]]) -> None:
        """Send datagrams in order (GSO runs where possible); what the kernel cannot take
        now is queued."""
        if self._closed:
            return
        if self._queue:
            self._queue.extend(datagrams)
            return
        sent = self._send(datagrams)
        if sent < len(datagrams):
            self._queue.extend(datagrams[sent:])
            self._writer = True
            self._loop.add_writer(self._fd, self._write_ready)

    def _send(self, datagrams: list[tuple[bytes, NetworkAddress]]) -> int:
        """Send from the start of ``datagrams``; return how many left (or were dropped)
        before the kernel pushed back."""
        sock = self.sock
        count = len(datagrams)
        i = 0
        while i < count:
            data, addr = datagrams[i]
            end = i + 1
            if self.gso and end < count:
                size = len(data)
                limit = min(count, i + min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // size))
                while end < limit:
                    nxt, nxt_addr = datagrams[end]
                    if nxt_addr != addr or len(nxt) > size:
                        break
                    end += 1
                    if len(nxt) < size:  # a shorter segment ends the run
                        break
            try:
                if end - i > 1:
                    sock.sendmsg([d for d, _ in datagrams[i:end]],
                                 [(SOL_UDP, UDP_SEGMENT, _SEGMENT_SIZE.pack(len(data)))],
                                 0, addr)
                else:
                    sock.sendto(data, addr)
            except (BlockingIOError, InterruptedError):
                return i
            except OSError as exc:
                if end - i > 1 and exc.errno in _GSO_REFUSED:
                    logger.debug("UDP GSO refused (%s): one datagram per send from now on",
                                 exc)
                    self.gso = False
                    continue  # the same datagrams again, one by one
                # EMSGSIZE (a path MTU probe too large), an ICMP error: QUIC recovers
                logger.debug("UDP send of %d bytes to %s: %s", len(data), addr, exc)
            i = end
        return count

    def _write_ready(self) -> None:
        queue = self._queue
        pending = list(queue)
        queue.clear()
        sent = self._send(pending)
        if sent < len(pending):
            queue.extend(pending[sent:])
            return
        self._loop.remove_writer(self._fd)
        self._writer = False
        if self._closing:
            self._close_now()


def _gro_segment_size(ancillary: list[tuple[int, int, bytes]]) -> int:
    for level, kind, value in ancillary:
        if level == SOL_UDP and kind == UDP_GRO and len(value) >= _GRO_SIZE.size:
            return int(_GRO_SIZE.unpack_from(value)[0])
    return 0


def udp_socket(family: int, address: NetworkAddress, settings: QuicSettings, *,
               dual_stack: bool, report_errors: bool = False) -> socket.socket:
    """A bound non-blocking UDP socket with the buffer sizes of ``settings``
    (``dual_stack``: IPv6 that takes IPv4 too; ``report_errors``: ICMP errors such as
    port unreachable reach the reader (Linux IP_RECVERR), so that a client learns at once
    that nothing listens where it dials)."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if dual_stack:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        if report_errors and _LINUX:
            for level, option in ((socket.IPPROTO_IP, _IP_RECVERR),
                                  (socket.IPPROTO_IPV6, _IPV6_RECVERR)):
                with contextlib.suppress(OSError):  # an IPv4 option, IPv6-only socket
                    sock.setsockopt(level, option, 1)
        settings.configure_socket(sock)
        sock.bind(address)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
