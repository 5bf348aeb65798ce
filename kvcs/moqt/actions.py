"""What the sans-IO MOQT session asks its I/O binding to do.

The session never touches sockets. After each input (stream data, reset, datagram, API
call) the binding drains :meth:`Session.actions` and carries these out in order, like
aioquic's ``QuicConnection.datagrams_to_send`` or h11's ``send``.

Stream IDs are QUIC stream IDs (also under WebTransport, where the binding adds and strips
the WebTransport stream preamble). New streams are allocated through the binding's
:class:`StreamOpener`, a synchronous call that does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class StreamOpener(Protocol):
    """Allocates the ID of a new locally initiated stream (no I/O)."""

    def open_stream(self, unidirectional: bool) -> int:  # pragma: no cover - protocol
        """Return the ID of a new stream; unidirectional or bidirectional."""
        ...


@dataclass(frozen=True, slots=True)
class SendStreamData:
    """Append ``data`` to the send side of ``stream_id``; ``end`` sends FIN after it."""

    stream_id: int
    data: bytes | memoryview
    end: bool = False


@dataclass(frozen=True, slots=True)
class SetStreamPriority:
    """Scheduling key of a stream's pending data: lower goes first under contention.

    Keys are tuples compared lexicographically, e.g. (1, subscriber priority, publisher
    priority, group, subgroup). Control and request streams use ``(0,)``; data stream keys
    start with 1 so that control traffic always goes first. Equal keys: FIFO by stream.
    """

    stream_id: int
    priority: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ResetStream:
    """RESET_STREAM on the send side of ``stream_id`` with an application error code."""

    stream_id: int
    code: int


@dataclass(frozen=True, slots=True)
class StopSending:
    """STOP_SENDING on the receive side of ``stream_id`` with an application error code."""

    stream_id: int
    code: int


@dataclass(frozen=True, slots=True)
class SendDatagram:
    """Send one QUIC DATAGRAM frame (RFC 9221)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class CloseSession:
    """Close the whole MOQT session (QUIC CONNECTION_CLOSE or WT session close)."""

    code: int
    reason: str


Action = (
    SendStreamData | SetStreamPriority | ResetStream | StopSending | SendDatagram | CloseSession
)
