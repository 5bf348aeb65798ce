"""The relay's upstream subscriptions: at most one :class:`Link` per track.

The first request that needs a track the cache cannot answer alone opens a link: ONE
SUBSCRIBE to the track's source (a publishing session or the upstream relay) with the
exactly-once pattern, Next Object plus a fill of everything the cache does not know yet.
Its objects go into the cached :class:`~kvcs.moqt.track.Track`, from which every
downstream session's TrackServer serves. Requests that arrive before SUBSCRIBE_OK wait on
the link; the track is complete as soon as End of Track is in and every Location before
it is known (the fill ended, subgroups closed): then it no longer depends on the source,
which may leave. A link that ends before that makes the relay drop what it cannot vouch
for and end the downstream requests.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..auth import render_namespace
from ..moqt import events as ev
from ..moqt.errors import PublishDoneCode, RequestErrorCode, SessionCode, StreamResetCode
from ..moqt.track import CachedObject, FullTrackName, ImmutabilityError, Track
from ..moqt.wire import (
    END_OF_NON_EXISTENT_RANGE,
    GroupOrder,
    Location,
    LocationFilter,
    Parameters,
)
from .requests import RelayedState
from .session import RelaySession

if TYPE_CHECKING:
    from .relay import Relay

log = logging.getLogger(__name__)


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


class LinkState(enum.Enum):
    """The lifecycle of an upstream subscription."""

    SUBSCRIBING = "subscribing"
    """SUBSCRIBE sent; the requests that need it wait (RelayedState.WAITING)."""
    ESTABLISHED = "established"
    """SUBSCRIBE_OK came: its track is served while it fills."""
    RETIRED = "retired"
    """Ended (complete, lost, failed, released); no longer in the table."""


class FillState(enum.Enum):
    """The fill of everything the cached copy did not know when the link opened."""

    AWAITING_OK = "awaiting_ok"
    """Its range is known from SUBSCRIBE_OK (LARGEST_OBJECT) only."""
    ENDED_EARLY = "ended_early"
    """The fill stream ended before SUBSCRIBE_OK (streams are not ordered)."""
    RUNNING = "running"
    DONE = "done"
    """Ended, or nothing to fill."""


@dataclass(eq=False)
class Link:
    """The one upstream subscription feeding a cached track. The requests that need it
    are records of the relay's :class:`~kvcs.relay.requests.RelayedRequests`."""

    key: FullTrackName
    source: RelaySession
    track: Track
    request_id: int = -1
    state: LinkState = LinkState.SUBSCRIBING
    fill: FillState = FillState.AWAITING_OK
    fill_end: Location | None = None
    unknown_ranges: bool = False
    """The upstream reported objects it no longer knows (End of Unknown Range)."""
    lost: bool = False
    """A stream was reset, or the fill could not be trusted: the copy cannot be vouched
    for as complete."""
    streams: dict[int, tuple[int, int]] = field(default_factory=dict)
    idle_handle: asyncio.TimerHandle | None = None

    @property
    def established(self) -> bool:
        """True once SUBSCRIBE_OK came (and until the link is retired)."""
        return self.state is LinkState.ESTABLISHED


class Links:
    """The upstream subscriptions of one relay, by track; see the module docstring."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self._by_track: dict[FullTrackName, Link] = {}
        self._by_request: dict[tuple[RelaySession, int], Link] = {}
        self.objects_in = 0
        """Objects received on upstream subscriptions (kvcs_relay_objects_in_total)."""
        self.bytes_in = 0
        """Their payload bytes (kvcs_relay_bytes_in_total)."""

    def __len__(self) -> int:
        return len(self._by_track)

    def get(self, key: FullTrackName) -> Link | None:
        """The link of track ``key``, if one is open."""
        return self._by_track.get(key)

    def all(self) -> list[Link]:
        """Every open link."""
        return list(self._by_track.values())

    def fed(self, source: RelaySession, request_id: int) -> Link | None:
        """The link whose SUBSCRIBE on ``source`` is ``request_id``."""
        return self._by_request.get((source, request_id))

    def feeding(self, track: Track) -> Link | None:
        """The link that feeds exactly this cached track object."""
        link = self._by_track.get(track.full_name)
        return link if link is not None and link.track is track else None

    # ------------------------------------------------------------------ opening

    def open(self, key: FullTrackName, source: RelaySession, track: Track | None) -> Link:
        """SUBSCRIBE upstream for ``key`` (fill from the first Location not cached)."""
        if track is None:
            track = self.relay.origin.cache_track(key[0], key[1])
        link = Link(key, source, track)
        start = first_unknown(track)
        fill_lf = LocationFilter.none() if start == Location(0, 0) else \
            LocationFilter.absolute_start(start.group, start.object)
        p = source.request_params()
        p.location_filter = LocationFilter.next_object()
        # ascending: the fill stream then tells, object by object, that every Location
        # before the one received is known (see on_objects)
        p.fill = Parameters(location_filter=fill_lf, group_order=GroupOrder.ASCENDING)
        p.forward = 1
        link.fill_end = start  # provisional; the real end is LARGEST_OBJECT of the OK
        link.request_id = source.session.subscribe(key[0], key[1], p)
        self._by_track[key] = link
        self._by_request[source, link.request_id] = link
        source.schedule_flush()
        log.info("upstream SUBSCRIBE %s/%r via session %d (fill from %s)",
                 render_namespace(key[0]), key[1], source.id, start)
        return link

    # ------------------------------------------------------------------ events

    def on_objects(self, link: Link, events: list[ev.ObjectReceived]) -> None:
        """A run of objects of the upstream subscription, in the order received: into the
        cached track with one :meth:`Track.extend <kvcs.moqt.track.Track.extend>` (each
        subscriber then gets them as one run), counted once per run."""
        track = link.track
        default = track.default_priority  # a Track Properties lookup: once per run
        streams = link.streams
        last_sid = -1
        run: list[CachedObject] = []
        nbytes = 0
        for e in events:
            r = e.record
            prio = r.publisher_priority
            run.append(CachedObject(r.group_id, r.object_id, r.subgroup_id,
                                    default if prio is None else prio, r.status,
                                    r.properties, exact_payload(r.payload)))
            nbytes += len(r.payload)
            if e.fill_id is None:
                sid = e.stream_id
                if sid != last_sid and sid >= 0:
                    streams[sid] = (r.group_id, r.subgroup_id)
                    last_sid = sid
            elif not link.unknown_ranges:
                # The fill stream is in ascending order: every Location before this
                # object is now known (absent if not received). Settling at each new
                # group lets FETCH and fill cursors downstream move on while the fill is
                # still running, instead of stalling at the first group boundary until
                # the fill ends.
                s = track.settled_until
                if s is None or r.group_id > s.group:
                    if not self._store(link, run):
                        return
                    run = []
                    track.settle(Location(r.group_id, r.object_id))
        # plain counters, read by the metrics at scrape time (docs/perf-profile.md)
        n = len(events)
        self.objects_in += n
        self.bytes_in += nbytes
        link.source.objects_in += n
        link.source.bytes_in += nbytes
        if self._store(link, run) and track.end_of_track is not None:
            self._maybe_complete(link)

    def _store(self, link: Link, run: list[CachedObject]) -> bool:
        """Add ``run`` to the link's track and account its new bytes; False (the source's
        session closed) if one of them contradicts a cached object."""
        if not run:
            return True
        track = link.track
        before = track.bytes
        try:
            track.extend(run)
        except ImmutabilityError as exc:
            self.relay.close_session(link.source, SessionCode.PROTOCOL_VIOLATION, str(exc))
            return False
        finally:
            added = track.bytes - before
            if added:
                self.relay.origin.added(added)
        return True

    def on_event(self, link: Link, e: ev.Event) -> None:
        """Any other event of the upstream subscription."""
        track = link.track
        if isinstance(e, ev.SubscribeAccepted):
            link.state = LinkState.ESTABLISHED
            msg = e.message
            if msg.track_properties:
                track.properties = tuple(msg.track_properties)
            largest = msg.params.largest_object
            if largest is not None and (track.largest is None or largest > track.largest):
                track.largest = largest
            start = link.fill_end or Location(0, 0)
            link.fill_end = largest
            if largest is None or start > largest or link.fill is FillState.ENDED_EARLY:
                # empty fill range (no fill stream), or the fill already came in
                link.fill = FillState.DONE
                if largest is not None and not link.lost and not link.unknown_ranges:
                    track.settle(largest)
            else:
                link.fill = FillState.RUNNING
            self._maybe_complete(link)
            for r in self.relay.requests.on_link(link, RelayedState.WAITING):
                if r.peer.is_closed:
                    self.relay.requests.end(r)
                else:
                    self.relay.serve(r.peer, r.event, track, link)
            self.maybe_idle(link)
        elif isinstance(e, ev.DataStreamEnded):
            if e.fill_id is not None:
                early = link.state is LinkState.SUBSCRIBING
                link.fill = FillState.ENDED_EARLY if early else FillState.DONE
                if e.reset_code is not None or link.unknown_ranges:
                    link.lost = True
                elif early:
                    pass  # SUBSCRIBE_OK settles the range
                elif link.fill_end is not None:
                    track.settle(link.fill_end)
            else:
                key = link.streams.pop(e.stream_id, None)
                if e.reset_code is not None:
                    link.lost = True
                elif key is not None:
                    track.close_subgroup(*key)
            self._maybe_complete(link)
        elif isinstance(e, ev.RangeMarkerReceived):
            if e.marker.kind != END_OF_NON_EXISTENT_RANGE:
                link.unknown_ranges = True
        elif isinstance(e, ev.SubscriptionEnded):
            done = e.message
            if e.streams_missing:
                # streams it counted never came (still queued upstream on a loaded host,
                # or reset before their header): their objects are unknown, so the track
                # cannot be declared complete (a relay below once did, with a layer short,
                # and its consumer's recovery FETCH found the range "after the Largest")
                link.lost = True
            if done.status == PublishDoneCode.TRACK_ENDED and not link.lost \
                    and not link.unknown_ranges and link.fill is not FillState.RUNNING:
                self._retire(link)
                if not track.complete:
                    track.finish()
                    log.info("track %r complete (%d objects, %d bytes)", track.name,
                             track.count, track.bytes)
            else:
                self.lost(link, done.status, done.reason or "upstream ended")
        elif isinstance(e, ev.RequestRejected):
            if e.update_id is None:
                self._failed(link, e.message.code, e.message.reason)
        elif isinstance(e, ev.RequestFailed):
            # the session cancels a track it finds malformed (digest 8.8): say so downstream
            malformed = e.code == StreamResetCode.MALFORMED_TRACK
            self._failed(link, RequestErrorCode.MALFORMED_TRACK if malformed
                         else RequestErrorCode.INTERNAL_ERROR, e.reason)

    def _maybe_complete(self, link: Link) -> None:
        """Mark the track complete once End of Track and every Location before it are
        known, without waiting for PUBLISH_DONE: the publisher may leave right after."""
        track = link.track
        if (not track.complete and link.established and not link.lost
                and not link.unknown_ranges and link.fill is not FillState.RUNNING
                and track.known_until_end()):
            track.finish()
            log.info("track %r complete (%d objects, %d bytes)", track.name, track.count,
                     track.bytes)

    # ------------------------------------------------------------------ endings

    def source_closed(self, source: RelaySession) -> None:
        """The session feeding some links ended."""
        for link in [lk for lk in self._by_track.values() if lk.source is source]:
            self.lost(link, PublishDoneCode.GOING_AWAY, "publisher went away")

    def _reject_waiting(self, link: Link, code: int, reason: str) -> None:
        requests = self.relay.requests
        for r in requests.on_link(link, RelayedState.WAITING):
            requests.end(r)
            self.relay.reject(r.peer, r.request_id, r.kind, code, reason)

    def _failed(self, link: Link, code: int, reason: str) -> None:
        if link.established:
            self.lost(link, PublishDoneCode.MALFORMED_TRACK
                      if code == RequestErrorCode.MALFORMED_TRACK
                      else PublishDoneCode.INTERNAL_ERROR, reason)
            return
        self._retire(link)
        self._reject_waiting(link, code, f"upstream: {reason}")
        if not link.track.count:
            self.relay.origin.forget(link.track)

    def lost(self, link: Link, status: int, reason: str) -> None:
        """The upstream subscription ended before the track was complete (``status``: the
        PUBLISH_DONE status that ended it). A malformed track (digest 8.8) ends every
        downstream request with MALFORMED_TRACK, a publisher that left with GOING_AWAY,
        anything else with INTERNAL_ERROR."""
        self._retire(link)
        malformed = status == PublishDoneCode.MALFORMED_TRACK
        self._reject_waiting(link, RequestErrorCode.MALFORMED_TRACK if malformed
                             else RequestErrorCode.INTERNAL_ERROR, f"upstream: {reason}")
        track = link.track
        if track.complete:
            return
        code = (status if status in (PublishDoneCode.GOING_AWAY, PublishDoneCode.MALFORMED_TRACK)
                else PublishDoneCode.INTERNAL_ERROR)
        reset = StreamResetCode.MALFORMED_TRACK if malformed else StreamResetCode.INTERNAL_ERROR
        requests = self.relay.requests
        for r in requests.on_link(link, RelayedState.SERVED):
            r.peer.abort_served(r.request_id, code, reason, reset)
        for r in requests.on_link(link):
            requests.detach(r)
        # we cannot state the completeness of what is cached honestly: drop it
        self.relay.origin.forget(track)
        log.info("dropped incomplete track %r: %s", track.name, reason)

    def _retire(self, link: Link) -> None:
        if link.state is LinkState.RETIRED:
            return
        link.state = LinkState.RETIRED
        if link.idle_handle is not None:
            link.idle_handle.cancel()
        if self._by_track.get(link.key) is link:
            del self._by_track[link.key]
        self._by_request.pop((link.source, link.request_id), None)

    def cancel(self, link: Link) -> None:
        """Unsubscribe upstream; the cached objects stay (what is known stays known)."""
        self._retire(link)
        if not link.source.is_closed:
            link.source.session.cancel(link.request_id)
            link.source.schedule_flush()
        log.info("upstream subscription for %r released", link.track.name)

    def evicted(self, link: Link) -> None:
        """The cache evicted the link's track: unsubscribe, refuse who still waits."""
        self.cancel(link)
        self._reject_waiting(link, RequestErrorCode.EXCESSIVE_LOAD, "cache full")

    def maybe_idle(self, link: Link) -> None:
        """Release the link once nobody needs it (after ``upstream_linger`` seconds)."""
        if not link.established or self.relay.requests.needs(link):
            return
        if link.idle_handle is not None:
            link.idle_handle.cancel()
        linger = self.relay.config.upstream_linger
        if linger <= 0:
            self._release_idle(link)
        else:
            link.idle_handle = asyncio.get_running_loop().call_later(
                linger, self._release_idle, link)

    def _release_idle(self, link: Link) -> None:
        link.idle_handle = None
        if link.state is LinkState.RETIRED or self.relay.requests.needs(link):
            return
        self.cancel(link)


def first_unknown(track: Track) -> Location:
    """First Location whose status the cached track does not know."""
    if track.complete:
        return Location(0, 0) if track.largest is None else Location(
            track.largest.group + 1, 0)
    g = 0
    for gid in track.group_ids():
        if gid != g or not track.group_closed(gid):
            break
        g += 1
    s = track.settled_until
    if s is not None and s.group >= g:
        return Location(s.group, s.object + 1)
    return Location(g, 0)
