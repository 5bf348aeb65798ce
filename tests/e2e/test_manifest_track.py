"""The consumer's manifest track (kvcs-draft "Retrieval during Production", "Manifest
Track"), over real QUIC: manifest.cose first, ``manifest`` only when the publisher says
manifest.cose does not exist and authenticity is not required; Next Object + fill
Relative Start 1; object digests of unsigned manifests checked too."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kvcs.endpoint import MoqtRequestError
from kvcs.hosting import TrackHost
from kvcs.kv.errors import ManifestError, SignatureError
from kvcs.kv.payload import HEADER_SIZE
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher
from kvcs.moqt.errors import RequestErrorCode
from kvcs.moqt.wire import Fetch, LocationFilter, Subscribe
from kvcs.testing import LocalNet
from kvcs.transport import DevCertificate

from .conftest import BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .helpers import check_layers, publish_cache, signing_key
from .recording import Requests, connect, direct_host
from .test_tampering import TamperingRelay


@pytest.fixture
async def direct(cert: DevCertificate) -> AsyncIterator[tuple[TrackHost, str, Requests]]:
    async with direct_host(cert) as d:
        yield d


async def _consumer(url: str, cert: DevCertificate, **kw: object) -> KvConsumer:
    ep = await connect(url, cert)
    return KvConsumer(ep, SCOPE, DESC, PROMPT, **kw)  # type: ignore[arg-type]


async def _close(c: KvConsumer) -> None:
    c.endpoint.close()
    await c.endpoint.wait_closed()


async def test_live_consumer_subscribes_as_the_document_says(
        direct: tuple[TrackHost, str, Requests], cert: DevCertificate) -> None:
    host, url, log = direct
    pub = KvPublisher(host, SCOPE, DESC, PROMPT)
    data = cache(60)
    await pub.put_layer(0, *data[0])
    c = await _consumer(url, cert)
    found = await c.discover()
    assert found is not None
    log.seen.clear()
    layers = c.prefix_layers(found)
    first = await anext(layers)
    assert first.index == 0 and same(first.k, data[0][0])
    for i in range(1, LAYERS):
        await pub.put_layer(i, *data[i])
    await pub.finish()
    rest = [x async for x in layers]
    assert [x.index for x in rest] == list(range(1, LAYERS))
    names = log.names()
    # manifest.cose first; "manifest" because the publisher said it does not exist
    assert names[:2] == [b"manifest.cose", b"manifest"]
    for name, m in log.seen:
        assert isinstance(m, Subscribe)  # a live publication: no FETCH
        if name == b"manifest":
            assert m.params.location_filter == LocationFilter.next_object()
            assert m.params.fill is not None
            assert m.params.fill.location_filter == LocationFilter.relative_start(1)
        elif name != b"manifest.cose":  # the data tracks: exactly once from {0, 0}
            assert m.params.location_filter == LocationFilter.next_object()
            assert m.params.fill is not None
            assert m.params.fill.location_filter == LocationFilter.absolute_start(0, 0)
    assert sorted(n for n in names if not n.startswith(b"manifest")) == [b"k.raw.s0",
                                                                         b"v.raw.s0"]
    assert c.stats.manifest_versions >= 3  # LAYERS / manifest_every + completion
    await _close(c)


async def test_late_live_consumer_fills_a_window_and_fetches_the_rest(
        direct: tuple[TrackHost, str, Requests], cert: DevCertificate) -> None:
    """Wanted layers more than a quarter of ``fetch_window`` holds: the fill reaches that
    quarter (one layer here) and the layers published before the SUBSCRIBE_OK after it are
    FETCHed, none past its Largest Object (the subscription brings those): still every
    object exactly once."""
    host, url, log = direct
    pub = KvPublisher(host, SCOPE, DESC, PROMPT)
    data = cache(61)
    for i in range(4):
        await pub.put_layer(i, *data[i])
    k, v = DESC.raw_bytes()
    layer = BLOCKS * (2 * HEADER_SIZE + k + v)
    c = await _consumer(url, cert, fetch_window=4 * layer)
    found = await c.discover()
    assert found is not None
    log.seen.clear()
    layers = c.prefix_layers(found)
    first = await anext(layers)
    assert first.index == 0
    for i in range(4, LAYERS):
        await pub.put_layer(i, *data[i])
    await pub.finish()
    got = [first, *[x async for x in layers]]
    check_layers(got, data)
    data_requests = [(n, m) for n, m in log.seen if not n.startswith(b"manifest")]
    for name in (b"k.raw.s0", b"v.raw.s0"):
        subs = [m for n, m in data_requests if n == name and isinstance(m, Subscribe)]
        assert len(subs) == 1
        assert subs[0].params.location_filter == LocationFilter.next_object()
        assert subs[0].params.fill is not None
        assert subs[0].params.fill.location_filter == LocationFilter.absolute_group_end(0, 0, 0)
        fetches = [m for n, m in data_requests if n == name and isinstance(m, Fetch)]
        # layers 1..3, one per FETCH, the last one ending at the Largest Object: layer 3's
        # End of Group {3, BLOCKS}
        lfs = [f.params.location_filter for f in fetches]
        assert lfs == [LocationFilter.absolute_group_end(1, 0, 0),
                       LocationFilter.absolute_group_end(2, 0, 0),
                       LocationFilter.absolute_range(3, 0, 0, BLOCKS)]
    assert c.stats.objects == LAYERS * BLOCKS * 2
    assert c.stats.duplicates == 0 and c.stats.rejected == 0
    await _close(c)


@pytest.mark.parametrize(("code", "transient"), [(RequestErrorCode.UNAUTHORIZED, False),
                                                 (RequestErrorCode.NOT_SUPPORTED, False),
                                                 (RequestErrorCode.EXCESSIVE_LOAD, True),
                                                 (RequestErrorCode.INTERNAL_ERROR, True)])
async def test_other_refusals_of_the_signed_track_never_downgrade(
        direct: tuple[TrackHost, str, Requests], cert: DevCertificate, code: int,
        transient: bool) -> None:
    """A refusal other than DOES_NOT_EXIST is never a reason to read ``manifest``: a
    lasting one ends the attempt, a transient one is asked again within the budget."""
    host, url, log = direct
    pub = KvPublisher(host, SCOPE, DESC, PROMPT)
    await pub.start()
    log.refuse[b"manifest.cose"] = code
    c = await _consumer(url, cert, recompute_budget_s=0.4)
    pubs = await c.discover_all()
    log.seen.clear()
    with pytest.raises(MoqtRequestError) as info:
        await c.manifest(pubs[0])
    assert info.value.code == code
    asked = log.names()
    assert set(asked) == {b"manifest.cose"}  # the unsigned track never asked
    assert (len(asked) > 2) is transient
    await _close(c)


async def test_a_transient_refusal_is_asked_again(
        direct: tuple[TrackHost, str, Requests], cert: DevCertificate) -> None:
    """A relay whose publisher session is just closing answers INTERNAL_ERROR, then
    DOES_NOT_EXIST: the consumer asks again and then reads ``manifest``."""
    host, url, log = direct
    pub = KvPublisher(host, SCOPE, DESC, PROMPT)
    await pub.start()
    log.refuse_once[b"manifest.cose"] = [RequestErrorCode.INTERNAL_ERROR,
                                         RequestErrorCode.DOES_NOT_EXIST]
    c = await _consumer(url, cert)
    pubs = await c.discover_all()
    m = await c.manifest(pubs[0])
    assert m.segments[0].blocks == len(c.keys)
    assert log.names() == [b"manifest.cose", b"manifest.cose", b"manifest"]
    await _close(c)


async def test_an_empty_signed_track_is_waited_for_not_downgraded(
        direct: tuple[TrackHost, str, Requests], cert: DevCertificate) -> None:
    """manifest.cose exists but has no version (yet): the consumer waits for it within the
    budget instead of reading the unsigned ``manifest`` the same namespace offers."""
    host, url, log = direct
    pub = KvPublisher(host, SCOPE, DESC, PROMPT)
    host.create_track(pub.fields, b"manifest.cose")  # empty
    await pub.start()
    c = await _consumer(url, cert, recompute_budget_s=0.3)
    pubs = await c.discover_all()
    with pytest.raises(ManifestError, match="no manifest version within"):
        await c.manifest(pubs[0])
    assert b"manifest" not in [n for n, _ in log.seen]
    await _close(c)


async def test_require_signed_refuses_a_publication_without_manifest_cose(
        net: LocalNet) -> None:
    relay = await net.relay()
    await publish_cache(net, relay, 61)
    _, keyring = signing_key("p")
    c = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT, keyring=keyring,
                   require_signed=True)
    pubs = await c.discover_all()
    with pytest.raises(SignatureError, match=r"manifest\.cose does not exist"):
        await c.manifest(pubs[0])


async def test_swapped_object_caught_by_unsigned_object_digests(net: LocalNet) -> None:
    """Without signatures, the manifest's object_digests still catch a relay that serves
    another publication's (self-consistent) object at a Location; before, only the Data
    Digest was checked and the foreign object was used."""
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    _, data_a = await publish_cache(net, clean, 62)
    pub_b, _ = await publish_cache(net, clean, 63)
    track_b = pub_b.endpoint.tracks[(pub_b.fields, b"v.raw.s0")]  # type: ignore[attr-defined]
    obj = track_b.get(type(track_b.largest)(2, 5))  # type: ignore[arg-type, misc]
    evil.swap = {(b"v.raw.s0", 2, 5): bytes(obj.payload)}  # type: ignore[misc]
    c = KvConsumer([await net.client(evil), await net.client(clean)], SCOPE, DESC, PROMPT,
                   recompute_budget_s=5)
    pubs = await c.discover_all()
    target = next(p for p in pubs if p.namespace.publication_id != pub_b.publication_id)
    got = [x async for x in c.prefix_layers(target)]
    check_layers(got, data_a)
    assert c.stats.rejected == 1 and c.stats.retries >= 1
