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


def test_writes_joined_while_they_are_the_last_action_on_one_stream() -> None:
    """Outbox.write_joined: consecutive writes on one stream become one SendStreamData with
    their bytes in order, up to the limit; another action, another stream, a FIN or the
    limit starts a new one. Pending joined bytes count in stream_bytes before the take."""
    out = Outbox()
    out.write_joined(2, b"h1", b"p1", False, 100)
    out.write_joined(2, b"h2", memoryview(b"p2"), False, 100)
    assert out.stream_bytes() == 8
    out.write_joined(6, b"x", b"y", False, 100)  # another stream
    out.emit(SetStreamPriority(6, (1,)))
    out.write_joined(6, b"z", b"", True, 100)  # after another action, with FIN
    out.write_joined(6, b"late", b"", False, 100)  # after the FIN: a write of its own
    out.write_joined(10, b"a" * 60, b"", False, 100)
    out.write_joined(10, b"b" * 41, b"", False, 100)  # over the limit: a new write
    assert out.stream_bytes() == 8 + 2 + 1 + 4 + 60 + 41
    got = out.take_actions()
    assert got == [SendStreamData(2, b"h1p1h2p2"), SendStreamData(6, b"xy"),
                   SetStreamPriority(6, (1,)), SendStreamData(6, b"z", True),
                   SendStreamData(6, b"late"), SendStreamData(10, b"a" * 60),
                   SendStreamData(10, b"b" * 41)]
    assert out.stream_bytes() == 0
    out.write_joined(2, b"h3", b"p3", False, 100)  # a new batch starts a new write
    assert out.take_actions() == [SendStreamData(2, b"h3p3")]

