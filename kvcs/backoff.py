"""Bounded exponential backoff with jitter: how long to wait before asking again.

Used wherever kvcs retries by itself: a relay reconnecting to its upstream, a publisher
reconnecting to its relay (:class:`~kvcs.kvnet.reconnect.ReconnectingTarget`), a consumer
resuming an interrupted retrieval, a manifest subscription refused for now
(:class:`~kvcs.kvnet.manifest_track.ManifestTrack`). Jitter spreads the retries of many
clients that lost the same relay at the same moment, so that they do not all come back in
the same instant.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays ``initial``, ``initial * factor``, ... capped at ``maximum`` seconds; each
    one drawn uniformly from its last ``jitter`` share (``jitter=0.5``: between half of it
    and all of it; 0: exactly it)."""

    initial: float = 0.1
    maximum: float = 5.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError("Backoff needs 0 < initial <= maximum")
        if self.factor < 1:
            raise ValueError("Backoff.factor must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("Backoff.jitter must be within 0..1")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The delays, without end (``rng``: a seeded generator for reproducible ones)."""
        draw = (rng or random).random
        delay = self.initial
        while True:
            yield delay * (1 - self.jitter * draw()) if self.jitter else delay
            delay = min(delay * self.factor, self.maximum)

    async def retry(self, attempt: Callable[[int], Awaitable[T]], *, what: str,
                    retry_on: tuple[type[BaseException], ...],
                    rng: random.Random | None = None) -> T:
        """Wait a delay, then ``await attempt(n)`` (n = 1, 2, ...), until it returns;
        an exception of ``retry_on`` is logged at INFO (``what`` names the attempt) and
        retried, any other ends it. Cancel the caller to stop trying."""
        for n, delay in enumerate(self.delays(rng), 1):
            await asyncio.sleep(delay)
            log.info("%s: attempt %d (after %.2f s)", what, n, delay)
            try:
                return await attempt(n)
            except retry_on as exc:
                log.info("attempt %d failed (%s): %s", n, what, exc or type(exc).__name__)
        raise AssertionError("unreachable: the delays never end")
