"""SendScheduler without a socket: what it hands the QUIC library, call by call."""

from __future__ import annotations

from typing import Any

from kvcs.transport.scheduler import SendScheduler


class _Quic:
    """Records what the scheduler hands to QUIC."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bytes, bool]] = []

    def send_stream_data(self, stream_id: int, data: Any, end_stream: bool = False) -> None:
        self.calls.append((stream_id, bytes(data), end_stream))

    def reset_stream(self, stream_id: int, code: int) -> None:  # pragma: no cover
        raise AssertionError("no reset expected")


class _View:
    """A library that sends everything at once (nothing unsent, no credit shown)."""

    def unsent(self) -> int:
        return 0

    def buffered(self) -> int:
        return 0

    def reserve(self, stream_id: int) -> None:
        pass

    def waiting(self, stream_id: int) -> bool:
        return False

    def credit(self, stream_id: int) -> int | None:
        return None

    def sent(self, stream_id: int) -> None:
        pass

    def forget(self, stream_id: int) -> None:
        pass


def _scheduler(chunk_size: int = 64 * 1024) -> tuple[SendScheduler, _Quic]:
    quic = _Quic()
    return SendScheduler(quic, _View(), (ValueError,), watermark=1 << 20,  # type: ignore[arg-type]
                         chunk_size=chunk_size), quic


def test_a_fin_queued_behind_data_leaves_with_its_last_bytes() -> None:
    """qh3 2.1 never resends a FIN sent in a STREAM frame of its own if it is lost while
    earlier bytes are unacknowledged (docs/reliability.md): a FIN that finds bytes of its
    stream still queued goes with them, in one call."""
    s, quic = _scheduler(chunk_size=4)
    s.write(2, b"abcdef", False)
    s.write(2, b"gh", False)
    s.write(2, b"", True)
    s.refill()
    assert quic.calls == [(2, b"abcd", False), (2, b"ef", False), (2, b"gh", True)]


def test_a_fin_after_every_byte_left_goes_alone() -> None:
    """Nothing left to carry it: the FIN is handed on its own (the only way to end it)."""
    s, quic = _scheduler()
    s.write(6, b"abc", False)
    s.refill()
    s.write(6, b"", True)
    s.refill()
    assert quic.calls == [(6, b"abc", False), (6, b"", True)]
