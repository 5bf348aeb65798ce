"""Tracks as stored by a publisher or cached by a relay (sans-IO).

A :class:`Track` keeps the objects of one Full Track Name by Location with everything a
relay must preserve (subgroup, priority, status, properties, payload bytes as received),
its Track Properties, the Largest Object, and what is known about group and track ends.
It tells listeners (the serving logic of each session) about every new object, so the
same object bytes are forwarded to every subscriber without copying.

Objects are immutable: a second object at a cached Location with different bytes or
header fields raises :class:`ImmutabilityError`.

A cached track (not an origin one) honours MAX_CACHE_DURATION per object: :meth:`Track.expire`
drops every object that arrived longer ago than the duration, whatever newer objects keep
arriving, and remembers where they were (:meth:`Track.gone`), so that a FETCH over them can
say "status unknown" instead of "does not exist".
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from ..errors import KvcsError
from .wire import (
    MAX_VI64,
    Location,
    ObjectRecord,
    ObjectStatus,
    Properties,
    TrackNamespace,
    prop_get,
)
from .wire.properties import DEFAULT_PUBLISHER_PRIORITY, MAX_CACHE_DURATION

FullTrackName = tuple[TrackNamespace, bytes]
_START = Location(0, 0)
_NORMAL, _END_OF_GROUP, _END_OF_TRACK = (
    int(ObjectStatus.NORMAL), int(ObjectStatus.END_OF_GROUP), int(ObjectStatus.END_OF_TRACK))
"""Module constants: an Enum attribute costs a lookup on the per-object path."""


STAGED_RUN_BYTES = 1 << 20
"""A staged run (:meth:`Track.stage`) is told to listeners once it holds this many payload
bytes, so that what a producer stages before its loop turn ends stays bounded for
back-pressure (a drain sees it queued in the sessions)."""


class ImmutabilityError(KvcsError, ValueError):
    """A different object arrived at a Location that already holds one."""


@dataclass(slots=True)
class CachedObject(ObjectRecord):
    """An object a track keeps: an :class:`ObjectRecord` (the header fields a relay must
    keep, in its order) with a resolved priority and when it arrived."""

    publisher_priority: int
    arrived: float = field(default=0.0, kw_only=True)

    def same_as(self, other: CachedObject) -> bool:
        """True if ``other`` carries identical header fields and payload bytes."""
        return (
            self.subgroup_id == other.subgroup_id
            and self.publisher_priority == other.publisher_priority
            and self.status == other.status
            and tuple(self.properties) == tuple(other.properties)
            and bytes(self.payload) == bytes(other.payload)
        )


TrackListener = Callable[["Track", str, Sequence[CachedObject]], None]
"""Called as listener(track, what, objs): what is "object" (objs: the new objects, in the
order stored, one or more), "group_closed", "subgroup_closed" (objs: one object carrying
group/subgroup), "settled", "ended" (End of Track known) or "gone" (track dropped), the last
three with no objects."""


@dataclass(slots=True)
class _Group:
    ids: list[int] = field(default_factory=list)  # sorted object ids present
    objects: dict[int, CachedObject] = field(default_factory=dict)
    end: int | None = None  # no object id >= end exists (from End of Group / track end)
    closed: bool = False  # every object of the group is known (cached or absent)
    gone: list[tuple[int, int]] = field(default_factory=list)
    """Sorted disjoint inclusive ranges of object ids dropped by age (never cached ones)."""


def _add_id(ranges: list[tuple[int, int]], x: int) -> None:
    """Insert ``x`` into sorted disjoint inclusive ranges, merging neighbours (objects
    usually expire in id order, so a group's ranges stay one)."""
    i = bisect.bisect_left(ranges, (x, x))
    if i > 0 and ranges[i - 1][1] >= x - 1:
        lo, hi = ranges[i - 1]
        if hi >= x:
            return
        merge = i < len(ranges) and ranges[i][0] == x + 1  # x joins two ranges
        ranges[i - 1] = (lo, ranges.pop(i)[1] if merge else x)
    elif i < len(ranges) and ranges[i][0] <= x + 1:
        if ranges[i][0] > x:
            ranges[i] = (x, ranges[i][1])
    else:
        ranges.insert(i, (x, x))


def _remove_id(ranges: list[tuple[int, int]], x: int) -> None:
    """Take ``x`` out of sorted disjoint inclusive ranges (splitting the one holding it)."""
    i = bisect.bisect_right(ranges, (x, MAX_VI64)) - 1
    if i < 0 or ranges[i][1] < x:
        return
    lo, hi = ranges[i]
    ranges[i:i + 1] = [r for r in ((lo, x - 1), (x + 1, hi)) if r[0] <= r[1]]


def _last_in(ranges: list[tuple[int, int]], first: int, last: int) -> int | None:
    """The largest id of the ranges within [first, last], or None."""
    i = bisect.bisect_right(ranges, (last, MAX_VI64)) - 1
    if i < 0:
        return None
    top = min(ranges[i][1], last)
    return top if top >= first else None


class Track:
    """Objects of one track by Location, plus Largest Object and end knowledge."""

    def __init__(self, namespace: TrackNamespace, name: bytes,
                 properties: Properties = (), clock: Callable[[], float] = time.monotonic,
                 origin: bool = False):
        self.namespace: TrackNamespace = tuple(namespace)
        self.name = bytes(name)
        self.properties = tuple(properties)  # also sets default_priority
        self._groups: dict[int, _Group] = {}
        self._group_ids: list[int] = []
        self._largest: Location | None = None  # built on demand (largest)
        self._largest_g = -1  # the Largest Object's Location as ints, kept per object
        self._largest_o = -1
        self.end_of_track: Location | None = None  # Location of the End of Track status
        self.complete = False  # every object of the track is known (ended and filled)
        self.settled_until: Location | None = None  # every Location <= this is known
        self.bytes = 0
        self.count = 0
        self.listeners: list[TrackListener] = []
        self.origin = origin
        """An origin track (held by its original publisher): every Location up to the
        Largest Object is known, since objects are added in order by their producer. Its
        objects never expire (MAX_CACHE_DURATION binds caches)."""
        self.expired_objects = 0
        """Objects dropped by :meth:`expire` so far."""
        self._arrivals: deque[CachedObject] = deque()  # cached objects in arrival order
        self._staged: list[CachedObject] = []  # stored, not yet told (stage)
        self._staged_bytes = 0
        self._clock = clock
        self.last_used = clock()
        self.created = self.last_used

    # ---------------------------------------------------------------- properties

    @property
    def largest(self) -> Location | None:
        """The Largest Object's Location (None while nothing is stored)."""
        loc = self._largest
        if loc is None and self._largest_g >= 0:
            loc = self._largest = Location(self._largest_g, self._largest_o)
        return loc

    @largest.setter
    def largest(self, loc: Location | None) -> None:
        self._largest = loc
        self._largest_g, self._largest_o = (-1, -1) if loc is None else loc

    @property
    def full_name(self) -> FullTrackName:
        """(namespace, name)."""
        return (self.namespace, self.name)

    @property
    def properties(self) -> Properties:
        """The track's Track Properties."""
        return self._properties

    @properties.setter
    def properties(self, value: Properties) -> None:
        self._properties = tuple(value)
        v = prop_get(self._properties, DEFAULT_PUBLISHER_PRIORITY, 128)
        # looked up once here, not for every object published (object_record)
        self._default_priority = int(v) if isinstance(v, int) else 128

    @property
    def default_priority(self) -> int:
        """DEFAULT_PUBLISHER_PRIORITY of the track (128 if absent)."""
        return self._default_priority

    @property
    def max_cache_duration_ms(self) -> int | None:
        """MAX_CACHE_DURATION in milliseconds, or None."""
        v = prop_get(self.properties, MAX_CACHE_DURATION, None)
        return int(v) if isinstance(v, int) else None

    # ---------------------------------------------------------------- writing

    def add(self, obj: CachedObject) -> bool:
        """Store an object; returns False for an identical duplicate.

        Raises :class:`ImmutabilityError` for a different object at the same Location.
        Listeners are told about new objects (after any staged ones).
        """
        g = self._store(obj)
        if g is None:
            return False
        self._notify("object", [obj])
        if self._may_end(obj, g):
            self._after_end(obj, g)
        return True

    def extend(self, objs: Iterable[CachedObject]) -> int:
        """Store a run of objects in order, as :meth:`add` does each; returns how many were
        new (identical duplicates are skipped).

        Listeners hear about the new objects in one "object" call per stretch that ends
        where an object closes a group or the track (then the close follows, as with
        :meth:`add`): a layer of a publication costs one call chain, not one per object.
        An :class:`ImmutabilityError` leaves the objects before the bad one stored and
        told.
        """
        if type(objs) is tuple and len(objs) == 1:  # a run of one: what add() does
            return int(self.add(objs[0]))
        run: list[CachedObject] = []
        added = 0
        try:
            for obj in objs:
                g = self._store(obj)
                if g is None:
                    continue
                run.append(obj)
                added += 1
                if self._may_end(obj, g):
                    told, run = run, []
                    self._notify("object", told)
                    self._after_end(obj, g)
        finally:
            if run:
                self._notify("object", run)
        return added

    def stage(self, obj: CachedObject) -> bool:
        """Store an object as :meth:`add` does, but tell listeners about it later, together
        with the objects staged after it, as one run: at :meth:`tell_staged`, before
        anything else listeners hear, or at once when the object may close its group or
        the track or the run reaches :data:`STAGED_RUN_BYTES`.

        A producer that publishes object by object then pays the listeners' forwarding
        chain (a subscription's checks, its stream, the object framing, the joined write)
        once per run instead of once per object (32 KiB objects published one by one to a
        subscribed sans-IO session, framing and joins included: 20.5 -> 12.5 us per
        object, alternating runs on the 2-core VM). Returns True when the object
        started a run that is still held back: the caller arranges for
        :meth:`tell_staged` to run, at the end of its event loop's turn.
        """
        g = self._store(obj)
        if g is None:
            return False
        staged = self._staged
        staged.append(obj)
        self._staged_bytes += len(obj.payload)
        ends = self._may_end(obj, g)
        if ends or self._staged_bytes >= STAGED_RUN_BYTES:
            self.tell_staged()
            if ends:
                self._after_end(obj, g)
            return False
        return len(staged) == 1

    def tell_staged(self) -> None:
        """Tell listeners about the objects :meth:`stage` has held back, as one run."""
        run = self._staged
        if run:
            self._staged = []
            self._staged_bytes = 0
            for listener in list(self.listeners):
                listener(self, "object", run)

    def _notify(self, what: str, objs: Sequence[CachedObject]) -> None:
        """Tell every listener; staged objects first, so that they hear in store order."""
        if self._staged:
            self.tell_staged()
        for listener in list(self.listeners):
            listener(self, what, objs)

    def _store(self, obj: CachedObject) -> _Group | None:
        """Store one object without telling listeners; returns its group, or None for an
        identical duplicate."""
        gid, oid, status = obj.group_id, obj.object_id, obj.status
        g = self._groups.get(gid)
        if g is None:
            g = self._groups[gid] = _Group()
            bisect.insort(self._group_ids, gid)
        old = g.objects.get(oid)
        if old is not None:
            if old.same_as(obj):
                return None
            raise ImmutabilityError(
                f"different object at {gid}/{oid} of {self.name!r}")
        end = self.end_of_track
        if status == _NORMAL:
            if g.end is not None and oid >= g.end:
                raise ImmutabilityError(f"object {gid}/{oid} after End of Group")
            if end is not None and (gid, oid) > end:
                raise ImmutabilityError(f"object {gid}/{oid} after End of Track")
        if not self.origin:  # only a cache's objects age (an origin's never expire)
            if not obj.arrived:
                obj.arrived = self._clock()
            self._arrivals.append(obj)
        if g.gone:
            _remove_id(g.gone, oid)  # aged out, and now received again
        g.objects[oid] = obj
        ids = g.ids
        if not ids or oid > ids[-1]:
            ids.append(oid)
        else:
            bisect.insort(ids, oid)
        self.bytes += len(obj.payload)
        self.count += 1
        if status != _NORMAL:
            if status in (_END_OF_GROUP, _END_OF_TRACK):
                # End of Group then End of Track (the next Object ID) is how KVCS ends a
                # track: the first marker bounds the group, whichever arrives first
                g.end = oid if g.end is None else min(g.end, oid)
            if status == _END_OF_TRACK:
                self.end_of_track = Location(gid, oid)
        lg = self._largest_g
        if gid > lg or (gid == lg and oid > self._largest_o):
            # kept as ints: a Location costs ~0.7 us to build, once per object published
            self._largest_g, self._largest_o, self._largest = gid, oid, None
        return g

    @staticmethod
    def _may_end(obj: CachedObject, g: _Group) -> bool:
        """True if the stored object may close its group or the track (:meth:`_after_end`)."""
        return obj.status != _NORMAL or (g.end is not None and not g.closed)

    def _after_end(self, obj: CachedObject, g: _Group) -> None:
        """Close the object's group and mark the track ended where the object completes
        them (after listeners heard about it)."""
        ends = obj.status in (ObjectStatus.END_OF_GROUP, ObjectStatus.END_OF_TRACK)
        if (ends and self.origin) or (g.end is not None and not g.closed
                                      and self._contiguous(g)):
            # an origin track is written in order: its end markers close the group. A
            # cached copy may learn the end before objects still in flight on other
            # streams (a fill): its group closes when the last missing one arrives
            self.close_group(obj.group_id)
        if obj.status == ObjectStatus.END_OF_TRACK:
            self._mark_ended()

    def append(self, group_id: int, object_id: int, payload: bytes | memoryview, *,
               status: int = ObjectStatus.NORMAL, priority: int | None = None,
               subgroup_id: int = 0, properties: Properties = ()) -> bool:
        """Add an object produced locally (priority defaults to the track's); see add()."""
        prio = self.default_priority if priority is None else priority
        return self.add(CachedObject(group_id, object_id, subgroup_id, prio, status,
                                     tuple(properties), payload))

    @staticmethod
    def _contiguous(g: _Group) -> bool:
        """Every Object ID from 0 to the group's last one is here (or aged out), and an
        end marker is among them."""
        last = max(g.ids[-1] if g.ids else -1, g.gone[-1][1] if g.gone else -1)
        if g.end is None or last < g.end:
            return False
        return len(g.ids) + sum(hi - lo + 1 for lo, hi in g.gone) == last + 1

    def close_group(self, group_id: int) -> None:
        """Record that every object of ``group_id`` is known (present or absent)."""
        g = self._groups.get(group_id)
        if g is None:
            g = self._groups[group_id] = _Group()
            bisect.insort(self._group_ids, group_id)
        if g.closed:
            return
        g.closed = True
        self._notify("group_closed", (CachedObject(group_id, 0, 0, 0, 0, (), b""),))

    def close_subgroup(self, group_id: int, subgroup_id: int) -> None:
        """Tell listeners that a subgroup ended (its stream finished cleanly)."""
        self._notify("subgroup_closed", (CachedObject(group_id, 0, subgroup_id, 0, 0, (), b""),))

    def settle(self, until: Location) -> None:
        """Record that every Location <= ``until`` is known (e.g. a fill finished)."""
        if self.settled_until is None or until > self.settled_until:
            self.settled_until = until
            for gid in self._group_ids:
                if gid < until.group:
                    self.close_group(gid)
            self._notify("settled", ())

    def _mark_ended(self) -> None:
        self._notify("ended", ())

    def finish(self, end: Location | None = None) -> None:
        """Mark the track complete (all objects known), e.g. after End of Track + fill."""
        self.complete = True
        if self.largest is not None:
            self.settle(self.largest)
        for gid in list(self._group_ids):
            self.close_group(gid)
        if self.end_of_track is None and end is not None:
            self.end_of_track = end
        self._mark_ended()

    def drop(self) -> None:
        """Forget all objects (staged ones too) and tell listeners the track is gone."""
        self._staged = []
        self._staged_bytes = 0
        self._notify("gone", ())
        self._groups.clear()
        self._group_ids.clear()
        self._arrivals.clear()
        self.bytes = 0
        self.count = 0

    def expiry_cutoff(self, now: float | None = None) -> float | None:
        """Objects that arrived before this clock time are older than MAX_CACHE_DURATION;
        None if nothing expires here (no duration, or an origin track)."""
        dur = self.max_cache_duration_ms
        if dur is None or self.origin:
            return None
        return (self._clock() if now is None else now) - dur / 1000.0

    def expire(self, now: float | None = None) -> int:
        """Drop every object older than MAX_CACHE_DURATION; returns the payload bytes freed.

        The track's knowledge stays (End of Group/Track, what is settled): a dropped object
        is remembered as :meth:`gone`. Whoever accounts the track's bytes (a cache) calls
        this, since it changes :attr:`bytes`.
        """
        cutoff = self.expiry_cutoff(now)
        q = self._arrivals
        if cutoff is None or not q or q[0].arrived >= cutoff:
            return 0
        return self._drop_oldest(lambda obj, _freed: obj.arrived < cutoff)

    def shed(self, nbytes: int) -> int:
        """Drop the oldest objects until at least ``nbytes`` of payload are freed (or none
        is left), remembered as :meth:`gone` like expired ones; returns the bytes freed. A
        cache over its budget sheds a live track it serves instead of evicting it whole."""
        return self._drop_oldest(lambda _obj, freed: freed < nbytes)

    def _drop_oldest(self, more: Callable[[CachedObject, int], bool]) -> int:
        q = self._arrivals
        freed = 0
        while q and more(q[0], freed):
            obj = q.popleft()
            g = self._groups.get(obj.group_id)
            if g is None or g.objects.get(obj.object_id) is not obj:
                continue
            del g.objects[obj.object_id]
            del g.ids[bisect.bisect_left(g.ids, obj.object_id)]
            freed += len(obj.payload)
            self.count -= 1
            self.expired_objects += 1
            if obj.status == ObjectStatus.NORMAL:
                # status objects leave their knowledge behind (group end, End of Track)
                _add_id(g.gone, obj.object_id)
        self.bytes -= freed
        return freed

    def gone(self, loc: Location) -> bool:
        """True if the object at ``loc`` existed here and was dropped by age."""
        g = self._groups.get(loc.group)
        return g is not None and _last_in(g.gone, loc.object, loc.object) is not None

    def last_gone(self, group_id: int, first: int, last: int) -> int | None:
        """The largest Object ID in [first, last] of ``group_id`` dropped by age, or None."""
        g = self._groups.get(group_id)
        return None if g is None or not g.gone else _last_in(g.gone, first, last)

    # ---------------------------------------------------------------- reading

    def get(self, loc: Location) -> CachedObject | None:
        """The object at ``loc`` or None."""
        g = self._groups.get(loc.group)
        return None if g is None else g.objects.get(loc.object)

    def group_ids(self) -> list[int]:
        """Group IDs present (sorted)."""
        return list(self._group_ids)

    def group_end(self, group_id: int) -> int | None:
        """Object ID of the group's end marker, if known."""
        g = self._groups.get(group_id)
        return None if g is None else g.end

    def group_closed(self, group_id: int) -> bool:
        """True if every object of the group is known."""
        g = self._groups.get(group_id)
        if g is not None and g.closed:
            return True
        if self.complete:
            return True
        if self.origin and self.largest is not None and group_id < self.largest.group:
            return True
        s = self.settled_until
        return s is not None and group_id < s.group

    def is_settled(self, loc: Location) -> bool:
        """True if the presence or absence of the object at ``loc`` is known."""
        if self.complete or (self.settled_until is not None and loc <= self.settled_until):
            return True
        if self.origin and self.largest is not None and loc <= self.largest:
            return True
        g = self._groups.get(loc.group)
        if g is None:
            return False
        if loc.object in g.objects or g.closed:
            return True
        if g.gone and _last_in(g.gone, loc.object, loc.object) is not None:
            return True  # it was here, and aged out
        return g.end is not None and loc.object >= g.end

    def known_until_end(self, start: Location = _START) -> bool:
        """True when End of Track is known and so is every Location from ``start`` to it.

        Origin tracks are written in order; a cached (relay) track may learn End of Track
        while earlier objects are still in flight on other streams.
        """
        eot = self.end_of_track
        if eot is None:
            return False
        if self.complete or self.origin:
            return True
        if self.settled_until is not None and self.settled_until >= eot:
            return True
        for g in range(start.group, eot.group + 1):
            lo = start.object if g == start.group else 0
            if g == eot.group:
                hi = eot.object
            elif self.group_closed(g) and lo == 0:
                continue
            else:
                end = self.group_end(g)
                if end is None:
                    return False
                hi = end
            if not all(self.is_settled(Location(g, o)) for o in range(lo, hi)):
                return False
        return True

    def objects(self, start: Location, end: Location | None = None,
                descending: bool = False) -> Iterator[CachedObject]:
        """Cached objects in [start, end] (inclusive), groups in the given order."""
        hi = end if end is not None else Location(MAX_VI64, MAX_VI64)
        gids = [g for g in self._group_ids if start.group <= g <= hi.group]
        if descending:
            gids.reverse()
        for gid in gids:
            g = self._groups[gid]
            lo_o = start.object if gid == start.group else 0
            hi_o = hi.object if gid == hi.group else MAX_VI64
            ids = g.ids
            i = bisect.bisect_left(ids, lo_o)
            while i < len(ids) and ids[i] <= hi_o:
                yield g.objects[ids[i]]
                i += 1

    def touch(self) -> None:
        """Mark the track as used now (LRU eviction)."""
        self.last_used = self._clock()

