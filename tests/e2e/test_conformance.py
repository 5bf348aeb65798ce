"""KVCS requirements that were implemented but untested (issue #15), checked over real
QUIC on 127.0.0.1 where they are network behaviour: the publisher's objects on the wire
(Subgroup 0, End of Group, End of Track, Publisher Priority, Track Properties, manifest
first), the consumer's checks on receipt (Token Count, Codec), excess objects discarded
without range filters, publications never mixed unless both are deterministic, and
constant-time token comparison."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from kvcs import auth
from kvcs.endpoint import Endpoint
from kvcs.hosting import TrackHost
from kvcs.kv.codecs import encode_component
from kvcs.kv.component import Component
from kvcs.kv.ids import CompatDescriptor
from kvcs.kv.manifest import Manifest
from kvcs.kv.payload import build_payload_bytes
from kvcs.kvnet.consumer import KvConsumer, RecomputeRequired
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.moqt import events as ev
from kvcs.moqt.track import CachedObject, Track
from kvcs.moqt.wire import PARAM_OBJECTID_FILTER, Fetch, GroupOrder, LocationFilter, ObjectStatus
from kvcs.moqt.wire.properties import (
    DEFAULT_PUBLISHER_PRIORITY,
    MAX_CACHE_DURATION,
    OBJECT_DELIVERY_TIMEOUT,
    SUBGROUP_DELIVERY_TIMEOUT,
)
from kvcs.testing import LocalNet, until
from kvcs.transport import DevCertificate, QuicSettings

from .conftest import BLOCK, BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .helpers import check_layers, publish_cache
from .recording import SETTINGS, Requests, connect, direct_host
from .test_tampering import TamperingRelay


@pytest.fixture
async def direct(cert: DevCertificate) -> AsyncIterator[tuple[TrackHost, str, Requests]]:
    async with direct_host(cert) as d:
        yield d


class Tap(Endpoint):
    """A consumer endpoint that keeps every object its session parses, per request (its
    Subscription iterators end at PUBLISH_DONE, which can overtake the last stream)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.seen: dict[int, list[Any]] = {}

    def handle_event(self, e: ev.Event) -> None:
        if isinstance(e, ev.ObjectReceived):
            self.seen.setdefault(e.request_id, []).append(e.record)
        super().handle_event(e)


async def test_objects_on_the_wire(direct: tuple[TrackHost, str, Requests],
                                   cert: DevCertificate) -> None:
    """Subgroup 0 in ascending Object order, End of Group after each Group, End of Track
    after the last, Publisher Priority floor(128*g/L) (0 on the manifest), and the Track
    Properties: MAX_CACHE_DURATION, no delivery timeout; read straight from the publisher
    (a relay re-streams)."""
    host, url, _ = direct
    pub = KvPublisher(host, SCOPE, DESC, PROMPT, PublisherOptions(retention_s=120))
    await pub.start()
    ep = await Tap.connect(url, cafile=str(cert.certfile), settings=SETTINGS)
    subs = {name: await ep.subscribe(pub.fields, name,
                                     location_filter=LocationFilter.next_object())
            for name in (b"k.raw.s0", b"v.raw.s0", b"manifest")}
    for i, (k, v) in enumerate(cache(100)):
        await pub.put_layer(i, k, v)
    await pub.finish()
    per_track = LAYERS * (BLOCKS + 1) + 1
    await until(lambda: all(len(ep.seen.get(s.request_id, ())) == per_track
                            for name, s in subs.items() if name != b"manifest"))
    for name in (b"k.raw.s0", b"v.raw.s0"):
        props = dict(subs[name].track_properties)
        assert props[MAX_CACHE_DURATION] == 120_000
        assert OBJECT_DELIVERY_TIMEOUT not in props and SUBGROUP_DELIVERY_TIMEOUT not in props
        objs = ep.seen[subs[name].request_id]
        assert all(o.subgroup_id == 0 for o in objs)
        for g in range(LAYERS):
            group = [o for o in objs if o.group_id == g]  # in arrival order
            normal = [o.object_id for o in group if o.status == ObjectStatus.NORMAL]
            assert normal == list(range(BLOCKS))  # one stream, ascending Object IDs
            # a status object ends its stream: End of Track may come on a stream of its own
            group.sort(key=lambda o: o.object_id)
            want = [(b, ObjectStatus.NORMAL) for b in range(BLOCKS)]
            want.append((BLOCKS, ObjectStatus.END_OF_GROUP))
            if g == LAYERS - 1:
                want.append((BLOCKS + 1, ObjectStatus.END_OF_TRACK))
            assert [(o.object_id, o.status) for o in group] == want
            # an object without a priority has the track's DEFAULT_PUBLISHER_PRIORITY
            assert {_priority(o, props) for o in group} == {math.floor(128 * g / LAYERS)}
    manifest = ep.seen[subs[b"manifest"].request_id]
    props = dict(subs[b"manifest"].track_properties)
    assert manifest and {_priority(o, props) for o in manifest} == {0}
    ep.close()
    await ep.wait_closed()


def _priority(obj: Any, props: dict) -> int:
    if obj.publisher_priority is not None:
        return obj.publisher_priority
    return int(props[DEFAULT_PUBLISHER_PRIORITY])


class _Recording(TrackHost):
    """A publish target that notes the track of every object, in publishing order."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[bytes] = []

    def publish_run(self, track: Track, objects: Iterable[CachedObject]) -> None:
        run = list(objects)
        self.order += [track.name] * len(run)
        super().publish_run(track, run)


async def test_manifest_before_the_first_data_object(net: LocalNet) -> None:
    target = _Recording()
    pub = KvPublisher(target, SCOPE, DESC, PROMPT)
    await pub.put_layer(0, *cache(101)[0])
    assert target.order[0] == b"manifest" and target.order[2] == b"k.raw.s0"
    # over QUIC: once announced, the manifest is there while no data object exists yet
    relay = await net.relay()
    early = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT)
    await early.start()
    c = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT)
    found = await c.discover()
    assert found is not None and found.namespace.publication_id == early.publication_id
    status = await c.endpoint.track_status(early.fields, b"k.raw.s0")
    assert status.params.largest_object is None


@pytest.mark.parametrize(("field", "value"), [("token_count", BLOCK - 1),
                                              ("codec", "q8")])
async def test_token_count_and_codec_checked_on_receipt(net: LocalNet, field: str,
                                                        value: Any) -> None:
    """An object whose digest is right but whose Token Count or Codec field is not the
    manifest's is discarded and treated as missing."""
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    data = cache(102)
    k, _ = data[2]
    rows = k[3 * BLOCK:4 * BLOCK]
    fields: dict[str, Any] = {"token_count": BLOCK, "codec": "raw", field: value}
    body = encode_component(Component.K, fields["codec"], rows, rows)
    evil.swap = {(b"k.raw.s0", 2, 3): build_payload_bytes(  # type: ignore[misc]
        Component.K, 2, 3, 3 * BLOCK, fields["token_count"], fields["codec"], body)}
    await publish_cache(net, clean, 102)
    c = KvConsumer([await net.client(evil), await net.client(clean)], SCOPE, DESC, PROMPT,
                   recompute_budget_s=5)
    found = await c.discover()
    assert found is not None
    got = [x async for x in c.prefix_layers(found)]
    check_layers(got, data)
    assert c.stats.rejected == 1 and c.stats.retries >= 1


@pytest.fixture
async def no_filters(cert: DevCertificate) -> AsyncIterator[tuple[TrackHost, str, Requests]]:
    async with direct_host(cert, max_filter_ranges=0) as d:
        yield d


async def test_excess_objects_discarded_without_range_filters(
        no_filters: tuple[TrackHost, str, Requests], cert: DevCertificate) -> None:
    host, url, log = no_filters
    pub = KvPublisher(host, SCOPE, DESC, PROMPT)
    data = cache(103)
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()
    c = KvConsumer(await connect(url, cert), SCOPE, DESC, PROMPT)
    assert c.endpoint.peer_max_filter_ranges == 0
    found = await c.discover()
    assert found is not None
    got = [x async for x in c.prefix_layers(found, range(1, 3), blocks=5)]
    for x in got:
        assert same(x.k, data[x.index][0][: 5 * BLOCK]) and same(x.v, data[x.index][1][: 5 * BLOCK])
    assert all(not m.params.range_filters for _, m in log.seen)  # no OBJECTID_FILTER sent
    assert c.stats.excess == 2 * 2 * (BLOCKS - 5) and c.stats.objects == 2 * 2 * 5
    c.endpoint.close()
    await c.endpoint.wait_closed()


@pytest.mark.parametrize("deterministic", [False, True])
async def test_publications_mixed_only_when_both_are_deterministic(
        net: LocalNet, deterministic: bool) -> None:
    """Publication A's objects are lost on the only relay that has A; publication B of the
    same prefix (identical bits) is on another relay. B's objects complete A only when both
    manifests say deterministic."""
    home_a = await net.relay()
    lossy = await net.relay(TamperingRelay, upstream=home_a)
    lossy.drop = {(b"k.raw.s0", 2, 7), (b"v.raw.s0", 4, 1)}  # type: ignore[misc]
    home_b = await net.relay()
    opts = PublisherOptions(deterministic=deterministic)
    _, data = await publish_cache(net, home_a, 104, opts)
    pub_b, _ = await publish_cache(net, home_b, 104, opts)  # same seed: the same bits
    c = KvConsumer([await net.client(lossy), await net.client(home_b)], SCOPE, DESC, PROMPT,
                   recompute_budget_s=2)
    found = await c.discover()  # on the first endpoint: publication A
    assert found is not None and found.namespace.publication_id != pub_b.publication_id
    alternates = await c.discover_all(endpoint=c.endpoints[1])
    assert [p.namespace.publication_id for p in alternates] == [pub_b.publication_id]
    got = []
    if deterministic:
        got = [x async for x in c.prefix_layers(found, alternates=alternates)]
        check_layers(got, data)
        assert len(got) == LAYERS
    else:
        with pytest.raises(RecomputeRequired) as info:
            async for x in c.prefix_layers(found, alternates=alternates):
                got.append(x)
        assert info.value.missing == {2: [7], 4: [1]}
        assert sorted(info.value.partial) == [2, 3, 4, 5]  # B's objects never placed
        check_layers([info.value.partial[3], info.value.partial[5]], data)
        assert [x.index for x in got] == [0, 1]


def test_tokens_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token is looked up by its SHA-256 (one hash, whatever the number of grants: issue
    27), and the grant found is compared with hmac.compare_digest (never ==, never
    stopping at the first differing byte); a token no grant has costs no comparison."""
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((bytes(a), bytes(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    a = auth.Authorizer.from_mapping({"tokens": [
        {"token": t, "subscribe": [["kvcs-1"]]} for t in ("alpha", "bravo", "charlie")]})
    assert not a.allowed([b"alphx"], auth.SUBSCRIBE, (b"kvcs-1", b"s"))
    assert calls == []
    assert a.allowed([b"bravo"], auth.SUBSCRIBE, (b"kvcs-1", b"s"))
    assert calls == [(b"bravo", b"bravo")]


async def test_manifest_versions() -> None:
    """Each version is Object 0 of a new Group (IDs +1 per version): one at the start, one
    at least every eight completed layers, one when a segment is added, one when it
    completes; every completed layer's object digests are listed."""
    desc = CompatDescriptor.from_dict({**DESC.members, "layers": 20})
    host = TrackHost()  # the published objects, as every subscriber is served them
    pub = KvPublisher(host, SCOPE, desc, PROMPT)
    data = [cache(105)[i % LAYERS] for i in range(20)]
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    pub.add_segment(PROMPT[:BLOCK] + 7)
    track = host.tracks[(pub.fields, b"manifest")]
    objs = [o for o in track.objects(type(track.largest)(0, 0))  # type: ignore[misc]
            if o.status == ObjectStatus.NORMAL]
    assert [(o.group_id, o.object_id) for o in objs] == [(g, 0) for g in range(5)]
    versions = [Manifest.parse(bytes(o.payload)) for o in objs]
    # start, 8 and 16 completed layers, segment 0 complete (20), segment 1 added
    assert [len(m.segments[0].object_digests["k.raw.s0"]) for m in versions] == \
        [0, 8, 16, 20, 20]  # type: ignore[index]
    assert [m.segments[0].complete for m in versions] == [False] * 3 + [True] * 2
    assert [len(m.segments) for m in versions] == [1, 1, 1, 1, 2]


async def test_completed_retrieval_requests(direct: tuple[TrackHost, str, Requests],
                                            cert: DevCertificate) -> None:
    """Layers a..b of a completed segment: one FETCH per data track with Absolute Start,
    Group End {a, 0} + b-a, GROUP_ORDER Ascending, OBJECTID_FILTER 0..n-1."""
    host, url, log = direct
    pub = KvPublisher(host, SCOPE, DESC, PROMPT)
    for i, (k, v) in enumerate(cache(106)):
        await pub.put_layer(i, k, v)
    await pub.finish()
    c = KvConsumer(await connect(url, cert), SCOPE, DESC, PROMPT)
    found = await c.discover()
    assert found is not None
    log.seen.clear()
    got = [x async for x in c.prefix_layers(found, range(2, 5), blocks=5)]
    assert [x.index for x in got] == [2, 3, 4] and c.stats.excess == 0
    fetches = [(n, m) for n, m in log.seen if isinstance(m, Fetch)]
    assert sorted(n for n, _ in fetches) == [b"k.raw.s0", b"v.raw.s0"]
    for _, m in fetches:
        assert m.params.location_filter == LocationFilter.absolute_group_end(2, 0, 2)
        assert m.params.group_order == GroupOrder.ASCENDING
        [rf] = m.params.range_filters
        assert rf.param_type == PARAM_OBJECTID_FILTER and list(rf.ranges) == [(0, 4)]
    c.endpoint.close()
    await c.endpoint.wait_closed()


async def test_enough_streams_for_pipelined_layers(net: LocalNet) -> None:
    """A 96-layer cache published at once to a live consumer: 192 subgroup streams
    (k and v, one per layer) open together; the endpoints grant enough of them."""
    assert QuicSettings().max_streams_uni >= 2 * 96
    desc = CompatDescriptor.from_dict({**DESC.members, "layers": 96, "head_dim": 8})
    data = [(k[:, :, :8].copy(), v[:, :, :8].copy()) for k, v in cache(107)]
    relay = await net.relay()
    pub = KvPublisher(await net.client(relay), SCOPE, desc, PROMPT)
    await pub.start()
    c = KvConsumer(await net.client(relay), SCOPE, desc, PROMPT)
    found = await c.discover()
    assert found is not None
    layers = c.prefix_layers(found)
    reader = asyncio.ensure_future(anext(layers))
    await asyncio.sleep(0.1)  # subscribed
    for i in range(96):
        await pub.put_layer(i, *data[i % LAYERS])
    await pub.finish()
    got = [await reader] + [x async for x in layers]
    assert [x.index for x in got] == list(range(96))
    assert all(same(x.k, data[x.index % LAYERS][0]) for x in got)
