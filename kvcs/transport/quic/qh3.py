"""The qh3 adapter: an aioquic fork whose connection state lives in a compiled core.

On the 2-core development machines qh3 moves 2-3x more bytes per CPU second than aioquic,
which is what a relay (it receives and re-sends every byte) and a decode worker (it
verifies every byte) need. Its core hides per-stream flow-control state (the scheduler
budgets on ``get_send_buffer_size`` and never parks a stream), fixes the peer stream
limits (100 bidirectional, 103 unidirectional) and has no congestion controller choice.

Two patches of qh3 2.1 are applied when the adapter is first used (:func:`apply_patches`);
on another qh3 version they are skipped with a warning, since they replace qh3 internals.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import qh3
from qh3.h3 import events as h3events
from qh3.h3.connection import H3Connection
from qh3.quic import connection as qh3_connection
from qh3.quic import events
from qh3.quic import tls_bridge as qh3_tls_bridge
from qh3.quic.configuration import QuicConfiguration
from qh3.quic.connection import QuicConnection, QuicConnectionError
from qh3.quic.packet import (
    Buffer,
    QuicErrorCode,
    QuicPacketType,
    encode_quic_version_negotiation,
    pull_quic_header,
)

from . import shared
from .base import (
    H3ConnectionAPI,
    NetworkAddress,
    PacketHeader,
    QuicConnectionAPI,
    StreamSendView,
)

if TYPE_CHECKING:
    from ..config import QuicSettings

logger = logging.getLogger(__name__)

PATCHED_VERSIONS = ("2.1.",)
"""qh3 versions whose internals the patches below were written for (prefixes)."""

FALLBACK_DATAGRAM_SIZE = 1200
"""The datagram size qh3 falls back to when a handshake is slow (RFC 9000's minimum)."""

PROBE_CEILING = {2: 1472, 4: 1452}
"""Largest datagram size qh3's path MTU probing tries, by peer address form (IPv4 2-tuple,
IPv6 4-tuple: kvcs clients use IPv6 sockets, so 1452)."""


def _patch_max_udp_payload() -> None:
    """qh3 2.x clients announce ``max_udp_payload_size=1472`` whatever their
    ``max_datagram_size``, so servers (a relay, a publishing server) never send larger
    datagrams to them (~35 MiB/s on loopback). Announce nothing instead (RFC 9000 default
    65527): the sender still caps datagrams at its own ``max_datagram_size``."""
    push = qh3_tls_bridge.push_quic_transport_parameters
    if getattr(push, "_kvcs_patched", False):
        return

    def push_parameters(buf: Any, parameters: Any) -> None:
        if parameters.max_udp_payload_size == 1472:
            parameters.max_udp_payload_size = None
        push(buf, parameters)

    push_parameters._kvcs_patched = True  # type: ignore[attr-defined]
    qh3_tls_bridge.push_quic_transport_parameters = push_parameters  # type: ignore[assignment]


STREAM_RESERVATION_ERROR = "qh3 stream reservation error"
"""The reason phrase of the CONNECTION_CLOSE sent when qh3's core raises a stream
reservation error (:func:`_patch_datagrams_to_send`)."""


def _patch_datagrams_to_send() -> None:
    """qh3 2.1's ``datagrams_to_send`` polls its core one datagram at a time and, when a
    poll fails (its core sometimes raises "packet builder capacity exhausted" under
    heavy fan-out), loses every datagram already taken from the core in that call: the
    peer never sees them and loss recovery must resend them. Keep what was built and
    stop at the failure; the next transmit polls again. Skip qh3's per-datagram logging
    calls without a QUIC logger (they parse each packet header: ~1 us per datagram).

    Its core also raises ValueError ("reserved stream is missing", then "another stream
    reservation is already active") when ACKs arrive late in bursts, and from then on
    never sends the rest of some streams (docs/reliability.md, "qh3 and stream
    reservations"): what was built before it is kept, the error is logged as a WARNING
    (it was a silent stall) and the connection is closed with INTERNAL_ERROR
    (:data:`STREAM_RESERVATION_ERROR`)."""
    cls = qh3_connection.QuicConnection
    if getattr(cls.datagrams_to_send, "_kvcs_patched", False):
        return

    def datagrams_to_send(self: Any, now: float) -> list[tuple[bytes, Any]]:
        if self._core is None:
            return []
        datagrams: list[tuple[bytes, Any]] = []
        poll = self._core.poll_transmit
        logged = self._quic_logger is not None  # qh3 parses every packet header to log
        while True:
            try:
                transmit = poll(now)
            except RuntimeError as exc:  # what _call_core turns into QuicConnectionError
                if not datagrams:
                    raise QuicConnectionError(QuicErrorCode.INTERNAL_ERROR, None,
                                              str(exc)) from exc
                logger.debug("qh3 poll_transmit: %s (kept %d datagrams)", exc, len(datagrams))
                break
            except ValueError as exc:  # the core's stream-reservation errors
                # after it the core never sends the rest of some streams (5 of 6 seeds
                # of tests/transport/test_qh3_reservations.py): close the connection so
                # that the session ends now and its users recover (reconnect, fetch
                # elsewhere) instead of waiting on a stream that will never end
                if self._close_event is not None:  # closed already: nothing more to send
                    break
                logger.warning("qh3 poll_transmit: %s (kept %d datagrams); closing the "
                               "connection: qh3 2.1 may never send the rest of a stream "
                               "now (docs/reliability.md, \"qh3 and stream "
                               "reservations\")", exc, len(datagrams))
                self.close(error_code=QuicErrorCode.INTERNAL_ERROR,
                           reason_phrase=STREAM_RESERVATION_ERROR)
                # poll again now: the CONNECTION_CLOSE must leave in this transmit, or the
                # peer learns of the close only when something else makes this side send
                # (the real-QUIC test waited past 5 s in 1 of ~10 runs without this)
                continue
            if transmit is None:
                break
            if logged:
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


_patched = False


def apply_patches() -> bool:
    """Apply the qh3 patches once (True if applied). On a qh3 version they were not
    written for, log a warning and leave qh3 as it is: kvcs still works, with the
    limitations the patch docstrings describe."""
    global _patched
    if _patched:
        return True
    if not qh3.__version__.startswith(PATCHED_VERSIONS):
        logger.warning("qh3 %s: kvcs patches are written for qh3 %s and are not applied "
                       "(servers may send clients datagrams of at most 1472 bytes)",
                       qh3.__version__, "/".join(v + "x" for v in PATCHED_VERSIONS))
        return False
    _patch_max_udp_payload()
    _patch_datagrams_to_send()
    logging.getLogger("quic").addFilter(_RoutinePeerClose())
    _patched = True
    return True


class _Qh3SendView:
    """qh3 shows only the bytes queued for a first transmission, flow control included,
    and refuses to create a stream past the peer's stream limit (ValueError): such a
    stream waits here (credit 0) until the peer's MAX_STREAMS covers it."""

    __slots__ = ("_quic", "_waiting")

    def __init__(self, quic: QuicConnection) -> None:
        self._quic = quic
        self._waiting: set[int] = set()  # local streams past the peer's stream limit

    def _allowed(self, stream_id: int) -> bool:
        quic = self._quic
        limit = (quic.max_concurrent_uni_streams if stream_id & 2
                 else quic.max_concurrent_bidi_streams)  # cumulative: MAX_STREAMS
        return stream_id >> 2 < limit

    def reserve(self, stream_id: int) -> None:
        try:
            # qh3 records the ID (the next one differs) before its core checks the limit
            self._quic.send_stream_data(stream_id, b"")
        except ValueError:
            if self._allowed(stream_id):
                raise
            self._waiting.add(stream_id)

    def waiting(self, stream_id: int) -> bool:
        if stream_id not in self._waiting:
            return False
        if not self._allowed(stream_id):
            return True
        self._waiting.discard(stream_id)  # qh3 creates it with its first data
        return False

    def unsent(self) -> int:
        return int(self._quic.get_send_buffer_size())

    def buffered(self) -> int:
        return int(self._quic.get_send_buffer_size())

    def credit(self, stream_id: int) -> int | None:
        return 0 if self._waiting and self.waiting(stream_id) else None

    def sent(self, stream_id: int) -> None:
        pass

    def forget(self, stream_id: int) -> None:
        self._waiting.discard(stream_id)


class Qh3Adapter:
    """:class:`~kvcs.transport.quic.base.QuicAdapter` for qh3 2.x."""

    name = "qh3"
    max_datagram_size_limit = 60000
    """qh3 builds packets up to the UDP limit (65507 on IPv4 loopback)."""
    events = events
    h3events = h3events
    errors: tuple[type[BaseException], ...] = (QuicConnectionError, ValueError, RuntimeError)
    """qh3 turns its core's errors into QuicConnectionError (connection state) and
    ValueError (stream state)."""

    def __init__(self) -> None:
        self.version: str = qh3.__version__
        apply_patches()

    def configuration(self, settings: QuicSettings, *, is_client: bool,
                      alpn_protocols: Sequence[str],
                      max_datagram_size: int) -> QuicConfiguration:
        # probe_datagram_size: path MTU probing (client only). qh3 probes 1280, 1350,
        # 1452 and 1472 bytes above max_datagram_size, never beyond: a no-op for larger
        # sizes (the loopback preset), and what lifts a handshake fallback (see
        # datagram_size_fell_back) from 1200 bytes to 1452.
        return QuicConfiguration(
            **shared.configuration_options(settings, is_client=is_client,
                                           alpn_protocols=alpn_protocols,
                                           max_datagram_size=max_datagram_size),
            probe_datagram_size=True)

    def client_connection(self, configuration: QuicConfiguration,
                          settings: QuicSettings) -> QuicConnectionAPI:
        return cast(QuicConnectionAPI, QuicConnection(configuration=configuration))

    def server_connection(self, configuration: QuicConfiguration, settings: QuicSettings,
                          original_destination_cid: bytes) -> QuicConnectionAPI:
        return cast(QuicConnectionAPI, QuicConnection(
            configuration=configuration,
            original_destination_connection_id=original_destination_cid))

    def parse_header(self, data: bytes, cid_length: int) -> PacketHeader | None:
        try:
            header = pull_quic_header(Buffer(data=data), cid_length)
        except ValueError:
            return None
        return shared.packet_header(header, QuicPacketType)

    def version_negotiation(self, header: PacketHeader, versions: Sequence[int]) -> bytes:
        return bytes(encode_quic_version_negotiation(
            source_cid=header.destination_cid, destination_cid=header.source_cid,
            supported_versions=list(versions)))

    def h3_connection(self, quic: QuicConnectionAPI) -> H3ConnectionAPI:
        return cast(H3ConnectionAPI, H3Connection(cast(QuicConnection, quic),
                                                  enable_webtransport=True))

    def peer_certificate(self, quic: QuicConnectionAPI) -> bytes | None:
        cert = cast(QuicConnection, quic).get_peercert()
        return None if cert is None else bytes(cert.public_bytes())

    def peer_address(self, quic: QuicConnectionAPI) -> NetworkAddress | None:
        return cast(QuicConnection, quic)._remote_addr  # no public accessor in qh3 2.1

    def receive_datagrams(self, quic: QuicConnectionAPI, datagrams: list[bytes],
                          addr: NetworkAddress, now: float) -> None:
        if len(datagrams) == 1:
            quic.receive_datagram(datagrams[0], addr, now)
            return
        # one call into the core for the batch once the handshake is done (qh3's public
        # API; skipping its per-datagram no-op logging call through qh3's private
        # attributes saved ~0.3 ms/MiB on a relay, not worth binding to qh3's internals)
        cast(QuicConnection, quic).receive_many_datagrams(datagrams, addr, now)

    def receive_segments(self, quic: QuicConnectionAPI, buffer: bytes, segment_size: int,
                         addr: NetworkAddress, now: float) -> None:
        # qh3's public GRO entry: its core cuts the buffer, no bytes object per datagram
        # made here
        cast(QuicConnection, quic).receive_gro_buffer(buffer, segment_size, addr, now)

    def idle_timeout(self, quic: QuicConnectionAPI) -> float:
        ours = float(quic.configuration.idle_timeout or 0)
        tls = cast(QuicConnection, quic)._tls
        peer = tls.remote_transport_parameters if tls is not None else None  # no accessor
        theirs = (peer.max_idle_timeout or 0) / 1000 if peer is not None else 0
        return min(t for t in (ours, theirs) if t) if ours or theirs else 0.0

    def datagram_size(self, quic: QuicConnectionAPI) -> int:
        core = cast(QuicConnection, quic)._core
        if core is None:
            return int(quic.configuration.max_datagram_size)
        return int(core.active_path[5])  # (id, local, remote, sent, received, path MTU)

    def datagram_size_fell_back(self, quic: QuicConnectionAPI) -> bool:
        """qh3 2.1 clients whose first loss-detection timeout (0.67 s with qh3's 333 ms
        initial RTT) expires before the first packet from the server cut their datagram
        size to 1200 bytes for the life of the connection, taking the large first Initial
        for lost on a small-MTU path; path MTU probing then lifts it to 1452 bytes at most.
        A busy or just-started server triggers it as surely as a small path MTU: a client
        made with QuicSettings.loopback() then sends 1-2 KB datagrams instead of 60 KB,
        3-4x slower (issue #19). True when that happened and probing cannot restore the
        configured size; meaningful when the handshake completes."""
        core = cast(QuicConnection, quic)._core
        if core is None or not quic.configuration.is_client or core.pto_total == 0:
            return False
        _, _, remote, _, _, size = core.active_path
        ceiling = PROBE_CEILING.get(len(remote), min(PROBE_CEILING.values()))
        return bool(size == FALLBACK_DATAGRAM_SIZE
                    and quic.configuration.max_datagram_size > ceiling)

    def send_h3_datagram(self, h3: H3ConnectionAPI, session_id: int, data: bytes) -> None:
        # qh3 writes its argument as the Quarter Stream ID of RFC 9297
        cast(H3Connection, h3).send_datagram(session_id // 4, data)

    def h3_datagram_session(self, event: Any) -> int:
        return int(event.flow_id) * 4  # the raw Quarter Stream ID

    def adopt_local_webtransport_bidi(self, h3: H3ConnectionAPI, stream_id: int,
                                      session_id: int) -> None:
        stream = cast(H3Connection, h3)._get_or_create_stream(stream_id)
        shared.mark_local_webtransport_bidi(stream, session_id)

    def adopt_webtransport_stream(self, h3: H3ConnectionAPI, stream_id: int) -> None:
        shared.forget_when_done(cast(H3Connection, h3)._stream, stream_id)

    def send_view(self, quic: QuicConnectionAPI) -> StreamSendView:
        return _Qh3SendView(cast(QuicConnection, quic))


ADAPTER = Qh3Adapter
"""The adapter class :func:`kvcs.transport.quic.adapter` makes."""
