"""Publications that outlive their publisher (issue #16) and per-object MAX_CACHE_DURATION
(issue #15), through real QUIC and, for the track model, sans-IO."""

from __future__ import annotations

import asyncio

import pytest

from kvcs.endpoint import Endpoint, FetchResult, HandOverError, MoqtRequestError
from kvcs.moqt.errors import RequestErrorCode
from kvcs.moqt.track import CachedObject, Track
from kvcs.moqt.wire import (
    END_OF_UNKNOWN_RANGE,
    MAX_CACHE_DURATION,
    Location,
    LocationFilter,
    ObjectStatus,
)
from kvcs.relay import Relay
from kvcs.testing import until

from .conftest import NEXT, WHOLE, Env, end_track, payload, publish_group

NS = (b"kvcs-1", b"\x42" * 16, b"\x5e" * 32, b"\x65" * 32, b"\x07" * 16)
PREFIX = NS[:4]


def _props(duration_ms: int) -> tuple[tuple[int, int], ...]:
    return ((MAX_CACHE_DURATION, duration_ms),)


def _publish_whole(pub: Endpoint, name: bytes, duration_ms: int, groups: int = 3,
                   per_group: int = 4) -> None:
    track = pub.create_track(NS, name, _props(duration_ms))
    for g in range(groups):
        publish_group(pub, track, g, per_group)
    end_track(pub, track, groups)


async def _fetch_all(ep: Endpoint, name: bytes, groups: int = 3,
                     per_group: int = 4) -> FetchResult:
    res = await ep.fetch(NS, name, location_filter=LocationFilter.none())
    got = await res.collect(timeout=5)
    assert [(o.group_id, o.object_id) for o in got] == [
        (g, o) for g in range(groups) for o in range(per_group)]
    assert all(bytes(o.payload) == payload(o.group_id, o.object_id) for o in got)
    return res


async def _refused(coro: object, code: int = RequestErrorCode.DOES_NOT_EXIST) -> None:
    with pytest.raises(MoqtRequestError) as info:
        await coro  # type: ignore[misc]
    assert info.value.code == code


async def _gone_everywhere(watches: list, relays: list[Relay], timeout: float) -> None:
    for watch in watches:
        assert await watch.next(timeout) == (False, NS)
    for relay in relays:
        await until(lambda r=relay: not r.namespaces.retained and not r.origin.tracks, 2)  # type: ignore[misc]


async def test_completed_publication_outlives_its_publisher(env: Env) -> None:
    """Publish, hand over, exit: a consumer arriving later discovers and retrieves the
    publication from the relay and from a relay chained behind it, until its
    MAX_CACHE_DURATION has passed; then it is withdrawn everywhere."""
    a = await env.relay(sweep_interval=0.05)
    b = await env.relay(upstream=a, sweep_interval=0.05)
    pub = await env.client(a)
    await pub.announce(NS)
    duration = 2500
    for name in (b"manifest", b"k.raw.s0", b"v.raw.s0"):
        _publish_whole(pub, name, duration)
    # nobody pulled anything yet: the hand-over makes relay A pull every track
    assert not a.origin.tracks
    await pub.hand_over(NS, timeout=5)
    assert all(a.origin.get((NS, n)).complete for n in (b"manifest", b"k.raw.s0", b"v.raw.s0"))
    assert pub.server.active == 0  # nothing came back to the publisher (Forward 0)
    pub.close()
    await pub.wait_closed()
    await until(lambda: not a.publishers)
    assert NS in a.namespaces.retained
    assert a.metrics.get("kvcs_relay_retained_namespaces") == 1
    # consumers arriving afterwards, at A and at B (chained behind A)
    watches = []
    for relay in (a, b):
        c = await env.client(relay)
        watch = await c.subscribe_namespace(PREFIX)
        assert await watch.next(3) == (True, NS)
        watches.append(watch)
        for name in (b"manifest", b"k.raw.s0", b"v.raw.s0"):
            res = await _fetch_all(c, name)
            # A holds the track complete: FETCH_OK says End Of Track (B, pulling it from A
            # for this FETCH, cannot know it yet)
            assert res.ok is not None and res.ok.end_of_track == (relay is a)
        sub = await c.subscribe(NS, b"k.raw.s0", location_filter=NEXT, fill=WHOLE)
        assert len([o for o in await sub.collect(timeout=5)
                    if o.status == ObjectStatus.NORMAL]) == 12
        assert sub.done is not None and sub.done.status == 2  # TRACK_ENDED
        status = await c.track_status(NS, b"v.raw.s0")
        assert status.params.largest_object == Location(3, 0)
        await _refused(c.fetch(NS, b"kv.q8.s0", location_filter=LocationFilter.none()))
    assert b.origin.get((NS, b"k.raw.s0")).complete
    # MAX_CACHE_DURATION later every object has aged out: NAMESPACE_DONE at A and at B
    await _gone_everywhere(watches, [a, b], timeout=duration / 1000 + 3)
    late = await env.client(b)
    await _refused(late.fetch(NS, b"k.raw.s0", location_filter=LocationFilter.none()))
    watch = await late.subscribe_namespace(PREFIX)
    assert await watch.next(0.3) is None
    assert a.metrics.get("kvcs_relay_cache_evictions_total", reason="age") == 3


async def test_only_what_the_relay_holds_outlives_the_publisher(env: Env) -> None:
    """Without a hand-over the relay keeps what it pulled; other tracks of the namespace
    do not exist for it any more. An incomplete publication is withdrawn."""
    relay = await env.relay()
    pub = await env.client(relay)
    await pub.announce(NS)
    _publish_whole(pub, b"k.raw.s0", 60000)
    _publish_whole(pub, b"v.raw.s0", 60000)
    c = await env.client(relay)
    await _fetch_all(c, b"k.raw.s0")  # only k is ever pulled
    await until(lambda: relay.origin.get((NS, b"k.raw.s0")).complete)
    pub.close()
    await pub.wait_closed()
    await until(lambda: not relay.publishers)
    watch = await c.subscribe_namespace(PREFIX)
    assert await watch.next(3) == (True, NS)
    await _fetch_all(c, b"k.raw.s0")
    await _refused(c.fetch(NS, b"v.raw.s0", location_filter=LocationFilter.none()))
    await _refused(c.subscribe(NS, b"v.raw.s0"))
    # a publisher that leaves mid-production takes its namespace with it
    ns2 = (*PREFIX, b"\x08" * 16)
    pub2 = await env.client(relay)
    await pub2.announce(ns2)
    track = pub2.create_track(ns2, b"k.raw.s0")
    publish_group(pub2, track, 0, 4)
    sub = await c.subscribe(ns2, b"k.raw.s0", location_filter=NEXT, fill=WHOLE)
    assert await watch.next(3) == (True, ns2)
    await until(lambda: relay.origin.get((ns2, b"k.raw.s0")).count >= 4)
    pub2.close()
    assert await watch.next(3) == (False, ns2)
    await sub.collect(timeout=3)
    assert relay.origin.get((ns2, b"k.raw.s0")) is None
    assert relay.namespaces.retained == {NS}


async def test_hand_over_needs_ended_tracks_and_a_relay(env: Env) -> None:
    relay = await env.relay()
    pub = await env.client(relay)
    await pub.announce(NS)
    track = pub.create_track(NS, b"k.raw.s0")
    publish_group(pub, track, 0, 2)
    with pytest.raises(HandOverError, match="End of Track"):
        await pub.hand_over(NS)
    end_track(pub, track, 1)
    await pub.hand_over(NS, timeout=5)
    # the relay loses the track (evicted for space): the next hand-over says so
    relay.origin.budget = 1
    relay.origin.enforce_budget()
    relay.origin.budget = 1 << 30
    assert relay.origin.get((NS, b"k.raw.s0")) is None
    await pub.hand_over(NS, timeout=5)  # the relay pulls it again


async def test_objects_age_out_one_by_one_while_the_track_is_fed(env: Env) -> None:
    """MAX_CACHE_DURATION is per object: old objects leave the cache (and FETCH answers
    End of Unknown Range for them: they existed) while newer ones keep arriving and are
    served; once the last object aged out, the namespace of the finished publication is
    withdrawn."""
    relay = await env.relay(sweep_interval=0.02)
    pub = await env.client(relay)
    await pub.announce(NS)
    track = pub.create_track(NS, b"k.raw.s0", _props(300))
    live = await env.client(relay)
    sub = await live.subscribe(NS, b"k.raw.s0", location_filter=NEXT, fill=WHOLE)
    watch = await live.subscribe_namespace(PREFIX)
    assert await watch.next(3) == (True, NS)
    cached = relay.origin.get((NS, b"k.raw.s0"))
    for g in range(8):  # one group every 100 ms: 0.8 s, well over 300 ms
        publish_group(pub, track, g, 4)
        await until(lambda g=g: cached.group_closed(g))  # type: ignore[misc]
        await asyncio.sleep(0.1)
    assert cached.expired_objects > 0 and relay.links.feeding(cached) is not None
    assert cached.gone(Location(0, 0)) and cached.get(Location(7, 0)) is not None
    assert relay.metrics.get("kvcs_relay_cache_expired_objects_total") > 0
    c = await env.client(relay)
    res = await c.fetch(NS, b"k.raw.s0", location_filter=LocationFilter.none())
    got = await res.collect(timeout=5)
    served = {o.group_id for o in got}
    assert 7 in served and 0 not in served
    assert all(bytes(o.payload) == payload(o.group_id, o.object_id) for o in got)
    # the gone objects are reported as unknown (never as non-existent), before the first
    # object that is still served
    assert res.markers and all(m.kind == END_OF_UNKNOWN_RANGE for m in res.markers)
    first = min(Location(o.group_id, o.object_id) for o in got)
    assert Location(res.markers[0].group_id, res.markers[0].object_id) < first
    assert Location(res.markers[-1].group_id, res.markers[-1].object_id) >= Location(0, 3)
    # the subscriber still got every object live, once
    end_track(pub, track, 8)
    delivered = [o for o in await sub.collect(timeout=5) if o.status == ObjectStatus.NORMAL]
    assert sorted((o.group_id, o.object_id) for o in delivered) == [
        (g, o) for g in range(8) for o in range(4)]
    await until(lambda: cached.complete)
    pub.close()
    await pub.wait_closed()
    # the publication (complete) is kept at most until its last object aged out
    assert await watch.next(3) == (False, NS)
    await until(lambda: relay.origin.get((NS, b"k.raw.s0")) is None, 2)
    assert relay.metrics.get("kvcs_relay_cache_evictions_total", reason="age") == 1
    assert not relay.namespaces.retained


def test_track_expiry_per_object_and_gone_ranges() -> None:
    now = [100.0]
    track = Track(NS, b"t", _props(1000), clock=lambda: now[0])
    for o in range(4):
        track.add(CachedObject(0, o, 0, 0, 0, (), b"x" * 10))
        now[0] += 0.4
    track.add(CachedObject(0, 4, 0, 0, ObjectStatus.END_OF_GROUP, (), b""))
    assert track.group_closed(0)
    # at 101.7: objects that arrived at 100.0 and 100.4 are older than 1 s
    assert track.expire(101.5) == 20
    assert (track.count, track.bytes, track.expired_objects) == (3, 20, 2)
    assert track.gone(Location(0, 0)) and track.gone(Location(0, 1))
    assert not track.gone(Location(0, 2)) and track.get(Location(0, 2)) is not None
    assert track.is_settled(Location(0, 1))
    assert track.last_gone(0, 0, 3) == 1 and track.last_gone(0, 2, 3) is None
    # everything ages out; the End of Group leaves its knowledge, not a gone id
    assert track.expire(200.0) == 20
    assert track.count == 0 and track.group_closed(0) and track.group_end(0) == 4
    assert track.last_gone(0, 0, 10) == 3
    # an object received again is served again
    track.add(CachedObject(0, 2, 0, 0, 0, (), b"y" * 10))
    assert not track.gone(Location(0, 2)) and track.gone(Location(0, 3))
    assert track.last_gone(0, 0, 2) == 1
    # origin tracks (the publisher's own) never expire
    origin = Track(NS, b"o", _props(1), clock=lambda: now[0], origin=True)
    origin.append(0, 0, b"z")
    assert origin.expire(now[0] + 10) == 0 and origin.expiry_cutoff() is None
