"""QUIC settings of the asyncio binding (throughput knobs with measured defaults).

Measured on the project machines (loopback, one unidirectional stream): aioquic with its own
defaults (1200-byte datagrams, 1 MiB windows, kernel socket buffers) reaches ~24 MiB/s;
with ``max_datagram_size=16000``, 4 MiB ``SO_SNDBUF``/``SO_RCVBUF`` and a 64 KiB receive
buffer per ``recvfrom`` it reaches ~320 MiB/s. qh3 (the default library) builds packets up
to the UDP limit: its loopback preset uses 60000-byte datagrams, which cuts the relay's CPU
per MiB by about a quarter against 16000. See ``bench/bench_transport.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .quic import adapter, default_library, resolve

logger = logging.getLogger(__name__)

ALPN_MOQT = "moqt-22"
ALPN_H3 = "h3"

MiB = 1024 * 1024
KiB = 1024

MIN_DATAGRAM_SIZE = 1200


def max_datagram_size_limit(library: str | None = None) -> int:
    """Largest ``max_datagram_size`` of a QUIC library (default: the process default):
    16000 on aioquic (larger sizes break its own framing), 60000 on qh3 (it builds
    packets up to the UDP limit, 65507 on IPv4 loopback)."""
    return adapter(library).max_datagram_size_limit


@dataclass(frozen=True, slots=True)
class QuicSettings:
    """Transport knobs shared by client and server. All sizes are bytes.

    Defaults suit the internet; use :meth:`loopback` for same-host deployments.
    """

    max_datagram_size: int = 1350
    """Largest UDP payload sent (QUIC packet size). 1350 is safe on the internet; loopback
    deployments use the :meth:`loopback` preset (:func:`max_datagram_size_limit`: 16000
    on aioquic, 60000 on qh3). Validated to 1200..that limit. Each endpoint caps only what
    it sends: a peer on the other library receives either size. qh3 probes the path for
    up to 1472 bytes above smaller sizes. What a connection sends now:
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
    """Seconds of silence before the connection is dropped."""

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
    """aioquic congestion controller: ``"reno"`` or ``"cubic"`` (qh3 has no choice)."""

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
        if not MIN_DATAGRAM_SIZE <= self.max_datagram_size <= limit:
            raise ValueError(
                f"max_datagram_size must be within {MIN_DATAGRAM_SIZE}..{limit} on "
                f"{library}, got {self.max_datagram_size}"
            )
        for name in ("max_data", "max_stream_data", "max_streams_uni", "max_streams_bidi"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.datagram_receive_buffer < 2048:
            raise ValueError("datagram_receive_buffer must be at least 2048")
        if self.send_watermark <= 0:
            raise ValueError("send_watermark must be positive")

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

    def quic_configuration(self, *, is_client: bool, alpn_protocols: Sequence[str]) -> Any:
        """A ``QuicConfiguration`` of :attr:`library` for these settings (without TLS
        material)."""
        return adapter(self.library).configuration(
            self, is_client=is_client, alpn_protocols=alpn_protocols)

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
