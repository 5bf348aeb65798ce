"""Hostile clients against a real relay over QUIC on 127.0.0.1, while a well-behaved
publisher -> relay -> consumer transfer runs: the flooding sessions are limited with the
draft's codes, the misbehaving ones closed, the good transfer finishes with identical
bytes, and the relay's session count and memory come back down once they are gone.

The hostile clients (tests/faults/hostile.py) use the public transport API with a kvcs
session plus raw bytes; the relay is kvcs.relay.Relay through kvcs.testing.LocalNet."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import kvcs
from kvcs.endpoint import Endpoint
from kvcs.moqt.config import CONTROL_MESSAGE_MAX
from kvcs.moqt.errors import PublishDoneCode, RequestErrorCode, SessionCode, StreamResetCode
from kvcs.moqt.wire import (
    ControlStreamParser,
    LocationFilter,
    ObjectStatus,
    Parameters,
    RequestError,
    RequestOk,
    SubgroupHeader,
    SubgroupWriter,
    Subscribe,
    encode_message,
    encode_vi64,
)
from kvcs.relay import Relay
from kvcs.testing import LocalNet, until
from kvcs.transport import DevCertificate, MoqtConnection

from .hostile import HostileSession, hostile_client, retry

NS = (b"good", b"ns")
GROUPS, OBJECTS, SIZE = 6, 16, 4096  # the good transfer: 384 KiB
KVCS_FILES = str(Path(kvcs.__file__).parent / "*")
IN_FLIGHT = 32
"""Requests (streams) a flooding client keeps open at once. The relay's qh3 grants 100
bidirectional streams, and its MAX_STREAMS lags behind the streams both ends have
finished (by up to ~70 measured): past the credit, streams wait for it in the client's
send scheduler, so the flood is paced by the relay's answers instead."""


def payload(g: int, o: int) -> bytes:
    head = b"%d/%d|" % (g, o)
    return (head * (SIZE // len(head) + 1))[:SIZE]


@pytest.fixture
async def net(cert: DevCertificate) -> AsyncIterator[LocalNet]:
    async with LocalNet(cert) as n:
        yield n


async def _setup(net: LocalNet) -> tuple[Relay, Endpoint, Endpoint]:
    """A relay, a publisher of NS (with a small complete track ``small``) and a consumer."""
    relay = await net.relay()
    pub = await net.client(relay)
    await pub.announce(NS)
    small = pub.create_track(NS, b"small")
    for o in range(4):
        pub.publish(small, 0, o, b"s" * 1000)
    pub.publish(small, 0, 4, b"", status=ObjectStatus.END_OF_TRACK)
    consumer = await net.client(relay)
    res = await consumer.fetch(NS, b"small", location_filter=LocationFilter.none())
    assert len(await res.collect(timeout=10)) == 4  # cached by the relay from now on
    return relay, pub, consumer


async def _good_transfer(pub: Endpoint, consumer: Endpoint, name: bytes) -> None:
    """Publish a track while the consumer subscribes to it through the relay (exactly-once
    pattern); every object arrives with identical bytes."""
    track = pub.create_track(NS, name)
    sub = await consumer.subscribe(NS, name, location_filter=LocationFilter.next_object(),
                                   fill=Parameters(location_filter=LocationFilter.none()))
    collected = asyncio.create_task(sub.collect(timeout=60))
    for g in range(GROUPS):
        for o in range(OBJECTS):
            pub.publish(track, g, o, payload(g, o))
        await pub.drain(1 << 20)
        await asyncio.sleep(0.005)  # a live track: produced while the flood goes on
    pub.publish(track, GROUPS, 0, b"", status=ObjectStatus.END_OF_TRACK)
    got = sorted((o for o in await collected if o.status == ObjectStatus.NORMAL),
                 key=lambda o: (o.group_id, o.object_id))
    assert [(o.group_id, o.object_id) for o in got] == [
        (g, o) for g in range(GROUPS) for o in range(OBJECTS)]
    assert all(bytes(o.payload) == payload(o.group_id, o.object_id) for o in got)


def _answers(h: HostileSession, stream_id: int) -> list[object]:
    return list(ControlStreamParser().feed(bytes(h.received.get(stream_id, b""))))


def _kvcs_bytes() -> int:
    """Bytes allocated by kvcs code (not by the QUIC library) still alive."""
    gc.collect()
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, KVCS_FILES)])
    return sum(s.size for s in snap.statistics("filename"))


async def _request_flood(conn: MoqtConnection, h: HostileSession, n: int) -> None:
    """Thousands of requests: SUBSCRIBEs for tracks nobody publishes, FETCHes of a real
    track, SUBSCRIBEs with the largest namespace the draft allows; then junk data
    streams (unknown Track Aliases)."""
    s = h.session
    huge = tuple(bytes([65 + i % 26]) * 127 for i in range(32))  # 32 fields, 4064 bytes
    for i in range(n):
        if s.open_requests >= IN_FLIGHT:
            conn.flush()
            await until(lambda: s.open_requests < IN_FLIGHT)
        if i % 3 == 0:
            ns = (b"nobody", b"%d" % i)
            await retry(conn, lambda: s.subscribe(ns, b"t"))  # noqa: B023 - called at once
        elif i % 3 == 1:
            await retry(conn, lambda: s.fetch(
                NS, b"small", Parameters(location_filter=LocationFilter.none())))
        else:
            await retry(conn, lambda: s.subscribe(huge, b""))
        if i % 25 == 0:
            conn.flush()
            await asyncio.sleep(0)
    for k in range(150):
        w = SubgroupWriter(SubgroupHeader(1000 + k, 0, 0, None))
        junk = w.header_bytes() + w.object_prefix(0, 100) + b"j" * 100
        await retry(conn, lambda: h.write(junk, unidirectional=True, end=True))  # noqa: B023
        if k % IN_FLIGHT == IN_FLIGHT - 1:  # each batch ends (FIN) before the next
            conn.flush()
            await asyncio.sleep(0.05)
    conn.flush()
    await until(lambda: h.answered >= n, timeout=60)


async def test_floods_are_limited_while_a_transfer_runs(net: LocalNet) -> None:
    relay, pub, consumer = await _setup(net)
    await _good_transfer(pub, consumer, b"warm-up")  # connections and caches warm
    tracemalloc.start()
    try:
        before = _kvcs_bytes()
        cache_before = relay.origin.bytes
        ca, a = await hostile_client(relay.port, str(net.cert.certfile), net.settings)
        cb, b = await hostile_client(relay.port, str(net.cert.certfile), net.settings)
        flood = asyncio.create_task(_request_flood(ca, a, 1500))
        # b: requests that never finish, each a 64 KB control message short of one byte
        head = encode_vi64(Subscribe.TYPE) + (65000).to_bytes(2, "big")
        partial = [await retry(cb, lambda: b.write(head + bytes(64_999))) for _ in range(90)]
        cb.flush()
        await _good_transfer(pub, consumer, b"during")
        await flood
        # a was limited, not closed: every request got its answer
        assert a.session.closed is None and a.answered == 1500
        assert a.rejected[RequestErrorCode.DOES_NOT_EXIST] == 1000
        assert a.events["FetchAccepted"] + a.rejected[RequestErrorCode.EXCESSIVE_LOAD] == 500
        # b: past max_control_bytes (4 MiB) the relay refuses its streams, EXCESSIVE_LOAD
        # bounded deadlines, not speed: tracemalloc is on and the machine may be loaded
        await until(lambda: sum(sid in b.ended for sid in partial) >= 20, timeout=30)
        refused = [sid for sid in partial if sid in b.ended]
        for sid in refused:
            (err,) = _answers(b, sid)
            assert isinstance(err, RequestError) and err.code == RequestErrorCode.EXCESSIVE_LOAD
        (rb,) = [p for p in relay.sessions.values() if p.session.usage.draining_streams]
        cfg = rb.session.config
        assert rb.session.usage.control_bytes <= cfg.max_control_bytes + CONTROL_MESSAGE_MAX
        assert b.session.closed is None
        # the relay forgets them once they are gone; what it cached for the good track
        # stays, nothing of the floods does
        ca.close()
        cb.close()
        await until(lambda: len(relay.sessions) == 2, timeout=30)
        cached = relay.origin.bytes - cache_before
        assert cached == GROUPS * OBJECTS * SIZE
        await asyncio.sleep(0.1)
        left = _kvcs_bytes() - before
        assert left <= 2 * cached + (256 << 10), (left, cached)
    finally:
        tracemalloc.stop()


MALFORMED = {
    "unknown message type on the control stream": (None, b"\x7e\x00\x00",
                                                    SessionCode.PROTOCOL_VIOLATION),
    "a request stream starting with a response": (
        "bidi", encode_message(RequestOk(Parameters(), ())), SessionCode.PROTOCOL_VIOLATION),
    "a request ID of the server's parity": (
        "bidi", encode_message(Subscribe(1, NS, b"t", Parameters())),
        SessionCode.INVALID_REQUEST_ID),
    "a namespace of 33 fields": (
        "bidi", encode_vi64(Subscribe.TYPE) + (70).to_bytes(2, "big") + b"\x00\x21"
        + b"\x01a" * 33 + b"\x01t\x00", SessionCode.PROTOCOL_VIOLATION),
    "an unknown data stream type": ("uni", b"\x03\x00\x00", SessionCode.PROTOCOL_VIOLATION),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_input_closes_only_the_offender(net: LocalNet, case: str) -> None:
    relay, pub, consumer = await _setup(net)
    conn, h = await hostile_client(relay.port, str(net.cert.certfile), net.settings)
    where, raw, code = MALFORMED[case]
    if where is None:  # after our SETUP on our own control stream
        h.write(raw, stream_id=h.session.control_stream_id)
    else:
        h.write(raw, unidirectional=where == "uni")
    transfer = asyncio.create_task(_good_transfer(pub, consumer, b"t"))
    conn.flush()
    await until(lambda: h.session.closed is not None)
    assert h.session.closed is not None and h.session.closed[0] == code, h.session.closed
    await transfer
    await until(lambda: len(relay.sessions) == 2)
    assert not pub.is_closed and not consumer.is_closed


async def test_malformed_track_from_a_publisher(net: LocalNet) -> None:
    """A publisher breaks its track (an object after End of Group): the relay cancels its
    upstream subscription with MALFORMED_TRACK (only that request: the publisher's session
    stays), caches nothing of the track, and ends the consumer's subscription with
    MALFORMED_TRACK."""
    relay = await net.relay()
    conn, h = await hostile_client(relay.port, str(net.cert.certfile), net.settings)
    hns = (b"hostile", b"pub")
    h.session.publish_namespace(hns)
    conn.flush()
    await until(lambda: h.events["RequestAccepted"] == 1)
    consumer = await net.client(relay)
    sub_task = asyncio.create_task(consumer.subscribe(hns, b"t"))
    await until(lambda: bool(h.requests))
    (req,) = h.requests
    alias = h.session.subscribe_ok(req.request_id)
    w = SubgroupWriter(SubgroupHeader(alias, 0, 0, None))
    sid = h.write(w.header_bytes() + w.object_prefix(0, 4) + b"good"
                  + w.object_prefix(1, 0, status=ObjectStatus.END_OF_GROUP)
                  + w.object_prefix(2, 3) + b"bad", unidirectional=True)
    conn.flush()
    sub = await sub_task
    await until(lambda: sid in h.stopped)
    assert h.stopped[sid] == StreamResetCode.MALFORMED_TRACK
    await until(lambda: [c.request_id for c in h.cancelled] == [req.request_id])
    assert h.session.closed is None  # only the request is cut off
    await sub.collect(timeout=10)
    assert relay.origin.get((hns, b"t")) is None
    assert sub.done is not None and sub.done.status == PublishDoneCode.MALFORMED_TRACK
