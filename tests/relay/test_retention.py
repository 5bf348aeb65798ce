"""Per-object MAX_CACHE_DURATION (issue #15), through real QUIC and, for the track model,
sans-IO."""

from __future__ import annotations

import asyncio

import pytest

from kvcs.endpoint import Endpoint, FetchResult, MoqtRequestError
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
        await until(lambda r=relay: not r.namespaces.retained and not r.cache.tracks, 2)  # type: ignore[misc]


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
    cached = relay.cache.get((NS, b"k.raw.s0"))
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
    await until(lambda: relay.cache.get((NS, b"k.raw.s0")) is None, 2)
    assert relay.metrics.get("kvcs_relay_cache_evictions_total", reason="age") == 1


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
