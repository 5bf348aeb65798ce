"""Serving tracks to one session: SUBSCRIBE (live + fill), FETCH and TRACK_STATUS (sans-IO).

A :class:`TrackServer` is bound to one :class:`~kvcs.moqt.session.Session`. The
application (a publisher endpoint or the relay) decides *which* :class:`Track` answers a
request and calls :meth:`TrackServer.serve_subscribe`, :meth:`serve_fetch` or
:meth:`serve_track_status`; from then on the server

* answers with SUBSCRIBE_OK / FETCH_OK / REQUEST_OK (LARGEST_OBJECT, Track Properties),
* evaluates LOCATION_FILTER and Range Filters (OBJECTID, SUBGROUP, PRIORITY,
  OBJECT_PROPERTY) with the draft-22 rules, honours FORWARD and priorities,
* forwards every new object of the track to each live subscription on a subgroup stream
  per (group, subgroup), in object order, finishing streams at End of Group / End of Track,
* delivers fills (FILL_PARAMETERS, in SUBSCRIBE or REQUEST_UPDATE) and fetches from the
  track through a cursor that pauses at objects whose status is not yet known (a relay
  still filling from upstream) and resumes as they arrive,
* ends subscriptions with PUBLISH_DONE (correct stream count) when the track ends.

Payload bytes are written as the views stored in the track: no copies per subscriber.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import events as ev
from .errors import PublishDoneCode, RequestErrorCode, StreamResetCode
from .filters import FilterError, check_range_filters, passes_range_filters
from .session import Session
from .track import CachedObject, Track
from .wire import (
    END_OF_UNKNOWN_RANGE,
    MAX_VI64,
    Fetch,
    GroupOrder,
    Location,
    LocationFilter,
    ObjectStatus,
    Parameters,
    RangeFilter,
    Subscribe,
    TrackStatus,
)
from .wire.params import LF_ABSOLUTE_RANGE, LF_NEXT_OBJECT

_NORMAL, _END_OF_TRACK = int(ObjectStatus.NORMAL), int(ObjectStatus.END_OF_TRACK)
"""Module constants: an Enum attribute costs a lookup on the per-object path."""

__all__ = ["CURSOR_COST", "FilterError", "TrackServer", "check_range_filters",
           "passes_range_filters"]

log = logging.getLogger(__name__)

_END = Location(MAX_VI64, MAX_VI64)
_RESET_FOR_DONE: dict[int, int] = {
    PublishDoneCode.GOING_AWAY: StreamResetCode.GOING_AWAY,
    PublishDoneCode.TOO_FAR_BEHIND: StreamResetCode.TOO_FAR_BEHIND,
    PublishDoneCode.EXCESSIVE_LOAD: StreamResetCode.EXCESSIVE_LOAD,
    PublishDoneCode.MALFORMED_TRACK: StreamResetCode.MALFORMED_TRACK,
}
"""The code of the RESET_STREAMs that cut a subscription's data streams short, by the
PUBLISH_DONE status that ends it (INTERNAL_ERROR for the others)."""


CURSOR_COST = 512
"""Bytes of Python objects one fetch or fill cursor keeps (a slotted _Cursor, its list and
queue entries), for the relay's per-session accounting; what it wrote is queued in the
transport and counted there."""


@dataclass(slots=True)
class _Cursor:
    """Delivery of a Location range from a track on one fetch or fill stream."""

    request_id: int
    stream_id: int
    track: Track
    start: Location
    end: Location
    descending: bool
    filters: tuple[RangeFilter, ...]
    fill_id: int | None
    group: int
    obj: int
    done: bool = False
    groups: list[int] | None = None  # descending: remaining groups
    blocked: bool = False  # waiting for the stream to drain (write window)
    prio_group: int = -1  # group whose priority the stream currently carries
    unknown: Location | None = None  # aged-out objects passed over up to here: to report


@dataclass(slots=True)
class _Subscription:
    request_id: int
    track: Track
    alias: int
    start: Location
    end: Location | None
    forward: bool
    filters: tuple[RangeFilter, ...]
    streams: dict[tuple[int, int], int] = field(default_factory=dict)
    last_ids: dict[tuple[int, int], int] = field(default_factory=dict)
    """The last Object ID written on each open subgroup stream."""
    cursors: list[_Cursor] = field(default_factory=list)
    ended: bool = False  # track ended: PUBLISH_DONE once fills are done
    done: bool = False


class TrackServer:
    """Serves tracks on one session; see the module docstring."""

    def __init__(self, session: Session, max_filter_ranges: int | None = None, *,
                 on_request_ended: Callable[[int], None] | None = None,
                 can_fill: Callable[[int, int, Location, Location], bool] | None = None,
                 backlog: Callable[[], int] | None = None, max_backlog: int = 0,
                 wake: Callable[[], None] | None = None, max_cursors: int = 0) -> None:
        self.session = session
        self.wake = wake
        """Called when a track this server serves changed and serving it wrote something
        to the session (objects, stream ends, PUBLISH_DONE): the binding flushes that
        session (``MoqtConnection.flush_soon``). Whoever changes a track (a producer, a
        relay's upstream link, a session of a shared origin) then need not know which
        sessions it reached: exactly those whose serving wrote are woken."""
        self.max_filter_ranges = (session.config.max_filter_ranges
                                  if max_filter_ranges is None else max_filter_ranges)
        self._subs: dict[int, _Subscription] = {}
        self._fetches: dict[int, _Cursor] = {}
        self._watched: dict[int, Track] = {}  # id(track) -> track with our listener
        self._blocked: dict[int, _Cursor] = {}  # stream id -> cursor waiting to write
        self.objects_sent = 0
        self.bytes_sent = 0
        self._can_fill = can_fill
        """Optional check called as (subscription request id, fill id, start, end) before a
        fill starts; returning False means the fill cannot be served: the fill stream is
        opened and reset right after its FETCH_HEADER (digest 6.2, a MUST in d22)."""
        self._on_request_ended = on_request_ended
        """Called with the Request ID of a served subscription or fetch once it has ended
        for any reason (done, cancelled, failed): the owner's bookkeeping (the relay's)."""
        self._backlog = backlog
        self.max_backlog = max_backlog
        """With ``backlog`` (the bytes written to the session that the transport has not
        taken yet): past this many, a live object is not queued for a subscriber that
        does not read; its subscription ends with PUBLISH_DONE TOO_FAR_BEHIND (digest
        9.3) and its streams are reset, which frees what they held. Fetches and fills
        need no such bound: their cursors wait for the stream to drain (``write_window``)."""
        self.too_far_behind = 0
        """Subscriptions ended with TOO_FAR_BEHIND so far."""
        self.max_cursors = max_cursors
        """Fetch and fill streams written at once (0: no limit); more wait their turn, in
        order. Each may have a write window in flight, so this bounds what a session's
        fetches and fills hold: 100 concurrent whole-track fills held ~2.6 MiB each."""
        self._running: list[_Cursor] = []
        self._waiting: deque[_Cursor] = deque()
        self._admitting = False

    # ------------------------------------------------------------- requests

    def serve(self, request_id: int, msg: Subscribe | Fetch | TrackStatus, track: Track) -> bool:
        """Answer a SUBSCRIBE, FETCH or TRACK_STATUS from ``track``; False if rejected."""
        if isinstance(msg, Subscribe):
            return self.serve_subscribe(request_id, msg, track)
        if isinstance(msg, Fetch):
            return self.serve_fetch(request_id, msg, track)
        self.serve_track_status(request_id, msg, track)
        return True

    def serve_subscribe(self, request_id: int, msg: Subscribe, track: Track) -> bool:
        """Answer a SUBSCRIBE from ``track``; returns False if it was rejected."""
        p = msg.params
        try:
            check_range_filters(p.range_filters, self.max_filter_ranges)
            if p.fill is not None:
                check_range_filters(p.fill.range_filters, self.max_filter_ranges)
        except FilterError as exc:
            self.session.request_error(request_id, exc.code, str(exc))
            return False
        lf = p.location_filter or LocationFilter.none()
        if lf.type == LF_ABSOLUTE_RANGE and lf.end_group_delta == 0 \
                and lf.end_object < lf.start_object:
            self.session.request_error(request_id, RequestErrorCode.INVALID_RANGE,
                                       "end before start")
            return False
        # objects published before this request go to the subscriptions that were there
        # (its range is set against the Largest Object, which counts them)
        track.tell_staged()
        start, end = lf.bounds(track.largest)
        if end is not None and end < start:
            self.session.request_error(request_id, RequestErrorCode.INVALID_RANGE,
                                       "empty subscription range")
            return False
        forward = p.forward != 0
        ok_params = Parameters(largest_object=track.largest)
        include = p.include_properties != 0
        alias = self.session.subscribe_ok(request_id, ok_params,
                                          track.properties if include else ())
        sub = _Subscription(request_id, track, alias, start, end, forward, p.range_filters)
        self._subs[request_id] = sub
        self._watch(track)
        if p.fill is not None and forward:
            self._start_fill(sub, p.fill, lf, request_id)
        if track.complete or (track.end_of_track is not None and (
                track.largest is not None and track.largest >= track.end_of_track)):
            self._track_ended(sub)
        return True

    def serve_fetch(self, request_id: int, msg: Fetch, track: Track) -> bool:
        """Answer a FETCH from ``track``; returns False if it was rejected."""
        p = msg.params
        try:
            check_range_filters(p.range_filters, self.max_filter_ranges)
        except FilterError as exc:
            self.session.request_error(request_id, exc.code, str(exc))
            return False
        lf = p.location_filter
        if lf is not None and lf.type == LF_NEXT_OBJECT:
            self.session.request_error(request_id, RequestErrorCode.INVALID_RANGE,
                                       "Next Object filter in FETCH")
            return False
        if lf is not None and lf.type == LF_ABSOLUTE_RANGE and lf.end_group_delta == 0 \
                and lf.end_object < lf.start_object:
            self.session.request_error(request_id, RequestErrorCode.INVALID_RANGE,
                                       "end before start")
            return False
        rng = self._fetch_range(lf, track)
        if rng is None:
            self.session.request_error(request_id, RequestErrorCode.INVALID_RANGE,
                                       "range starts after the Largest Object")
            return False
        start, end = rng
        # a relay that pulled a finished track learns its end from PUBLISH_DONE only (fetch
        # streams carry no End of Track): complete, its Largest Object is the final one
        end_of_track = (track.end_of_track is not None and end >= track.end_of_track) or (
            track.complete and track.largest is not None and end >= track.largest)
        report_end = self._report_end(track, end)
        self.session.fetch_ok(request_id, report_end, end_of_track,
                              track.properties if p.include_properties != 0 else ())
        descending = p.group_order == GroupOrder.DESCENDING
        sid = self.session.open_fetch_stream(request_id, None,
                                             track.default_priority, start.group)
        cur = self._cursor(request_id, sid, track, start, end, descending, p.range_filters,
                           None)
        self._fetches[request_id] = cur
        self._watch(track)
        self._begin(cur)
        return True

    def serve_track_status(self, request_id: int, msg: TrackStatus, track: Track) -> None:
        """Answer TRACK_STATUS with LARGEST_OBJECT and the Track Properties."""
        include = msg.params.include_properties != 0
        self.session.request_ok(request_id, Parameters(largest_object=track.largest),
                                track.properties if include else ())

    def handle(self, event: ev.Event) -> bool:
        """Handle session events about requests this server serves; True if consumed."""
        if isinstance(event, ev.DataStreamWritable):
            cur = self._blocked.pop(event.stream_id, None)
            if cur is None:
                return False
            cur.blocked = False
            self._pump(cur)
            return True
        if isinstance(event, ev.UpdateReceived):
            sub = self._subs.get(event.request_id)
            if sub is not None:
                self._update(sub, event)
                return True
            if event.request_id in self._fetches:
                self.session.request_ok(event.request_id, update_id=event.update_id)
                return True
            return False
        if isinstance(event, ev.RequestCancelled):
            sub = self._subs.pop(event.request_id, None)
            if sub is not None:
                sub.done = True
                for cur in sub.cursors:
                    cur.done = True
                self._unwatch_if_idle(sub.track)
                self._notify_done(event.request_id)
                self._admit()
                return True
            cur = self._fetches.pop(event.request_id, None)
            if cur is not None:
                cur.done = True
                self.session.reset_data_stream(cur.stream_id, StreamResetCode.CANCELLED)
                self._unwatch_if_idle(cur.track)
                self._notify_done(event.request_id)
                self._admit()
                return True
        return False

    def end_subscription(self, request_id: int, status: int, reason: str = "") -> None:
        """End a served subscription now, e.g. upstream went away: its open data streams
        (live subgroups, fills) are reset with the code matching ``status``, then
        PUBLISH_DONE ``status`` (digest 4.11: after every stream is closed or reset)."""
        sub = self._subs.pop(request_id, None)
        if sub is None:
            return
        sub.done = True
        code = _RESET_FOR_DONE.get(status, StreamResetCode.INTERNAL_ERROR)
        for cur in sub.cursors:
            if not cur.done:
                cur.done = True
                self._blocked.pop(cur.stream_id, None)
                self.session.reset_data_stream(cur.stream_id, code)
        for sid in sub.streams.values():
            if self.session.data_stream_open(sid):
                self.session.reset_data_stream(sid, code)
        sub.streams.clear()
        self.session.publish_done(request_id, status, reason)
        self._unwatch_if_idle(sub.track)
        self._notify_done(request_id)
        self._admit()

    def fail_fetch(self, request_id: int, code: int = StreamResetCode.INTERNAL_ERROR) -> None:
        """Abort a fetch in progress (reset its data stream)."""
        cur = self._fetches.pop(request_id, None)
        if cur is not None and not cur.done:
            cur.done = True
            self.session.reset_data_stream(cur.stream_id, code)
            self._unwatch_if_idle(cur.track)
            self._notify_done(request_id)
            self._admit()

    def fail_fill(self, request_id: int, fill_id: int | None = None,
                  code: int = StreamResetCode.INTERNAL_ERROR) -> None:
        """Abort the open fill streams of subscription ``request_id`` (only the one of
        ``fill_id`` if given) by resetting them; live delivery continues."""
        sub = self._subs.get(request_id)
        if sub is None:
            return
        for cur in sub.cursors:
            if not cur.done and (fill_id is None or cur.fill_id == fill_id):
                cur.done = True
                self.session.reset_data_stream(cur.stream_id, code)
        self._maybe_done(sub)
        self._admit()

    def _notify_done(self, request_id: int) -> None:
        if self._on_request_ended is not None:
            self._on_request_ended(request_id)

    def serving(self, request_id: int) -> bool:
        """True while the subscription or fetch ``request_id`` is being served."""
        return request_id in self._subs or request_id in self._fetches

    def close(self) -> None:
        """Forget everything (the session is gone)."""
        for track in list(self._watched.values()):
            if self._on_track in track.listeners:
                track.listeners.remove(self._on_track)
        self._watched.clear()
        self._subs.clear()
        self._fetches.clear()
        self._blocked.clear()
        self._running.clear()
        self._waiting.clear()

    @property
    def active(self) -> int:
        """Number of live subscriptions and fetches being served."""
        return len(self._subs) + len(self._fetches)

    @property
    def fetching(self) -> int:
        """Number of fetches being served."""
        return len(self._fetches)

    # ------------------------------------------------------------- ranges

    @staticmethod
    def _fetch_range(lf: LocationFilter | None, track: Track) -> tuple[Location, Location] | None:
        largest = track.largest
        if largest is None:
            return None
        start, end = (lf or LocationFilter.none()).bounds(largest)
        if end is None or end > largest:
            end = largest
        if start > largest or end < start:
            return None
        return start, end

    @staticmethod
    def _report_end(track: Track, end: Location) -> Location:
        if end.object == MAX_VI64:
            # through the end of a group: report the last object known in it
            last = None
            for obj in track.objects(Location(end.group, 0), end):
                last = obj
            if last is not None:
                return last.location
            return Location(end.group, 0)
        return end

    def _cursor(self, rid: int, sid: int, track: Track, start: Location, end: Location,
                descending: bool, filters: tuple[RangeFilter, ...],
                fill_id: int | None) -> _Cursor:
        cur = _Cursor(rid, sid, track, start, end, descending, filters, fill_id,
                      start.group, start.object)
        if descending:
            cur.groups = [g for g in track.group_ids() if start.group <= g <= end.group]
            cur.groups.reverse()
            if cur.groups:
                cur.group = cur.groups.pop(0)
                cur.obj = start.object if cur.group == start.group else 0
        return cur

    def _start_fill(self, sub: _Subscription, fill: Parameters, sub_filter: LocationFilter,
                    fill_id: int) -> None:
        track = sub.track
        lf = fill.location_filter if fill.location_filter is not None else sub_filter
        rng = self._fetch_range(lf, track)
        if rng is None:
            return  # empty fill: no stream
        start, end = rng
        descending = fill.group_order == GroupOrder.DESCENDING
        filters = fill.range_filters or sub.filters
        sid = self.session.open_fetch_stream(sub.request_id, fill_id, track.default_priority,
                                             start.group)
        if self._can_fill is not None and not self._can_fill(sub.request_id, fill_id,
                                                             start, end):
            self.session.reset_data_stream(sid, StreamResetCode.INTERNAL_ERROR)
            return
        cur = self._cursor(sub.request_id, sid, track, start, end, descending, filters,
                           fill_id)
        sub.cursors.append(cur)
        self._begin(cur)

    # ------------------------------------------------------------- updates

    def _update(self, sub: _Subscription, event: ev.UpdateReceived) -> None:
        p = event.params
        try:
            if p.range_filters:
                check_range_filters(p.range_filters, self.max_filter_ranges)
            if p.fill is not None:
                check_range_filters(p.fill.range_filters, self.max_filter_ranges)
        except FilterError as exc:
            self.session.request_error(sub.request_id, exc.code, str(exc),
                                       update_id=event.update_id)
            self.end_subscription(sub.request_id, PublishDoneCode.UPDATE_FAILED, str(exc))
            return
        sub.track.tell_staged()  # what was published before the update, under the old terms
        if p.forward is not None:
            sub.forward = p.forward == 1
        if p.location_filter is not None:
            sub.start, sub.end = p.location_filter.bounds(sub.track.largest)
        if p.range_filters:
            sub.filters = tuple(f for f in p.range_filters if not f.remove)
        self.session.request_ok(sub.request_id, Parameters(largest_object=sub.track.largest),
                                update_id=event.update_id)
        if p.fill is not None and sub.forward:
            lf = p.location_filter or LocationFilter.none()
            self._start_fill(sub, p.fill, lf, event.update_id)

    # ------------------------------------------------------------- track events

    def _watch(self, track: Track) -> None:
        if id(track) not in self._watched:
            self._watched[id(track)] = track
            track.listeners.append(self._on_track)
        track.touch()

    def _unwatch_if_idle(self, track: Track) -> None:
        if any(s.track is track for s in self._subs.values()) or any(
            c.track is track for c in self._fetches.values()
        ):
            return
        self._watched.pop(id(track), None)
        if self._on_track in track.listeners:
            track.listeners.remove(self._on_track)

    def _on_track(self, track: Track, what: str, objs: Sequence[CachedObject]) -> None:
        if self.session.is_closed:
            return
        try:
            self._track_changed(track, what, objs)
        finally:
            if self.wake is not None and self.session.has_output:
                self.wake()

    def _track_changed(self, track: Track, what: str, objs: Sequence[CachedObject]) -> None:
        subs = [s for s in self._subs.values() if s.track is track]
        if what == "object":
            # one call per run of new objects (a published layer, what a relay received
            # in one read): the checks below run once per run, not once per object
            for sub in subs:
                self._forward(sub, objs)
        elif what == "subgroup_closed":
            obj = objs[0]
            for sub in subs:
                sid = sub.streams.pop((obj.group_id, obj.subgroup_id), None)
                sub.last_ids.pop((obj.group_id, obj.subgroup_id), None)
                if sid is not None:
                    self.session.end_data_stream(sid)
        elif what == "group_closed":
            obj = objs[0]
            for sub in subs:
                for key in [k for k in sub.streams if k[0] == obj.group_id]:
                    self.session.end_data_stream(sub.streams.pop(key))
                    sub.last_ids.pop(key, None)
        elif what == "ended":
            for sub in subs:
                self._track_ended(sub)
        elif what == "gone":
            for sub in subs:
                self.end_subscription(sub.request_id, PublishDoneCode.EXPIRED, "track evicted")
            for rid, cur in list(self._fetches.items()):
                if cur.track is track:
                    self.fail_fetch(rid)
            return
        # any change can unblock cursors (and complete a cached track's live range)
        ended = track.end_of_track is not None
        for sub in subs:
            if not sub.ended and ended:
                self._track_ended(sub)
            for cur in sub.cursors:
                if not cur.done:
                    self._pump(cur)
            if sub.ended and not sub.done:
                self._maybe_done(sub)
        if self._fetches:
            for cur in list(self._fetches.values()):
                if cur.track is track and not cur.done:
                    self._pump(cur)

    def _forward(self, sub: _Subscription, objs: Sequence[CachedObject]) -> None:
        """Write a run of new objects to a live subscription: each stretch of consecutive
        objects of one subgroup in one write."""
        if sub.done or not sub.forward:
            return
        # once per run: what the transport holds does not change while the run is written
        if self._backlog is not None and self._backlog() > self.max_backlog:
            # the peer does not read (QUIC flow control holds the rest back): queueing
            # more would grow without bound, and pin objects the cache has let go
            log.info("subscription %d: subscriber too far behind (%d bytes queued)",
                     sub.request_id, self._backlog())
            self.too_far_behind += 1
            self.end_subscription(sub.request_id, PublishDoneCode.TOO_FAR_BEHIND,
                                  "subscriber too far behind")
            return
        # the Locations compared as ints: obj.location builds a tuple (~0.3 us) per object
        start_g, start_o = sub.start
        end_g, end_o = sub.end if sub.end is not None else (-1, -1)
        filters = sub.filters
        stretch: list[CachedObject] = []
        key = (-1, -1)
        for obj in objs:
            g = obj.group_id
            if g <= start_g and (g < start_g or obj.object_id < start_o):
                continue
            if end_g >= 0 and g >= end_g and (g > end_g or obj.object_id > end_o):
                continue
            normal = obj.status == _NORMAL
            if normal and filters and not passes_range_filters(obj, filters):
                continue
            k = (obj.group_id, obj.subgroup_id)
            if k != key or obj.object_id <= stretch[-1].object_id:
                if stretch:
                    self._write_stretch(sub, key, stretch)
                    if sub.done:
                        return
                stretch = []
                key = k
            stretch.append(obj)
            if not normal:  # it ends its stream: the stretch ends with it
                self._write_stretch(sub, key, stretch)
                if sub.done:
                    return
                stretch = []
                key = (-1, -1)
        if stretch:
            self._write_stretch(sub, key, stretch)

    def _write_stretch(self, sub: _Subscription, key: tuple[int, int],
                       objs: list[CachedObject]) -> None:
        """Write objects of subgroup ``key`` (increasing Object IDs, only the last one may
        be a status object) on its stream, opening the stream first if needed."""
        s = self.session
        first, last = objs[0], objs[-1]
        sid = sub.streams.get(key)
        if sid is not None and not s.data_stream_open(sid):
            sid = None
        if sid is not None and first.object_id <= sub.last_ids.get(key, -1):
            # behind what this stream carried already (a relay whose upstream sent the
            # subgroup on two streams that raced): a subgroup stream only goes forward, so
            # it ends here, with everything written to it delivered, and the subgroup
            # goes on in a new stream (draft-22 section 11.3.2)
            s.end_data_stream(sid)
            sid = None
        if sid is None:
            default = sub.track.default_priority
            prio = None if first.publisher_priority == default else first.publisher_priority
            sid = s.open_subgroup(sub.request_id, first.group_id, first.subgroup_id, prio,
                                  default_priority=default, has_properties=True)
            sub.streams[key] = sid
        status = last.status
        end = status != _NORMAL
        s.write_objects(sid, objs, end=end)
        self.objects_sent += len(objs)
        self.bytes_sent += len(first.payload) if len(objs) == 1 else sum(
            [len(o.payload) for o in objs])
        if end:
            sub.streams.pop(key, None)
            sub.last_ids.pop(key, None)
            if status == _END_OF_TRACK:
                self._track_ended(sub)
        else:
            sub.last_ids[key] = last.object_id

    @staticmethod
    def _live_complete(sub: _Subscription) -> bool:
        """True when every Location from the subscription start to End of Track is known."""
        t = sub.track
        return t.origin or t.complete or t.known_until_end(sub.start)

    def _track_ended(self, sub: _Subscription) -> None:
        if not self._live_complete(sub):
            return  # re-checked as the track learns more
        sub.ended = True
        self._maybe_done(sub)

    def _maybe_done(self, sub: _Subscription) -> None:
        if sub.done or not sub.ended:
            return
        if any(not c.done for c in sub.cursors):
            return
        sub.done = True
        self._subs.pop(sub.request_id, None)
        self.session.publish_done(sub.request_id, PublishDoneCode.TRACK_ENDED, "")
        self._unwatch_if_idle(sub.track)
        self._notify_done(sub.request_id)

    # ------------------------------------------------------------- cursors

    def _pump(self, cur: _Cursor) -> None:
        """Send what the track can give in order; stop where status is unknown.

        Objects that aged out (MAX_CACHE_DURATION) existed but cannot be served: they are
        reported with End of Unknown Range, never as a gap (a gap says "does not exist").
        """
        if cur.done or cur.blocked:
            return
        s = self.session
        track = cur.track
        end = cur.end
        window = s.config.write_window
        cutoff = track.expiry_cutoff()
        written = 0
        while True:
            g = cur.group
            if (not cur.descending and g > end.group) or (cur.descending and g < cur.start.group):
                break
            hi = Location(g, end.object if g == end.group else MAX_VI64)
            lo = Location(g, cur.obj)
            for obj in track.objects(lo, hi):
                if obj.object_id != cur.obj:
                    if not self._gap_known(track, g, cur.obj):
                        return  # wait for the missing object
                    self._note_gone(cur, g, obj.object_id - 1)
                cur.obj = obj.object_id + 1
                if obj.status != ObjectStatus.NORMAL:
                    continue  # fetch streams carry no status objects
                if cutoff is not None and obj.arrived < cutoff:
                    cur.unknown = obj.location  # aged out, not dropped yet
                    continue
                if not passes_range_filters(obj, cur.filters):
                    continue
                if window and written >= window:
                    # the window is full: wait for the stream to drain (DataStreamWritable)
                    # before this object, not after the last one written. A range that
                    # ends there (only status objects after it) then ends in this call,
                    # and its FIN leaves with the last object's bytes: a FIN in a STREAM
                    # frame of its own that is lost while earlier bytes of the stream are
                    # unacknowledged is never resent by qh3 2.1 (docs/reliability.md)
                    cur.obj = obj.object_id
                    cur.blocked = True
                    self._blocked[cur.stream_id] = cur
                    s.want_writable(cur.stream_id)
                    return
                if cur.prio_group != g:
                    # a fetch stream carries many groups: it takes each group's priority
                    cur.prio_group = g
                    s.reprioritize(cur.stream_id, obj.publisher_priority, g)
                if not self._write_unknown(cur) or not s.write_fetch_object(
                        cur.stream_id, obj.group_id, obj.subgroup_id, obj.object_id,
                        obj.publisher_priority, obj.payload, obj.properties or None):
                    cur.done = True
                    self._cursor_finished(cur)
                    return
                self.objects_sent += 1
                self.bytes_sent += len(obj.payload)
                written += len(obj.payload)
            if g == end.group and cur.obj > end.object:
                if not cur.descending:
                    break  # the last group of an ascending range is done
            elif not self._gap_known(track, g, cur.obj):
                return  # the rest of this group is not known yet
            else:
                self._note_gone(cur, g, hi.object)
            # move to the next group
            if cur.descending:
                assert cur.groups is not None
                if not cur.groups:
                    break
                cur.group = cur.groups.pop(0)
                cur.obj = cur.start.object if cur.group == cur.start.group else 0
                continue
            nxt = next((x for x in track.group_ids() if x > g), None)
            if nxt is None or nxt > end.group:
                if track.complete or (track.settled_until is not None
                                      and track.settled_until.group >= end.group) \
                        or (track.end_of_track is not None
                            and track.end_of_track.group <= g):
                    break
                if g >= end.group:
                    break
                return
            if nxt != g + 1 and not (track.complete or (
                    track.settled_until is not None and track.settled_until.group >= nxt)):
                return
            cur.group = nxt
            cur.obj = 0
        cur.done = True
        if self._write_unknown(cur):
            s.end_data_stream(cur.stream_id)
        self._cursor_finished(cur)

    @staticmethod
    def _note_gone(cur: _Cursor, group: int, last: int) -> None:
        """Objects ``cur.obj``..``last`` of ``group`` are passed over: if some of them aged
        out, an End of Unknown Range must cover them."""
        gone = cur.track.last_gone(group, cur.obj, last)
        if gone is not None:
            cur.unknown = Location(group, gone)

    def _write_unknown(self, cur: _Cursor) -> bool:
        """Write the pending End of Unknown Range; False if the stream is gone."""
        loc = cur.unknown
        if loc is None:
            return True
        cur.unknown = None
        return self.session.write_end_of_range(cur.stream_id, END_OF_UNKNOWN_RANGE,
                                               loc.group, loc.object)

    @staticmethod
    def _gap_known(track: Track, group: int, obj: int) -> bool:
        """True if object ``obj`` of ``group`` is known (present or absent)."""
        return track.is_settled(Location(group, obj)) or track.group_closed(group)

    @property
    def cursors(self) -> tuple[int, int]:
        """(fetch and fill streams being written, waiting their turn)."""
        return self._prune_running(), sum(not c.done for c in self._waiting)

    def _prune_running(self) -> int:
        """Forget the running cursors that ended (a finished one leaves in
        :meth:`_cursor_finished`; a cancelled one is only marked done) and return how many
        run: a cursor kept after its end pins its track."""
        self._running = [c for c in self._running if not c.done]
        return len(self._running)

    def _begin(self, cur: _Cursor) -> None:
        """Start writing a new cursor, or queue it behind :attr:`max_cursors` others."""
        running = self._prune_running()
        if self.max_cursors and running >= self.max_cursors:
            cur.blocked = True  # not in _blocked: only _admit starts it
            self._waiting.append(cur)
            return
        self._running.append(cur)
        self._pump(cur)

    def _admit(self) -> None:
        """Start waiting cursors while fewer than :attr:`max_cursors` run."""
        if self._admitting or not self._waiting:
            return
        self._admitting = True  # a started cursor may finish at once: no recursion
        try:
            while self._waiting and self._prune_running() < self.max_cursors:
                cur = self._waiting.popleft()
                if not cur.done:
                    cur.blocked = False
                    self._running.append(cur)
                    self._pump(cur)
        finally:
            self._admitting = False

    def _cursor_finished(self, cur: _Cursor) -> None:
        self._blocked.pop(cur.stream_id, None)
        if cur in self._running:  # a finished cursor must not pin its track
            self._running.remove(cur)
        if cur.fill_id is None:
            if self._fetches.pop(cur.request_id, None) is not None:
                self._unwatch_if_idle(cur.track)
                self._notify_done(cur.request_id)
        else:
            sub = self._subs.get(cur.request_id)
            if sub is not None:
                self._maybe_done(sub)
        self._admit()
