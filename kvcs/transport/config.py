"""QUIC settings of the asyncio binding (throughput knobs with measured defaults).

Measured on the project machines (loopback, one unidirectional stream): aioquic with its own
defaults (1200-byte datagrams, 1 MiB windows, kernel socket buffers) reaches ~24 MiB/s;
with ``max_datagram_size=16000``, 4 MiB ``SO_SNDBUF``/``SO_RCVBUF`` and a 64 KiB receive
buffer per ``recvfrom`` it reaches ~320 MiB/s. qh3 (the default library) builds packets up
to the UDP limit: its loopback preset uses 60000-byte datagrams, which cuts the relay's CPU
per MiB by about a quarter against 16000. See ``bench/bench_transport.py``.

At Ethernet sizes (1452-byte datagrams) packet batching (:attr:`QuicSettings.gso`, UDP
GSO/GRO) cuts qh3's CPU per MiB 2.4x on the busier side (raw QUIC, one stream: 2.4 ms per
MiB each side against 6.3 and 5.0) and lifts throughput 3.3x (medians of 4 alternating
runs); at 8952 bytes it spares the sender a quarter but not the receiver, whose cost is
qh3's decryption; aioquic gains 1.2x at 1452 (its Python packet handling dominates).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .quic import adapter, default_library, resolve
from .quic.base import NetworkAddress

logger = logging.getLogger(__name__)

ALPN_MOQT = "moqt-22"
ALPN_H3 = "h3"

MiB = 1024 * 1024
KiB = 1024

MIN_DATAGRAM_SIZE = 1200
"""RFC 9000's smallest datagram size."""

INTERNET_DATAGRAM_SIZE = 1350
"""Datagram size to peers off loopback unless told otherwise: fits the paths of the
internet (tunnels included) below the 1500-byte Ethernet MTU."""

UDP_IP_OVERHEAD = 48
"""IPv6 (40) + UDP (8) header bytes: an MTU of 1500 carries 1452-byte datagrams, 9000
(jumbo frames) 8952. IPv4's 20-byte header leaves 20 bytes spare."""


def is_loopback(address: NetworkAddress | None) -> bool:
    """Whether a socket address (``(host, port)`` or IPv6 4-tuple, IPv4-mapped included)
    is on loopback."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def datagram_size_for_mtu(mtu: int) -> int:
    """The UDP payload that fits a path MTU (``--mtu``): ``mtu`` less IPv6 and UDP
    headers."""
    return mtu - UDP_IP_OVERHEAD


def max_datagram_size_limit(library: str | None = None) -> int:
    """Largest ``max_datagram_size`` of a QUIC library (default: the process default):
    16000 on aioquic (larger sizes break its own framing), 60000 on qh3 (it builds
    packets up to the UDP limit, 65507 on IPv4 loopback)."""
    return adapter(library).max_datagram_size_limit


CONGESTION_CONTROLS = ("reno", "cubic", "bbr")
"""Names :attr:`QuicSettings.congestion_control` accepts (aioquic's controllers)."""


@dataclass(frozen=True, slots=True)
class QuicSettings:
    """Transport knobs shared by client and server. All sizes are bytes.

    The defaults suit the internet and, per connection, loopback (see
    :attr:`max_datagram_size`); :meth:`for_path` makes settings for a LAN (``--mtu``).
    """

    max_datagram_size: int | None = None
    """Largest UDP payload sent (QUIC packet size). ``None`` (default) chooses per peer
    (:meth:`datagram_size_for`): the library's largest (:func:`max_datagram_size_limit`:
    16000 on aioquic, 60000 on qh3) to a peer on loopback, :data:`INTERNET_DATAGRAM_SIZE`
    to any other; a number applies to every peer (1452 for a 1500-byte Ethernet MTU, 8952
    for jumbo frames: :meth:`for_path`). Validated to 1200..that limit. Each endpoint caps
    only what it sends: a peer on the other library receives either size. qh3 probes the
    path for up to 1472 bytes (1452 to IPv6 peers) above smaller sizes. What a connection
    sends now:
    :attr:`MoqtConnection.max_datagram_size <kvcs.transport.MoqtConnection.max_datagram_size>`."""

    max_data: int = 16 * MiB
    """Connection-level receive flow-control window (aioquic default 1 MiB)."""

    max_stream_data: int = 8 * MiB
    """Per-stream receive flow-control window (aioquic default 1 MiB)."""

    max_streams_uni: int = 1024
    """Concurrent peer-initiated unidirectional streams allowed (aioquic hard-codes 128;
    KVCS opens hundreds of subgroup streams). aioquic raises the limit by one for each
    finished stream. aioquic only: qh3 allows 103."""

    max_streams_bidi: int = 256
    """Concurrent peer-initiated bidirectional (request) streams allowed. aioquic only:
    qh3 allows 100."""

    idle_timeout: float = 30.0
    """Seconds of silence before the connection is dropped (QUIC takes the smaller of
    both ends' values)."""

    keep_alive_s: float | None = None
    """Seconds without a packet from the peer after which the connection sends a QUIC
    PING, so that a quiet session (a publisher waiting for subscribers) outlives the idle
    timeout. ``None`` (default): a third of the negotiated idle timeout on clients (they
    keep their servers' sessions up too), none on servers. ``0``: never."""

    gso: bool = True
    """Packet batching where the kernel offers it (Linux): runs of equal-size datagrams
    to one peer leave in one ``sendmsg`` (UDP GSO) and the kernel hands datagrams of one
    flow over in batches (UDP GRO). Falls back to a system call per datagram where the
    kernel refuses. ``False``: one system call per datagram (for comparisons)."""

    socket_send_buffer: int | None = 4 * MiB
    """``SO_SNDBUF`` of the UDP socket; ``None`` keeps the kernel default. Linux caps it at
    ``net.core.wmem_max`` (and doubles the value internally)."""

    socket_receive_buffer: int | None = 4 * MiB
    """``SO_RCVBUF`` of the UDP socket; ``None`` keeps the kernel default (``rmem_max`` cap).
    Too small a buffer drops bursts of large datagrams on loopback."""

    datagram_receive_buffer: int = 64 * KiB
    """Size passed to each ``recvfrom`` by the asyncio datagram transport (asyncio uses
    256 KiB; every call allocates that much before shrinking the result). 64 KiB fits any
    UDP datagram and is cheaper per datagram."""

    max_datagram_frame_size: int = 65536
    """QUIC DATAGRAM support (RFC 9221), required by MOQT: largest DATAGRAM frame accepted."""

    congestion_control: str = "reno"
    """aioquic congestion controller: ``"reno"``, ``"cubic"`` or ``"bbr"``
    (:mod:`kvcs.transport.quic.bbr`: a bandwidth and min-RTT model that does not read
    random loss as congestion, for long lossy paths; docs/perf-profile.md). qh3 has no
    choice: its one controller is used whatever this says."""

    max_connections: int = 1024
    """Server: connections at once. The first packets of a new client past it are
    dropped (its handshake then times out): with the per-session state bound
    (:func:`kvcs.moqt.config.state_bound`) this bounds a server's memory."""

    accept_rate: float = 100.0
    """Server: new connections per second, in bursts of up to :attr:`accept_burst`. A
    handshake costs the server ~1.5-2 ms (a client reconnecting in a loop made 230 per
    second: half a relay's event loop); past the rate a new client's first packets are
    dropped, and QUIC resends them ~0.3 s, then 0.7 s, ... later."""

    accept_burst: int = 32
    """Server: new connections accepted at once before :attr:`accept_rate` applies."""

    handshake_timeout: float = 3.0
    """Server: a connection that has sent nothing this many seconds after its client's
    first datagram is forgotten: none of the client's packets could be decrypted (garbage,
    or Initials corrupted on the way), so there was nothing to answer, and the client's
    next good Initial opens a connection anew. Before, such a connection was kept for the
    whole idle timeout (30 s measured). A client whose Initial decrypts is answered at once
    and is not affected."""

    send_watermark: int = 512 * KiB
    """Send scheduler: stream bytes handed to QUIC but not yet sent are kept below this,
    the rest waits in per-stream queues so that stream priorities take effect. Large enough
    to keep the pipe full (see the benchmark), small enough for priorities to matter."""

    library: str | None = None
    """QUIC library of the connections and servers made with these settings: ``"qh3"``,
    ``"aioquic"`` or ``"auto"``; ``None`` takes the process default
    (:func:`kvcs.transport.use_library`, else ``$KVCS_QUIC_BACKEND``, else qh3 when
    installed). Resolved to ``"qh3"`` or ``"aioquic"`` when the settings are made."""

    def __post_init__(self) -> None:
        library = resolve(self.library) if self.library else default_library()
        object.__setattr__(self, "library", library)
        limit = max_datagram_size_limit(library)
        if (self.max_datagram_size is not None
                and not MIN_DATAGRAM_SIZE <= self.max_datagram_size <= limit):
            raise ValueError(
                f"max_datagram_size must be within {MIN_DATAGRAM_SIZE}..{limit} on "
                f"{library}, got {self.max_datagram_size}"
            )
        if self.keep_alive_s is not None and self.keep_alive_s < 0:
            raise ValueError("keep_alive_s must be positive, 0 (off) or None (automatic)")
        for name in ("max_data", "max_stream_data", "max_streams_uni", "max_streams_bidi",
                     "max_connections", "accept_rate", "accept_burst", "handshake_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.datagram_receive_buffer < 2048:
            raise ValueError("datagram_receive_buffer must be at least 2048")
        if self.send_watermark <= 0:
            raise ValueError("send_watermark must be positive")
        if self.congestion_control not in CONGESTION_CONTROLS:
            raise ValueError(f"unknown congestion control {self.congestion_control!r}: use "
                             f"one of {', '.join(CONGESTION_CONTROLS)}")

    @classmethod
    def loopback(cls, **overrides: Any) -> QuicSettings:
        """Preset for client and server on the same host: the library's largest datagrams
        (16000 bytes on aioquic, 60000 on qh3), 4 MiB socket buffers, 64 KiB receive
        buffer. ``overrides`` are fields (``library=`` picks the library first)."""
        library = overrides.pop("library", None)
        base = cls(library=library)
        base = dataclasses.replace(
            base,
            max_datagram_size=max_datagram_size_limit(base.library),
            socket_send_buffer=4 * MiB,
            socket_receive_buffer=4 * MiB,
            datagram_receive_buffer=64 * KiB,
        )
        return dataclasses.replace(base, **overrides)

    @classmethod
    def for_path(cls, mtu: int | None = None, preset: str = "default",
                 **overrides: Any) -> QuicSettings:
        """Settings from the command-line options: ``preset`` ``"default"`` (datagram size
        per peer) or ``"loopback"`` (:meth:`loopback`); ``mtu``, the path MTU of a LAN
        (1500 Ethernet, 9000 jumbo frames), sets every peer's datagram size to what fits
        it (:func:`datagram_size_for_mtu`). ValueError with a one-line reason."""
        if preset not in ("default", "loopback"):
            raise ValueError(f"unknown QUIC preset {preset!r}: use default or loopback")
        settings = cls.loopback(**overrides) if preset == "loopback" else cls(**overrides)
        if mtu is None:
            return settings
        size = datagram_size_for_mtu(mtu)
        limit = max_datagram_size_limit(settings.library)
        if not MIN_DATAGRAM_SIZE <= size <= limit:
            raise ValueError(f"--mtu must be within {MIN_DATAGRAM_SIZE + UDP_IP_OVERHEAD}.."
                             f"{limit + UDP_IP_OVERHEAD} on {settings.library}, got {mtu}")
        return dataclasses.replace(settings, max_datagram_size=size)

    def with_transport(self, library: str | None = None,
                       congestion_control: str | None = None) -> QuicSettings:
        """These settings on ``library`` (None: the same) with ``congestion_control``
        (None: the same); a datagram size above the new library's limit becomes its
        limit. ValueError (one line) for a controller asked of qh3, whose one built-in
        controller cannot be changed."""
        lib = resolve(library) if library else self.library
        assert lib is not None  # resolved when made
        changes: dict[str, Any] = {"library": lib}
        if congestion_control is not None:
            if lib != "aioquic":
                raise ValueError(f"congestion control {congestion_control!r} needs the aioquic "
                                 f"QUIC library (--quic-backend aioquic): {lib} has one "
                                 "built-in controller")
            changes["congestion_control"] = congestion_control
        if self.max_datagram_size is not None:
            changes["max_datagram_size"] = min(self.max_datagram_size,
                                               max_datagram_size_limit(lib))
        return dataclasses.replace(self, **changes)

    def datagram_size_for(self, peer: NetworkAddress | None) -> int:
        """The datagram size of a connection with ``peer`` (see
        :attr:`max_datagram_size`)."""
        if self.max_datagram_size is not None:
            return self.max_datagram_size
        if is_loopback(peer):
            return max_datagram_size_limit(self.library)
        return INTERNET_DATAGRAM_SIZE

    def keep_alive_interval(self, *, is_client: bool, idle_timeout: float) -> float | None:
        """Seconds of quiet after which a connection with negotiated ``idle_timeout``
        pings its peer; ``None``: never (see :attr:`keep_alive_s`)."""
        if self.keep_alive_s is not None:
            return self.keep_alive_s or None
        return idle_timeout / 3 if is_client and idle_timeout > 0 else None

    @classmethod
    def aioquic_defaults(cls, library: str | None = None) -> QuicSettings:
        """aioquic's own defaults (for comparison benchmarks only)."""
        return cls(
            library=library,
            max_datagram_size=1200,
            max_data=1 * MiB,
            max_stream_data=1 * MiB,
            max_streams_uni=128,
            max_streams_bidi=128,
            idle_timeout=60.0,
            socket_send_buffer=None,
            socket_receive_buffer=None,
            datagram_receive_buffer=256 * KiB,
        )

    def quic_configuration(self, *, is_client: bool, alpn_protocols: Sequence[str],
                           peer: NetworkAddress | None = None) -> Any:
        """A ``QuicConfiguration`` of :attr:`library` for these settings and a connection
        with ``peer`` (:meth:`datagram_size_for`), without TLS material."""
        return adapter(self.library).configuration(
            self, is_client=is_client, alpn_protocols=alpn_protocols,
            max_datagram_size=self.datagram_size_for(peer))

    def configure_socket(self, sock: socket.socket) -> None:
        """Apply the socket buffer sizes to a UDP socket (before or after binding)."""
        for option, value in (
            (socket.SO_SNDBUF, self.socket_send_buffer),
            (socket.SO_RCVBUF, self.socket_receive_buffer),
        ):
            if value is None:
                continue
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, value)
            except OSError as exc:  # pragma: no cover - platform specific
                logger.warning("cannot set socket option %s=%d: %s", option, value, exc)
        logger.debug(
            "UDP socket buffers: snd=%d rcv=%d",
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        )
