"""What the asyncio binding needs from a QUIC library: the :class:`QuicAdapter` protocol.

kvcs drives a library's sans-IO ``QuicConnection`` (and its ``H3Connection`` for
WebTransport) through the public calls both qh3 and aioquic share
(:class:`QuicConnectionAPI`, :class:`H3ConnectionAPI`). Everything else, the private state
read for flow control, the peer certificate and address, datagram sizes, H3 stream quirks
and the patches a library version needs, sits behind one adapter per library
(:mod:`.qh3`, :mod:`.aioquic`), and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config import QuicSettings

NetworkAddress = Any
"""A socket address as the libraries take it: ``(host, port)`` or IPv6 4-tuple."""


def split_segments(buffer: bytes, segment_size: int) -> list[bytes]:
    """The datagrams of a GRO buffer: ``segment_size`` bytes each, the last possibly
    shorter (where a library or a router cannot take the buffer whole)."""
    return [buffer[i:i + segment_size] for i in range(0, len(buffer), segment_size)]


class QuicConnectionAPI(Protocol):
    """The public sans-IO surface of ``QuicConnection`` shared by qh3 and aioquic."""

    host_cid: bytes

    @property
    def configuration(self) -> Any: ...

    def connect(self, addr: NetworkAddress, now: float) -> None: ...

    def receive_datagram(self, data: bytes, addr: NetworkAddress, now: float) -> None: ...

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, NetworkAddress]]: ...

    def get_timer(self) -> float | None: ...

    def handle_timer(self, now: float) -> None: ...

    def next_event(self) -> Any: ...

    def get_next_available_stream_id(self, is_unidirectional: bool = False) -> int: ...

    def send_stream_data(self, stream_id: int, data: Any, end_stream: bool = False) -> None: ...

    def reset_stream(self, stream_id: int, error_code: int) -> None: ...

    def stop_stream(self, stream_id: int, error_code: int) -> None: ...

    def send_datagram_frame(self, data: bytes) -> None: ...

    def send_ping(self, uid: int) -> None: ...

    def close(self, error_code: int = ..., frame_type: int | None = None,
              reason_phrase: str = "") -> None: ...


class H3ConnectionAPI(Protocol):
    """The public surface of ``H3Connection`` (WebTransport enabled) that kvcs uses."""

    def handle_event(self, event: Any) -> list[Any]: ...

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]],
                     end_stream: bool = False) -> None: ...

    def send_data(self, stream_id: int, data: bytes, end_stream: bool) -> None: ...

    def create_webtransport_stream(self, session_id: int,
                                   is_unidirectional: bool = False) -> int: ...


class StreamSendView(Protocol):
    """A connection's stream send state, as the send scheduler sees it."""

    def unsent(self) -> int:
        """Stream bytes in QUIC that could be sent now but are not yet: the scheduler keeps
        this below its watermark. Bytes held back by flow control do not count where the
        library shows them apart."""
        ...

    def buffered(self) -> int:
        """Every stream byte in QUIC not yet sent (back-pressure measure)."""
        ...

    def reserve(self, stream_id: int) -> None:
        """Create the new local stream ``stream_id`` (the library's next available ID), so
        that the next ID differs. Past the peer's stream limit the stream waits for the
        peer's MAX_STREAMS: :meth:`credit` is 0 until then. Never loses the stream."""
        ...

    def waiting(self, stream_id: int) -> bool:
        """Whether ``stream_id`` still waits for the peer's stream credit and so cannot
        be reset yet (the library cannot create it)."""
        ...

    def credit(self, stream_id: int) -> int | None:
        """Bytes ``stream_id`` may take before flow control (or the peer's stream limit)
        holds them back; ``None`` when the library does not show it (never park). Raises
        one of the adapter's ``errors`` when the stream cannot send any more."""
        ...

    def sent(self, stream_id: int) -> None:
        """Data was handed to QUIC for ``stream_id`` (so :meth:`unsent` accounts it)."""
        ...

    def forget(self, stream_id: int) -> None:
        """The scheduler dropped ``stream_id``."""
        ...


@dataclass(frozen=True, slots=True)
class PacketHeader:
    """What a server needs from a datagram's first QUIC packet to route it."""

    version: int | None
    """``None`` for a short header."""
    initial: bool
    """An Initial packet (may open a connection)."""
    version_negotiation: bool
    destination_cid: bytes
    source_cid: bytes


class QuicAdapter(Protocol):
    """One QUIC library as the binding uses it (see the module docstring)."""

    name: str
    """``"qh3"`` or ``"aioquic"``."""
    version: str
    """The installed library version."""
    max_datagram_size_limit: int
    """Largest ``max_datagram_size`` the library sends correctly."""
    events: Any
    """The library's ``quic.events`` module."""
    h3events: Any
    """The library's ``h3.events`` module."""
    errors: tuple[type[BaseException], ...]
    """What the library raises when a stream or the connection can no longer take a call."""

    def configuration(self, settings: QuicSettings, *, is_client: bool,
                      alpn_protocols: Sequence[str], max_datagram_size: int) -> Any:
        """A ``QuicConfiguration`` of this library for ``settings`` and a connection that
        sends datagrams of up to ``max_datagram_size`` bytes (no TLS material)."""
        ...

    def client_connection(self, configuration: Any, settings: QuicSettings) -> QuicConnectionAPI:
        """A client ``QuicConnection`` tuned for ``settings``."""
        ...

    def server_connection(self, configuration: Any, settings: QuicSettings,
                          original_destination_cid: bytes) -> QuicConnectionAPI:
        """A server ``QuicConnection`` for a client's first Initial."""
        ...

    def parse_header(self, data: bytes, cid_length: int) -> PacketHeader | None:
        """The header of the first packet of ``data``; ``None`` if it does not parse."""
        ...

    def version_negotiation(self, header: PacketHeader, versions: Sequence[int]) -> bytes:
        """A Version Negotiation packet answering ``header``."""
        ...

    def h3_connection(self, quic: QuicConnectionAPI) -> H3ConnectionAPI:
        """An ``H3Connection`` with WebTransport enabled on ``quic``."""
        ...

    def peer_certificate(self, quic: QuicConnectionAPI) -> bytes | None:
        """The peer's leaf certificate (DER) after the handshake."""
        ...

    def peer_address(self, quic: QuicConnectionAPI) -> NetworkAddress | None:
        """Where the connection sends its datagrams."""
        ...

    def receive_datagrams(self, quic: QuicConnectionAPI, datagrams: list[bytes],
                          addr: NetworkAddress, now: float) -> None:
        """Feed datagrams that arrived together from ``addr`` (one library call where the
        library takes a batch)."""
        ...

    def receive_segments(self, quic: QuicConnectionAPI, buffer: bytes, segment_size: int,
                         addr: NetworkAddress, now: float) -> None:
        """Feed a GRO buffer from ``addr``: datagrams of ``segment_size`` bytes back to
        back, the last possibly shorter (split in the library where it takes such a
        buffer)."""
        ...

    def idle_timeout(self, quic: QuicConnectionAPI) -> float:
        """The connection's idle timeout in seconds once the handshake is done: the
        smaller of ours and the peer's (0: none)."""
        ...

    def datagram_size(self, quic: QuicConnectionAPI) -> int:
        """The largest UDP payload the connection sends now."""
        ...

    def datagram_size_fell_back(self, quic: QuicConnectionAPI) -> bool:
        """Whether the library cut the datagram size during the handshake, below the
        configured size and for the connection's life, because the server answered late
        (see :meth:`.qh3.Qh3Adapter.datagram_size_fell_back`)."""
        ...

    def send_h3_datagram(self, h3: H3ConnectionAPI, session_id: int, data: bytes) -> None:
        """Send an HTTP datagram for the WebTransport session on CONNECT stream
        ``session_id``."""
        ...

    def h3_datagram_session(self, event: Any) -> int:
        """The CONNECT stream an HTTP ``DatagramReceived`` event belongs to."""
        ...

    def adopt_local_webtransport_bidi(self, h3: H3ConnectionAPI, stream_id: int,
                                      session_id: int) -> None:
        """Tell the H3 layer that our new bidirectional stream ``stream_id`` is a
        WebTransport stream of ``session_id``: its peer half carries WebTransport data,
        never HTTP/3 frames (the binding writes the stream's preamble itself)."""
        ...

    def adopt_webtransport_stream(self, h3: H3ConnectionAPI, stream_id: int) -> None:
        """A peer-opened WebTransport stream: kvcs never sends HTTP/3 frames on it, so
        the H3 layer may forget it once it ends."""
        ...

    def send_view(self, quic: QuicConnectionAPI) -> StreamSendView:
        """The stream send state of ``quic`` for the scheduler."""
        ...
