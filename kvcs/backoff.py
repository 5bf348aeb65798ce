"""Bounded exponential backoff with jitter: how long to wait before asking again.

Used wherever kvcs retries by itself: a relay reconnecting to its upstream, a publisher
reconnecting to its relay (:class:`~kvcs.kvnet.reconnect.ReconnectingTarget`), a consumer
resuming an interrupted retrieval, a manifest subscription refused for now
(:class:`~kvcs.kvnet.manifest_track.ManifestTrack`). Jitter spreads the retries of many
clients that lost the same relay at the same moment, so that they do not all come back in
the same instant.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Backoff"]


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
