"""The QUIC classes of the library chosen by :mod:`kvcs.quic_backend`.

Every module of :mod:`kvcs.transport` imports the QUIC classes from here. The library is
fixed when this module is first imported (``KVCS_QUIC_BACKEND``; default ``auto``: qh3
when installed).

qh3 2.x keeps aioquic's asyncio/H3 surface but moves the connection into a native core,
so some aioquic-specific tuning is unavailable with it: per-stream flow-control state (the
send scheduler then budgets on ``get_send_buffer_size`` and does not park blocked
streams), the peer stream limits (qh3 allows 100 bidi / 103 uni concurrent streams), the
congestion controller choice, and the receive batching of the binding.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from ..quic_backend import BACKEND_ENV, Backend, resolve

try:
    BACKEND: Backend = resolve(os.environ.get(BACKEND_ENV))
    """The QUIC library in use."""
except ValueError as exc:
    raise ImportError(f"{BACKEND_ENV}: {exc}") from None


def _patch_qh3_max_udp_payload() -> None:
    """qh3 2.x clients announce ``max_udp_payload_size=1472`` whatever their
    ``max_datagram_size``, so servers (a relay, a publishing server) never send larger
    datagrams to them (~35 MiB/s on loopback). Announce nothing instead (RFC 9000 default
    65527): the sender still caps datagrams at its own ``max_datagram_size``."""
    import qh3.quic.tls_bridge as bridge

    push = bridge.push_quic_transport_parameters
    if getattr(push, "_kvcs_patched", False):
        return

    def push_parameters(buf: Any, parameters: Any) -> None:
        if parameters.max_udp_payload_size == 1472:
            parameters.max_udp_payload_size = None
        push(buf, parameters)

    push_parameters._kvcs_patched = True  # type: ignore[attr-defined]
    bridge.push_quic_transport_parameters = push_parameters  # type: ignore[assignment]


def _patch_qh3_datagrams_to_send() -> None:
    """qh3 2.1's ``datagrams_to_send`` polls its core one datagram at a time and, when a
    poll fails (its core sometimes raises "packet builder capacity exhausted" under
    heavy fan-out), loses every datagram already taken from the core in that call: the
    peer never sees them and loss recovery must resend them. Keep what was built and
    stop at the failure; the next transmit polls again."""
    from qh3.quic import connection as qconn

    cls = qconn.QuicConnection
    if getattr(cls.datagrams_to_send, "_kvcs_patched", False):
        return
    log = logging.getLogger(__name__)

    def datagrams_to_send(self: Any, now: float) -> list[tuple[bytes, Any]]:
        if self._core is None:
            return []
        datagrams: list[tuple[bytes, Any]] = []
        while True:
            try:
                transmit = self._call_core(self._core.poll_transmit, now)
            except qconn.QuicConnectionError as exc:
                if not datagrams:
                    raise
                log.debug("qh3 poll_transmit: %s (kept %d datagrams)", exc, len(datagrams))
                break
            if transmit is None:
                break
            self._log_datagram("datagrams_sent", transmit[0])
            self._log_packets("packet_sent", transmit[0])
            datagrams.append((transmit[0], transmit[1]))
        return datagrams

    datagrams_to_send._kvcs_patched = True  # type: ignore[attr-defined]
    cls.datagrams_to_send = datagrams_to_send  # type: ignore[method-assign]


class _RoutinePeerClose(logging.Filter):
    """qh3 logs every peer CONNECTION_CLOSE, the normal end of a session included, as a
    WARNING ("Native peer close"); kvcs reports session ends itself. Demote it to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Native peer close: %r":
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


if TYPE_CHECKING or BACKEND == "aioquic":
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.asyncio.server import QuicServer
    from aioquic.h3 import events as h3events
    from aioquic.h3.connection import FrameType, H3Connection
    from aioquic.quic import events
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import NetworkAddress, QuicConnection, QuicConnectionError
    from aioquic.quic.packet import QuicErrorCode
else:
    from qh3.asyncio.protocol import QuicConnectionProtocol
    from qh3.asyncio.server import QuicServer
    from qh3.h3 import events as h3events
    from qh3.h3.connection import FrameType, H3Connection
    from qh3.quic import events
    from qh3.quic.configuration import QuicConfiguration
    from qh3.quic.connection import NetworkAddress, QuicConnection, QuicConnectionError
    from qh3.quic.packet import QuicErrorCode

    _patch_qh3_max_udp_payload()
    _patch_qh3_datagrams_to_send()
    logging.getLogger("quic").addFilter(_RoutinePeerClose())

__all__ = [
    "BACKEND",
    "BACKEND_ENV",
    "FrameType",
    "H3Connection",
    "NetworkAddress",
    "QuicConfiguration",
    "QuicConnection",
    "QuicConnectionError",
    "QuicConnectionProtocol",
    "QuicErrorCode",
    "QuicServer",
    "events",
    "h3events",
]
