"""The QUIC library and settings of the benchmarks.

This is the one place the bench asks kvcs which QUIC library it runs on (the transport
is being reworked: its library selection moved): :data:`QUIC_LIBRARY` is the library of
the settings this process makes, :data:`LIBRARY_ENV` the environment variable that
chooses it for a child process.
"""

from __future__ import annotations

import importlib

import kvcs.transport
from kvcs.transport import QuicSettings

# Looked up by name: the bench runs on both sides of the transport rework.
if hasattr(kvcs.transport, "default_library"):  # one adapter per library (QuicSettings.library)
    QUIC_LIBRARY: str = kvcs.transport.default_library()
    LIBRARY_ENV: str = importlib.import_module("kvcs.transport.quic").LIBRARY_ENV
else:  # before it: one library per process, bound when kvcs.transport is imported
    QUIC_LIBRARY = importlib.import_module("kvcs.transport.backend").BACKEND
    LIBRARY_ENV = importlib.import_module("kvcs.quic_backend").BACKEND_ENV

__all__ = ["ETHERNET_DATAGRAM", "LIBRARY_ENV", "QUIC_LIBRARY", "quic_settings"]

ETHERNET_DATAGRAM = 1452
"""UDP payload of a 1500-byte Ethernet MTU over IPv6 (1500 - 40 - 8): the "ethernet"
runs use it everywhere."""


def quic_settings(datagram_size: int | None = None) -> QuicSettings:
    """The loopback preset (4 MiB socket buffers; the library's largest datagrams: 60000
    bytes on qh3, 16000 on aioquic), or the same with ``datagram_size``-byte datagrams."""
    if datagram_size is None:
        return QuicSettings.loopback()
    return QuicSettings.loopback(max_datagram_size=datagram_size)
