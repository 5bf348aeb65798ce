"""Fan-out and cache: one upstream subscription, many subscribers, late joiners."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from kvcs.endpoint import MoqtRequestError
from kvcs.moqt.errors import RequestErrorCode
from kvcs.moqt.wire import LocationFilter, ObjectStatus
from kvcs.testing import until

from .conftest import NEXT, WHOLE, Env, SilentEndpoint, end_track, payload, publish_group

NS = (b"kvcs-1", bytes(range(16)), b"\x00" * 32, b"\xff" * 32, bytes(range(16, 32)))


def check_objects(objs: list, groups: int, per_group: int, size: int = 2048) -> None:
    normal = [o for o in objs if o.status == ObjectStatus.NORMAL]
    locs = [(o.group_id, o.object_id) for o in normal]
    assert len(locs) == len(set(locs)), "an object arrived twice"
    assert sorted(locs) == [(g, o) for g in range(groups) for o in range(per_group)]
    for o in normal:
        assert bytes(o.payload) == payload(o.group_id, o.object_id, size)


async def test_fanout_one_publisher_eight_subscribers(env: Env) -> None:
    relay = await env.relay()
    pub = await env.client(relay)
    await pub.announce(NS)
    track = pub.create_track(NS, b"k.raw.s0")
    publish_group(pub, track, 0, 10)  # before anyone subscribes: delivered by fill
    subs_eps = [await env.client(relay) for _ in range(8)]
    subs = await asyncio.gather(*(ep.subscribe(NS, b"k.raw.s0", location_filter=NEXT,
                                               fill=WHOLE) for ep in subs_eps))
    tasks = [asyncio.create_task(s.collect(timeout=8)) for s in subs]
    for g in range(1, 6):
        publish_group(pub, track, g, 10)
        await pub.drain(1 << 20)
    end_track(pub, track, 6)
    results = await asyncio.gather(*tasks)
    for objs in results:
        check_objects(objs, 6, 10)
    # each object left the publisher once (fill streams carry no status objects, so
    # group 0's End of Group, published before the subscription, is not sent)
    assert pub.server.objects_sent == track.count - 1
    assert relay.metrics.get("kvcs_relay_cache_misses_total") == 1
    assert relay.metrics.get("kvcs_relay_objects_in_total") == track.count - 1
    _n_out, b_out = relay.objects_out()
    assert b_out == 8 * 60 * 2048


async def test_late_joiner_after_publisher_left(env: Env) -> None:
    relay = await env.relay()
    pub, track, _, _, task = await env.live_track(relay, NS, b"v.raw.s0")
    for g in range(4):
        publish_group(pub, track, g, 8)
    end_track(pub, track, 4)
    check_objects(await task, 4, 8)
    cached = relay.origin.get((NS, b"v.raw.s0"))
    assert cached is not None
    await until(lambda: cached.complete)
    pub.close()
    await pub.wait_closed()
    await until(lambda: not relay.publishers)
    late = await env.client(relay)
    # SUBSCRIBE + fill from cache
    sub2 = await late.subscribe(NS, b"v.raw.s0", location_filter=NEXT, fill=WHOLE)
    check_objects(await sub2.collect(timeout=5), 4, 8)
    assert sub2.done is not None and sub2.done.status == 2  # TRACK_ENDED
    # FETCH of the whole track
    res = await late.fetch(NS, b"v.raw.s0", location_filter=LocationFilter.none())
    check_objects(await res.collect(timeout=5), 4, 8)
    # a fetch of part of it
    res = await late.fetch(NS, b"v.raw.s0",
                           location_filter=LocationFilter.absolute_range(1, 2, 1, 3))
    got = [(o.group_id, o.object_id) for o in await res.collect(timeout=5)]
    assert got == [(1, o) for o in range(2, 8)] + [(2, o) for o in range(4)]
    assert relay.metrics.get("kvcs_relay_cache_hits_total") >= 3


async def test_track_status_answered_when_publisher_leaves(env: Env) -> None:
    """A TRACK_STATUS the relay forwarded to a publisher that then disconnects gets an
    error at once (it used to stay unanswered until the requester's idle timeout)."""
    relay = await env.relay()
    pub = await env.client(relay, endpoint_class=SilentEndpoint)  # never answers
    await pub.announce(NS)
    c = await env.client(relay)
    task = asyncio.create_task(c.track_status(NS, b"k.raw.s0"))
    await until(lambda: pub.requests)
    pub.close()
    with pytest.raises(MoqtRequestError) as info:
        await asyncio.wait_for(task, 5)
    assert info.value.code == RequestErrorCode.INTERNAL_ERROR
    assert "went away" in info.value.reason
    # and a request racing the publisher's departure is answered too, not left hanging
    pub2 = await env.client(relay)
    await pub2.announce(NS)
    pub2.close()
    with contextlib.suppress(MoqtRequestError):
        await asyncio.wait_for(c.track_status(NS, b"k.raw.s0"), 5)


async def test_fetch_triggers_upstream_subscription(env: Env) -> None:
    relay = await env.relay()
    pub = await env.client(relay)
    await pub.announce(NS)
    track = pub.create_track(NS, b"t")
    for g in range(3):
        publish_group(pub, track, g, 5)
    await pub.drain(0)
    c = await env.client(relay)
    res = await c.fetch(NS, b"t", location_filter=LocationFilter.none())
    got = await res.collect(timeout=5)
    check_objects(got, 3, 5)
    assert relay.metrics.get("kvcs_relay_cache_misses_total") == 1


async def test_fetch_through_relay_does_not_wait_for_the_whole_fill(env: Env) -> None:
    """The relay's upstream fill is ordered: once it delivers group 1, group 0 is known to
    be complete, so a downstream FETCH of group 0 finishes while the fill is still running
    (here the fill pauses at an object of group 1 the publisher does not know yet)."""
    relay = await env.relay()
    pub = await env.client(relay)
    await pub.announce(NS)
    track = pub.create_track(NS, b"t")
    publish_group(pub, track, 0, 4, end_of_group=False)  # objects 0..3, no End of Group
    pub.publish(track, 1, 0, payload(1, 0))
    pub.publish(track, 1, 1, payload(1, 1))
    pub.publish(track, 1, 3, payload(1, 3))  # (1, 2) unknown: the fill stops before it
    await pub.drain(0)
    c = await env.client(relay)
    res = await c.fetch(NS, b"t", location_filter=LocationFilter.absolute_group_end(0, 0, 0))
    got = [o for o in await res.collect(timeout=5) if o.payload.nbytes]
    assert [(o.group_id, o.object_id) for o in got] == [(0, o) for o in range(4)]
    assert all(bytes(o.payload) == payload(0, o.object_id) for o in got)
