"""A token bucket: what paces new connections (:mod:`.server`) and the peers' requests
(:class:`kvcs.admission.RequestPacer`)."""

from __future__ import annotations

import time
from collections.abc import Callable


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
