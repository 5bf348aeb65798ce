"""Eviction (age, bytes), resource limits and hostile clients."""

from __future__ import annotations

import asyncio

import pytest

from kvcs.endpoint import MoqtRequestError
from kvcs.moqt.errors import PublishDoneCode, RequestErrorCode, SessionCode
from kvcs.moqt.wire import MAX_CACHE_DURATION, Location, LocationFilter, ObjectStatus
from kvcs.relay.links import exact_payload
from kvcs.testing import until
from kvcs.transport.testing import raw_stream_id, raw_write

from .conftest import NEXT, Env, SilentEndpoint, end_track, payload, publish_group

NS = (b"kvcs-1", b"\xaa" * 16)


async def _complete_track(env: Env, relay, pub, name: bytes, groups: int = 2,  # type: ignore[no-untyped-def]
                          per_group: int = 8, props=()) -> None:  # type: ignore[no-untyped-def]
    track = pub.create_track(NS, name, props)
    for g in range(groups):
        publish_group(pub, track, g, per_group, size=4096)
    end_track(pub, track, groups)
    c = await env.client(relay)
    res = await c.fetch(NS, name, location_filter=LocationFilter.none())
    assert len(await res.collect(timeout=5)) == groups * per_group
    await until(lambda: (relay.origin.get((NS, name)) is not None
                         and relay.origin.get((NS, name)).complete))


async def test_eviction_by_age(env: Env) -> None:
    relay = await env.relay(sweep_interval=0.05)
    pub = await env.client(relay)
    await pub.announce(NS)
    await _complete_track(env, relay, pub, b"short", props=((MAX_CACHE_DURATION, 300),))
    await _complete_track(env, relay, pub, b"long", props=((MAX_CACHE_DURATION, 60000),))
    assert relay.origin.get((NS, b"short")).max_cache_duration_ms == 300
    await until(lambda: relay.origin.get((NS, b"short")) is None, timeout=3)
    assert relay.origin.get((NS, b"long")) is not None
    assert relay.metrics.get("kvcs_relay_cache_evictions_total", reason="age") == 1
    assert relay.origin.bytes == relay.origin.get((NS, b"long")).bytes


async def test_eviction_by_bytes_lru(env: Env) -> None:
    budget = 150 * 1024
    relay = await env.relay(cache_bytes=budget)
    pub = await env.client(relay)
    await pub.announce(NS)
    await _complete_track(env, relay, pub, b"t1")  # 64 KiB each
    await _complete_track(env, relay, pub, b"t2")
    assert relay.origin.bytes == 2 * 64 * 1024
    # use t1 again (LRU), then a third track pushes the least recently used (t2) out
    c = await env.client(relay)
    res = await c.fetch(NS, b"t1", location_filter=LocationFilter.absolute_range(0, 0, 0, 1))
    await res.collect(timeout=5)
    await _complete_track(env, relay, pub, b"t3")
    assert relay.origin.bytes <= budget
    assert relay.origin.get((NS, b"t2")) is None
    assert relay.origin.get((NS, b"t1")) is not None
    assert relay.origin.get((NS, b"t3")) is not None
    assert relay.metrics.get("kvcs_relay_cache_evictions_total", reason="bytes") == 1
    assert relay.metrics.get("kvcs_relay_cache_bytes") == relay.origin.bytes


async def test_a_live_track_larger_than_the_cache_keeps_its_subscribers(env: Env) -> None:
    """A live track that outgrows the cache budget while it feeds a subscriber loses its
    oldest objects, not its subscriber: the cache stays within its budget, the subscriber
    receives every object and TRACK_ENDED (evicting the whole followed track ended it with
    PUBLISH_DONE EXPIRED "track evicted": the stalled-consumer fault scenario's failure)."""
    relay = await env.relay(cache_bytes=1 << 20)
    pub = await env.client(relay)
    await pub.announce(NS)
    track = pub.create_track(NS, b"live")
    sub = await (await env.client(relay)).subscribe(NS, b"live", location_filter=NEXT)
    for g in range(16):  # 16 groups of 128 KiB, as fast as the relay takes them
        publish_group(pub, track, g, 32, size=4096)
        await pub.drain(256 << 10)
        await asyncio.sleep(0)
        assert relay.origin.bytes <= 1 << 20
    end_track(pub, track, 16)
    objs = await sub.collect(timeout=5)
    assert sub.done is not None and sub.done.status == PublishDoneCode.TRACK_ENDED
    assert len([o for o in objs if o.payload]) == 16 * 32
    assert relay.metrics.get("kvcs_relay_cache_evictions_total", reason="bytes") == 0
    assert relay.metrics.get("kvcs_relay_cache_shed_bytes_total") >= 1 << 20


async def test_too_many_fetches_is_excessive_load(env: Env) -> None:
    relay = await env.relay(max_fetches_per_session=2)
    # the publisher never answers: each fetch the relay accepts stays open upstream (a
    # finished fetch would free its slot before the third one arrives)
    pub = await env.client(relay, endpoint_class=SilentEndpoint)
    await pub.announce(NS)
    c = await env.client(relay)
    tasks = [asyncio.create_task(c.fetch(NS, b"t", location_filter=LocationFilter.none()))
             for _ in range(3)]
    done, pending = await asyncio.wait(tasks, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    errors = [t.exception() for t in done]
    assert len(errors) == 1 and isinstance(errors[0], MoqtRequestError)
    assert errors[0].code == RequestErrorCode.EXCESSIVE_LOAD
    assert errors[0].retry_interval > 0
    for t in pending:
        t.cancel()


async def test_malformed_bytes_close_only_that_session(env: Env) -> None:
    relay = await env.relay()
    pub, track, good, _, task = await env.live_track(relay, NS, b"t")
    bad = await env.client(relay)
    sid = raw_stream_id(bad.conn, unidirectional=False)
    # SUBSCRIBE type with a length that runs past garbage, then FIN
    raw_write(bad.conn, sid, b"\x03\x00\x05\xff\xff\xff\xff\xff", end=True)
    code, _ = await asyncio.wait_for(bad.wait_closed(), 5)
    assert code == SessionCode.PROTOCOL_VIOLATION
    # a second hostile client: a data stream for an unknown alias is just ignored,
    # a second SETUP is a protocol violation
    bad2 = await env.client(relay)
    ctrl = bad2.session._control
    raw_write(bad2.conn, ctrl, b"\x2f\x00\x00\x01\x00")  # SETUP again
    code2, _ = await asyncio.wait_for(bad2.wait_closed(), 5)
    assert code2 == SessionCode.PROTOCOL_VIOLATION
    # the others continue undisturbed
    for g in range(3):
        publish_group(pub, track, g, 4)
    end_track(pub, track, 3)
    got = [o for o in await task if o.status == ObjectStatus.NORMAL]
    assert len(got) == 12
    assert not pub.is_closed and not good.is_closed


async def test_immutability_violation_closes_the_publisher(env: Env) -> None:
    relay = await env.relay()
    pub, track, c, sub, task = await env.live_track(relay, NS, b"t")
    publish_group(pub, track, 0, 4, end_of_group=False)
    cached = relay.origin.get((NS, b"t"))
    await until(lambda: cached.get(Location(0, 3)) is not None)
    # the publisher sends a different payload at 0/1 on a second subgroup stream
    (rid,) = list(pub.server._subs)
    s = pub.session
    sid = s.open_subgroup(rid, 0, 1, 128)
    s.write_object(sid, 1, b"EVIL" * 100)
    pub.flush()
    code, _ = await asyncio.wait_for(pub.wait_closed(), 5)
    assert code == SessionCode.PROTOCOL_VIOLATION
    got = await task
    assert all(bytes(o.payload) == payload(o.group_id, o.object_id, 2048) for o in got)
    assert sub.done is not None and sub.done.status in (0x0, 0x4)  # INTERNAL / GOING_AWAY
    assert relay.metrics.get("kvcs_relay_protocol_errors_total") == 1
    assert relay.origin.get((NS, b"t")) is None  # incomplete: dropped
    # the subscriber's session is fine
    with pytest.raises(MoqtRequestError):
        await c.subscribe(NS, b"t")  # no publisher any more -> DOES_NOT_EXIST


def test_exact_payload_copies_views_that_pin_larger_buffers() -> None:
    chunk = bytes(60000)
    view = memoryview(chunk)[100:100 + 32768]
    kept = exact_payload(view)
    assert type(kept) is bytes and kept == view  # a copy: the 60000-byte chunk is free
    whole = memoryview(bytes(32768))
    assert exact_payload(whole) is whole  # already exact: kept as the zero-copy view
    near = memoryview(bytes(33000))[:32768]
    assert exact_payload(near) is near  # within 1/8: not worth a copy
    data = b"x" * 10
    assert exact_payload(data) is data


async def test_cache_memory_is_bounded_by_its_payload_bytes(env: Env) -> None:
    """What the relay caches pins no more than 1/8 beyond the payload bytes it counts."""
    relay = await env.relay()
    pub, track, _, _, task = await env.live_track(relay, NS, b"t")
    for g in range(4):
        for o in range(16):
            pub.publish(track, g, o, bytes([o]) * 32768)
        pub.publish(track, g, 16, b"", status=ObjectStatus.END_OF_GROUP)
    pub.publish(track, 4, 0, b"", status=ObjectStatus.END_OF_TRACK)
    assert len([o for o in await task if o.status == ObjectStatus.NORMAL]) == 64
    cached = relay.origin.get((NS, b"t"))
    assert cached is not None
    pinned = 0
    for obj in cached.objects(Location(0, 0)):
        p = obj.payload
        pinned += len(p.obj) if isinstance(p, memoryview) else len(p)  # type: ignore[arg-type]
    assert cached.bytes == 64 * 32768
    assert pinned <= cached.bytes * 9 // 8
