"""WebTransport over HTTP/3: the session on one QUIC connection (:class:`WebTransport`)
and its wire helpers (error-code mapping, capsules, structured-field lists)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .config import ALPN_MOQT
from .interfaces import SessionInputs
from .quic.base import QuicAdapter, QuicConnectionAPI

logger = logging.getLogger(__name__)

#: First HTTP/3 error code of the WebTransport application error range
#: (draft-ietf-webtrans-http3, WEBTRANSPORT_APPLICATION_ERROR).
WT_ERROR_FIRST = 0x52E4A40FA8DB
WT_ERROR_LAST = 0x52E5AC983162

#: CLOSE_WEBTRANSPORT_SESSION capsule type.
CAPSULE_CLOSE_WEBTRANSPORT_SESSION = 0x2843
#: DRAIN_WEBTRANSPORT_SESSION capsule type.
CAPSULE_DRAIN_WEBTRANSPORT_SESSION = 0x78AE

#: Unidirectional stream type of a WebTransport stream (WEBTRANSPORT_STREAM, 0x54).
WT_UNI_STREAM_TYPE = 0x54
#: Signal value opening a WebTransport bidirectional stream (WEBTRANSPORT_STREAM, 0x41).
WT_BIDI_SIGNAL = 0x41

H3_NO_ERROR = 0x100
MAX_CLOSE_REASON = 1024


def encode_varint(value: int) -> bytes:
    """A QUIC variable-length integer (RFC 9000, 16): 1, 2, 4 or 8 bytes."""
    if value < 0x40:
        return value.to_bytes(1, "big")
    if value < 0x4000:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 0x40000000:
        return (value | 0x80000000).to_bytes(4, "big")
    if value < 0x4000000000000000:
        return (value | 0xC000000000000000).to_bytes(8, "big")
    raise ValueError(f"QUIC varint out of range: {value}")


def decode_varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """Decode a QUIC varint at ``pos``: ``(value, next position)``, or ``None`` if
    ``data`` ends before it does."""
    if pos >= len(data):
        return None
    length = 1 << (data[pos] >> 6)
    if pos + length > len(data):
        return None
    value = int.from_bytes(data[pos : pos + length], "big") & ((1 << (8 * length - 2)) - 1)
    return value, pos + length


def wt_to_http_error(code: int) -> int:
    """Map a 32-bit WebTransport application error code into the HTTP/3 code space."""
    code &= 0xFFFFFFFF
    return WT_ERROR_FIRST + code + code // 0x1E


def http_to_wt_error(code: int) -> int | None:
    """Inverse of :func:`wt_to_http_error`; ``None`` if ``code`` is outside the range or
    a reserved (GREASE) code point."""
    if not WT_ERROR_FIRST <= code <= WT_ERROR_LAST:
        return None
    shifted = code - WT_ERROR_FIRST
    if shifted % 0x1F == 0x1E:
        return None
    return shifted - shifted // 0x1F


def encode_close_capsule(code: int, reason: str) -> bytes:
    """CLOSE_WEBTRANSPORT_SESSION capsule: 32-bit code then a UTF-8 message (<=1024 B)."""
    message = reason.encode("utf-8")[:MAX_CLOSE_REASON]
    # do not cut a UTF-8 sequence in half
    message = message.decode("utf-8", "ignore").encode("utf-8")
    body = (code & 0xFFFFFFFF).to_bytes(4, "big") + message
    return encode_varint(CAPSULE_CLOSE_WEBTRANSPORT_SESSION) + encode_varint(len(body)) + body


class CapsuleParser:
    """Incremental capsule parser for the CONNECT stream's DATA payload."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add bytes; return complete ``(capsule type, value)`` pairs."""
        self._buffer += data
        capsules: list[tuple[int, bytes]] = []
        while self._buffer:
            ctype = decode_varint(self._buffer, 0)
            length = decode_varint(self._buffer, ctype[1]) if ctype else None
            if ctype is None or length is None:
                break
            start = length[1]
            if len(self._buffer) < start + length[0]:
                break
            capsules.append((ctype[0], self._buffer[start : start + length[0]]))
            self._buffer = self._buffer[start + length[0] :]
        return capsules


def decode_close_capsule(value: bytes) -> tuple[int, str]:
    """Return ``(code, reason)`` of a CLOSE_WEBTRANSPORT_SESSION capsule value."""
    if len(value) < 4:
        raise ValueError("CLOSE_WEBTRANSPORT_SESSION capsule too short")
    return int.from_bytes(value[:4], "big"), value[4:].decode("utf-8", "replace")


def parse_sf_string_list(value: str) -> list[str]:
    """Parse a Structured Field list of strings (RFC 8941), e.g. ``"moqt-22", "moqt-21"``.

    Parameters (``;a=b``) are ignored; bare tokens are accepted as well. Malformed members
    are skipped rather than failing the whole list.
    """
    items: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i] in " \t,":
            i += 1
        if i >= n:
            break
        if value[i] == '"':
            i += 1
            out: list[str] = []
            while i < n and value[i] != '"':
                if value[i] == "\\" and i + 1 < n:
                    i += 1
                out.append(value[i])
                i += 1
            i += 1  # closing quote
            items.append("".join(out))
        else:
            start = i
            while i < n and value[i] not in ",;":
                i += 1
            token = value[start:i].strip()
            if token:
                items.append(token)
        # skip parameters up to the next comma
        while i < n and value[i] != ",":
            if value[i] == '"':  # quoted parameter value
                i += 1
                while i < n and value[i] != '"':
                    i += 2 if value[i] == "\\" else 1
            i += 1
    return items


def sf_string(value: str) -> str:
    """Serialize ``value`` as a Structured Field string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class WebTransport:
    """HTTP/3 and one WebTransport session carrying MOQT on a QUIC connection.

    Either role: a client sends the extended CONNECT (:meth:`send_connect`), a server
    answers one offering ``moqt-22``. Stream data, resets and datagrams of the session go
    to ``inputs``; what arrives for a session not yet established waits and is replayed.
    The connection is told through three callbacks: ``start_session(authority, path)``
    when the CONNECT succeeded (returns whether the MOQT session now exists),
    ``peer_closed(code, reason)`` when the peer ended the session, ``refused(reason)``
    when a server refused our CONNECT. ``accepting()`` is False once the connection closes
    (early input is then dropped, not kept).
    """

    def __init__(
        self,
        quic: QuicConnectionAPI,
        lib: QuicAdapter,
        inputs: SessionInputs,
        *,
        is_client: bool,
        start_session: Callable[[str | None, str | None], bool],
        peer_closed: Callable[[int, str], None],
        refused: Callable[[str], None],
        accepting: Callable[[], bool],
    ) -> None:
        self._quic = quic
        self._lib = lib
        self.h3 = lib.h3_connection(quic)
        self._inputs = inputs
        self._is_client = is_client
        self._start_session = start_session
        self._peer_closed = peer_closed
        self._refused = refused
        self._accepting = accepting
        self.session_id: int | None = None
        """The CONNECT stream of the session."""
        self._target: tuple[str | None, str | None] = (None, None)  # client: authority, path
        self._streams: set[int] = set()
        self._pending: dict[int, list[Any]] = {}
        self._capsules = CapsuleParser()
        events = lib.events
        self._signals = (events.StreamReset, events.StopSendingReceived)
        h3events = lib.h3events
        self._headers = h3events.HeadersReceived
        self._stream_data = h3events.WebTransportStreamDataReceived
        self._datagram = h3events.DatagramReceived
        self._data = h3events.DataReceived

    # -- requests from the connection ------------------------------------------------

    def send_connect(self, authority: str | None, path: str | None) -> None:
        """Client: open the session with an extended CONNECT offering ``moqt-22``."""
        stream_id = self._quic.get_next_available_stream_id()
        self.session_id = stream_id
        self._target = (authority, path)
        self.h3.send_headers(stream_id, [
            (b":method", b"CONNECT"),
            (b":protocol", b"webtransport"),
            (b":scheme", b"https"),
            (b":authority", (authority or "").encode()),
            (b":path", (path or "/").encode()),
            (b"wt-available-protocols", sf_string(ALPN_MOQT).encode()),
            (b"sec-webtransport-http3-draft02", b"1"),
        ])

    def open_stream(self, unidirectional: bool) -> tuple[int, bytes]:
        """A new WebTransport stream of the session: its QUIC stream ID and the preamble
        to write first on it (stream type or signal value, then the session ID). The
        binding creates the stream with that preamble, so that a stream past the peer's
        stream limit waits for credit like any other (the H3 layer would lose it)."""
        session_id = self.session_id
        assert session_id is not None
        stream_id = self._quic.get_next_available_stream_id(unidirectional)
        if unidirectional:
            preamble = encode_varint(WT_UNI_STREAM_TYPE) + encode_varint(session_id)
        else:
            self._lib.adopt_local_webtransport_bidi(self.h3, stream_id, session_id)
            preamble = encode_varint(WT_BIDI_SIGNAL) + encode_varint(session_id)
        self._streams.add(stream_id)
        return stream_id, preamble

    def send_datagram(self, data: bytes) -> None:
        """An HTTP datagram of the session."""
        assert self.session_id is not None
        self._lib.send_h3_datagram(self.h3, self.session_id, data)

    def send_close(self, code: int, reason: str) -> None:
        """CLOSE_WEBTRANSPORT_SESSION capsule and FIN on the CONNECT stream."""
        assert self.session_id is not None
        self.h3.send_data(self.session_id, encode_close_capsule(code, reason), end_stream=True)

    # -- QUIC events ------------------------------------------------------------------

    def quic_event(self, event: Any) -> None:
        """Feed one QUIC event (other than handshake, termination and connection IDs)."""
        for h3event in self.h3.handle_event(event):
            self._on_h3_event(h3event)
        # resets and STOP_SENDING produce no H3 events: map WT streams ourselves
        if isinstance(event, self._signals):
            self._on_stream_signal(event)

    def _on_stream_signal(self, event: Any) -> None:
        stream_id = event.stream_id
        inputs = self._inputs
        if stream_id == self.session_id and inputs.session is not None:
            self._peer_closed(0, "CONNECT stream reset")
            return
        if stream_id not in self._streams or inputs.session is None:
            return
        code = http_to_wt_error(event.error_code)
        if code is None:
            logger.debug("stream %d: non-WebTransport error code %#x", stream_id, event.error_code)
            code = 0
        if isinstance(event, self._signals[0]):
            inputs.stream_reset(stream_id, code)
        else:
            inputs.stop_sending(stream_id, code)

    def _keep_early(self, session_id: int, event: Any) -> None:
        """Input for a session not yet established: replayed once it is."""
        if self._inputs.session is None and self._accepting():
            self._pending.setdefault(session_id, []).append(event)

    def _on_h3_event(self, event: Any) -> None:
        inputs = self._inputs
        if isinstance(event, self._stream_data):
            if inputs.session is None or event.session_id != self.session_id:
                self._keep_early(event.session_id, event)
                return
            if event.stream_id not in self._streams:
                self._streams.add(event.stream_id)
                self._lib.adopt_webtransport_stream(self.h3, event.stream_id)
            inputs.stream_data(event.stream_id, event.data, event.stream_ended)
        elif isinstance(event, self._datagram):
            session_id = self._lib.h3_datagram_session(event)
            if inputs.session is None or session_id != self.session_id:
                self._keep_early(session_id, event)
                return
            inputs.datagram(event.data)
        elif isinstance(event, self._headers):
            if self._is_client:
                self._on_connect_response(event)
            else:
                self._on_connect_request(event)
        elif (isinstance(event, self._data) and event.stream_id == self.session_id
              and inputs.session is not None):
            for ctype, value in self._capsules.feed(event.data):
                if ctype == CAPSULE_CLOSE_WEBTRANSPORT_SESSION:
                    try:
                        code, reason = decode_close_capsule(value)
                    except ValueError:
                        code, reason = 0, "malformed close capsule"
                    self._peer_closed(code, reason)
                    return
            if event.stream_ended:
                self._peer_closed(0, "CONNECT stream closed")

    def _established(self, authority: str | None, path: str | None) -> None:
        if self._start_session(authority, path):
            for event in self._pending.pop(self.session_id or 0, []):
                self._on_h3_event(event)
        self._pending.clear()

    def _on_connect_request(self, event: Any) -> None:
        headers = {k.decode(): v.decode(errors="replace") for k, v in event.headers}
        stream_id = event.stream_id
        method, protocol = headers.get(":method"), headers.get(":protocol")
        offered = parse_sf_string_list(headers.get("wt-available-protocols", ""))
        status = 200
        if method != "CONNECT" or protocol != "webtransport" or self.session_id is not None:
            status = 404
        elif ALPN_MOQT not in offered:
            status = 400
        if status != 200:
            logger.info("rejecting %s %s (:protocol=%s, offered=%s): %d", method,
                        headers.get(":path"), protocol, offered, status)
            self.h3.send_headers(stream_id, [(b":status", str(status).encode())],
                                 end_stream=True)
            return
        self.session_id = stream_id
        self.h3.send_headers(stream_id, [
            (b":status", b"200"),
            (b"wt-protocol", sf_string(ALPN_MOQT).encode()),
            (b"sec-webtransport-http3-draft", b"draft02"),
        ])
        self._established(headers.get(":authority"), headers.get(":path", "/"))

    def _on_connect_response(self, event: Any) -> None:
        if event.stream_id != self.session_id or self._inputs.session is not None:
            return
        headers = {k.decode(): v.decode(errors="replace") for k, v in event.headers}
        status = headers.get(":status", "")
        selected = parse_sf_string_list(headers.get("wt-protocol", ""))
        if not status.startswith("2") or selected != [ALPN_MOQT]:
            self._refused(f"WebTransport CONNECT refused: status {status}, "
                          f"wt-protocol {selected}")
            return
        self._established(*self._target)
