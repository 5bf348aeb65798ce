"""A tree of relays that behaves as one cache (issue #25), through real QUIC on loopback:
a root and edges below it; announcements travel up, requests are routed down to the edge
holding the track, each hop caches and coalesces, and the links' metrics show it."""

from __future__ import annotations

import asyncio

from kvcs.endpoint import Endpoint
from kvcs.moqt.wire import Location, LocationFilter, ObjectStatus
from kvcs.relay import Relay
from kvcs.testing import until

from .conftest import NEXT, WHOLE, Env, end_track, payload, publish_group

NS = (b"kvcs-1", b"\x42" * 16, b"\x5e" * 32, b"\x65" * 32, b"\x0a" * 16)
PREFIX = NS[:2]
NAMES = (b"manifest", b"k.raw.s0", b"v.raw.s0")
GROUPS, PER_GROUP, SIZE = 4, 8, 4096
TRACK_BYTES = GROUPS * PER_GROUP * SIZE


def _publish(pub: Endpoint) -> None:
    for name in NAMES:
        track = pub.create_track(NS, name)
        for g in range(GROUPS):
            publish_group(pub, track, g, PER_GROUP, SIZE)
        end_track(pub, track, GROUPS)


async def _fetch(ep: Endpoint, name: bytes) -> None:
    res = await ep.fetch(NS, name, location_filter=LocationFilter.none())
    got = await res.collect(timeout=10)
    assert [(o.group_id, o.object_id) for o in got] == [
        (g, o) for g in range(GROUPS) for o in range(PER_GROUP)]
    assert all(bytes(o.payload) == payload(o.group_id, o.object_id, SIZE) for o in got)


def _link(relay: Relay, what: str, link: str) -> float:
    return relay.metrics.get(f"kvcs_relay_link_{what}_total", link=link)


def _up(relay: Relay) -> str:
    return f"upstream {relay.upstream_url}"


async def test_tree_one_cache(env: Env) -> None:
    root = await env.relay()
    e1, e2, e3 = [await env.relay(upstream=root) for _ in range(3)]
    # watchers at the root and at the sibling edges, before anything is published
    watches = []
    for relay in (root, e2, e3):
        w = await env.client(relay)
        watches.append(await w.subscribe_namespace(PREFIX))
    pub = await env.client(e1)
    await pub.announce(NS)
    _publish(pub)
    for watch in watches:  # the announcement travelled up, then down the other branches
        assert await watch.next(5) == (True, NS)
    # consumers at edges 2 and 3 retrieve the manifest and K, identical bytes; three at
    # edge 2 at once share one upstream subscription per track
    cs2 = [await env.client(e2) for _ in range(3)]
    c3 = await env.client(e3)
    await asyncio.gather(*[_fetch(c, n) for c in (*cs2, c3) for n in NAMES[:2]])
    # each link carried each object once: e1 -> root once, root -> e2 once, root -> e3 once
    for relay in (e2, e3):
        assert _link(relay, "bytes_in", _up(relay)) == 2 * TRACK_BYTES
    assert _link(e1, "bytes_out", _up(e1)) == 2 * TRACK_BYTES
    assert root.metrics.get("kvcs_relay_bytes_in_total") == 2 * TRACK_BYTES
    assert root.metrics.get("kvcs_relay_bytes_out_total") == 4 * TRACK_BYTES
    assert pub.server.bytes_sent == 2 * TRACK_BYTES
    # a live subscriber at edge 3 while one is already following at edge 2: one copy
    s2 = await cs2[0].subscribe(NS, b"k.raw.s0", location_filter=NEXT, fill=WHOLE)
    s3 = await c3.subscribe(NS, b"k.raw.s0", location_filter=NEXT, fill=WHOLE)
    for sub in (s2, s3):
        got = [o for o in await sub.collect(timeout=10) if o.status == ObjectStatus.NORMAL]
        assert len(got) == GROUPS * PER_GROUP
        assert sub.done is not None and sub.done.status == 2  # TRACK_ENDED
    # publish and go: the publisher hands over to edge 1 and leaves; edge 1 keeps the
    # publication announced upstream, so a new edge finds and retrieves every track (V
    # was never pulled through the root: it comes down from edge 1)
    await pub.hand_over(NS, timeout=10)
    pub.close()
    await pub.wait_closed()
    await until(lambda: NS in e1.namespaces.retained)
    assert NS in e1.announcer.forwarded
    for watch in watches:
        assert await watch.next(0.3) is None  # still available everywhere
    e4 = await env.relay(upstream=root)
    c4 = await env.client(e4)
    w4 = await c4.subscribe_namespace(PREFIX)
    assert await w4.next(5) == (True, NS)
    for name in NAMES:
        await _fetch(c4, name)
    assert root.origin.get((NS, b"v.raw.s0")).complete
    # one copy of each track on each link: V went up from edge 1 once, for edge 4
    assert _link(e4, "bytes_in", _up(e4)) == 3 * TRACK_BYTES
    assert _link(e1, "bytes_out", _up(e1)) == 3 * TRACK_BYTES


async def test_withdrawal_travels_up(env: Env) -> None:
    root = await env.relay()
    e1, e2 = [await env.relay(upstream=root) for _ in range(2)]
    w = await env.client(e2)
    watch = await w.subscribe_namespace(PREFIX)
    pub = await env.client(e1)
    await pub.announce(NS)
    assert await watch.next(5) == (True, NS)
    pub.withdraw(NS)  # nothing held: nothing kept
    assert await watch.next(5) == (False, NS)
    await until(lambda: not e1.announcer.forwarded and not root.publishers)
    pub2 = await env.client(e2)  # at the watcher's own edge, then gone with its session
    ns2 = (*PREFIX, b"\x01")
    await pub2.announce(ns2)
    assert await watch.next(5) == (True, ns2)
    await until(lambda: ns2 in root.publishers)
    pub2.close()
    assert await watch.next(5) == (False, ns2)
    await until(lambda: ns2 not in root.publishers)


async def test_several_upstreams_tried_in_order(env: Env) -> None:
    """An edge lists two upstream relays: the first that answers is used; when it goes,
    the edge moves to the other one and announces its namespaces there."""
    a, b = await env.relay(), await env.relay()
    dead = await env.relay()
    dead_url = f"moqt://127.0.0.1:{dead.port}/"
    await dead.stop(grace=0)
    env.relays.remove(dead)
    urls = [f"moqt://127.0.0.1:{r.port}/" for r in (a, b)]
    edge = await env.relay(upstream=urls[0], upstream_linger=0, upstream_timeout=1.0)
    edge.config.upstream = [dead_url, *urls]  # the first does not answer
    pub = await env.client(edge)
    await pub.announce(NS)
    await until(lambda: NS in a.publishers)
    # reconnecting goes through the list in order: the dead one, then a
    await a.stop(grace=0)
    env.relays.remove(a)
    await until(lambda: edge.upstream_url == urls[1] and NS in b.publishers, 15)
    c = await env.client(b)
    track = pub.create_track(NS, b"k.raw.s0")
    publish_group(pub, track, 0, PER_GROUP, SIZE)
    end_track(pub, track, 1)
    res = await c.fetch(NS, b"k.raw.s0", location_filter=LocationFilter.none())
    got = await res.collect(timeout=10)
    assert [bytes(o.payload) for o in got] == [payload(0, o, SIZE) for o in range(PER_GROUP)]
    assert edge.metrics.get("kvcs_relay_upstream_reconnects_total") == 1


async def test_three_levels(env: Env) -> None:
    """root <- mid <- edge A, root <- edge B: a publication at edge A is announced two hops
    up and found and retrieved at edge B, three hops away."""
    root = await env.relay()
    mid = await env.relay(upstream=root)
    edge_a = await env.relay(upstream=mid)
    edge_b = await env.relay(upstream=root)
    w = await env.client(edge_b)
    watch = await w.subscribe_namespace(PREFIX)
    pub = await env.client(edge_a)
    await pub.announce(NS)
    _publish(pub)
    assert await watch.next(5) == (True, NS)
    await _fetch(w, b"k.raw.s0")
    for relay in (edge_a, mid, root, edge_b):  # each hop holds a copy
        track = relay.origin.get((NS, b"k.raw.s0"))
        assert track is not None and track.complete and track.bytes == TRACK_BYTES
    assert _link(edge_a, "bytes_out", _up(edge_a)) == TRACK_BYTES
    assert _link(mid, "bytes_out", _up(mid)) == TRACK_BYTES
    pub.close()  # edge A holds what was pulled, complete: it keeps the publication
    await pub.wait_closed()
    await until(lambda: NS in edge_a.namespaces.retained)
    assert await watch.next(0.3) is None


async def test_join_mid_layer_shares_the_upstream_subscription(env: Env) -> None:
    """Live: a consumer at edge 2 follows a track published at edge 1; a second one joins
    at edge 2 while a group is half produced. Both get every object once; edge 2's link
    to the root carried one copy."""
    root = await env.relay()
    e1, e2 = [await env.relay(upstream=root) for _ in range(2)]
    pub = await env.client(e1)
    await pub.announce(NS)
    # the announcement reaches the root through edge 1 on its own time: the first subscribe
    # at edge 2 failed with DOES_NOT_EXIST when it overtook it (make test at load 13)
    await until(lambda: NS in root.publishers)
    track = pub.create_track(NS, b"k.raw.s0")
    first, second = await env.client(e2), await env.client(e2)
    s1 = await first.subscribe(NS, b"k.raw.s0", location_filter=NEXT, fill=WHOLE)
    t1 = asyncio.create_task(s1.collect(timeout=15))
    publish_group(pub, track, 0, PER_GROUP, SIZE)
    for o in range(PER_GROUP // 2):
        pub.publish(track, 1, o, payload(1, o, SIZE))
    await until(lambda: (c := e2.origin.get((NS, b"k.raw.s0"))) is not None
                and c.get(Location(1, PER_GROUP // 2 - 1)) is not None)
    s2 = await second.subscribe(NS, b"k.raw.s0", location_filter=NEXT, fill=WHOLE)
    t2 = asyncio.create_task(s2.collect(timeout=15))
    for o in range(PER_GROUP // 2, PER_GROUP):
        pub.publish(track, 1, o, payload(1, o, SIZE))
    pub.publish(track, 1, PER_GROUP, b"", status=ObjectStatus.END_OF_GROUP)
    end_track(pub, track, 2)
    for got in await asyncio.gather(t1, t2):
        normal = [(o.group_id, o.object_id) for o in got if o.status == ObjectStatus.NORMAL]
        assert sorted(normal) == [(g, o) for g in range(2) for o in range(PER_GROUP)]
        assert len(normal) == len(set(normal))
        assert all(bytes(o.payload) == payload(o.group_id, o.object_id, SIZE)
                   for o in got if o.status == ObjectStatus.NORMAL)
    assert _link(e2, "bytes_in", _up(e2)) == 2 * PER_GROUP * SIZE
    assert pub.server.bytes_sent == 2 * PER_GROUP * SIZE


async def test_upstream_link_on_its_own_library_and_controller(env: Env) -> None:
    """An edge whose upstream link runs aioquic with the ``bbr`` controller (a link across
    sites) while its own clients use the net's library: a publication at the edge is
    retrieved at the root over that link, every byte identical."""
    root = await env.relay()
    edge = await env.relay(upstream=root, upstream_quic_backend="aioquic",
                           upstream_congestion_control="bbr")
    assert (edge.upstream_settings.library, edge.upstream_settings.congestion_control) == (
        "aioquic", "bbr")
    assert edge.settings.library == env.settings.library
    watch = await (await env.client(root)).subscribe_namespace(PREFIX)
    pub = await env.client(edge)
    await pub.announce(NS)
    _publish(pub)
    assert await watch.next(5) == (True, NS)
    consumer = await env.client(root)
    await asyncio.gather(*[_fetch(consumer, n) for n in NAMES])
    assert _link(edge, "bytes_out", _up(edge)) == 3 * TRACK_BYTES
