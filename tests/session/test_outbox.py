"""Outbox.stream_bytes: the stream data a session wrote and its binding has not taken yet
(what a relay's session backlog counts besides the connection's send queue)."""

from __future__ import annotations

from kvcs.moqt.actions import SendStreamData, SetStreamPriority
from kvcs.moqt.outbox import Outbox


def test_stream_bytes_counts_pending_stream_data_until_taken() -> None:
    out = Outbox()
    assert out.stream_bytes() == 0
    out.emit(SetStreamPriority(2, (1,)))
    out.emit(SendStreamData(2, b"abc"))
    assert out.stream_bytes() == 3
    out.actions.append(SendStreamData(2, memoryview(b"defgh"), True))  # a hot path's append
    out.emit(SendStreamData(6, b"", True))
    assert out.stream_bytes() == 8
    assert out.stream_bytes() == 8  # each action counted once
    assert len(out.take_actions()) == 4
    assert out.stream_bytes() == 0
    out.emit(SendStreamData(2, b"ij"))
    assert out.stream_bytes() == 2


def test_nothing_is_counted_once_closed() -> None:
    out = Outbox()
    out.closed = (0, "done")
    out.emit(SendStreamData(2, b"abc"))
    assert out.stream_bytes() == 0
