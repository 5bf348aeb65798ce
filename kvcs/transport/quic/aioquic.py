"""The aioquic adapter: pure-Python QUIC, where every kvcs tuning applies.

kvcs reads aioquic's per-stream send state to park streams blocked by flow control
(:class:`_AioquicSendView`), raises the peer stream limits that aioquic hard-codes (128)
and lets :class:`~kvcs.transport.QuicSettings` pick the congestion controller: aioquic's
``reno`` and ``cubic``, or kvcs's model-based ``bbr`` (:mod:`kvcs.transport.quic.bbr`,
with its own pacer in place of aioquic's). ACKs are processed by
:class:`~kvcs.transport.quic.aioquic_recovery.AckRecovery` (aioquic's, without a copy of
every packet in flight per ACK) and packets are written by
:class:`~kvcs.transport.quic.aioquic_send.QuicConnection` (aioquic's, its per-packet
stream loops narrowed to the streams that can write). Those reads
use aioquic 1.x internals; :class:`AioquicAdapter` checks they exist when it is made and
refuses an aioquic without them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import aioquic
from aioquic.buffer import Buffer
from aioquic.h3 import events as h3events
from aioquic.h3.connection import H3Connection
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection, QuicConnectionError
from aioquic.quic.packet import QuicPacketType, encode_quic_version_negotiation, pull_quic_header
from aioquic.quic.stream import QuicStream
from cryptography.hazmat.primitives.serialization import Encoding

from . import aioquic_recovery, aioquic_send, bbr, shared
from .base import (
    H3ConnectionAPI,
    NetworkAddress,
    PacketHeader,
    QuicConnectionAPI,
    StreamSendView,
    split_segments,
)

if TYPE_CHECKING:
    from ..config import QuicSettings


class _AioquicSendView:
    """Per-stream send state from aioquic's stream objects: bytes held back by flow
    control or by the peer's stream limit are not "unsent", and such streams report no
    credit, so that the scheduler parks them instead of starving the others."""

    __slots__ = ("_handed", "_quic")

    def __init__(self, quic: QuicConnection) -> None:
        self._quic = quic
        self._handed: dict[int, QuicStream] = {}  # streams with data handed to aioquic

    def unsent(self) -> int:
        total = 0
        done: list[int] = []
        for stream_id, stream in self._handed.items():
            sender = stream.sender
            unsent = sender._buffer_stop - sender.highest_offset
            if unsent <= 0 or sender._reset_error_code is not None:
                done.append(stream_id)
                continue
            if stream.is_blocked:
                continue
            credit = stream.max_stream_data_remote - sender.highest_offset
            if credit > 0:
                total += min(unsent, credit)
        for stream_id in done:
            del self._handed[stream_id]
        return total

    def buffered(self) -> int:
        total = 0
        for stream in self._handed.values():
            sender = stream.sender
            if sender._reset_error_code is None:
                total += max(0, sender._buffer_stop - sender.highest_offset)
        return total

    def reserve(self, stream_id: int) -> None:
        # aioquic creates a stream past the peer's limit "blocked" and sends it once the
        # peer's MAX_STREAMS allows (credit() is 0 meanwhile)
        self._quic.send_stream_data(stream_id, b"")

    def waiting(self, stream_id: int) -> bool:
        # aioquic would send a RESET_STREAM for a blocked stream at once, past the peer's
        # limit: a STREAM_LIMIT_ERROR that closes the connection
        stream = self._quic._streams.get(stream_id)
        return stream is not None and stream.is_blocked

    def credit(self, stream_id: int) -> int:
        streams = self._quic._streams
        stream = streams.get(stream_id)
        if stream is None:
            # create the aioquic stream (local streams are normally created on open)
            self._quic.send_stream_data(stream_id, b"")
            stream = streams[stream_id]
        if stream.is_blocked:
            return 0
        return int(stream.max_stream_data_remote - stream.sender._buffer_stop)

    def sent(self, stream_id: int) -> None:
        stream = self._quic._streams.get(stream_id)
        if stream is not None:
            self._handed[stream_id] = stream

    def forget(self, stream_id: int) -> None:
        self._handed.pop(stream_id, None)


class _ReportedConnectionError(logging.Filter):
    """aioquic logs the error that closes a connection (a refused certificate, a peer's
    protocol violation) as a WARNING before closing; kvcs reports the close itself, with
    its reason (the CLI in one line). Demote the library's copy to DEBUG."""

    _message = re.compile(r"(\[[0-9a-f]+\] )?Error: \d+, reason: ")  # QuicConnectionError

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and self._message.match(record.getMessage()):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_log_filter = _ReportedConnectionError()


class AioquicAdapter:
    """:class:`~kvcs.transport.quic.base.QuicAdapter` for aioquic 1.x."""

    name = "aioquic"
    max_datagram_size_limit = 16000
    """aioquic encodes some frame lengths assuming a packet fits well below 16 KiB (sizes
    above ~16383 break its own framing)."""
    events = events
    h3events = h3events
    errors: tuple[type[BaseException], ...] = (QuicConnectionError, ValueError, RuntimeError)

    def __init__(self) -> None:
        self.version: str = aioquic.__version__
        stream = QuicStream(stream_id=0)
        quic = QuicConnection(configuration=QuicConfiguration())
        missing = [name for owner, name in (
            (QuicConnection, "get_peer_address"), (H3Connection, "_get_or_create_stream"),
            (quic, "_remote_max_idle_timeout"), (quic, "_local_max_streams_bidi"),
            (stream, "is_blocked"), (stream, "max_stream_data_remote"),
            (stream.sender, "highest_offset"), (stream.sender, "_buffer_stop"),
            (stream.sender, "_reset_error_code"),
            (quic, "_loss"), (quic._loss, "_cc"), (quic._loss, "_pacer"),
            *((quic._loss, name) for name in aioquic_recovery.REQUIRED),
            *((quic, name) for name in aioquic_send.REQUIRED),
            # what aioquic_send._can_write reads of a stream
            (stream, "max_stream_data_local"), (stream.sender, "buffer_is_empty"),
            (stream.sender, "reset_pending"), (stream.receiver, "stop_pending"),
            (stream, "is_finished"),
        ) if not hasattr(owner, name)]
        if missing:
            raise ImportError(f"aioquic {self.version} lacks {', '.join(missing)}, which "
                              "kvcs relies on: install aioquic 1.7")
        logging.getLogger("quic").addFilter(_log_filter)  # once: filters are a set

    def configuration(self, settings: QuicSettings, *, is_client: bool,
                      alpn_protocols: Sequence[str],
                      max_datagram_size: int) -> QuicConfiguration:
        return QuicConfiguration(
            **shared.configuration_options(settings, is_client=is_client,
                                           alpn_protocols=alpn_protocols,
                                           max_datagram_size=max_datagram_size),
            congestion_control_algorithm=settings.congestion_control)

    def _tuned(self, quic: QuicConnection, settings: QuicSettings) -> QuicConnectionAPI:
        # peers may open many streams (aioquic hard-codes 128 concurrently); set before
        # the handshake, which announces them. What was announced is also what was
        # "sent": aioquic sends MAX_STREAMS only when the limit differs from it, so a
        # limit below 128 left at sent=128 was never raised again.
        for limit, value in ((quic._local_max_streams_uni, settings.max_streams_uni),
                             (quic._local_max_streams_bidi, settings.max_streams_bidi)):
            limit.value = limit.sent = value
        # ACKs processed in time proportional to what they acknowledge (aioquic copies
        # every packet in flight per ACK: 2,300-3,300 at 80 ms and ~20 MiB/s)
        aioquic_recovery.install(quic._loss)
        control = quic._loss._cc
        if isinstance(control, bbr.BbrCongestionControl):  # pace at the model's rate
            quic._loss._pacer = bbr.BbrPacer(control, max_datagram_size=quic._max_datagram_size)
        return cast(QuicConnectionAPI, quic)

    def client_connection(self, configuration: QuicConfiguration,
                          settings: QuicSettings) -> QuicConnectionAPI:
        return self._tuned(aioquic_send.QuicConnection(configuration=configuration), settings)

    def server_connection(self, configuration: QuicConfiguration, settings: QuicSettings,
                          original_destination_cid: bytes) -> QuicConnectionAPI:
        return self._tuned(aioquic_send.QuicConnection(
            configuration=configuration,
            original_destination_connection_id=original_destination_cid), settings)

    def parse_header(self, data: bytes, cid_length: int) -> PacketHeader | None:
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=cid_length)
        except ValueError:
            return None
        return shared.packet_header(header, QuicPacketType)

    def version_negotiation(self, header: PacketHeader, versions: Sequence[int]) -> bytes:
        return encode_quic_version_negotiation(
            source_cid=header.destination_cid, destination_cid=header.source_cid,
            supported_versions=list(versions))

    def h3_connection(self, quic: QuicConnectionAPI) -> H3ConnectionAPI:
        return cast(H3ConnectionAPI, H3Connection(cast(QuicConnection, quic),
                                                  enable_webtransport=True))

    def peer_certificate(self, quic: QuicConnectionAPI) -> bytes | None:
        cert = cast(QuicConnection, quic).tls._peer_certificate  # no public accessor
        return None if cert is None else cert.public_bytes(Encoding.DER)

    def peer_address(self, quic: QuicConnectionAPI) -> NetworkAddress | None:
        return cast(QuicConnection, quic).get_peer_address() or None

    def receive_datagrams(self, quic: QuicConnectionAPI, datagrams: list[bytes],
                          addr: NetworkAddress, now: float) -> None:
        for data in datagrams:
            quic.receive_datagram(data, addr, now)

    def receive_segments(self, quic: QuicConnectionAPI, buffer: bytes, segment_size: int,
                         addr: NetworkAddress, now: float) -> None:
        for data in split_segments(buffer, segment_size):
            quic.receive_datagram(data, addr, now)

    def idle_timeout(self, quic: QuicConnectionAPI) -> float:
        ours = float(quic.configuration.idle_timeout or 0)
        theirs = cast(QuicConnection, quic)._remote_max_idle_timeout or 0  # no accessor
        return min(t for t in (ours, theirs) if t) if ours or theirs else 0.0

    def datagram_size(self, quic: QuicConnectionAPI) -> int:
        return int(cast(QuicConnection, quic)._max_datagram_size)  # fixed by the config

    def datagram_size_fell_back(self, quic: QuicConnectionAPI) -> bool:
        return False  # aioquic keeps the configured size

    def send_h3_datagram(self, h3: H3ConnectionAPI, session_id: int, data: bytes) -> None:
        cast(H3Connection, h3).send_datagram(session_id, data)  # divides by 4 itself

    def h3_datagram_session(self, event: Any) -> int:
        return int(event.stream_id)

    def adopt_local_webtransport_bidi(self, h3: H3ConnectionAPI, stream_id: int,
                                      session_id: int) -> None:
        with cast(H3Connection, h3)._get_or_create_stream(stream_id) as stream:
            shared.mark_local_webtransport_bidi(stream, session_id)

    def adopt_webtransport_stream(self, h3: H3ConnectionAPI, stream_id: int) -> None:
        shared.forget_when_done(cast(H3Connection, h3)._stream, stream_id)

    def send_view(self, quic: QuicConnectionAPI) -> StreamSendView:
        return _AioquicSendView(cast(QuicConnection, quic))


ADAPTER = AioquicAdapter
"""The adapter class :func:`kvcs.transport.quic.adapter` makes."""
