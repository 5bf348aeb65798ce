"""The relay's object cache: tracks by Full Track Name, a byte budget, age and LRU eviction.

Age is per object: :meth:`Cache.sweep` drops every object older than its track's
MAX_CACHE_DURATION (:meth:`~kvcs.moqt.track.Track.expire`), also from tracks still being
fed, and removes a track once it has lost all its objects to age and nothing feeds it.

Payloads are kept as received: zero-copy views of the received stream data, except that a
view pinning a much larger receive buffer is copied to exact size (:func:`exact_payload`),
so that the budget bounds memory. :attr:`Cache.bytes` counts payload bytes only; the
per-object overhead (a :class:`CachedObject` and index entries, roughly 200 bytes per
object in CPython) comes on top and is documented in docs/relay.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..moqt.track import FullTrackName, Track
from ..moqt.wire import TrackNamespace, namespace_has_prefix
from .metrics import Metrics

log = logging.getLogger(__name__)

OBJECT_OVERHEAD = 200
"""Approximate bytes of Python bookkeeping per cached object (not counted in ``bytes``)."""


def exact_payload(payload: bytes | memoryview) -> bytes | memoryview:
    """The payload as the cache keeps it. A zero-copy view of received stream data pins
    the whole chunk it points into (a 32 KiB object in a 60000-byte datagram's data keeps
    all of it: the relay's RSS was 1.5x its cached payload), so a view of a buffer more
    than 1/8 larger than itself is copied to exact size."""
    if isinstance(payload, memoryview):
        base = payload.obj
        size = len(base) if isinstance(base, bytes | bytearray | memoryview) else None
        if size is None or size > len(payload) + (len(payload) >> 3):
            return bytes(payload)
    return payload


def _never(_track: Track) -> bool:
    return False


def _ignore(_track: Track, _reason: str) -> None:
    return None


class Cache:
    """Tracks by Full Track Name with a payload byte budget.

    ``pinned(track)``: evict it last (it feeds subscribers). ``fed(track)``: something
    still adds objects to it, so it stays even when age has emptied it. ``on_evict(track,
    reason)``: called when a track is evicted (``age`` or ``bytes``), before it is dropped.
    """

    def __init__(self, budget: int, metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.monotonic, *,
                 pinned: Callable[[Track], bool] = _never,
                 fed: Callable[[Track], bool] = _never,
                 on_evict: Callable[[Track, str], None] = _ignore) -> None:
        self.budget = budget
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.tracks: dict[FullTrackName, Track] = {}
        self.bytes = 0
        """Payload bytes of all cached tracks (kept up to date by :meth:`added`)."""
        self._pinned = pinned
        self._fed = fed
        self._on_evict = on_evict

    def get(self, key: FullTrackName) -> Track | None:
        """The cached track or None."""
        return self.tracks.get(key)

    def put(self, track: Track) -> None:
        """Add a track (empty or not) to the cache."""
        self.tracks[track.full_name] = track
        self.bytes += track.bytes

    def added(self, nbytes: int) -> None:
        """Account ``nbytes`` of new payload; evicts if over budget."""
        self.bytes += nbytes
        if self.bytes > self.budget:
            self.enforce_budget()

    def remove(self, track: Track, reason: str) -> None:
        """Drop a track (listeners are told it is gone)."""
        if self.tracks.get(track.full_name) is not track:
            return
        del self.tracks[track.full_name]
        self.bytes -= track.bytes
        self.metrics.inc("kvcs_relay_cache_evictions_total", reason=reason)
        log.info("evicting track %r (%d bytes, %s)", track.name, track.bytes, reason)
        self._on_evict(track, reason)
        track.drop()

    def forget(self, track: Track) -> None:
        """Remove a track without counting an eviction (e.g. incomplete, source gone)."""
        if self.tracks.get(track.full_name) is track:
            del self.tracks[track.full_name]
            self.bytes -= track.bytes
            track.drop()

    def under(self, prefix: TrackNamespace) -> list[Track]:
        """The cached tracks whose namespace starts with ``prefix`` (field-wise)."""
        return [t for t in self.tracks.values() if namespace_has_prefix(t.namespace, prefix)]

    def enforce_budget(self) -> None:
        """Evict unpinned tracks, least recently used first; then shed the oldest objects
        of pinned ones (a live track outgrowing the budget loses its past, not its
        followers: evicting it whole ended every subscription with "track evicted")."""
        if self.bytes <= self.budget:
            return
        order = sorted(self.tracks.values(),
                       key=lambda t: (self._pinned(t), t.last_used))
        for track in order:
            if self.bytes <= self.budget:
                break
            if self._pinned(track):
                freed = track.shed(self.bytes - self.budget)
                self.bytes -= freed
                self.metrics.inc("kvcs_relay_cache_shed_bytes_total", freed)
            else:
                self.remove(track, "bytes")

    def sweep(self) -> None:
        """Drop objects older than their track's MAX_CACHE_DURATION, evict the tracks age
        has emptied (unless still fed), then enforce the budget."""
        now = self.clock()
        for track in list(self.tracks.values()):
            before = track.count
            freed = track.expire(now)
            if track.count != before:
                self.bytes -= freed
                self.metrics.inc("kvcs_relay_cache_expired_objects_total", before - track.count)
            if not track.count and track.expired_objects and not self._fed(track):
                self.remove(track, "age")
        self.enforce_budget()
