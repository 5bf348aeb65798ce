"""Small WebTransport-over-HTTP/3 helpers: error-code mapping, capsules, header lists."""

from __future__ import annotations

from aioquic.buffer import Buffer, BufferReadError, encode_uint_var

#: First HTTP/3 error code of the WebTransport application error range
#: (draft-ietf-webtrans-http3, WEBTRANSPORT_APPLICATION_ERROR).
WT_ERROR_FIRST = 0x52E4A40FA8DB
WT_ERROR_LAST = 0x52E5AC983162

#: CLOSE_WEBTRANSPORT_SESSION capsule type.
CAPSULE_CLOSE_WEBTRANSPORT_SESSION = 0x2843
#: DRAIN_WEBTRANSPORT_SESSION capsule type.
CAPSULE_DRAIN_WEBTRANSPORT_SESSION = 0x78AE

H3_NO_ERROR = 0x100
MAX_CLOSE_REASON = 1024


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
    return encode_uint_var(CAPSULE_CLOSE_WEBTRANSPORT_SESSION) + encode_uint_var(len(body)) + body


class CapsuleParser:
    """Incremental capsule parser for the CONNECT stream's DATA payload."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Add bytes; return complete ``(capsule type, value)`` pairs."""
        self._buffer += data
        capsules: list[tuple[int, bytes]] = []
        while self._buffer:
            buf = Buffer(data=self._buffer)
            try:
                ctype = buf.pull_uint_var()
                length = buf.pull_uint_var()
            except BufferReadError:
                break
            start = buf.tell()
            if len(self._buffer) < start + length:
                break
            capsules.append((ctype, self._buffer[start : start + length]))
            self._buffer = self._buffer[start + length :]
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
