"""Test helpers that write to QUIC streams behind the MOQT session's back, to play a
misbehaving peer (malformed control messages, truncated objects) over real QUIC.

Not for applications: the session never learns of these streams or bytes.
"""

from __future__ import annotations

from .connection import MoqtConnection


def raw_stream_id(conn: MoqtConnection, unidirectional: bool) -> int:
    """The ID of the next local stream of ``conn``'s QUIC connection (raw QUIC only),
    allocated without telling the session."""
    return conn._quic.get_next_available_stream_id(unidirectional)


def raw_write(conn: MoqtConnection, stream_id: int, data: bytes, end: bool = False) -> None:
    """Write ``data`` (and FIN if ``end``) on ``stream_id`` straight into QUIC, bypassing
    the session and the send scheduler, and transmit."""
    conn._quic.send_stream_data(stream_id, data, end)
    conn.transmit()
