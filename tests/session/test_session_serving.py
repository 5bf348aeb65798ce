"""TrackServer over a sans-IO Pair: filters, forward, group order, priorities, range
filters, fills (SUBSCRIBE and REQUEST_UPDATE), fill failure, end markers, exactly-once."""

from __future__ import annotations

import pytest

from kvcs.moqt import events as ev
from kvcs.moqt import wire
from kvcs.moqt.actions import SetStreamPriority
from kvcs.moqt.errors import PublishDoneCode, RequestErrorCode, StreamResetCode
from kvcs.moqt.serving import TrackServer
from kvcs.moqt.session import SessionConfig
from kvcs.moqt.track import CachedObject, Track

from .pair import Pair, established, of_type

NS = (b"kv", b"s")
L = wire.Location


def _obj(g: int, o: int, sg: int = 0, prio: int = 10, status: int = 0) -> CachedObject:
    payload = b"" if status else f"{g}/{o}".encode() * 3
    return CachedObject(g, o, sg, prio, status, (), payload)


def _track_with_hole() -> Track:
    """A relay-like (non-origin) track holding 0/0 and 0/2: a fill waits at the hole 0/1."""
    track = Track(NS, b"t")
    track.add(_obj(0, 0))
    track.add(_obj(0, 2))
    return track


def _fill(track: Track, groups: range, objects: int = 4) -> None:
    for g in groups:
        for o in range(objects):
            track.add(_obj(g, o))


class Served:
    """A Pair plus a TrackServer on the server side answering from one track."""

    def __init__(self, track: Track | None = None, **server_cfg: object) -> None:
        cfg = SessionConfig(is_client=False, **server_cfg)  # type: ignore[arg-type]
        self.p: Pair = established(server_cfg=cfg)
        self.track = track if track is not None else Track(NS, b"t", origin=True)
        self.server = TrackServer(self.p.server)

    def subscribe_joining(self) -> int:
        """SUBSCRIBE as a late joiner: live from the next object, plus a fill of all the
        track holds before it; returns the Request ID."""
        return self.p.client.subscribe(NS, b"t", wire.Parameters(
            location_filter=wire.LocationFilter.next_object(),
            fill=wire.Parameters(location_filter=wire.LocationFilter.none())))

    def run(self) -> list:
        """Pump until quiet, letting the TrackServer answer; return client events."""
        out: list = []
        for _ in range(50):
            self.p.pump()
            sevs = self.p.events(self.p.server)
            for e in sevs:
                if self.server.handle(e):
                    continue
                if isinstance(e, ev.RequestReceived):
                    m = e.message
                    if isinstance(m, wire.Subscribe):
                        self.server.serve_subscribe(e.request_id, m, self.track)
                    else:
                        self.server.serve_fetch(e.request_id, m, self.track)  # type: ignore
            out += self.p.events(self.p.client)
            if not sevs:
                self.p.pump()
                out += self.p.events(self.p.client)
                return out
        raise AssertionError("did not settle")

    def add(self, *objs: CachedObject) -> list:
        for o in objs:
            self.track.add(o)
        return self.run()


def locs(evs: list) -> list[wire.Location]:
    return [e.location for e in of_type(evs, ev.ObjectReceived)]


# ------------------------------------------------------------------- LOCATION_FILTER


@pytest.mark.parametrize(
    ("lf", "expected"),
    [
        (None, [L(1, 2), L(1, 3), L(2, 0), L(2, 1), L(3, 0), L(3, 1)]),
        (wire.LocationFilter.none(), [L(1, 2), L(1, 3), L(2, 0), L(2, 1), L(3, 0), L(3, 1)]),
        (wire.LocationFilter.next_object(), [L(1, 2), L(1, 3), L(2, 0), L(2, 1), L(3, 0), L(3, 1)]),
        (wire.LocationFilter.relative_start(0), [L(2, 0), L(2, 1), L(3, 0), L(3, 1)]),
        (wire.LocationFilter.relative_start(1), [L(1, 2), L(1, 3), L(2, 0), L(2, 1), L(3, 0),
                                                 L(3, 1)]),
        (wire.LocationFilter.absolute_start(2, 1), [L(2, 1), L(3, 0), L(3, 1)]),
        (wire.LocationFilter.absolute_group_end(1, 3, 1), [L(1, 3), L(2, 0), L(2, 1)]),
        (wire.LocationFilter.absolute_range(2, 0, 1, 0), [L(2, 0), L(2, 1), L(3, 0)]),
    ],
)
def test_location_filter_types_on_live_objects(lf: wire.LocationFilter | None,
                                               expected: list[wire.Location]) -> None:
    s = Served()
    _fill(s.track, range(1), 4)
    s.track.add(_obj(1, 0))
    s.track.add(_obj(1, 1))  # Largest = {1,1}
    s.p.client.subscribe(NS, b"t", wire.Parameters(location_filter=lf))
    evs = s.run()
    (ok,) = of_type(evs, ev.SubscribeAccepted)
    assert ok.message.params.largest_object == L(1, 1)
    got = s.add(_obj(1, 2), _obj(1, 3), _obj(2, 0), _obj(2, 1), _obj(3, 0), _obj(3, 1))
    assert locs(got) == expected


def test_unsatisfiable_subscription_range_is_invalid_range() -> None:
    s = Served()
    s.p.client.subscribe(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.absolute_range(3, 5, 0, 2)))
    (rej,) = s.run()
    assert isinstance(rej, ev.RequestRejected)
    assert rej.message.code == RequestErrorCode.INVALID_RANGE


# --------------------------------------------------------------------------- FORWARD


def test_forward_zero_then_update_forward_one() -> None:
    s = Served()
    _fill(s.track, range(1), 2)
    rid = s.p.client.subscribe(NS, b"t", wire.Parameters(
        forward=0, fill=wire.Parameters(location_filter=wire.LocationFilter.none())))
    evs = s.run()
    assert of_type(evs, ev.SubscribeAccepted)
    assert of_type(evs, ev.ObjectReceived) == []  # paused: no fill either
    assert locs(s.add(_obj(1, 0))) == []
    uid = s.p.client.request_update(rid, wire.Parameters(forward=1))
    evs = s.run()
    (ok,) = of_type(evs, ev.RequestAccepted)
    assert ok.update_id == uid and ok.message.params.largest_object == L(1, 0)
    assert locs(evs) == []  # switching to forward does not create a fill
    assert locs(s.add(_obj(1, 1), _obj(2, 0))) == [L(1, 1), L(2, 0)]


# ----------------------------------------------------------------------- GROUP_ORDER


def test_fetch_descending_group_order() -> None:
    s = Served()
    _fill(s.track, range(4), 3)
    rid = s.p.client.fetch(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.absolute_range(1, 1, 2, 1),
        group_order=wire.GroupOrder.DESCENDING))
    evs = s.run()
    (ok,) = of_type(evs, ev.FetchAccepted)
    assert ok.message.end_location == L(3, 1)
    assert locs(evs) == [L(3, 0), L(3, 1), L(2, 0), L(2, 1), L(2, 2), L(1, 1), L(1, 2)]
    assert all(e.request_id == rid for e in of_type(evs, ev.ObjectReceived))
    assert of_type(evs, ev.DataStreamEnded)[0].reset_code is None


def test_a_finished_fetch_does_not_keep_its_track() -> None:
    """Once its stream ended, a cursor lets go of its track: a publisher that hands each
    publication over to a relay and forgets it kept every track it ever served (a soak's
    kvcs-allocated bytes grew by 47-90 MB over 105 cycles: tests/faults/test_soak.py)."""
    import gc
    import weakref

    s = Served()  # max_cursors 0: no limit, as a publisher's endpoint
    _fill(s.track, range(3), 3)
    s.p.client.fetch(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.absolute_range(0, 0, 2, 2)))
    evs = s.run()
    assert len(locs(evs)) == 9 and of_type(evs, ev.DataStreamEnded)
    ref = weakref.ref(s.track)
    s.track = Track(NS, b"other", origin=True)
    gc.collect()
    assert ref() is None


# ------------------------------------------------------------------------ priorities


def test_subscriber_and_publisher_priorities_in_stream_priority() -> None:
    s = Served(Track(NS, b"t", properties=((0x0E, 50),), origin=True))
    rid = s.p.client.subscribe(NS, b"t", wire.Parameters(subscriber_priority=7))
    s.run()
    s.add(_obj(0, 0, prio=50), _obj(1, 0, sg=2, prio=3))
    prios = [a for n, a in s.p.wire if n == "client" and isinstance(a, SetStreamPriority)
             and a.priority[0] == 1]  # data streams
    assert [a.priority[:3] for a in prios] == [(1, 7, 50), (1, 7, 3)]
    assert prios[0].priority[3] < prios[1].priority[3]  # group 0 before group 1
    # a REQUEST_UPDATE of SUBSCRIBER_PRIORITY applies to streams opened afterwards
    s.p.client.request_update(rid, wire.Parameters(subscriber_priority=200))
    s.run()
    s.add(_obj(2, 0, prio=50))
    prios = [a for n, a in s.p.wire if n == "client" and isinstance(a, SetStreamPriority)
             and a.priority[0] == 1]
    assert prios[-1].priority[:3] == (1, 200, 50)


def test_received_priorities_inherit_default() -> None:
    s = Served(Track(NS, b"t", properties=((0x0E, 50),), origin=True))
    s.p.client.subscribe(NS, b"t")
    s.run()
    evs = s.add(_obj(0, 0, prio=50), _obj(1, 0, prio=3))
    objs = of_type(evs, ev.ObjectReceived)
    assert [o.record.publisher_priority for o in objs] == [None, 3]


# --------------------------------------------------------------------- range filters


def test_objectid_filter_subscription_and_fetch() -> None:
    s = Served()
    _fill(s.track, range(2), 5)
    f = wire.RangeFilter(0x26, 0, ((0, 1), (3, 3)))
    s.p.client.subscribe(NS, b"t", wire.Parameters(range_filters=(f,)))
    s.run()
    got = s.add(*[_obj(2, o) for o in range(5)])
    assert locs(got) == [L(2, 0), L(2, 1), L(2, 3)]
    s.p.client.fetch(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.absolute_start(0, 0),
        range_filters=(wire.RangeFilter(0x26, 0, ((0, 1),)),)))
    evs = s.run()
    assert locs(evs) == [L(0, 0), L(0, 1), L(1, 0), L(1, 1), L(2, 0), L(2, 1)]


def test_range_filters_over_max_filter_ranges_is_invalid_filter() -> None:
    s = Served(max_filter_ranges=1)
    s.p.client.subscribe(NS, b"t", wire.Parameters(
        range_filters=(wire.RangeFilter(0x26, 0, ((0, 1), (3, 4))),)))
    (rej,) = s.run()
    assert isinstance(rej, ev.RequestRejected)
    assert rej.message.code == RequestErrorCode.INVALID_FILTER
    _fill(s.track, range(1), 1)
    s.p.client.fetch(NS, b"t", wire.Parameters(range_filters=(
        wire.RangeFilter(0x26, 0, ((0, 1),)), wire.RangeFilter(0x25, 1, ((0, 0),)))))
    (rej,) = s.run()
    assert rej.message.code == RequestErrorCode.INVALID_FILTER
    # inside FILL_PARAMETERS too
    s.p.client.subscribe(NS, b"t", wire.Parameters(fill=wire.Parameters(
        range_filters=(wire.RangeFilter(0x26, 0, ((0, 1), (3, 4))),))))
    (rej,) = s.run()
    assert rej.message.code == RequestErrorCode.INVALID_FILTER
    assert not s.p.closed


def test_update_with_invalid_filter_fails_update_and_subscription() -> None:
    s = Served(max_filter_ranges=1)
    rid = s.p.client.subscribe(NS, b"t")
    s.run()
    uid = s.p.client.request_update(rid, wire.Parameters(
        range_filters=(wire.RangeFilter(0x26, 0, ((0, 1), (3, 4))),)))
    evs = s.run()
    (rej,) = of_type(evs, ev.RequestRejected)
    assert rej.update_id == uid and rej.message.code == RequestErrorCode.INVALID_FILTER
    (done,) = of_type(evs, ev.SubscriptionEnded)
    assert done.message.status == PublishDoneCode.UPDATE_FAILED


# ------------------------------------------------------------------------------ fill


def test_fill_in_subscribe_uses_subscribe_request_id() -> None:
    s = Served()
    _fill(s.track, range(3), 3)
    rid = s.p.client.subscribe(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.next_object(),
        fill=wire.Parameters(location_filter=wire.LocationFilter.relative_start(2))))
    evs = s.run()
    fills = of_type(evs, ev.ObjectReceived)
    assert [e.location for e in fills] == [L(1, 0), L(1, 1), L(1, 2), L(2, 0), L(2, 1),
                                            L(2, 2)]
    assert {e.fill_id for e in fills} == {rid}
    (end,) = of_type(evs, ev.DataStreamEnded)
    assert end.kind == "fetch" and end.fill_id == rid and end.reset_code is None


def test_fill_in_request_update_carries_update_id() -> None:
    s = Served()
    _fill(s.track, range(2), 2)
    rid = s.p.client.subscribe(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.next_object()))
    s.run()
    uid = s.p.client.request_update(rid, wire.Parameters(
        fill=wire.Parameters(location_filter=wire.LocationFilter.absolute_start(1, 0))))
    evs = s.run()
    (ok,) = of_type(evs, ev.RequestAccepted)
    assert ok.update_id == uid and ok.message.params.largest_object == L(1, 1)
    fills = of_type(evs, ev.ObjectReceived)
    assert [e.location for e in fills] == [L(1, 0), L(1, 1)]
    assert {e.fill_id for e in fills} == {uid}
    assert {e.request_id for e in fills} == {rid}
    # the fill stream header is FETCH_HEADER 05 + the update's Request ID
    from kvcs.moqt.actions import SendStreamData

    first = next(a for n, a in s.p.wire if n == "client" and isinstance(a, SendStreamData)
                 and a.stream_id == fills[0].stream_id)
    assert bytes(first.data) == bytes([0x05, uid])


def test_empty_fill_opens_no_stream() -> None:
    s = Served()
    _fill(s.track, range(1), 2)
    # subscription filter Next Object and no inner filter: the fill inherits it -> empty
    s.p.client.subscribe(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.next_object(), fill=wire.Parameters()))
    evs = s.run()
    assert of_type(evs, ev.ObjectReceived) == []
    assert of_type(evs, ev.DataStreamEnded) == []


def test_fill_failure_resets_fill_stream_and_live_continues() -> None:
    track = _track_with_hole()
    s = Served(track)
    rid = s.subscribe_joining()
    evs = s.run()
    assert locs(evs) == [L(0, 0)]
    s.server.fail_fill(rid)
    evs = s.run()
    (end,) = of_type(evs, ev.DataStreamEnded)
    assert end.fill_id == rid and end.reset_code == StreamResetCode.INTERNAL_ERROR
    # live delivery is unaffected
    evs = s.add(_obj(0, 3), _obj(0, 4, status=wire.ObjectStatus.END_OF_TRACK))
    assert locs(evs) == [L(0, 3), L(0, 4)]
    (done,) = of_type(evs, ev.SubscriptionEnded)
    assert done.message.stream_count == 2  # the fill stream counts
    assert not s.p.closed


def test_fill_that_cannot_be_served_is_opened_and_reset() -> None:
    s = Served()
    _fill(s.track, range(2), 2)
    s.server = TrackServer(s.p.server, can_fill=lambda sub, fill, start, end: False)
    rid = s.subscribe_joining()
    evs = s.run()
    assert of_type(evs, ev.SubscribeAccepted)
    assert locs(evs) == []
    (end,) = of_type(evs, ev.DataStreamEnded)
    assert end.fill_id == rid and end.reset_code is not None
    # the header was written before the reset
    from kvcs.moqt.actions import ResetStream, SendStreamData

    sent = [a for n, a in s.p.wire if n == "client" and getattr(a, "stream_id", -1) ==
            end.stream_id]
    assert isinstance(sent[-2], SendStreamData) and bytes(sent[-2].data) == bytes([5, rid])
    assert isinstance(sent[-1], ResetStream)


def test_track_dropped_ends_subscription_and_resets_fill() -> None:
    track = _track_with_hole()
    s = Served(track)
    rid = s.subscribe_joining()
    s.run()
    track.drop()
    evs = s.run()
    (end,) = of_type(evs, ev.DataStreamEnded)
    assert end.fill_id == rid and end.reset_code is not None
    (done,) = of_type(evs, ev.SubscriptionEnded)
    assert done.message.status == PublishDoneCode.EXPIRED
    assert done.message.stream_count == 1


def test_fill_cancelled_by_stop_sending_only_affects_fill() -> None:
    track = _track_with_hole()
    s = Served(track)
    s.subscribe_joining()
    evs = s.run()
    fill_sid = of_type(evs, ev.ObjectReceived)[0].stream_id

    s.p.server.stop_sending(fill_sid, StreamResetCode.CANCELLED)  # from the client
    evs = s.run()
    assert locs(s.add(_obj(0, 3))) == [L(0, 3)]
    # filling the hole later does not resurrect the cancelled fill
    assert locs(s.add(_obj(0, 1))) == []


# --------------------------------------------------------------- End of Group / Track


def test_end_of_group_and_end_of_track() -> None:
    s = Served()
    rid = s.p.client.subscribe(NS, b"t")
    s.run()
    evs = s.add(_obj(0, 0), _obj(0, 1), _obj(0, 2, status=wire.ObjectStatus.END_OF_GROUP))
    objs = of_type(evs, ev.ObjectReceived)
    assert [o.record.status for o in objs] == [0, 0, wire.ObjectStatus.END_OF_GROUP]
    (end,) = of_type(evs, ev.DataStreamEnded)  # FIN right after End of Group
    assert end.reset_code is None and end.stream_id == objs[0].stream_id
    evs = s.add(_obj(1, 0), _obj(1, 1, status=wire.ObjectStatus.END_OF_TRACK))
    assert [o.record.status for o in of_type(evs, ev.ObjectReceived)] == [
        0, wire.ObjectStatus.END_OF_TRACK]
    (done,) = of_type(evs, ev.SubscriptionEnded)
    assert done.request_id == rid
    assert done.message.status == PublishDoneCode.TRACK_ENDED
    assert done.message.stream_count == 2
    # FETCH streams carry no status objects
    s.p.client.fetch(NS, b"t")
    evs = s.run()
    assert locs(evs) == [L(0, 0), L(0, 1), L(1, 0)]
    (ok,) = of_type(evs, ev.FetchAccepted)
    assert ok.message.end_of_track


def test_subscribe_to_finished_track_ends_at_once_with_fill() -> None:
    s = Served()
    _fill(s.track, range(2), 2)
    s.track.add(_obj(1, 2, status=wire.ObjectStatus.END_OF_TRACK))
    s.subscribe_joining()
    evs = s.run()
    assert locs(evs) == [L(0, 0), L(0, 1), L(1, 0), L(1, 1)]
    (done,) = of_type(evs, ev.SubscriptionEnded)
    assert done.message.stream_count == 1
    assert of_type(evs, ev.DataStreamEnded)[0].fill_id is not None


# -------------------------------------------------------------------- exactly once


@pytest.mark.parametrize("chunk", [None, 7])
def test_exactly_once_join_half_way(chunk: int | None) -> None:
    s = Served()
    if chunk:
        s.p.chunk = chunk
    groups, per = 6, 5
    produced = [(g, o) for g in range(groups) for o in range(per)]
    half = len(produced) // 2 + 2  # mid-group
    for g, o in produced[:half]:
        s.track.add(_obj(g, o))
    rid = s.subscribe_joining()
    evs = s.run()
    for g, o in produced[half:]:
        evs += s.add(_obj(g, o))
    evs += s.add(_obj(groups - 1, per, status=wire.ObjectStatus.END_OF_TRACK))
    objs = [e for e in of_type(evs, ev.ObjectReceived) if e.record.status == 0]
    got = [(e.location.group, e.location.object) for e in objs]
    assert sorted(got) == produced  # every object exactly once
    assert len(got) == len(set(got))
    fill = {(e.location.group, e.location.object) for e in objs if e.fill_id == rid}
    live = {(e.location.group, e.location.object) for e in objs if e.fill_id is None}
    assert fill == set(produced[:half]) and live == set(produced[half:])
    for e in objs:
        assert bytes(e.record.payload) == f"{e.location.group}/{e.location.object}".encode() * 3
    (done,) = of_type(evs, ev.SubscriptionEnded)
    ended = of_type(evs, ev.DataStreamEnded)
    assert done.message.stream_count == len(ended)


def test_publish_done_and_fin_overtaking_the_fill_stream() -> None:
    """PUBLISH_DONE + FIN arrive before the fill stream: the fill is still attributed and
    counted (regression: the request was forgotten and the fill stream abandoned)."""
    s = Served()
    _fill(s.track, range(2), 3)
    s.track.add(_obj(1, 3, status=wire.ObjectStatus.END_OF_TRACK))
    rid = s.subscribe_joining()
    s.p.pump()
    for e in s.p.events(s.p.server):
        if isinstance(e, ev.RequestReceived):
            s.server.serve_subscribe(e.request_id, e.message, s.track)  # type: ignore[arg-type]
    acts = s.p.server.actions()
    bidi = [a for a in acts if getattr(a, "stream_id", 3) % 4 == 0]
    uni = [a for a in acts if a not in bidi]
    s.p._deliver(bidi, s.p.client, "client")
    s.p._deliver(uni, s.p.client, "client")
    s.p.pump()
    evs = s.p.events(s.p.client)
    assert locs(evs) == [L(0, 0), L(0, 1), L(0, 2), L(1, 0), L(1, 1), L(1, 2)]
    assert {e.fill_id for e in of_type(evs, ev.ObjectReceived)} == {rid}
    (done,) = of_type(evs, ev.SubscriptionEnded)
    assert done.message.stream_count == 1
    assert s.p.client.actions() == [] or not s.p.closed
    assert not s.p.client.has_request(rid)  # forgotten once everything has ended


def test_write_window_interleaves_fill_streams_and_tracks_group_priority() -> None:
    """With a write window, two fill streams alternate instead of one draining first, and
    each fill stream carries the priority of the group it is sending."""
    from kvcs.moqt.actions import SendStreamData as _Send
    from kvcs.moqt.actions import SetStreamPriority as _Prio
    from kvcs.moqt.events import RequestReceived as _Req
    from kvcs.moqt.serving import TrackServer as _Server
    from kvcs.moqt.session import SessionConfig as _Cfg
    from kvcs.moqt.track import CachedObject as _Obj
    from kvcs.moqt.track import Track as _Track
    from kvcs.moqt.wire import LocationFilter as _LF
    from kvcs.moqt.wire import Parameters as _P

    from .pair import Pair as _Pair

    p = _Pair(server_cfg=_Cfg(is_client=False, write_window=4000))
    p.pump()
    server = _Server(p.server)
    tracks = {}
    for name in (b"k", b"v"):
        t = tracks[name] = _Track((b"ns",), name, origin=True)
        for g in range(4):
            for o in range(4):
                t.add(_Obj(g, o, 0, 10 * g, 0, (), bytes([g]) * 1000))
    for name in (b"k", b"v"):
        p.client.subscribe((b"ns",), name, _P(location_filter=_LF.next_object(),
                                              fill=_P(location_filter=_LF.none())))
    p.pump()
    for e in list(p.server.events()):
        if isinstance(e, _Req):
            server.serve_subscribe(e.request_id, e.message, tracks[e.message.name])
    while True:  # what an Endpoint does: pump, then hand events to the TrackServer
        p.pump()
        evs = list(p.server.events())
        if not evs:
            break
        for e in evs:
            server.handle(e)
    # one write per object: its prefix (a few bytes) and its 1000-byte payload
    fills = [a for who, a in p.wire if who == "client" and isinstance(a, _Send)
             and 1000 < len(a.data) < 1100]
    order = [a.stream_id for a in fills]
    assert len(order) == 32
    # the two streams alternate in windows of 4 objects, not 16 then 16
    assert order[:8].count(order[0]) == 4 and order[8:16].count(order[0]) == 4
    prios = [a.priority for who, a in p.wire if who == "client" and isinstance(a, _Prio)
             and a.stream_id == order[0]]
    assert [x[2] for x in prios[-4:]] == [0, 10, 20, 30]  # publisher priority per group
    events = list(p.client.events())
    got = [(e.request_id, e.record.group_id) for e in events if hasattr(e, "record")]
    assert len(got) == 32


def test_a_fill_that_ends_where_its_write_window_fills_ends_at_once() -> None:
    """A fill whose last object fills the write window (only status objects after it)
    ends its stream in the same call, so that its FIN leaves with its last bytes; it used
    to wait for the stream to drain and send the FIN alone, which qh3 2.1 never resends
    if it is lost while earlier bytes are unacknowledged (docs/reliability.md)."""
    from kvcs.moqt.actions import SendStreamData

    p = established(server_cfg=SessionConfig(is_client=False, write_window=4000))
    server = TrackServer(p.server)
    track = Track(NS, b"t", origin=True)
    for g in range(2):
        for o in range(4):
            track.add(CachedObject(g, o, 0, 10, 0, (), bytes(1000)))
        track.add(_obj(g, 4, status=wire.ObjectStatus.END_OF_GROUP if g == 0
                       else wire.ObjectStatus.END_OF_TRACK))
    p.client.subscribe(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.next_object(),
        fill=wire.Parameters(location_filter=wire.LocationFilter.none())))
    p.pump()
    req = next(e for e in p.server.events() if isinstance(e, ev.RequestReceived))
    assert server.serve_subscribe(req.request_id, req.message, track)
    p.pump()
    # the first window (group 0) is written; the second waits for DataStreamWritable
    writable = [e for e in p.server.events() if isinstance(e, ev.DataStreamWritable)]
    assert len(writable) == 1
    sent = [a for who, a in p.wire if who == "client" and isinstance(a, SendStreamData)
            and a.stream_id == writable[0].stream_id]
    assert not any(a.end for a in sent)
    before = len(p.wire)
    server.handle(writable[0])  # group 1: its four objects, then the end of the range
    p.pump()
    last = [a for who, a in p.wire[before:] if who == "client"
            and isinstance(a, SendStreamData) and a.stream_id == writable[0].stream_id]
    assert len(last) == 5 and last[-1].end  # the FIN in the same call, not after a drain
    assert not [e for e in p.server.events() if isinstance(e, ev.DataStreamWritable)]


def test_live_objects_behind_their_subgroup_stream_go_on_a_new_stream() -> None:
    """A relay's track may receive a subgroup's objects out of order (its upstream sent
    the subgroup on two streams that raced): the live stream never goes backwards; it ends
    and the subgroup goes on in a new stream, every object delivered once."""
    s = Served(Track(NS, b"t"))  # a cached (relay) track
    s.p.client.subscribe(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.next_object()))
    assert of_type(s.run(), ev.SubscribeAccepted)
    got = s.add(_obj(0, 0), _obj(0, 3), _obj(0, 4), _obj(0, 1), _obj(0, 2), _obj(0, 5))
    objs = of_type(got, ev.ObjectReceived)
    assert sorted(o.location for o in objs) == [L(0, o) for o in range(6)]
    streams = [o.stream_id for o in objs]
    assert len(set(streams)) == 2  # 0, 3, 4 on one; 1, 2, 5 on the next
    assert s.server.objects_sent == 6


# ------------------------------------------------------------------- runs


def test_a_run_goes_out_one_write_per_subgroup_stretch_in_order() -> None:
    """A run of new objects (Track.extend: a relay's received run, a published layer) is
    written as one write per stretch of one subgroup, in order; the subscriber's session
    hands the objects of one request that come together out as a run (next_objects)."""
    from kvcs.moqt.actions import SendStreamData

    s = Served(track=Track(NS, b"t"))  # a relay's copy
    rid = s.p.client.subscribe(NS, b"t")
    s.run()
    s.p.wire.clear()
    s.track.extend([_obj(0, 0, 0), _obj(0, 1, 0), _obj(0, 2, 1), _obj(0, 3, 1),
                    _obj(0, 4, 0), _obj(0, 5, 0)])
    s.p.pump()
    writes = [a for n, a in s.p.wire if n == "client" and isinstance(a, SendStreamData)]
    headers = 2  # one subgroup stream each for subgroups 0 and 1
    assert len(writes) == headers + 3
    first = s.p.client.next_event()
    assert isinstance(first, ev.ObjectReceived) and first.request_id == rid
    run = [first, *s.p.client.next_objects(rid)]
    assert [e.location for e in run] == [L(0, o) for o in range(6)]
    assert [e.record.subgroup_id for e in run] == [0, 0, 1, 1, 0, 0]
    assert s.p.client.next_objects(rid) == []


def test_a_large_run_goes_out_two_32k_objects_per_joined_write() -> None:
    """A run of JOIN_RUN_BELOW or more (a publisher's layer) is not joined into one
    buffer: its 32 KiB objects go out two per write (JOIN_WRITE_LIMIT, one qh3 call each),
    prefix and payload joined (writing the payload by reference after its prefix cost the
    publisher more, docs/perf-profile.md)."""
    from kvcs.moqt.actions import SendStreamData
    from kvcs.moqt.datastreams import JOIN_RUN_BELOW, JOIN_WRITE_LIMIT

    s = Served()
    s.p.client.subscribe(NS, b"t")
    s.run()
    s.p.wire.clear()
    payloads = [bytes([o]) * (32 * 1024) for o in range(JOIN_RUN_BELOW // (32 * 1024) + 1)]
    s.track.extend([CachedObject(0, o, 0, 10, 0, (), memoryview(p))
                    for o, p in enumerate(payloads)])
    s.p.pump()
    writes = [a for n_, a in s.p.wire if n_ == "client" and isinstance(a, SendStreamData)]
    data = writes[1:]  # after the stream header
    assert [len(w.data) // (32 * 1024) for w in data] == [2, 2, 2, 2, 1]
    assert all(len(w.data) <= JOIN_WRITE_LIMIT for w in data)
    objs = of_type(s.p.events(s.p.client), ev.ObjectReceived)
    assert [bytes(o.record.payload) for o in objs] == payloads
    assert [o.location for o in objs] == [L(0, o) for o in range(len(payloads))]


def test_a_large_run_of_small_objects_shares_writes() -> None:
    """Objects of a large run smaller than half of JOIN_WRITE_BYTES (q8's 16.6 KiB) share
    joined writes of at most JOIN_WRITE_LIMIT, in order: the per-write cost (scheduler,
    qh3 call) is paid per 64 KiB, not per object; every object arrives once, intact."""
    from kvcs.moqt.actions import SendStreamData
    from kvcs.moqt.datastreams import JOIN_RUN_BELOW, JOIN_WRITE_LIMIT

    s = Served()
    s.p.client.subscribe(NS, b"t")
    s.run()
    s.p.wire.clear()
    payloads = [bytes([o % 251]) * (17_000 + o) for o in range(JOIN_RUN_BELOW // 17_000 + 2)]
    run = [CachedObject(0, o, 0, 10, 0, (), memoryview(p)) for o, p in enumerate(payloads)]
    run.append(CachedObject(0, len(payloads), 0, 10, wire.ObjectStatus.END_OF_GROUP, (), b""))
    s.track.extend(run)
    s.p.pump()
    writes = [a for n_, a in s.p.wire if n_ == "client" and isinstance(a, SendStreamData)]
    data = writes[1:]  # after the stream header
    assert all(len(w.data) <= JOIN_WRITE_LIMIT for w in data)
    assert len(data) == -(-len(payloads) // 3)  # three per write (the last: the rest)
    assert data[-1].end and not any(w.end for w in data[:-1])
    objs = of_type(s.p.events(s.p.client), ev.ObjectReceived)
    got = [o for o in objs if o.record.status == wire.ObjectStatus.NORMAL]
    assert [bytes(o.record.payload) for o in got] == payloads
    assert [o.location for o in objs] == [L(0, o) for o in range(len(payloads) + 1)]


def test_objects_added_one_by_one_share_joined_writes() -> None:
    """Objects added one at a time (a producer's single publishes, each its own call
    chain) before the binding takes the session's actions go out two 32 KiB objects per
    write (Outbox.write_joined, JOIN_WRITE_LIMIT), the End of Group with the last ones;
    every object arrives once, intact, in order."""
    from kvcs.moqt.actions import SendStreamData
    from kvcs.moqt.datastreams import JOIN_WRITE_LIMIT

    s = Served()
    s.p.client.subscribe(NS, b"t")
    s.run()
    s.p.wire.clear()
    payloads = [bytes([o]) * (32 * 1024) for o in range(5)]
    for o, payload in enumerate(payloads):
        s.track.add(CachedObject(0, o, 0, 10, 0, (), memoryview(payload)))
    s.track.add(CachedObject(0, 5, 0, 10, wire.ObjectStatus.END_OF_GROUP, (), b""))
    s.p.pump()
    writes = [a for n_, a in s.p.wire if n_ == "client" and isinstance(a, SendStreamData)]
    data = writes[1:]  # after the stream header
    assert [len(w.data) // (32 * 1024) for w in data] == [2, 2, 1]
    assert all(len(w.data) <= JOIN_WRITE_LIMIT for w in data)
    assert data[-1].end and not any(w.end for w in data[:-1])
    objs = of_type(s.p.events(s.p.client), ev.ObjectReceived)
    got = [o for o in objs if o.record.status == wire.ObjectStatus.NORMAL]
    assert [bytes(o.record.payload) for o in got] == payloads
    assert [o.location for o in objs] == [L(0, o) for o in range(6)]


# ------------------------------------------------------------------ staged runs


def _subscribe_next(s: Served) -> int:
    return s.p.client.subscribe(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.next_object()))


def _server_streams(s: Served) -> dict[int, bytes]:
    """Every byte the server wrote, by stream."""
    from kvcs.moqt.actions import SendStreamData

    out: dict[int, bytes] = {}
    for name, a in s.p.wire:
        if name == "client" and isinstance(a, SendStreamData):
            out[a.stream_id] = out.get(a.stream_id, b"") + bytes(a.data)
    return out


@pytest.mark.parametrize("size", [7, 200, 40_000])
def test_objects_staged_one_by_one_go_out_byte_for_byte_as_added_one_by_one(size: int) -> None:
    def published(write: str) -> tuple[dict[int, bytes], list]:
        s = Served()
        _subscribe_next(s)
        s.run()
        for g in range(3):
            objs = [CachedObject(g, o, 0, 10, 0, (), bytes([o]) * size) for o in range(5)]
            last = wire.ObjectStatus.END_OF_TRACK if g == 2 else wire.ObjectStatus.END_OF_GROUP
            objs.append(_obj(g, 5, status=last))
            for obj in objs:
                (s.track.add if write == "add" else s.track.stage)(obj)
        return _server_streams(s), s.run()

    (added, evs_added), (staged, evs_staged) = published("add"), published("stage")
    assert staged == added
    assert locs(evs_staged) == locs(evs_added) and len(locs(evs_added)) == 18


def test_a_subscribe_while_objects_are_staged_does_not_get_them_twice() -> None:
    s = Served()
    first = _subscribe_next(s)
    s.run()
    s.track.stage(_obj(0, 0))
    s.track.stage(_obj(0, 1))
    # from 0/0 on: objects published before it went to the subscriptions there were
    # (a subscription carries what is published after it; the past is FETCH's)
    second = s.p.client.subscribe(NS, b"t", wire.Parameters(
        location_filter=wire.LocationFilter.absolute_start(0, 0)))
    evs = s.run()
    s.track.add(_obj(0, 2))
    evs += s.run()
    got = {rid: [e.location for e in of_type(evs, ev.ObjectReceived) if e.request_id == rid]
           for rid in (first, second)}
    assert got == {first: [L(0, 0), L(0, 1), L(0, 2)], second: [L(0, 2)]}
