"""kvcs MOQT publisher -> moq.Server (moq-dev/moq relay) -> kvcs MOQT subscriber, draft 22.

kvcs offers only ALPN ``moqt-22``, so moq.Server speaks draft 22 to it. After our SETUP the
moq server opens a SUBSCRIBE_NAMESPACE (empty prefix) and a PUBLISH_NAMESPACE per broadcast
on its own bidi streams; the Endpoint must answer both with REQUEST_OK.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("moq")

from moq_helpers import FfiServer

from kvcs.endpoint import Endpoint, ReceivedObject, Subscription
from kvcs.moqt.track import Track
from kvcs.moqt.wire import (
    LocationFilter,
    ObjectStatus,
    Parameters,
    PublishNamespace,
    SubscribeNamespace,
)
from kvcs.transport import QuicSettings

pytestmark = pytest.mark.interop

NS = (b"interop", b"kvcs")
NAME = b"video"
OBJECTS = 8


def payload(g: int, o: int) -> bytes:
    """Deterministic object payload."""
    return f"{g}/{o}|".encode() * (50 + 7 * o)


def publish_group(ep: Endpoint, track: Track, g: int, objs: range) -> None:
    """Publish objects ``objs`` of group ``g``; End of Group after the last object."""
    for o in objs:
        ep.publish(track, g, o, payload(g, o))
    if objs.stop == OBJECTS:
        ep.publish(track, g, OBJECTS, b"", status=ObjectStatus.END_OF_GROUP)


@pytest.fixture
async def server() -> AsyncIterator[FfiServer]:
    async with FfiServer() as srv:
        yield srv
    assert srv.session_errors == []


async def connect(srv: FfiServer, opened: list[Endpoint]) -> Endpoint:
    ep = await Endpoint.connect(f"moqt://127.0.0.1:{srv.port}/", verify=False,
                                settings=QuicSettings.loopback())
    opened.append(ep)
    return ep


async def close_all(opened: list[Endpoint]) -> None:
    for ep in opened:
        ep.close()
    for ep in opened:
        await asyncio.wait_for(ep.wait_closed(), 5)


async def read(sub: Subscription, n: int, timeout: float = 5.0) -> list[ReceivedObject]:
    """The first ``n`` normal objects of a subscription."""
    out: list[ReceivedObject] = []

    async def run() -> None:
        async for obj in sub:
            if obj.status == ObjectStatus.NORMAL:
                out.append(obj)
                if len(out) == n:
                    return

    await asyncio.wait_for(run(), timeout)
    return out


def locations(objs: list[ReceivedObject]) -> list[tuple[int, int]]:
    """Sorted Locations; groups travel on separate streams, so they may interleave, but
    objects of one group must arrive in order."""
    for g in {o.group_id for o in objs}:
        ids = [o.object_id for o in objs if o.group_id == g and not o.fill]
        assert ids == sorted(ids), f"group {g} out of order: {ids}"
    return sorted((o.group_id, o.object_id) for o in objs)


def check_payloads(objs: list[ReceivedObject]) -> None:
    for o in objs:
        assert bytes(o.payload) == payload(o.group_id, o.object_id), o.location


async def test_live_late_join_and_fetch(server: FfiServer) -> None:
    opened: list[Endpoint] = []
    try:
        pub = await connect(server, opened)
        assert pub.conn.info is not None and pub.conn.info.alpn == "moqt-22"
        assert pub.peer_setup is not None and pub.peer_setup.implementation == "moq-lite-rs"
        await pub.announce(NS)
        track = pub.create_track(NS, NAME)

        # live: subscribed before anything is published
        sub_ep = await connect(server, opened)
        live = await sub_ep.subscribe(NS, NAME, location_filter=LocationFilter.next_object())
        for g in range(3):
            publish_group(pub, track, g, range(OBJECTS))
        got = await read(live, 3 * OBJECTS)
        assert locations(got) == [(g, o) for g in range(3) for o in range(OBJECTS)]
        check_payloads(got)

        # late join while the publisher is connected, in the middle of group 3: a fill of
        # the current group (Relative Start 1) gives its start, the live part the rest
        publish_group(pub, track, 3, range(3))
        await asyncio.sleep(0.2)
        late_ep = await connect(server, opened)
        late = await late_ep.subscribe(
            NS, NAME, location_filter=LocationFilter.next_object(),
            fill=Parameters(location_filter=LocationFilter.relative_start(1)))
        assert late.largest is not None and late.largest.group == 3
        publish_group(pub, track, 3, range(3, OBJECTS))
        publish_group(pub, track, 4, range(OBJECTS))
        got = await read(late, 2 * OBJECTS)
        assert locations(got) == [(g, o) for g in (3, 4) for o in range(OBJECTS)]
        assert any(o.fill for o in got) and not all(o.fill for o in got)
        check_payloads(got)
        got = await read(live, 2 * OBJECTS)  # the first subscriber saw it all live
        assert locations(got) == [(g, o) for g in (3, 4) for o in range(OBJECTS)]

        # single-group FETCH of a past group
        res = await late_ep.fetch(NS, NAME,
                                  location_filter=LocationFilter.absolute_group_end(1, 0, 0))
        objs = [o for o in await res.collect(5) if o.status == ObjectStatus.NORMAL]
        assert locations(objs) == [(1, o) for o in range(OBJECTS)]
        check_payloads(objs)

        # the moq server asked each Endpoint for its namespaces (SUBSCRIBE_NAMESPACE, empty
        # prefix) and announced ours to the subscribers (PUBLISH_NAMESPACE); each request got
        # REQUEST_OK and stays open (unanswered, the server re-announces: one request each)
        await asyncio.sleep(0.3)
        for ep in (pub, sub_ep, late_ep):
            assert list(ep.namespace_watches.values()) == [()]
            for rid in ep.namespace_watches:
                req = ep.session.subscription_info(rid)
                assert isinstance(req.message, SubscribeNamespace)
                assert req.responded and req.established and not req.finished
        for ep in (sub_ep, late_ep):
            assert list(ep.peer_namespaces.values()) == [NS]
            for rid in ep.peer_namespaces:
                req = ep.session.subscription_info(rid)
                assert isinstance(req.message, PublishNamespace)
                assert req.responded and req.established and not req.finished
    finally:
        await close_all(opened)
