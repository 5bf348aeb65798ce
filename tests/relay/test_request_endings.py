"""How requests end through a relay: a call abandoned before its answer withdraws its
request on both ends, and a subscription ends only after everything it carried."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from kvcs.endpoint import Endpoint
from kvcs.moqt.errors import PublishDoneCode
from kvcs.moqt.track import CachedObject, Track
from kvcs.moqt.wire import Location, ObjectStatus, SubgroupHeader, SubgroupWriter
from kvcs.relay import Relay
from kvcs.testing import until
from kvcs.transport.testing import raw_stream_id, raw_write

from .conftest import NEXT, WHOLE, Env, SilentEndpoint, payload

NS = (b"endings",)

CALLS: dict[str, Callable[[Endpoint], Awaitable[object]]] = {
    "subscribe": lambda ep: ep.subscribe(NS, b"t", location_filter=NEXT, fill=WHOLE),
    "fetch": lambda ep: ep.fetch(NS, b"t"),
    "track_status": lambda ep: ep.track_status(NS, b"t"),
}


def _relay_requests(relay: Relay) -> int:
    return sum(p.open_requests() for p in relay.sessions.values())


@pytest.mark.parametrize("call", list(CALLS))
async def test_a_call_abandoned_before_its_answer_withdraws_the_request(
        env: Env, call: str) -> None:
    """A caller that gives up waiting (a timeout cancels the call) leaves no request
    behind: the endpoint cancels it, so the relay forgets it too."""
    relay = await env.relay()
    pub = await env.client(relay, endpoint_class=SilentEndpoint)  # never answers
    await pub.announce(NS)
    consumer = await env.client(relay)
    baseline = _relay_requests(relay)  # the publisher's PUBLISH_NAMESPACE
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(CALLS[call](consumer), 0.3)
    await until(lambda: consumer.session.open_requests == 0)
    await until(lambda: _relay_requests(relay) == baseline)
    assert not consumer.is_closed


def test_end_of_track_ahead_of_its_group_does_not_complete_the_track() -> None:
    """A relay may get a group's End of Track before the group's objects (they travel on
    other streams): the group stays open, and the track is complete only once they are
    all in. (Closing the group at once made the relay send PUBLISH_DONE early and drop
    the objects still in flight, the last End of Group among them.)"""
    track = Track(NS, b"t")  # a relay's cached copy: objects arrive in any order
    track.add(CachedObject(0, 5, 0, 128, ObjectStatus.END_OF_TRACK, (), b""))
    assert track.end_of_track == Location(0, 5)
    assert not track.group_closed(0) and not track.known_until_end()
    for o in range(4):
        track.add(CachedObject(0, o, 0, 128, ObjectStatus.NORMAL, (), b"x"))
    assert not track.group_closed(0) and not track.known_until_end()
    track.add(CachedObject(0, 4, 0, 128, ObjectStatus.END_OF_GROUP, (), b""))
    assert track.group_closed(0) and track.known_until_end()


async def test_end_of_track_overtaking_its_group_loses_nothing(env: Env) -> None:
    """A KVCS publisher ends a track with End of Group then End of Track (the next Object
    ID), and a publisher FINs a stream after End of Group, so End of Track travels on a
    stream of its own and may overtake the group. The relay then keeps the track open
    until the group is in: the subscriber gets every object, then PUBLISH_DONE (before,
    the relay ended the subscription at once and the group still in flight was lost)."""
    n = 3
    relay = await env.relay()
    pub = await env.client(relay, endpoint_class=SilentEndpoint)  # answers by hand
    await pub.announce(NS)
    consumer = await env.client(relay)
    subscribing = asyncio.create_task(consumer.subscribe(NS, b"t", location_filter=NEXT))
    await until(lambda: bool(pub.requests))
    alias = pub.session.subscribe_ok(pub.requests[0].request_id)
    pub.flush()
    sub = await subscribing
    # End of Track first, on its own stream; the group's objects and End of Group later
    tail = SubgroupWriter(SubgroupHeader(alias, 0, 0, None))
    raw_write(pub.conn, raw_stream_id(pub.conn, unidirectional=True),
              tail.header_bytes() + tail.object_prefix(n + 1, 0, ObjectStatus.END_OF_TRACK),
              end=True)
    await asyncio.sleep(0.1)
    assert not sub.finished
    group = SubgroupWriter(SubgroupHeader(alias, 0, 0, None))
    data = group.header_bytes()
    for o in range(n):
        data += group.object_prefix(o, 512) + payload(0, o, 512)
    data += group.object_prefix(n, 0, ObjectStatus.END_OF_GROUP)
    raw_write(pub.conn, raw_stream_id(pub.conn, unidirectional=True), data, end=True)
    got = await sub.collect(timeout=10)
    assert sorted((o.object_id, o.status) for o in got) == [
        *((o, ObjectStatus.NORMAL) for o in range(n)), (n, ObjectStatus.END_OF_GROUP),
        (n + 1, ObjectStatus.END_OF_TRACK)]
    assert all(bytes(o.payload) == payload(0, o.object_id, 512) for o in got[:n] if not o.status)
    assert sub.done is not None and sub.done.status == PublishDoneCode.TRACK_ENDED
    cached = relay.origin.get((NS, b"t"))
    assert cached is not None and cached.complete and cached.count == n + 2


SEQUENTIAL_FETCHES = 3000
"""More than the ~2,600 FETCHes after which a qh3 session was once seen to stop granting
stream credit (each FETCH takes a bidirectional and a unidirectional stream)."""


async def test_thousands_of_sequential_fetches_on_one_session(env: Env) -> None:
    """A long-lived decode worker's pattern: FETCH after FETCH on one session through a
    relay. Every request ends on both ends and returns its streams' credit, so the
    session never stalls (each FETCH is bounded to 5 s) and keeps no request state."""
    relay = await env.relay()
    pub = await env.client(relay)
    await pub.announce(NS)
    track = pub.create_track(NS, b"t")
    for o in range(3):
        track.append(0, o, payload(0, o, 256))
    track.append(0, 3, b"", status=ObjectStatus.END_OF_TRACK)
    consumer = await env.client(relay)
    for i in range(SEQUENTIAL_FETCHES):
        res = await asyncio.wait_for(consumer.fetch(NS, b"t"), 5)
        got = await res.collect(timeout=5)
        assert [o.object_id for o in got] == [0, 1, 2], i
    await until(lambda: consumer.session.open_requests == 0)
    assert _relay_requests(relay) == 1  # the publisher's PUBLISH_NAMESPACE
