"""aioquic's packet writing with its per-packet loops over the streams that can write.

aioquic 1.7 builds each 1-RTT packet with two loops over streams: every stream for
MAX_STREAM_DATA (``_write_stream_limits``), and every unfinished stream of its send queue
for STREAM, RESET_STREAM and STOP_SENDING frames, after which it rebuilds the queue. A
stream stays in both until the peer has acknowledged all of it, so on a long path they
hold every MOQT group in flight: 50-140 streams at 80 ms and ~20 MiB/s in the long-haul
bench, where the loops cost more than building and encrypting the packet
(microbenchmark: 26 us per 1452-byte packet with one stream, 58 us with 128 in flight).

:class:`QuicConnection` keeps aioquic's ``_write_application`` and narrows what it loops
over for the duration of one call: the streams that can receive data (the only ones
``_write_stream_limits`` writes for; a locally opened unidirectional stream cannot) and
the queued streams that have something to write (data, a reset, a STOP_SENDING, or are
finished and to be discarded). Nothing else changes during a call (only acknowledgements
finish a stream or give it data to resend), so the same frames are written, and the queue
is left in aioquic's order (the streams that wrote last, in the order they last wrote).
"""

from __future__ import annotations

from typing import Any

from aioquic.quic.connection import QuicConnection as _AioquicConnection
from aioquic.quic.stream import QuicStream

REQUIRED = ("_streams", "_streams_queue", "_write_application")
"""What :class:`QuicConnection` uses of aioquic's connection (and, of streams,
:func:`_can_write`'s attributes and ``max_stream_data_local``)."""


def _can_write(stream: QuicStream) -> bool:
    """Whether aioquic's send-queue loop would do anything for ``stream`` now."""
    sender = stream.sender
    return (not sender.buffer_is_empty or sender.reset_pending
            or stream.receiver.stop_pending or stream.is_finished)


class QuicConnection(_AioquicConnection):
    """aioquic's connection, its per-packet stream loops narrowed (module docstring)."""

    def _write_application(self, builder: Any, network_path: Any, now: float) -> None:
        streams, queue = self._streams, self._streams_queue
        active = [stream for stream in queue if _can_write(stream)]
        if len(active) == len(queue) and len(streams) == len(queue):
            super()._write_application(builder, network_path, now)
            return
        # the streams of the queue that can write, and those that may need a MAX_STREAM_DATA
        writers = set(active)
        narrowed = {stream_id: stream for stream_id, stream in streams.items()
                    if stream.max_stream_data_local or stream in writers}
        listed = list(narrowed)
        # a stream that writes new bytes raises its highest offset: aioquic's "sent" (it
        # counts the flow-control credit used, which a retransmission does not use)
        offsets = {stream: stream.sender.highest_offset for stream in active}
        self._streams, self._streams_queue = narrowed, active
        try:
            super()._write_application(builder, network_path, now)
        finally:
            order = self._streams_queue  # aioquic's new order of the active streams
            for stream_id in listed:
                if stream_id not in narrowed:  # finished: aioquic discarded it
                    del streams[stream_id]
            sent = [stream for stream in order
                    if stream.sender.highest_offset != offsets[stream]]
            # aioquic's order for the whole queue: the streams that did not write, as they
            # were (less the discarded), then those that wrote, in aioquic's new order
            kept, wrote = set(order), set(sent)
            self._streams = streams
            self._streams_queue = [stream for stream in queue if stream not in writers
                                   or (stream in kept and stream not in wrote)]
            self._streams_queue.extend(sent)
