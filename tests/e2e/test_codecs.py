"""Codec choice (KVSP profile section 5: a consumer that meets a codec it does not
implement selects another listed encoding) and HTTP recovery of signed non-raw tracks,
over real QUIC."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

import kvcs.kv.codecs as codecs
from kvcs.hosting import TrackHost
from kvcs.kv.errors import ManifestError
from kvcs.kv.manifest import Manifest
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.moqt.wire import Fetch
from kvcs.testing import LocalNet
from kvcs.transport import DevCertificate

from .conftest import BLOCK, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .helpers import publish_cache, signing_key
from .recording import Requests, connect, direct_host
from .test_http_fallback import _store, holder, http  # noqa: F401 (fixtures)
from .test_tampering import TamperingRelay


class ExoticPublisher(KvPublisher):
    """Lists a ``kv.lz4`` track no kvcs build implements (the registry may grow)."""

    def manifest(self) -> Manifest:
        m = super().manifest()
        for s in m.segments:
            s.tracks = [f"kv.lz4.s{s.segment}", *s.tracks]
        return m


@pytest.fixture
async def direct(cert: DevCertificate) -> AsyncIterator[tuple[TrackHost, str, Requests]]:
    async with direct_host(cert) as d:
        yield d


async def _completed(host: TrackHost, seed: int, cls: type[KvPublisher] = KvPublisher,
                     **options: object) -> list:
    pub = cls(host, SCOPE, DESC, PROMPT, PublisherOptions(**options))  # type: ignore[arg-type]
    data = cache(seed)
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()
    return data


async def _fetched_tracks(url: str, cert: DevCertificate, log: Requests,
                          codec: str | list[str]) -> tuple[list, set[bytes]]:
    log.seen.clear()
    c = KvConsumer(await connect(url, cert), SCOPE, DESC, PROMPT, codec=codec)
    found = await c.discover()
    assert found is not None
    got = [x async for x in c.prefix_layers(found)]
    assert [x.index for x in got] == list(range(LAYERS)) and c.stats.rejected == 0
    c.endpoint.close()
    await c.endpoint.wait_closed()
    return got, set(log.names(Fetch))


async def test_preference_order_and_codecs_not_implemented(
        direct: tuple[TrackHost, str, Requests], cert: DevCertificate,
        monkeypatch: pytest.MonkeyPatch) -> None:
    host, url, log = direct
    data = await _completed(host, 70, ExoticPublisher, joint_codec="zstd")
    # lz4 is listed but not implemented here: the next preference is used
    got, tracks = await _fetched_tracks(url, cert, log, ["lz4", "zstd", "raw"])
    assert tracks == {b"kv.zstd.s0"}
    assert all(same(x.k, data[x.index][0]) and same(x.v, data[x.index][1]) for x in got)
    _, tracks = await _fetched_tracks(url, cert, log, "raw")
    assert tracks == {b"k.raw.s0", b"v.raw.s0"}
    # without the zstandard package, zstd is not implemented either: raw is selected
    monkeypatch.setattr(codecs, "zstd_available", lambda: False)  # the zstd record asks it
    got, tracks = await _fetched_tracks(url, cert, log, ["lz4", "zstd", "raw"])
    assert tracks == {b"k.raw.s0", b"v.raw.s0"}
    assert all(same(x.v, data[x.index][1]) for x in got)
    c = KvConsumer(await connect(url, cert), SCOPE, DESC, PROMPT, codec=["lz4", "zstd"])
    found = await c.discover()
    assert found is not None
    with pytest.raises(ManifestError, match="no usable tracks"):
        _ = [x async for x in c.prefix_layers(found)]


@pytest.mark.parametrize("codec", ["q8", "zstd"])
async def test_signed_non_raw_track_recovered_over_http(
        net: LocalNet, holder: object, http: object, codec: str) -> None:  # noqa: F811
    """A consumer that requires producer authenticity reads the kv.<codec> track; objects a
    relay spoils are recovered from a KVSP holder's raw containers, confirmed against the
    signed digests of the kv.<codec> objects they encode to."""
    key, keyring = signing_key("prefill-codec")
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    name = f"kv.{codec}.s0".encode()
    evil.flip = {(name, 1, 4), (name, 3, 0)}  # type: ignore[misc]
    _, data = await publish_cache(net, clean, 71, PublisherOptions(producer_key=key,
                                                              joint_codec=codec))
    _store(holder, data)  # type: ignore[arg-type]
    consumer = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT, keyring=keyring,
                          require_signed=True, codec=codec, recompute_budget_s=5,
                          http=http)  # type: ignore[arg-type]
    found = await consumer.discover()
    assert found is not None
    got = [x async for x in consumer.prefix_layers(found)]
    assert [x.index for x in got] == list(range(LAYERS))
    assert consumer.stats.http_blocks == 2  # blocks 4 and 0, once each
    assert consumer.stats.rejected >= 2  # the spoiled objects (again on the MOQT retry)
    rows = {1: slice(4 * BLOCK, 5 * BLOCK), 3: slice(0, BLOCK)}
    for x in got:
        k, v = data[x.index]
        if codec == "zstd":
            assert same(x.k, k) and same(x.v, v)
        else:  # q8 objects are lossy; the recovered blocks are the exact raw rows
            assert np.allclose(x.k.astype(np.float32), k.astype(np.float32), atol=0.05)
            if x.index in rows:
                r = rows[x.index]
                assert same(x.k[r], k[r]) and same(x.v[r], v[r])

