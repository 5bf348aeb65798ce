"""Priority send scheduler in front of aioquic.

aioquic accepts any amount of stream data and serves all streams with pending data
round-robin, so priorities only work if data is held back. :class:`SendScheduler` keeps a
queue per stream and hands data to aioquic only while aioquic's *sendable but not yet
sent* bytes are below a watermark, always from the stream with the lowest priority key
(ties: the stream first seen first, i.e. FIFO by stream). :meth:`refill` is called before
every ``datagrams_to_send`` by the binding.

Bytes held back by flow control (stream credit) or by the peer's stream limit do not count
against the watermark, and such streams are parked until they can send again, so a blocked
stream never starves the others.

With the qh3 backend (no per-stream state visible) the budget is qh3's
``get_send_buffer_size()`` (which includes bytes held back by flow control) and streams are
never parked.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from dataclasses import dataclass, field

from aioquic.quic.stream import QuicStream

from .backend import BACKEND, QuicConnection

logger = logging.getLogger(__name__)

DEFAULT_PRIORITY: tuple[int, ...] = (0,)
"""Key of streams the session never prioritised (control/request streams use (0,))."""


@dataclass(slots=True)
class _Queue:
    """Pending data of one stream."""

    priority: tuple[int, ...]
    seq: int
    chunks: deque[tuple[memoryview, bool]] = field(default_factory=deque)
    offset: int = 0  # consumed bytes of chunks[0]
    queued: int = 0  # bytes still queued
    in_heap: bool = False
    parked: bool = False
    finished: bool = False  # FIN handed to aioquic


def _as_bytes_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")
    return view


class SendScheduler:
    """Per-stream queues drained into a :class:`QuicConnection` by priority."""

    def __init__(self, quic: QuicConnection, watermark: int, chunk_size: int = 64 * 1024,
                 low_water: int = 256 * 1024):
        self._quic = quic
        self.watermark = watermark
        self.chunk_size = chunk_size
        self.low_water = low_water
        """A stream is reported in :attr:`drained` when its queue falls to this many bytes
        (or empties), so its writer can top it up before QUIC runs out of its data."""
        self._queues: dict[int, _Queue] = {}
        self._priorities: dict[int, tuple[int, ...]] = {}
        self._heap: list[tuple[tuple[int, ...], int, int]] = []
        self._parked: set[int] = set()
        self._in_quic: dict[int, QuicStream] = {}
        self._seq = 0
        self._native = BACKEND == "qh3"  # stream state lives in qh3's native core
        self.queued_bytes = 0
        """Bytes waiting in the scheduler (not yet handed to aioquic)."""
        self.drained: list[int] = []
        """Streams whose queue emptied or fell to :attr:`low_water` since the binding last
        looked; the binding reports them to the session (``stream_writable``)."""

    # -- inputs ---------------------------------------------------------------------

    def set_priority(self, stream_id: int, priority: tuple[int, ...]) -> None:
        """Set the scheduling key of ``stream_id`` (lower goes first)."""
        self._priorities[stream_id] = tuple(priority)
        queue = self._queues.get(stream_id)
        if queue is not None and queue.priority != priority:
            queue.priority = tuple(priority)
            if queue.in_heap:
                heapq.heappush(self._heap, (queue.priority, queue.seq, stream_id))

    def write(self, stream_id: int, data: bytes | bytearray | memoryview, end: bool) -> None:
        """Queue ``data`` (kept by reference: do not mutate it) and optionally the FIN."""
        queue = self._queues.get(stream_id)
        if queue is None:
            self._seq += 1
            queue = self._queues[stream_id] = _Queue(
                self._priorities.get(stream_id, DEFAULT_PRIORITY), self._seq
            )
        if queue.finished:
            logger.debug("stream %d: data after FIN dropped", stream_id)
            return
        view = _as_bytes_view(data)
        if not view.nbytes and not end:
            return
        queue.chunks.append((view, end))
        queue.queued += view.nbytes
        self.queued_bytes += view.nbytes
        if not queue.in_heap and not queue.parked:
            queue.in_heap = True
            heapq.heappush(self._heap, (queue.priority, queue.seq, stream_id))

    def drop(self, stream_id: int) -> int:
        """Discard queued data of ``stream_id`` (reset / STOP_SENDING); return bytes dropped."""
        queue = self._queues.pop(stream_id, None)
        self._priorities.pop(stream_id, None)
        self._parked.discard(stream_id)
        self._in_quic.pop(stream_id, None)
        if queue is None:
            return 0
        self.queued_bytes -= queue.queued
        return queue.queued

    def forget(self, stream_id: int) -> None:
        """Forget a stream whose send side is done (keeps nothing queued)."""
        self.drop(stream_id)

    # -- accounting -----------------------------------------------------------------

    def unsent_bytes(self) -> int:
        """Stream bytes in aioquic that are sendable now but not yet sent."""
        if self._native:
            return int(self._quic.get_send_buffer_size())  # type: ignore[attr-defined]
        total = 0
        done: list[int] = []
        for stream_id, stream in self._in_quic.items():
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
            del self._in_quic[stream_id]
        return total

    @property
    def buffered_bytes(self) -> int:
        """Queued bytes plus bytes in aioquic not yet sent (back-pressure measure)."""
        total = self.queued_bytes
        if self._native:
            return total + int(self._quic.get_send_buffer_size())  # type: ignore[attr-defined]
        for stream in self._in_quic.values():
            sender = stream.sender
            if sender._reset_error_code is None:
                total += max(0, sender._buffer_stop - sender.highest_offset)
        return total

    @property
    def has_queued(self) -> bool:
        """Whether any stream has data waiting that is not parked."""
        return bool(self._heap)

    # -- draining -------------------------------------------------------------------

    def _stream(self, stream_id: int) -> QuicStream | None:
        stream = self._quic._streams.get(stream_id)
        if stream is None:
            # create the aioquic stream (local streams are normally created on open)
            self._quic.send_stream_data(stream_id, b"")
            stream = self._quic._streams.get(stream_id)
        return stream

    def _unpark(self) -> None:
        for stream_id in list(self._parked):
            queue = self._queues.get(stream_id)
            stream = self._quic._streams.get(stream_id)
            if queue is None or stream is None:
                self._parked.discard(stream_id)
                continue
            if not stream.is_blocked and stream.max_stream_data_remote > (
                stream.sender._buffer_stop
            ):
                self._parked.discard(stream_id)
                queue.parked = False
                queue.in_heap = True
                heapq.heappush(self._heap, (queue.priority, queue.seq, stream_id))

    def refill(self) -> int:
        """Hand queued data to aioquic by priority up to the watermark; return bytes moved."""
        if self._parked:
            self._unpark()
        if not self._heap:
            return 0
        budget = self.watermark - self.unsent_bytes()
        moved = 0
        heap = self._heap
        while budget > 0 and heap:
            priority, seq, stream_id = heap[0]
            queue = self._queues.get(stream_id)
            if (
                queue is None
                or queue.priority != priority
                or queue.seq != seq
                or (not queue.chunks)
            ):
                heapq.heappop(heap)
                if queue is not None and queue.seq == seq and not queue.chunks:
                    queue.in_heap = False
                continue
            if self._native:
                view, end = queue.chunks[0]
                take = min(view.nbytes - queue.offset, budget, self.chunk_size)
                if not self._native_send(queue, stream_id, take):
                    heapq.heappop(heap)
                    self.drop(stream_id)
                    continue
                budget -= take
                moved += take
                continue
            try:
                stream = self._stream(stream_id)
            except (ValueError, RuntimeError) as exc:
                logger.debug("stream %d: cannot send (%s), dropping queued data", stream_id, exc)
                heapq.heappop(heap)
                self.drop(stream_id)
                continue
            if stream is None:  # pragma: no cover - defensive
                heapq.heappop(heap)
                self.drop(stream_id)
                continue
            view, end = queue.chunks[0]
            remaining = view.nbytes - queue.offset
            take = min(remaining, budget, self.chunk_size)
            if remaining:
                credit = stream.max_stream_data_remote - stream.sender._buffer_stop
                if stream.is_blocked or credit <= 0:
                    heapq.heappop(heap)
                    queue.in_heap = False
                    queue.parked = True
                    self._parked.add(stream_id)
                    continue
                take = min(take, credit)
            piece = view[queue.offset : queue.offset + take]
            last = queue.offset + take == view.nbytes
            fin = end and last
            try:
                self._quic.send_stream_data(stream_id, piece, end_stream=fin)  # type: ignore[arg-type]
            except (ValueError, RuntimeError) as exc:
                logger.debug("stream %d: send failed (%s), dropping queued data", stream_id, exc)
                heapq.heappop(heap)
                self.drop(stream_id)
                continue
            self._in_quic[stream_id] = stream
            budget -= take
            moved += take
            self._consumed(queue, stream_id, take, last, fin)
        return moved

    def _consumed(self, queue: _Queue, stream_id: int, take: int, last: bool,
                  fin: bool) -> None:
        """Account ``take`` bytes of the head chunk of ``queue`` handed to QUIC."""
        low = self.low_water
        if queue.queued > low >= queue.queued - take:
            self.drained.append(stream_id)  # low water: the writer may top it up now
        queue.queued -= take
        self.queued_bytes -= take
        if last:
            queue.chunks.popleft()
            queue.offset = 0
        else:
            queue.offset += take
        if fin:
            queue.finished = True
        if not queue.chunks:
            heapq.heappop(self._heap)
            queue.in_heap = False
            if queue.finished:
                del self._queues[stream_id]
                self._priorities.pop(stream_id, None)
            else:
                self.drained.append(stream_id)

    def _native_send(self, queue: _Queue, stream_id: int,
                     take: int) -> bool:
        """qh3: hand ``take`` bytes of the head chunk to QUIC; False if the stream is gone."""
        view, end = queue.chunks[0]
        piece = view[queue.offset : queue.offset + take]
        last = queue.offset + take == view.nbytes
        fin = end and last
        try:
            self._quic.send_stream_data(stream_id, piece, end_stream=fin)  # type: ignore[arg-type]
        except Exception as exc:  # qh3 raises its own error types
            logger.debug("stream %d: send failed (%s), dropping queued data", stream_id, exc)
            return False
        self._consumed(queue, stream_id, take, last, fin)
        return True
