"""The QUIC library and settings of the benchmarks.

This is the one place the bench imports kvcs's QUIC-library selection (its module may be
renamed): :data:`QUIC_LIBRARY` is the library this process is bound to, :data:`LIBRARY_ENV`
the environment variable that chooses it for a child process.
"""

from __future__ import annotations

from kvcs.quic_backend import BACKEND_ENV as LIBRARY_ENV
from kvcs.transport import QuicSettings
from kvcs.transport.backend import BACKEND as QUIC_LIBRARY

__all__ = ["ETHERNET_DATAGRAM", "LIBRARY_ENV", "QUIC_LIBRARY", "quic_settings"]

ETHERNET_DATAGRAM = 1452
"""UDP payload of a 1500-byte Ethernet MTU over IPv6 (1500 - 40 - 8), the largest
datagram moq-dev/moq's QUIC stack probes for: the "ethernet" runs use it everywhere."""


def quic_settings(datagram_size: int | None = None) -> QuicSettings:
    """The loopback preset (4 MiB socket buffers; the library's largest datagrams: 60000
    bytes on qh3, 16000 on aioquic), or the same with ``datagram_size``-byte datagrams."""
    if datagram_size is None:
        return QuicSettings.loopback()
    return QuicSettings.loopback(max_datagram_size=datagram_size)
