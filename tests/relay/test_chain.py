"""Two relays chained: consumer at B, publisher at A, B --upstream A."""

from __future__ import annotations

import asyncio

from kvcs.moqt.wire import Location, ObjectStatus
from kvcs.testing import until

from .conftest import NEXT, WHOLE, Env, end_track, payload, publish_group

NS = (b"kvcs-1", b"\x6d" * 16, b"\x5e" * 32, b"\x65" * 32, b"\x01" * 16)
NAME = b"k.raw.s0"


async def test_chained_join_mid_production(env: Env) -> None:
    a = await env.relay()
    b = await env.relay(upstream=f"moqt://127.0.0.1:{a.port}/",
                        upstream_cafile=str(env.cert.certfile), upstream_linger=0)
    pub = await env.client(a)
    await pub.announce(NS)
    track = pub.create_track(NS, NAME)
    publish_group(pub, track, 0, 4)
    publish_group(pub, track, 1, 4)
    # an early consumer at B makes B cache groups 0..1, then leaves: B releases upstream
    c1 = await env.client(b)
    s1 = await c1.subscribe(NS, NAME, location_filter=NEXT, fill=WHOLE)
    early = [o async for o in _take(s1, 8)]
    assert {(o.group_id, o.object_id) for o in early} == {(g, o) for g in (0, 1)
                                                          for o in range(4)}
    await s1.cancel()
    await until(lambda: not b.links)
    cached_b = b.origin.get((NS, NAME))
    assert cached_b is not None and cached_b.is_settled(Location(1, 3))
    in_b_before = b.metrics.get("kvcs_relay_objects_in_total")
    # production continues; A (still subscribed to the publisher) caches groups 2..3
    publish_group(pub, track, 2, 4)
    publish_group(pub, track, 3, 4)
    await until(lambda: a.origin.get((NS, NAME)).group_closed(3))
    # a consumer joins at B mid-production
    c2 = await env.client(b)
    s2 = await c2.subscribe(NS, NAME, location_filter=NEXT, fill=WHOLE)
    task = asyncio.create_task(s2.collect(timeout=8))
    publish_group(pub, track, 4, 4)
    publish_group(pub, track, 5, 4)
    end_track(pub, track, 6)
    got = await task
    normal = [o for o in got if o.status == ObjectStatus.NORMAL]
    locs = [(o.group_id, o.object_id) for o in normal]
    assert len(locs) == len(set(locs)), "an object arrived twice"
    assert sorted(locs) == [(g, o) for g in range(6) for o in range(4)]
    for o in normal:
        assert bytes(o.payload) == payload(o.group_id, o.object_id)
    # groups 0..1 came from B's cache: B took only groups 2.. from A this time
    in_b_second = b.metrics.get("kvcs_relay_objects_in_total") - in_b_before
    fill_part = [o for o in normal if o.fill]
    live_part = [o for o in normal if not o.fill]
    assert {o.group_id for o in fill_part} >= {0, 1, 2, 3}
    assert live_part and {o.group_id for o in live_part} <= {3, 4, 5}
    assert in_b_second < 6 * 4 + 6  # not the whole track again
    assert in_b_second >= 4 * 4  # groups 2..5 came from A
    # the publisher sent each object once (A kept its one subscription)
    assert pub.server.objects_sent <= track.count
    assert s2.done is not None and s2.done.status == 2


async def _take(sub, n: int):  # type: ignore[no-untyped-def]
    count = 0
    async for o in sub:
        if o.status == ObjectStatus.NORMAL:
            yield o
            count += 1
            if count == n:
                return


async def test_namespace_discovery_through_upstream(env: Env) -> None:
    a = await env.relay()
    b = await env.relay(upstream=f"moqt://127.0.0.1:{a.port}/",
                        upstream_cafile=str(env.cert.certfile))
    watcher = await env.client(b)
    watch = await watcher.subscribe_namespace((b"kvcs-1",))
    pub = await env.client(a)
    await pub.announce(NS)
    assert await watch.next(3) == (True, NS)
    local = await env.client(b)
    ns2 = (b"kvcs-1", b"\x00\xff" * 8)
    await local.announce(ns2)
    assert await watch.next(3) == (True, ns2)
    pub.withdraw(NS)
    assert await watch.next(3) == (False, NS)
    local.close()
    assert await watch.next(3) == (False, ns2)
