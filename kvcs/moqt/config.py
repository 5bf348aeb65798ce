"""Settings of a MOQT session, and the most state one peer can make a session hold.

Every resource a peer can make a session keep is bounded by a setting of
:class:`SessionConfig`, and exceeding it has the draft's answer (digest section 9):

======================  ==========  =====================================================
setting                 default     when the peer exceeds it
======================  ==========  =====================================================
setup_buffer_limit      1 MiB       input before the peer's SETUP: the session closes with
                                    PROTOCOL_VIOLATION (0x3)
max_requests            256         live requests of the peer: a new one is refused with
                                    REQUEST_ERROR EXCESSIVE_LOAD (0x9, Retry Interval
                                    :data:`RETRY_AFTER_MS`), its stream FINed
max_control_bytes       4 MiB       control state the peer makes us keep (its requests'
                                    messages, control messages not finished yet, pending
                                    REQUEST_UPDATEs, namespaces announced to us): a new
                                    request is refused with REQUEST_ERROR EXCESSIVE_LOAD; a
                                    live one that grows past it is cancelled (RESET_STREAM
                                    and STOP_SENDING EXCESSIVE_LOAD)
max_setup_tokens        16          Authorization Tokens in the peer's SETUP (kept for the
                                    session's life): the session closes with UNAUTHORIZED
                                    (0x2); a request's tokens are charged to
                                    max_control_bytes. Every message, SETUP
                                    included, is capped while parsing at
                                    wire.MAX_TOKENS (16) tokens and
                                    wire.MAX_TOKEN_BYTES, UNAUTHORIZED too
max_request_updates     0           REQUEST_UPDATEs awaiting our answer per request
                        (unlimited) (advertised in SETUP): TOO_MANY_REQUEST_UPDATES (0x1B);
                                    each pending one is also charged to max_control_bytes
max_data_bytes          64 MiB      data the peer makes us hold on its data streams
                                    (objects being received, unfinished object headers,
                                    streams held until their Track Alias is known): the
                                    stream that needs more is stopped (STOP_SENDING
                                    EXCESSIVE_LOAD)
max_object_properties   64 KiB      one object's Properties: its stream is stopped
                                    (STOP_SENDING EXCESSIVE_LOAD)
======================  ==========  =====================================================

The namespace limits are the draft's (digest 3.6: 32 fields, 4096 bytes; PROTOCOL_VIOLATION,
checked by the codec); a control message is at most 65535 bytes (its 16-bit Length) and an
object payload at most :data:`~kvcs.moqt.wire.MAX_OBJECT_PAYLOAD` (PROTOCOL_VIOLATION).
``max_filter_ranges`` (16) is advertised in SETUP and enforced where filters are applied
(:mod:`kvcs.moqt.serving`: REQUEST_ERROR INVALID_FILTER); a request's ranges are charged to
max_control_bytes whatever their number. A stream the peer leaves unfinished costs memory
only within these bounds; nothing here expires it by time (CONTROL_MESSAGE_TIMEOUT /
DATA_STREAM_TIMEOUT would need a clock from the binding).

The memory bound
----------------
Charges are what the state costs in Python objects (measured with ``tracemalloc`` in
``tests/session/test_hostile_flood.py``, which also floods a session and checks the bound
below), not its wire size: a decoded Range Filter range takes ~130 bytes for its ~2 wire
bytes. With ``c`` the session's :class:`SessionConfig`, ``S`` and ``U`` the bidirectional
and unidirectional streams the transport lets the peer have open at once (QUIC
``max_streams_bidi`` / ``max_streams_uni``: 256 and 1024 by default), one session holds at
most :func:`state_bound` bytes::

    SESSION_COST + c.setup_buffer_limit + MAX_SKIPPED_REQUEST_IDS * ID_COST
    + CONTROL_MESSAGE_MAX + (c.max_setup_tokens + MAX_UNKNOWN_SETUP_OPTIONS) * ITEM_COST
                                                 (the peer's SETUP as kept)
    + c.max_control_bytes + CONTROL_MESSAGE_MAX   (one message over the limit at most)
    + c.max_data_bytes + c.max_object_properties + HEADER_MAX  (one header over the limit)
    + S * TOMBSTONE_COST + U * TOMBSTONE_COST    (streams refused or stopped, kept until
                                                  the peer ends them)

With the defaults and the transport's default stream limits that is about 70 MiB, 64 of it
``max_data_bytes``: what a publisher may legitimately have in flight. Events the
application has not drained yet are the application's (each binding drains them after
every input). The requests the application makes itself are not charged: their number is
its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from .wire import AuthToken

RETRY_AFTER_MS = 1000
"""Retry Interval of a REQUEST_ERROR EXCESSIVE_LOAD the session sends (retry after 1 s)."""
MAX_SKIPPED_REQUEST_IDS = 4096
"""Peer Request IDs that may be outstanding below the highest one seen. Each request has
its own stream, so requests arrive out of order; a peer cannot have many more requests in
flight than its open bidirectional streams, so a larger gap is treated as invalid
(INVALID_REQUEST_ID)."""
MAX_UNKNOWN_SETUP_OPTIONS = 64
"""Unknown Setup Options kept in :attr:`Session.peer_setup` (the draft ignores them; the
rest are dropped)."""

# -- what state costs, in bytes of Python objects (measured, rounded up) ---------------

ITEM_COST = 160
"""One decoded item of a message: a namespace field, an Authorization Token, a property,
a Range Filter range, a parameter."""
MESSAGE_COST = 1024
"""A decoded request-starting message with its Parameters, beyond its items and bytes."""
REQUEST_COST = 2048
"""A request's record: its state, parser and registry entries."""
UPDATE_COST = 128
"""A peer's REQUEST_UPDATE awaiting our answer."""
STREAM_COST = 1024
"""An incoming data stream with its parser."""
HELD_OBJECT_COST = 512
"""An object kept until its stream's Track Alias is known (plus its payload, copied)."""
EARLY_ITEM_COST = 256
"""One piece of input kept before the peer's SETUP (plus its bytes)."""
TOMBSTONE_COST = 256
"""A stream the session refused or stopped, remembered until the peer ends it."""
ID_COST = 128
"""A skipped peer Request ID remembered until its request arrives."""
SESSION_COST = 64 * 1024
"""A session with nothing in it (its parts, parsers, tables)."""
CONTROL_MESSAGE_MAX = 65535 + 11
"""A control message: type (at most 9 bytes), 16-bit Length, body."""
HEADER_MAX = 64
"""An object header without its Properties (vi64 fields and a priority byte)."""


@dataclass(slots=True)
class SessionConfig:
    """Settings of one MOQT session (the bounds: see the module docstring).

    ``path``/``authority`` are sent as SETUP options by a client over raw QUIC (never over
    WebTransport). ``max_filter_ranges`` and ``max_request_updates`` are what we accept
    from the peer (advertised in our SETUP).
    """

    is_client: bool
    implementation: str = "kvcs/0.1"
    path: bytes | None = None
    authority: bytes | None = None
    auth_tokens: tuple[AuthToken, ...] = ()
    max_filter_ranges: int = 16
    max_request_updates: int = 0
    setup_buffer_limit: int = 1 << 20
    """Bytes of requests, data and datagrams the peer may send before its SETUP."""
    max_requests: int = 256
    """The peer's requests the session keeps at once (the transport's default
    ``max_streams_bidi`` is 256 too)."""
    max_control_bytes: int = 4 << 20
    """Control state the peer can make the session keep, in bytes of Python objects."""
    max_setup_tokens: int = 16
    """Authorization Tokens accepted in the peer's SETUP (kept for the whole session;
    a request's tokens are charged to ``max_control_bytes``)."""
    max_data_bytes: int = 64 << 20
    """Data the peer can make the session hold on its data streams, in bytes."""
    max_object_properties: int = 1 << 16
    """Bytes of one object's Properties."""
    write_window: int = 0
    """Bytes a fetch or fill stream may have queued before its sender waits for
    :meth:`Session.stream_writable` (0: no limit). Keeps memory bounded and lets the
    binding's scheduler interleave streams by priority instead of draining one long
    stream first; only set it when the binding reports writability."""
    webtransport: bool = False
    request_rate: float = 0.0
    """The peer's new requests decoded per second (0: each as it arrives): one past the
    rate waits with its message undecoded, charged to ``max_control_bytes``, and
    unanswered (:class:`~kvcs.moqt.ratelimit.RequestGate`); a server sets its request
    pacer's rate here, so that a flooding peer costs no decoding beyond what the server
    would handle anyway."""
    request_burst: int = 64
    """New requests decoded at once before ``request_rate`` applies."""
    clock: Callable[[], float] = time.monotonic
    """The session's time in seconds (only ``request_rate`` reads it)."""
    publish_done_wait_s: float = 2.0
    """How long a subscriber waits, after PUBLISH_DONE, for the streams it counts that it
    has not seen (digest 4.11: a timer >= the delivery timeouts; kvcs sets none). A
    relay that evicts a live track resets streams before their header went out: their
    subscriber could never attribute them and would wait forever."""
    publish_done_stall_s: float = 20.0
    """After PUBLISH_DONE, how long a data stream it counts may stay open without a byte
    before its end is taken as lost and the subscription ends with that stream missing.
    qh3 2.1 can lose a stream's FIN for good (docs/reliability.md, "qh3 and lost FINs"):
    every byte arrives and the end never does; a relay would hold the track's link, and
    its subscribers, open for as long as the session lasts."""


def state_bound(config: SessionConfig, bidi_streams: int = 256, uni_streams: int = 1024) -> int:
    """The most bytes of state one session with ``config`` holds, whatever its peer sends
    (module docstring), when the transport lets the peer have ``bidi_streams`` and
    ``uni_streams`` streams open at once."""
    c = config
    setup = CONTROL_MESSAGE_MAX + (c.max_setup_tokens + MAX_UNKNOWN_SETUP_OPTIONS) * ITEM_COST
    return (SESSION_COST + c.setup_buffer_limit + setup
            + MAX_SKIPPED_REQUEST_IDS * ID_COST
            + c.max_control_bytes + CONTROL_MESSAGE_MAX
            + c.max_data_bytes + c.max_object_properties + HEADER_MAX
            + (bidi_streams + uni_streams) * TOMBSTONE_COST)
