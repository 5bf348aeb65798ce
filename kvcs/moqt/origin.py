"""What a MOQT application offers its peers: tracks and published namespaces (sans-IO).

An :class:`Origin` is shared by every session that serves it (one endpoint, all sessions
of a :class:`~kvcs.hosting.TrackHost`, all sessions of a relay): every producer writes
into it and every session serves it. It holds

* the tracks by Full Track Name (:meth:`create_track`, :meth:`track`; a relay's copies of
  other origins' tracks, :meth:`cache_track`) and their retention: a payload byte
  budget (least recently used first, a track being followed last and then only its
  oldest objects), MAX_CACHE_DURATION per object (:meth:`sweep`), completion (a
  :class:`~kvcs.moqt.track.Track` knows it); a :class:`Retention` policy says which
  tracks are followed or fed and hears what goes, and
* a namespace table: which *publication* (a session and the Request ID of its
  PUBLISH_NAMESPACE, or the application itself) makes a namespace available, and which
  *watch* (a session and the Request ID of its peer's SUBSCRIBE_NAMESPACE) looks at which
  prefix.

The table does no I/O. :meth:`publish`, :meth:`withdraw` and :meth:`watch` return the
NAMESPACE / NAMESPACE_DONE messages to send as :class:`NamespaceNotice` values, and the
caller sends each on the notice's session. A namespace is available while at least one
publication holds it: several publishers of one namespace (two sessions of a relay, or a
session and the upstream relay) give a watcher one NAMESPACE, then one NAMESPACE_DONE.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .track import CachedObject, FullTrackName, Track
from .wire import Properties, TrackNamespace, namespace_has_prefix

log = logging.getLogger(__name__)

S = TypeVar("S", bound=Hashable)
"""The sessions (endpoints, relay sessions) that publish and watch."""


class Retention(Protocol):
    """What an origin with a byte budget asks and tells its owner (a relay)."""

    def pinned(self, track: Track) -> bool:
        """Evict it last, and shed its oldest objects rather than evict it whole (it
        feeds subscribers)."""
        ...

    def fed(self, track: Track) -> bool:
        """Something still adds objects to it: it stays even when age has emptied it."""
        ...

    def evicted(self, track: Track, reason: str) -> None:
        """``track`` is being evicted (``age`` or ``bytes``), before it is dropped."""
        ...

    def expired(self, track: Track, objects: int) -> None:
        """``objects`` of ``track`` aged out (MAX_CACHE_DURATION)."""
        ...

    def shed(self, track: Track, nbytes: int) -> None:
        """``nbytes`` of ``track``'s oldest objects were dropped to meet the budget."""
        ...


@dataclass(frozen=True, slots=True)
class NamespaceNotice(Generic[S]):
    """Send NAMESPACE (``active``) or NAMESPACE_DONE for ``namespace`` on the
    SUBSCRIBE_NAMESPACE ``request_id`` of ``session``."""

    session: S
    request_id: int
    namespace: TrackNamespace
    active: bool


class Origin(Generic[S]):
    """Tracks and namespace table of one application; see the module docstring."""

    def __init__(self, budget: int | None = None, retention: Retention | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tracks: dict[FullTrackName, Track] = {}
        """Tracks by (namespace, name)."""
        self.budget = budget
        """Payload bytes the tracks may hold (None: no bound, an application's origin)."""
        self.bytes = 0
        """Payload bytes of the tracks (kept up to date by whoever adds to a copy:
        :meth:`added`)."""
        self.retention = retention
        self.clock = clock
        self._publications: dict[TrackNamespace, list[tuple[S | None, int]]] = {}
        self._published: dict[S | None, dict[tuple[int, TrackNamespace], None]] = {}
        self._watches: dict[S, dict[int, TrackNamespace]] = {}
        self._staged: dict[int, Track] = {}  # tracks holding staged objects (stage)

    # ------------------------------------------------------------------ tracks

    def stage(self, track: Track, obj: CachedObject) -> bool:
        """Store ``obj`` in ``track`` and hold it back from listeners until
        :meth:`tell_staged` (:meth:`Track.stage`); True when nothing of this origin was
        held back before: the caller arranges for :meth:`tell_staged` to run."""
        if not track.stage(obj):
            return False
        first = not self._staged
        self._staged[id(track)] = track
        return first

    def tell_staged(self) -> None:
        """Tell listeners about the objects every track holds back (:meth:`stage`): what
        sends a session's queued data first calls this (a flush, a close, back-pressure)."""
        if self._staged:
            tracks = list(self._staged.values())
            self._staged.clear()
            for track in tracks:
                track.tell_staged()

    def track(self, namespace: TrackNamespace, name: bytes) -> Track | None:
        """The track ``(namespace, name)``, or None."""
        return self.tracks.get((tuple(namespace), bytes(name)))

    def create_track(self, namespace: TrackNamespace, name: bytes,
                     properties: Properties = ()) -> Track:
        """The origin track ``(namespace, name)``, created on first use."""
        key = (tuple(namespace), bytes(name))
        track = self.tracks.get(key)
        if track is None:
            track = self.tracks[key] = Track(namespace, name, properties, origin=True)
        return track

    def add_track(self, track: Track) -> None:
        """Offer an existing track (one shared with another origin, or a relay's copy
        read back from disk)."""
        old = self.tracks.get(track.full_name)
        if old is not None:
            self.bytes -= old.bytes
        self.tracks[track.full_name] = track
        self.bytes += track.bytes

    def cache_track(self, namespace: TrackNamespace, name: bytes) -> Track:
        """A new, empty copy of another origin's track ``(namespace, name)`` (a relay's:
        filled from upstream, aged by MAX_CACHE_DURATION)."""
        track = Track(namespace, name, origin=False)
        self.add_track(track)
        return track

    def get(self, key: FullTrackName) -> Track | None:
        """The track by Full Track Name, or None."""
        return self.tracks.get(key)

    def under(self, prefix: TrackNamespace) -> list[Track]:
        """The tracks whose namespace starts with ``prefix`` (field-wise)."""
        return [t for t in self.tracks.values() if namespace_has_prefix(t.namespace, prefix)]

    def drop_tracks(self, prefix: TrackNamespace) -> int:
        """Stop offering every track whose namespace starts with ``prefix`` (field-wise);
        returns how many. Sessions serving them keep what they serve."""
        dropped = self.under(prefix)
        for track in dropped:
            del self.tracks[track.full_name]
            self.bytes -= track.bytes
        return len(dropped)

    # ------------------------------------------------------------------ retention

    def added(self, nbytes: int) -> None:
        """Account ``nbytes`` of new payload in a copy; evicts if over the budget."""
        self.bytes += nbytes
        if self.budget is not None and self.bytes > self.budget:
            self.enforce_budget()

    def remove(self, track: Track, reason: str) -> None:
        """Evict a track (``age``, ``bytes``): the policy hears it, then its listeners
        (the sessions serving it) are told it is gone."""
        if self.tracks.get(track.full_name) is not track:
            return
        del self.tracks[track.full_name]
        self.bytes -= track.bytes
        log.info("evicting track %r (%d bytes, %s)", track.name, track.bytes, reason)
        if self.retention is not None:
            self.retention.evicted(track, reason)
        track.drop()

    def forget(self, track: Track) -> None:
        """Remove a track without counting an eviction (e.g. incomplete, source gone)."""
        if self.tracks.get(track.full_name) is track:
            del self.tracks[track.full_name]
            self.bytes -= track.bytes
            track.drop()

    def enforce_budget(self) -> None:
        """Evict tracks nobody follows, least recently used first; then shed the oldest
        objects of followed ones (a live track outgrowing the budget loses its past, not
        its followers: evicting it whole ended every subscription with "track
        evicted")."""
        if self.budget is None or self.bytes <= self.budget:
            return
        pinned = self.retention.pinned if self.retention is not None else _never
        order = sorted(self.tracks.values(), key=lambda t: (pinned(t), t.last_used))
        for track in order:
            if self.bytes <= self.budget:
                break
            if pinned(track):
                freed = track.shed(self.bytes - self.budget)
                self.bytes -= freed
                if self.retention is not None:
                    self.retention.shed(track, freed)
            else:
                self.remove(track, "bytes")

    def sweep(self) -> None:
        """Drop objects older than their track's MAX_CACHE_DURATION, evict the tracks age
        has emptied (unless still fed), then enforce the budget."""
        now = self.clock()
        fed = self.retention.fed if self.retention is not None else _never
        for track in list(self.tracks.values()):
            before = track.count
            freed = track.expire(now)
            if track.count != before:
                self.bytes -= freed
                if self.retention is not None:
                    self.retention.expired(track, before - track.count)
            if not track.count and track.expired_objects and not fed(track):
                self.remove(track, "age")
        self.enforce_budget()

    # ------------------------------------------------------------------ publications

    @property
    def namespaces(self) -> list[TrackNamespace]:
        """The available namespaces, in the order they were first published."""
        return list(self._publications)

    def publish(self, namespace: TrackNamespace, session: S | None = None,
                request_id: int = 0) -> list[NamespaceNotice[S]]:
        """Record a publication of ``namespace`` (by ``session``'s PUBLISH_NAMESPACE
        ``request_id``, or by the application: no session). Returns the NAMESPACE notices
        for the watchers if the namespace was not available before."""
        ns = tuple(namespace)
        pubs = self._publications.get(ns)
        key = (session, request_id)
        if pubs is not None and key in pubs:
            return []
        self._published.setdefault(session, {})[request_id, ns] = None
        if pubs is not None:
            pubs.append(key)
            return []
        self._publications[ns] = [key]
        return self._notices(ns, True)

    def withdraw(self, namespace: TrackNamespace, session: S | None = None,
                 request_id: int = 0) -> list[NamespaceNotice[S]]:
        """End a publication; returns the NAMESPACE_DONE notices if it was the last one
        holding the namespace."""
        ns = tuple(namespace)
        pubs = self._publications.get(ns)
        key = (session, request_id)
        if pubs is None or key not in pubs:
            return []
        pubs.remove(key)
        mine = self._published[session]
        del mine[request_id, ns]
        if not mine:
            del self._published[session]
        if pubs:
            return []
        del self._publications[ns]
        return self._notices(ns, False)

    def withdraw_all(self, session: S | None,
                     request_id: int | None = None) -> list[NamespaceNotice[S]]:
        """End every publication of ``session`` (e.g. it closed), or those of its request
        ``request_id`` (e.g. an upstream SUBSCRIBE_NAMESPACE whose NAMESPACEs they were)."""
        notices: list[NamespaceNotice[S]] = []
        for rid, ns in self.publications(session):
            if request_id is None or rid == request_id:
                notices += self.withdraw(ns, session, rid)
        return notices

    def publications(self, session: S | None) -> list[tuple[int, TrackNamespace]]:
        """(Request ID, namespace) of every publication of ``session``."""
        return list(self._published.get(session, ()))

    def publishers(self, namespace: TrackNamespace) -> list[S | None]:
        """Who publishes exactly ``namespace`` (None: the application), oldest first."""
        return [session for session, _rid in self._publications.get(tuple(namespace), ())]

    def publisher(self, namespace: TrackNamespace,
                  accept: Callable[[S], bool] = lambda _s: True) -> S | None:
        """The session that publishes the longest (field-wise) prefix of ``namespace``
        (the latest of several), among those ``accept`` takes; None if there is none."""
        ns = tuple(namespace)
        for n in range(len(ns), -1, -1):
            for session in reversed(self.publishers(ns[:n])):
                if session is not None and accept(session):
                    return session
        return None

    # ------------------------------------------------------------------ watches

    def watch(self, session: S, request_id: int,
              prefix: TrackNamespace) -> list[NamespaceNotice[S]]:
        """Record a SUBSCRIBE_NAMESPACE of ``session``'s peer; returns a NAMESPACE notice
        for every available namespace under ``prefix``."""
        prefix = tuple(prefix)
        self._watches.setdefault(session, {})[request_id] = prefix
        return [NamespaceNotice(session, request_id, ns, True)
                for ns in self._publications if namespace_has_prefix(ns, prefix)]

    def unwatch(self, session: S, request_id: int) -> TrackNamespace | None:
        """Forget a watch (its request ended: nothing is sent); returns its prefix, or
        None if there was no such watch."""
        mine = self._watches.get(session)
        if mine is None or request_id not in mine:
            return None
        prefix = mine.pop(request_id)
        if not mine:
            del self._watches[session]
        return prefix

    def watches(self, session: S) -> dict[int, TrackNamespace]:
        """The prefixes ``session``'s peer watches, by Request ID (a copy)."""
        return dict(self._watches.get(session, {}))

    def watched_prefixes(self) -> list[TrackNamespace]:
        """Every prefix some watch is on, once each."""
        return list(dict.fromkeys(p for mine in self._watches.values() for p in mine.values()))

    def is_watched(self, prefix: TrackNamespace) -> bool:
        """True if some watch is on exactly ``prefix``."""
        prefix = tuple(prefix)
        return any(p == prefix for mine in self._watches.values() for p in mine.values())

    def _notices(self, ns: TrackNamespace, active: bool) -> list[NamespaceNotice[S]]:
        return [NamespaceNotice(session, rid, ns, active)
                for session, mine in self._watches.items()
                for rid, prefix in mine.items() if namespace_has_prefix(ns, prefix)]


def _never(_track: Track) -> bool:
    return False


__all__ = ["NamespaceNotice", "Origin", "Retention"]
