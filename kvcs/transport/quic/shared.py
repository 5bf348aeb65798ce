"""What the two adapters share: qh3 is an aioquic fork, so their configurations, packet
headers and H3 stream objects have the same shape; the code that reads them is written
once here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import QuicSettings
from .base import PacketHeader


def configuration_options(settings: QuicSettings, *, is_client: bool,
                          alpn_protocols: Sequence[str],
                          max_datagram_size: int) -> dict[str, Any]:
    """The ``QuicConfiguration`` arguments both libraries take the same way."""
    return dict(is_client=is_client, alpn_protocols=list(alpn_protocols),
                max_datagram_size=max_datagram_size, max_data=settings.max_data,
                max_stream_data=settings.max_stream_data, idle_timeout=settings.idle_timeout,
                max_datagram_frame_size=settings.max_datagram_frame_size)


def packet_header(header: Any, packet_types: Any) -> PacketHeader:
    """The library's parsed long/short header as a :class:`PacketHeader` (``packet_types``:
    the library's ``QuicPacketType`` enum)."""
    return PacketHeader(
        version=header.version,
        initial=header.packet_type == packet_types.INITIAL,
        version_negotiation=header.packet_type == packet_types.VERSION_NEGOTIATION,
        destination_cid=header.destination_cid,
        source_cid=header.source_cid,
    )

WEBTRANSPORT_STREAM = 0x41
"""The frame type that starts a WebTransport bidirectional stream (WebTransport over
HTTP/3, the same value as both libraries' ``FrameType.WEBTRANSPORT_STREAM``)."""


def mark_local_webtransport_bidi(stream: Any, session_id: int) -> None:
    """Our new bidirectional ``stream`` (the library's H3 stream object) belongs to the
    WebTransport session ``session_id``: both libraries would otherwise parse the peer's
    half as HTTP/3 frames (seen with aioquic 1.7.2 and qh3)."""
    stream.frame_type = WEBTRANSPORT_STREAM
    stream.session_id = session_id
    stream.sending_ended = True  # we never send HTTP/3 frames on it


def forget_when_done(streams: dict[int, Any], stream_id: int) -> None:
    """A peer-opened WebTransport stream: we never send HTTP/3 frames on it, which lets the
    library forget it once it ends (``streams``: the H3 layer's stream table)."""
    stream = streams.get(stream_id)
    if stream is not None:
        stream.sending_ended = True
