"""Rate limits without a clock of their own (the caller says what time it is):

* :class:`TokenBucket`: what paces new connections (:mod:`kvcs.transport.server`), the
  requests a server handles (:class:`kvcs.admission.RequestPacer`) and the requests one
  session decodes;
* :class:`RequestGate`: the peer's new request streams waiting, undecoded, for a token of
  their session's bucket (:class:`~kvcs.moqt.control.ControlPlane`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .wire import ControlStreamParser

WAITING_COST = 256
"""A request stream waiting for its turn (plus its bytes)."""


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; starts full."""

    __slots__ = ("_clock", "_stamp", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def take(self, now: float | None = None) -> bool:
        """Take one token if there is one (at ``now``, default the clock's time)."""
        self._refill(self._clock() if now is None else now)
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def wait(self, now: float) -> float:
        """Seconds from ``now`` until a token is there (0: one is)."""
        self._refill(now)
        return max(0.0, 1.0 - self._tokens) / self.rate

    def _refill(self, now: float) -> None:
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = max(self._stamp, now)


@dataclass(slots=True)
class WaitingStream:
    """A peer request stream whose first message is framed but not decoded: its frames
    (type, body) in order, the parser holding what follows, FIN, and the bytes charged to
    the control budget for it."""

    stream_id: int
    parser: ControlStreamParser
    frames: list[tuple[int, bytes]] = field(default_factory=list)
    end: bool = False
    charged: int = 0


class RequestGate:
    """The peer's new requests decoded at most ``rate`` a second (``burst`` at once), in
    arrival order: a request stream past the rate waits with its message undecoded (its
    bytes, at most a 64 KiB message, are the caller's to charge), and is not answered, so
    the transport's stream limit stops the peer from opening more. Decoding a request costs
    up to ~0.04 ms (64 KiB of parameters, with the limits checked while parsing): it is
    done only for requests the peer's share of the server's rate lets through."""

    __slots__ = ("_bucket", "_waiting")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self._bucket = TokenBucket(rate, burst, lambda: now)
        self._waiting: dict[int, WaitingStream] = {}  # in arrival order

    def __len__(self) -> int:
        return len(self._waiting)

    def admit(self, now: float) -> bool:
        """True if a new request may be decoded now (nothing waits and a token is there:
        it is taken)."""
        return not self._waiting and self._bucket.take(now)

    def hold(self, stream: WaitingStream) -> None:
        """Keep a request stream until its turn (:meth:`due`)."""
        self._waiting[stream.stream_id] = stream

    def get(self, stream_id: int) -> WaitingStream | None:
        """The waiting stream ``stream_id``, if it waits."""
        return self._waiting.get(stream_id)

    def drop(self, stream_id: int) -> WaitingStream | None:
        """Forget a waiting stream (reset by the peer); None if it does not wait."""
        return self._waiting.pop(stream_id, None)

    def clear(self) -> list[WaitingStream]:
        """Forget every waiting stream (the session closed); returns them."""
        out = list(self._waiting.values())
        self._waiting.clear()
        return out

    def due(self, now: float) -> list[WaitingStream]:
        """Take the waiting streams whose turn has come by ``now``, oldest first."""
        out: list[WaitingStream] = []
        while self._waiting and self._bucket.take(now):
            sid = next(iter(self._waiting))
            out.append(self._waiting.pop(sid))
        return out

    def next_due(self, now: float) -> float | None:
        """Seconds from ``now`` until the next waiting stream's turn (None: none waits)."""
        return self._bucket.wait(now) if self._waiting else None
