"""The MOQT session over real QUIC on 127.0.0.1 (ephemeral ports), both transports.

A server (:func:`serve_endpoints`) accepts raw QUIC (``moqt://``) and WebTransport
(``https://``) on one UDP port; each test connects clients to it and closes everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from kvcs.admission import Limits
from kvcs.auth import Authorizer
from kvcs.endpoint import Endpoint, FetchResult, MoqtRequestError, serve_endpoints
from kvcs.hosting import TrackHost
from kvcs.moqt import events as ev
from kvcs.moqt.errors import RequestErrorCode, SessionCode
from kvcs.moqt.origin import Origin
from kvcs.moqt.track import CachedObject
from kvcs.moqt.wire import (
    AuthToken,
    Location,
    LocationFilter,
    ObjectStatus,
    Parameters,
    RangeFilter,
    SubgroupHeader,
    SubgroupWriter,
    Subscribe,
    encode_message,
)
from kvcs.testing import until
from kvcs.transport import DevCertificate, QuicSettings
from kvcs.transport.testing import raw_stream_id, raw_write

SETTINGS = QuicSettings.loopback()
NS = (b"kv", b"quic")
KiB = 1024


@dataclass
class Srv:
    port: int
    eps: list[Endpoint]
    cert: DevCertificate

    def url(self, scheme: str = "moqt", path: str = "/moq") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    async def connect(self, scheme: str = "moqt") -> tuple[Endpoint, Endpoint]:
        """Connect a client; returns (client endpoint, the server's endpoint for it)."""
        n = len(self.eps)
        ep = await Endpoint.connect(self.url(scheme), cafile=str(self.cert.certfile),
                                    settings=SETTINGS, timeout=5)
        await until(lambda: len(self.eps) > n)
        peer = self.eps[-1]
        await asyncio.wait_for(peer.established(), 5)
        return ep, peer


@contextlib.asynccontextmanager
async def serving(cert: DevCertificate,
                  endpoint_class: type[Endpoint] = Endpoint) -> AsyncIterator[Srv]:
    """A server whose sessions are ``endpoint_class`` endpoints, closed on exit."""
    eps: list[Endpoint] = []
    server = await serve_endpoints("127.0.0.1", 0, eps.append, certfile=str(cert.certfile),
                                   keyfile=str(cert.keyfile), settings=SETTINGS,
                                   endpoint_class=endpoint_class)
    try:
        yield Srv(server.port, eps, cert)
    finally:
        for ep in eps:
            ep.close()
        await server.aclose()


@pytest.fixture
async def srv(cert: DevCertificate) -> AsyncIterator[Srv]:
    async with serving(cert) as s:
        yield s


async def _close(*eps: Endpoint) -> None:
    for ep in eps:
        ep.close()
    for ep in eps:
        await asyncio.wait_for(ep.wait_closed(), 5)


# ----------------------------------------------------------------------------- SETUP


@pytest.mark.parametrize("scheme", ["moqt", "https"])
async def test_both_transports_exchange_setup(srv: Srv, scheme: str) -> None:
    ep, peer = await srv.connect(scheme)
    assert ep.peer_setup is not None and peer.peer_setup is not None
    assert ep.peer_setup.implementation and peer.peer_setup.implementation
    assert ep.peer_max_filter_ranges == 16
    if scheme == "moqt":
        assert peer.peer_setup.path == b"/moq"
        assert peer.peer_setup.authority == f"127.0.0.1:{srv.port}".encode()
        assert not ep.conn.is_webtransport
    else:
        assert peer.peer_setup.path is None and peer.peer_setup.authority is None
        assert ep.conn.is_webtransport
    await _close(ep)


# ------------------------------------------------------------------ the big transfer


GROUPS, PER_GROUP, SIZE = 80, 64, 32 * KiB
_BASE = os.urandom(SIZE + GROUPS * PER_GROUP * 8)


def _payload(g: int, o: int) -> memoryview:
    """A distinct 32 KiB payload per object, as a zero-copy window of one random buffer."""
    k = (g * PER_GROUP + o) * 8
    return memoryview(_BASE)[k:k + SIZE]


@pytest.mark.parametrize("scheme", ["moqt", "https"])
async def test_track_80_groups_64_objects_32k_every_byte(srv: Srv, scheme: str) -> None:
    sub_ep, pub = await srv.connect(scheme)
    track = pub.create_track(NS, b"big")
    sub = await sub_ep.subscribe(NS, b"big", location_filter=LocationFilter.next_object(),
                                 fill=Parameters(location_filter=LocationFilter.none()))

    async def produce() -> None:
        for g in range(GROUPS):
            for o in range(PER_GROUP):
                pub.publish(track, g, o, _payload(g, o))
            await pub.drain(8 << 20)
        pub.publish(track, GROUPS - 1, PER_GROUP, b"", status=ObjectStatus.END_OF_TRACK)

    prod = asyncio.create_task(produce())
    n = 0
    next_in_group = [0] * GROUPS  # groups travel on separate streams: order within each
    async for obj in sub:
        if obj.status == ObjectStatus.END_OF_TRACK:
            assert obj.location == Location(GROUPS - 1, PER_GROUP)
            continue
        g, o = obj.group_id, obj.object_id
        assert o == next_in_group[g], (g, o)
        next_in_group[g] += 1
        if obj.payload != _payload(g, o):  # every byte
            raise AssertionError(f"payload of {g}/{o} differs")
        n += 1
    await asyncio.wait_for(prod, 10)
    assert n == GROUPS * PER_GROUP
    assert next_in_group == [PER_GROUP] * GROUPS
    assert sub.done is not None and sub.done.status == 0x2
    assert sub.done.stream_count == GROUPS  # one subgroup stream per group, no fill
    assert sub.reset_streams == []
    await _close(sub_ep)


async def test_deliver_runs_to_hands_every_object_once_in_order(srv: Srv) -> None:
    """``deliver_runs_to``: the objects of a subscription are handed over in runs (those
    parsed together), every object once, in order within its group, every byte; the
    iterator then ends with the subscription."""
    sub_ep, pub = await srv.connect()
    track = pub.create_track(NS, b"runs")
    sub = await sub_ep.subscribe(NS, b"runs", location_filter=LocationFilter.next_object(),
                                 fill=Parameters(location_filter=LocationFilter.none()))
    runs: list[list[tuple[int, int, int, bytes]]] = []
    sub.deliver_runs_to(lambda objs: runs.append(
        [(o.group_id, o.object_id, o.status, bytes(o.payload)) for o in objs]))
    groups, per = 4, 64
    for g in range(groups):  # q8-sized objects, a layer's run per group
        run = [CachedObject(g, o, 0, 128, ObjectStatus.NORMAL, (), _payload(g, o)[:17000])
               for o in range(per)]
        run.append(CachedObject(g, per, 0, 128, ObjectStatus.END_OF_GROUP, (), b""))
        pub.publish_run(track, run)
    pub.publish(track, groups - 1, per + 1, b"", status=ObjectStatus.END_OF_TRACK)
    assert [o async for o in sub] == []  # every object went to the callback
    got = [x for r in runs for x in r]
    assert sorted((g, o, b) for g, o, st, b in got if st == ObjectStatus.NORMAL) == [
        (g, o, bytes(_payload(g, o)[:17000])) for g in range(groups) for o in range(per)]
    assert len(got) == groups * (per + 1) + 1  # with End of Group x 4 and End of Track
    for g in range(groups):
        ids = [o for gg, o, st, _ in got if gg == g and st != ObjectStatus.END_OF_TRACK]
        assert ids == list(range(per + 1))  # in order on the group's stream
    assert all(runs)
    await _close(sub_ep)


async def test_published_objects_go_out_at_the_end_of_the_turn_or_at_a_flush(
        srv: Srv) -> None:
    """Objects published one by one are forwarded together at the end of the loop turn,
    or at once when the publisher flushes (or drains, or closes); the subscriber gets
    every one, once, in order."""
    sub_ep, pub = await srv.connect()
    track = pub.create_track(NS, b"turn")
    sub = await sub_ep.subscribe(NS, b"turn", location_filter=LocationFilter.next_object())
    sent = pub.server.objects_sent
    for o in range(3):
        pub.publish(track, 0, o, _payload(0, o))
    assert pub.server.objects_sent == sent and track.count == 3  # stored, not yet sent
    pub.flush()
    assert pub.server.objects_sent == sent + 3  # the flush sent them, in this turn
    for o in range(3, 5):
        pub.publish(track, 0, o, _payload(0, o))
    await asyncio.sleep(0)  # the end of the turn
    assert pub.server.objects_sent == sent + 5
    pub.publish(track, 0, 5, b"", status=ObjectStatus.END_OF_TRACK)  # an end: at once
    assert pub.server.objects_sent == sent + 6
    got = [(o.object_id, bytes(o.payload)) async for o in sub]
    assert got == [(o, bytes(_payload(0, o))) for o in range(5)] + [(5, b"")]
    await _close(sub_ep)


async def test_an_iterator_stopped_while_waiting_goes_on_with_the_next_object(
        srv: Srv) -> None:
    """A subscription's iterator whose waiting caller gave up (cancelled) still yields
    every later object, once, and ends with the subscription."""
    sub_ep, pub = await srv.connect()
    track = pub.create_track(NS, b"wait")
    sub = await sub_ep.subscribe(NS, b"wait", location_filter=LocationFilter.next_object())
    with pytest.raises(TimeoutError):  # nothing was published: the wait is given up
        await asyncio.wait_for(anext(sub), 0.05)
    for o in range(3):
        pub.publish(track, 0, o, _payload(0, o))
    pub.publish(track, 0, 3, b"", status=ObjectStatus.END_OF_TRACK)
    got = [(o.object_id, bytes(o.payload)) async for o in sub]
    assert got == [(o, bytes(_payload(0, o))) for o in range(3)] + [(3, b"")]
    assert [o async for o in sub] == []  # ended: it stays ended
    await _close(sub_ep)


# ------------------------------------------------------------------- exactly once


async def test_exactly_once_join_mid_production(srv: Srv) -> None:
    sub_ep, pub = await srv.connect("moqt")
    track = pub.create_track(NS, b"live")
    groups, per = 24, 16
    joined = asyncio.Event()

    async def produce() -> None:
        for g in range(groups):
            for o in range(per):
                pub.publish(track, g, o, f"{g}:{o}".encode() * 64)
                if g == groups // 2 and o == per // 2:
                    joined.clear()
                    await asyncio.sleep(0)
                    await joined.wait()  # the subscriber joins here, mid-group
                if o % 4 == 0:
                    await asyncio.sleep(0)
            await pub.drain(1 << 20)
        pub.publish(track, groups - 1, per, b"", status=ObjectStatus.END_OF_TRACK)

    prod = asyncio.create_task(produce())
    await until(lambda: track.largest is not None
                and track.largest >= Location(groups // 2, per // 2))
    sub = await sub_ep.subscribe(NS, b"live", location_filter=LocationFilter.next_object(),
                                 fill=Parameters(location_filter=LocationFilter.none()))
    assert sub.largest is not None and sub.largest >= Location(groups // 2, per // 2)
    joined.set()
    got: list[tuple[int, int]] = []
    fill = 0
    async for obj in sub:
        if obj.status:
            continue
        got.append((obj.group_id, obj.object_id))
        assert bytes(obj.payload) == f"{obj.group_id}:{obj.object_id}".encode() * 64
        fill += obj.fill
    await asyncio.wait_for(prod, 10)
    assert len(got) == len(set(got)) == groups * per
    assert sorted(got) == [(g, o) for g in range(groups) for o in range(per)]
    largest = sub.largest
    assert fill == largest.group * per + largest.object + 1  # fill = {0,0}..Largest
    assert sub.done is not None
    await _close(sub_ep)


# -------------------------------------------------------------------------- FETCH


async def test_fetch_group_range_and_objectid_filter(srv: Srv) -> None:
    sub_ep, pub = await srv.connect("moqt")
    track = pub.create_track(NS, b"f")
    for g in range(10):
        for o in range(8):
            pub.publish(track, g, o, bytes([g, o]) * 100)
    pub.flush()
    res = await sub_ep.fetch(NS, b"f", location_filter=LocationFilter.absolute_group_end(3, 0, 2))
    assert res.ok is not None and res.ok.end_location == Location(5, 7)
    objs = await res.collect(5)
    assert [(o.group_id, o.object_id) for o in objs] == [
        (g, o) for g in range(3, 6) for o in range(8)]
    assert all(bytes(o.payload) == bytes([o.group_id, o.object_id]) * 100 for o in objs)
    n = 3
    res = await sub_ep.fetch(NS, b"f", location_filter=LocationFilter.absolute_group_end(2, 0, 1),
                             range_filters=(RangeFilter(0x26, 0, ((0, n - 1),)),))
    objs = await res.collect(5)
    assert [(o.group_id, o.object_id) for o in objs] == [
        (g, o) for g in range(2, 4) for o in range(n)]
    await _close(sub_ep)


class _StreamBeforeOk(Endpoint):
    """Answers a FETCH with its whole fetch stream first and FETCH_OK 0.2 s later."""

    def handle_request(self, e: ev.RequestReceived) -> None:
        rid = e.request_id
        sid = self.session.open_fetch_stream(rid)
        for o in range(3):
            self.session.write_fetch_object(sid, 0, 0, o, 128, bytes([o]) * 500)
        self.session.end_data_stream(sid)
        self.flush()
        # FETCH_OK only once the client has the whole stream
        asyncio.get_running_loop().call_later(
            0.2, lambda: (self.session.fetch_ok(rid, Location(0, 2)), self.flush()))


async def test_fetch_stream_before_fetch_ok(cert: DevCertificate) -> None:
    """Streams are not ordered: a whole fetch stream (FIN included) may arrive before
    FETCH_OK on the request stream. The objects are kept and fetch() still returns."""
    async with serving(cert, _StreamBeforeOk) as srv:
        sub_ep, _pub = await srv.connect("moqt")
        res = await sub_ep.fetch(NS, b"reordered",
                                 location_filter=LocationFilter.absolute_group_end(0, 0, 0))
        assert res.ok is not None and res.ok.end_location == Location(0, 2)
        objs = await res.collect(5)
        assert [(o.object_id, bytes(o.payload)) for o in objs] == [
            (o, bytes([o]) * 500) for o in range(3)]
        await _close(sub_ep)


# ----------------------------------------------------------------- namespaces


async def test_subscribe_namespace_existing_and_new(srv: Srv) -> None:
    sub_ep, pub = await srv.connect("moqt")
    await pub.announce((b"kv", b"a"))
    await pub.announce((b"other", b"z"))
    watch = await sub_ep.subscribe_namespace((b"kv",))
    assert await watch.next(5) == (True, (b"kv", b"a"))
    await pub.announce((b"kv", b"b", b"c"))
    await pub.announce((b"kvx",))  # not under the prefix (field-wise match)
    assert await watch.next(5) == (True, (b"kv", b"b", b"c"))
    pub.withdraw((b"kv", b"a"))
    assert await watch.next(5) == (False, (b"kv", b"a"))
    assert await watch.next(0.1) is None
    assert watch.current == {(b"kv", b"b", b"c")}
    await watch.cancel()
    await _close(sub_ep)


async def test_track_host_serves_one_origin_to_every_session(cert: DevCertificate) -> None:
    """A TrackHost's sessions share its origin: its tracks, its namespaces, and each
    watcher gets NAMESPACE / NAMESPACE_DONE whichever session it came on."""
    host = TrackHost()
    server = await host.listen("127.0.0.1", 0, certfile=str(cert.certfile),
                               keyfile=str(cert.keyfile), settings=SETTINGS)
    url = f"moqt://127.0.0.1:{server.port}/"
    try:
        await host.announce((b"kv", b"a"))
        a, b = [await Endpoint.connect(url, cafile=str(cert.certfile), settings=SETTINGS)
                for _ in range(2)]
        wa = await a.subscribe_namespace((b"kv",))
        wb = await b.subscribe_namespace(())
        assert await wa.next(5) == (True, (b"kv", b"a"))
        assert await wb.next(5) == (True, (b"kv", b"a"))
        await host.announce((b"kv", b"b"))
        assert await wa.next(5) == (True, (b"kv", b"b"))
        assert await wb.next(5) == (True, (b"kv", b"b"))
        track = host.create_track((b"kv", b"b"), b"t")
        subs = [await ep.subscribe((b"kv", b"b"), b"t",
                                   location_filter=LocationFilter.next_object())
                for ep in (a, b)]
        host.publish(track, 0, 0, b"one object for both")
        for sub in subs:
            obj = await asyncio.wait_for(sub.__anext__(), 5)
            assert bytes(obj.payload) == b"one object for both"
        served = list(host.endpoints)
        a.close()
        await a.wait_closed()
        await until(lambda: len(host.endpoints) == 1)
        (gone,) = [ep for ep in served if ep not in host.endpoints]
        await until(lambda: gone.is_closed)
        assert host.origin.watches(gone) == {}  # its watch left the shared origin
        host.withdraw((b"kv", b"a"))
        assert await wb.next(5) == (False, (b"kv", b"a"))
        assert [len(ep.namespace_watches) for ep in host.endpoints] == [1]
        assert len(server.connections) == 1
        await _close(b)
    finally:
        await host.aclose()


async def test_shared_origin_reaches_every_sessions_subscribers(cert: DevCertificate) -> None:
    """Endpoints serving one shared origin (``serve_endpoints(..., origin=shared)``): an
    object published through either endpoint reaches the subscribers of both sessions at
    once, although neither client sends anything (the origin wakes every session whose
    serving wrote something, not only the publishing endpoint's)."""
    shared: Origin[Endpoint] = Origin()
    eps: list[Endpoint] = []
    server = await serve_endpoints("127.0.0.1", 0, eps.append, certfile=str(cert.certfile),
                                   keyfile=str(cert.keyfile), settings=SETTINGS,
                                   origin=shared)
    srv = Srv(server.port, eps, cert)
    try:
        (a, pa), (b, pb) = [await srv.connect() for _ in range(2)]
        track = pa.create_track(NS, b"shared")
        assert pb.origin is shared and pb.tracks[track.full_name] is track
        subs = [await ep.subscribe(NS, b"shared", location_filter=LocationFilter.next_object())
                for ep in (a, b)]
        for i, via in enumerate((pa, pb, pa, pb)):
            payload = f"object {i} through endpoint {eps.index(via)}".encode()
            via.publish(track, 0, i, payload)
            for sub in subs:
                obj = await asyncio.wait_for(sub.__anext__(), 5)
                assert (obj.object_id, bytes(obj.payload)) == (i, payload)
        await _close(a, b)
    finally:
        for ep in eps:
            ep.close()
        await server.aclose()


# ---------------------------------------------------------------- misbehaviour


def _raw_write(ep: Endpoint, stream_id: int, data: bytes, end: bool = False) -> None:
    raw_write(ep.conn, stream_id, data, end)


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("unknown_type", SessionCode.PROTOCOL_VIOLATION),
        ("second_setup", SessionCode.PROTOCOL_VIOLATION),
        ("control_fin", SessionCode.PROTOCOL_VIOLATION),
        ("truncated_request", SessionCode.PROTOCOL_VIOLATION),
        ("wrong_parity", SessionCode.INVALID_REQUEST_ID),
    ],
)
async def test_misbehaving_raw_peer_is_closed(srv: Srv, case: str, code: int) -> None:
    ep, peer = await srv.connect("moqt")
    control = ep.session.control_stream_id
    sub = encode_message(Subscribe(1 if case == "wrong_parity" else 0, NS, b"t", Parameters()))
    if case == "unknown_type":
        _raw_write(ep, control, b"\x7e\x00\x00")
    elif case == "second_setup":
        from kvcs.moqt.wire import Setup, SetupOptions

        _raw_write(ep, control, encode_message(Setup(SetupOptions())))
    elif case == "control_fin":
        _raw_write(ep, control, b"", end=True)
    else:
        sid = raw_stream_id(ep.conn, False)
        _raw_write(ep, sid, sub[:-1] if case == "truncated_request" else sub,
                   end=case == "truncated_request")
    closed = await asyncio.wait_for(ep.wait_closed(), 5)
    assert closed[0] == code
    assert (await asyncio.wait_for(peer.wait_closed(), 5))[0] == code


async def test_data_stream_ending_inside_object_over_quic(srv: Srv) -> None:
    bad, peer = await srv.connect("moqt")
    # the server side subscribes to a track the (misbehaving) client publishes
    track = bad.create_track(NS, b"pub")
    sub = await peer.subscribe(NS, b"pub")
    bad.publish(track, 0, 0, b"delivered")
    bad.flush()
    first = await asyncio.wait_for(sub.__anext__(), 5)
    assert bytes(first.payload) == b"delivered"
    alias = sub.ok.track_alias  # type: ignore[union-attr]
    w = SubgroupWriter(SubgroupHeader(alias, 1, 0, None))
    raw = w.header_bytes() + w.object_prefix(0, 5, 0, None) + b"whole"
    raw += w.object_prefix(1, 100, 0, None) + b"only part"
    sid = raw_stream_id(bad.conn, True)
    _raw_write(bad, sid, raw, end=True)
    closed = await asyncio.wait_for(peer.wait_closed(), 5)
    assert closed[0] == SessionCode.PROTOCOL_VIOLATION
    got = [bytes(o.payload) async for o in _drain(sub)]
    assert b"only part" not in b"".join(got)
    assert got in ([b"whole"], [])  # the complete object may be yielded, never the partial
    assert (await asyncio.wait_for(bad.wait_closed(), 5))[0] == SessionCode.PROTOCOL_VIOLATION


async def _drain(sub: object) -> AsyncIterator:  # type: ignore[type-arg]
    try:
        async for o in sub:  # type: ignore[attr-defined]
            yield o
    except Exception:
        return


async def test_unknown_alias_stream_over_quic_leaves_other_tracks(srv: Srv) -> None:
    bad, peer = await srv.connect("moqt")
    track = bad.create_track(NS, b"pub")
    sub = await peer.subscribe(NS, b"pub")
    w = SubgroupWriter(SubgroupHeader(999, 0, 0, None))
    sid = raw_stream_id(bad.conn, True)
    _raw_write(bad, sid, w.header_bytes() + w.object_prefix(0, 5, 0, None) + b"stray", True)
    bad.publish(track, 0, 0, b"real")
    bad.publish(track, 0, 1, b"", status=ObjectStatus.END_OF_TRACK)
    got = [(o.location, bytes(o.payload)) async for o in sub]
    assert got == [(Location(0, 0), b"real"), (Location(0, 1), b"")]
    assert not peer.is_closed and not bad.is_closed
    await _close(bad)


# ---------------------------------------------------------------- a host's admission


@contextlib.asynccontextmanager
async def hosting(cert: DevCertificate, **kw: object) -> AsyncIterator[tuple[TrackHost, str]]:
    """A TrackHost listening on an ephemeral port; yields it and its URL."""
    host = TrackHost(**kw)  # type: ignore[arg-type]
    server = await host.listen("127.0.0.1", 0, certfile=str(cert.certfile),
                               keyfile=str(cert.keyfile), settings=SETTINGS)
    try:
        yield host, f"moqt://127.0.0.1:{server.port}/"
    finally:
        await host.aclose()


async def test_track_host_limits_requests_and_fetches_per_session(
        cert: DevCertificate) -> None:
    """A publisher serving consumers itself refuses what the relay refuses: more open
    requests or concurrent FETCHes per session than its limits, with EXCESSIVE_LOAD and
    the Retry Interval."""
    async with hosting(cert, limits=Limits(max_requests=3, max_fetches=1,
                                           retry_ms=250)) as (host, url):
        track = host.create_track(NS, b"big")
        for o in range(64):  # 8 MiB: a FETCH of it outlasts the arrival of the next one
            host.publish(track, 0, o, bytes([o]) * (128 * KiB))
        c = await Endpoint.connect(url, cafile=str(cert.certfile), settings=SETTINGS)
        first, second = await asyncio.gather(
            c.fetch(NS, b"big", location_filter=LocationFilter.none()),
            c.fetch(NS, b"big", location_filter=LocationFilter.none()),
            return_exceptions=True)
        assert isinstance(first, FetchResult)
        assert isinstance(second, MoqtRequestError)
        assert second.code == RequestErrorCode.EXCESSIVE_LOAD and second.retry_interval == 250
        assert len(await first.collect(timeout=10)) == 64
        # the fetch is over: another one is admitted; live subscriptions count as open
        again = await c.fetch(NS, b"big", location_filter=LocationFilter.absolute_range(
            0, 0, 0, 1))
        assert len(await again.collect(timeout=5)) == 2
        subs = [await c.subscribe(NS, b"big", location_filter=LocationFilter.next_object())
                for _ in range(3)]
        with pytest.raises(MoqtRequestError) as info:
            await c.subscribe(NS, b"big", location_filter=LocationFilter.next_object())
        assert info.value.code == RequestErrorCode.EXCESSIVE_LOAD
        assert info.value.retry_interval == 250
        await subs[0].cancel()
        await until(lambda: host.endpoints[0].open_requests() == 2)
        await c.subscribe(NS, b"big", location_filter=LocationFilter.next_object())
        await _close(c)


async def test_track_host_requires_the_relays_tokens(cert: DevCertificate) -> None:
    auth = Authorizer.from_mapping({"tokens": [
        {"token": "reader", "subscribe": [["kv"]]},
        {"token": "other", "subscribe": [["elsewhere"]]},
    ]})
    async with hosting(cert, authorizer=auth) as (host, url):
        await host.announce(NS)
        track = host.create_track(NS, b"t")
        host.publish(track, 0, 0, b"for readers only")

        async def client(token: bytes | None) -> Endpoint:
            tokens = (AuthToken(3, token_type=0, value=token),) if token else ()
            return await Endpoint.connect(url, cafile=str(cert.certfile), settings=SETTINGS,
                                          auth_tokens=tokens)

        for token in (None, b"other"):
            c = await client(token)
            for request in (c.subscribe(NS, b"t"), c.subscribe_namespace((b"kv",)),
                            c.fetch(NS, b"t", location_filter=LocationFilter.none()),
                            c.track_status(NS, b"t")):
                with pytest.raises(MoqtRequestError) as info:
                    await request
                assert info.value.code == RequestErrorCode.UNAUTHORIZED
            await _close(c)
        reader = await client(b"reader")
        res = await reader.fetch(NS, b"t", location_filter=LocationFilter.none())
        assert [bytes(o.payload) for o in await res.collect(timeout=5)] == [b"for readers only"]
        watch = await reader.subscribe_namespace((b"kv",))
        assert await watch.next(5) == (True, NS)
        # a token alias (we keep no token cache) closes the session, as at the relay
        reader.session.subscribe(NS, b"t", Parameters(auth_tokens=(AuthToken(2, alias=7),)))
        reader.flush()
        code, _ = await asyncio.wait_for(reader.wait_closed(), 5)
        assert code == SessionCode.UNKNOWN_AUTH_TOKEN_ALIAS
