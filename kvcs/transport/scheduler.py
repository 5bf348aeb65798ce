"""Priority send scheduler in front of the QUIC library.

QUIC libraries accept any amount of stream data and serve all streams with pending data
round-robin, so priorities only work if data is held back. :class:`SendScheduler` keeps a
queue per stream and hands data to QUIC only while QUIC's *sendable but not yet sent*
bytes are below a watermark, always from the stream with the lowest priority key (ties:
the stream first seen first, i.e. FIFO by stream). :meth:`refill` is called before every
``datagrams_to_send`` by the binding.

What QUIC holds is read through the library adapter's
:class:`~kvcs.transport.quic.base.StreamSendView`. Where it shows per-stream credit
(aioquic), bytes held back by flow control or by the peer's stream limit do not count
against the watermark and such streams are parked until they can send again, so a blocked
stream never starves the others. Where it does not (qh3), the budget includes bytes held
back by flow control and streams are parked only while the peer's stream limit keeps
them from existing (qh3 refuses to create them): their data waits here, none is lost.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from dataclasses import dataclass, field

from .quic.base import QuicConnectionAPI, StreamSendView

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
    finished: bool = False  # FIN handed to QUIC


def _as_bytes_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")
    return view


class SendScheduler:
    """Per-stream queues drained into a QUIC connection by priority."""

    def __init__(self, quic: QuicConnectionAPI, view: StreamSendView,
                 errors: tuple[type[BaseException], ...], watermark: int,
                 chunk_size: int = 64 * 1024, low_water: int = 256 * 1024):
        self._quic = quic
        self._view = view
        self._errors = errors  # what the library raises for a stream that cannot send
        self.watermark = watermark
        self.chunk_size = chunk_size
        self._whole_below = chunk_size + chunk_size // 32
        self.low_water = low_water
        """A stream is reported in :attr:`drained` when its queue falls to this many bytes
        (or empties), so its writer can top it up before QUIC runs out of its data."""
        self._queues: dict[int, _Queue] = {}
        self._priorities: dict[int, tuple[int, ...]] = {}
        self._heap: list[tuple[tuple[int, ...], int, int]] = []
        self._parked: set[int] = set()
        self._resets: dict[int, int] = {}  # stream -> code, reset once it may exist
        self._seq = 0
        self.queued_bytes = 0
        """Bytes waiting in the scheduler (not yet handed to QUIC)."""
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

    def open(self, stream_id: int, preamble: bytes = b"") -> None:
        """A new local stream (the library's next available ID): create it in QUIC and
        queue ``preamble`` as its first bytes. Past the peer's stream limit, the stream
        and what is written on it wait here for the peer's MAX_STREAMS."""
        self._view.reserve(stream_id)
        if preamble:
            self.write(stream_id, preamble, False)

    def reset(self, stream_id: int, code: int) -> None:
        """Discard what is queued on ``stream_id`` and reset it: now, or, while it waits
        for the peer's stream credit, once it may exist (the peer opens it implicitly
        with any later stream and would otherwise keep it open)."""
        if self._view.waiting(stream_id):
            self._discard(stream_id)  # the view keeps watching its credit
            self._resets[stream_id] = code
        else:
            self.drop(stream_id)
            self._quic.reset_stream(stream_id, code)

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
        if not view.nbytes:
            if not end:
                return
            if queue.chunks:
                # the FIN rides on the last chunk still queued: QUIC sends it in the STREAM
                # frame that carries the stream's last bytes. A FIN in a frame of its own
                # is never resent by qh3 2.1 if that frame is lost while earlier bytes of
                # the stream are unacknowledged (docs/reliability.md, "qh3 and lost FINs")
                queue.chunks[-1] = (queue.chunks[-1][0], True)
                return
        queue.chunks.append((view, end))
        queue.queued += view.nbytes
        self.queued_bytes += view.nbytes
        if not queue.in_heap and not queue.parked:
            queue.in_heap = True
            heapq.heappush(self._heap, (queue.priority, queue.seq, stream_id))

    def drop(self, stream_id: int) -> int:
        """Discard queued data of ``stream_id`` (reset / STOP_SENDING); return bytes dropped."""
        self._view.forget(stream_id)
        return self._discard(stream_id)

    def _discard(self, stream_id: int) -> int:
        queue = self._queues.pop(stream_id, None)
        self._priorities.pop(stream_id, None)
        self._parked.discard(stream_id)
        if queue is None:
            return 0
        self.queued_bytes -= queue.queued
        return queue.queued

    def forget(self, stream_id: int) -> None:
        """Forget a stream whose send side is done (keeps nothing queued)."""
        self.drop(stream_id)

    # -- accounting -----------------------------------------------------------------

    def unsent_bytes(self) -> int:
        """Stream bytes in QUIC that are sendable now but not yet sent."""
        return self._view.unsent()

    @property
    def buffered_bytes(self) -> int:
        """Queued bytes plus bytes in QUIC not yet sent (back-pressure measure)."""
        return self.queued_bytes + self._view.buffered()

    @property
    def has_queued(self) -> bool:
        """Whether any stream has data waiting that is not parked."""
        return bool(self._heap)

    # -- draining -------------------------------------------------------------------

    def _unpark(self) -> None:
        for stream_id in list(self._parked):
            queue = self._queues.get(stream_id)
            if queue is None:
                self._parked.discard(stream_id)
                continue
            try:
                credit = self._view.credit(stream_id)
            except self._errors as exc:
                logger.debug("stream %d: cannot send (%s), dropping queued data", stream_id, exc)
                self.drop(stream_id)
                continue
            if credit is None or credit > 0:
                self._parked.discard(stream_id)
                queue.parked = False
                queue.in_heap = True
                heapq.heappush(self._heap, (queue.priority, queue.seq, stream_id))

    def _park(self, queue: _Queue, stream_id: int) -> None:
        heapq.heappop(self._heap)
        queue.in_heap = False
        queue.parked = True
        self._parked.add(stream_id)

    def _reset_allowed(self) -> None:
        for stream_id, code in list(self._resets.items()):
            if self._view.waiting(stream_id):
                continue
            del self._resets[stream_id]
            self._view.forget(stream_id)
            try:
                self._quic.reset_stream(stream_id, code)
            except self._errors as exc:
                logger.debug("stream %d: reset failed (%s)", stream_id, exc)

    def refill(self) -> int:
        """Hand queued data to QUIC by priority up to the watermark; return bytes moved."""
        if self._resets:
            self._reset_allowed()
        if self._parked:
            self._unpark()
        if not self._heap:
            return 0
        view, errors = self._view, self._errors
        budget = self.watermark - view.unsent()
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
            chunk, end = queue.chunks[0]
            remaining = chunk.nbytes - queue.offset
            # a chunk at most 1/32 larger than chunk_size goes whole: two 32 KiB objects
            # joined with their prefixes (65,548 bytes) in one QUIC call, not two
            take = min(remaining if remaining <= self._whole_below else self.chunk_size,
                       budget)
            if remaining:
                try:
                    credit = view.credit(stream_id)
                except errors as exc:
                    logger.debug("stream %d: cannot send (%s), dropping queued data",
                                 stream_id, exc)
                    heapq.heappop(heap)
                    self.drop(stream_id)
                    continue
                if credit is not None:
                    if credit <= 0:
                        self._park(queue, stream_id)
                        continue
                    take = min(take, credit)
            piece = chunk[queue.offset : queue.offset + take]
            last = queue.offset + take == chunk.nbytes
            fin = end and last
            try:
                self._quic.send_stream_data(stream_id, piece, end_stream=fin)
            except errors as exc:
                logger.debug("stream %d: send failed (%s), dropping queued data", stream_id, exc)
                heapq.heappop(heap)
                self.drop(stream_id)
                continue
            view.sent(stream_id)
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
