"""KVSP HTTP fallback: blocks a tampering relay spoils are fetched as containers from an
HTTP holder; with no MOQT path the whole cache comes over HTTP; nothing unverified is ever
yielded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kvcs.auth import Authorizer
from kvcs.cli import start_kvsp_beside
from kvcs.kv.errors import SignatureError
from kvcs.kv.ids import block_keys, scope_id
from kvcs.kv.store import BlockStore, store_cache
from kvcs.kvnet.consumer import KvConsumer, RecomputeRequired
from kvcs.kvnet.kvsp_http import KvspClient, KvspError, KvspServer
from kvcs.kvnet.publisher import PublisherOptions
from kvcs.testing import LocalNet

from .conftest import BLOCK, BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .helpers import check_layers, publish_cache, signing_key
from .retrieval import layers_until_recompute
from .test_tampering import TamperingRelay

SID = scope_id(SCOPE)
KEYS = block_keys(SCOPE, DESC.compat_id, PROMPT, BLOCK)
AUTH = Authorizer.from_mapping({"tokens": [
    {"token": "decode-worker", "subscribe": [["kvcs-1", "hex:" + SID.hex()]]}]})
AUTH_RELAY = Authorizer.from_mapping({"tokens": [
    {"token": "decode-worker", "subscribe": [["kvcs-1", "hex:" + SID.hex()]]},
    {"token": "prefill", "publish": [["kvcs-1", "hex:" + SID.hex()]],
     "subscribe": [["kvcs-1", "hex:" + SID.hex()]]},
    {"token": "publish-only", "publish": [["kvcs-1", "hex:" + SID.hex()]]}]})


@pytest.fixture
async def holder(net: LocalNet, tmp_path: Path) -> KvspServer:
    return await net.kvsp_server(BlockStore(tmp_path / "store"), AUTH)


@pytest.fixture
async def http(net: LocalNet, holder: KvspServer) -> AsyncIterator[KvspClient]:
    async with KvspClient(holder.url, "decode-worker", pin_sha256=net.cert.sha256) as c:
        yield c


def _store(holder: KvspServer, data: list) -> None:
    store_cache(holder.store, DESC, SCOPE, PROMPT, [k for k, _ in data], [v for _, v in data])


@pytest.mark.parametrize("mode", ["flip", "drop"])
async def test_spoiled_objects_recovered_over_http(net: LocalNet, holder: KvspServer,
                                                   http: KvspClient, mode: str) -> None:
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    bad = {(b"k.raw.s0", 2, 3), (b"v.raw.s0", 4, 0)}
    evil.flip, evil.drop = (bad, set()) if mode == "flip" else (set(), bad)  # type: ignore
    _, data = await publish_cache(net, clean, 31)
    _store(holder, data)
    # the only MOQT source is the tampering relay: retries there give the same bad bytes
    consumer = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT, recompute_budget_s=5,
                          http=http)
    found = await consumer.discover()
    assert found is not None
    got = [x async for x in consumer.layers(found)]
    assert [x.index for x in got] == list(range(LAYERS))
    check_layers(got, data)
    assert consumer.stats.http_blocks == 2  # blocks 3 and 0, once each
    if mode == "flip":
        assert consumer.stats.rejected >= 2


async def test_signed_digests_confirm_http_blocks(net: LocalNet, holder: KvspServer,
                                                  http: KvspClient) -> None:
    key, keyring = signing_key("prefill-http")
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    evil.flip = {(b"k.raw.s0", 1, 7), (b"v.raw.s0", 5, 15)}  # type: ignore[misc]
    _, data = await publish_cache(net, clean, 32, PublisherOptions(producer_key=key))
    _store(holder, data)
    consumer = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT, keyring=keyring,
                          require_signed=True, recompute_budget_s=5, http=http)
    found = await consumer.discover()
    assert found is not None
    got = [x async for x in consumer.layers(found)]
    check_layers(got, data)
    assert len(got) == LAYERS and consumer.stats.http_blocks == 2
    with pytest.raises(SignatureError):  # no manifest, no signature: refused
        _ = [x async for x in consumer.http_layers()]


async def test_blocks_missing_or_corrupt_on_the_holder_are_reported(
        net: LocalNet, holder: KvspServer, http: KvspClient) -> None:
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    evil.flip = {(b"k.raw.s0", 3, 5)}  # type: ignore[misc]
    evil.drop = {(b"v.raw.s0", 3, 9), (b"v.raw.s0", 3, 10)}  # type: ignore[misc]
    _, data = await publish_cache(net, clean, 33)
    _store(holder, data)
    holder.store.path(SID, DESC.compat_id, KEYS[5]).unlink()  # not held
    path = holder.store.path(SID, DESC.compat_id, KEYS[9])
    spoiled = bytearray(path.read_bytes())
    spoiled[200] ^= 0x10
    path.write_bytes(bytes(spoiled))  # held but corrupt: digest mismatch
    consumer = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT, recompute_budget_s=3,
                          http=http)
    found = await consumer.discover()
    assert found is not None
    got, short = await layers_until_recompute(consumer.layers(found))
    assert [x.index for x in got] == [0, 1, 2]
    check_layers(got, data)
    assert short.missing[3] == [5, 9]  # block 10 came over HTTP
    assert consumer.stats.http_blocks == 1 and consumer.stats.rejected >= 2


async def test_no_moqt_path_everything_over_http(net: LocalNet, holder: KvspServer,
                                                 http: KvspClient) -> None:
    data = cache(34)
    _store(holder, data)
    consumer = KvConsumer([], SCOPE, DESC, PROMPT, http=http)
    assert await consumer.discover() is None  # no endpoint: nothing over MOQT
    got = [x async for x in consumer.http_layers()]
    assert [x.index for x in got] == list(range(LAYERS))
    check_layers(got, data)
    assert consumer.stats.http_blocks == BLOCKS
    part = [x async for x in consumer.http_layers(range(2, 4), blocks=3)]
    assert [x.index for x in part] == [2, 3] and part[0].k.shape[0] == 3 * BLOCK
    for x in part:
        k, v = data[x.index]
        assert same(x.k, k[: 3 * BLOCK]) and same(x.v, v[: 3 * BLOCK])
    holder.store.path(SID, DESC.compat_id, KEYS[12]).unlink()
    with pytest.raises(RecomputeRequired) as info:
        _ = [x async for x in consumer.http_layers()]
    assert info.value.missing == {layer: [12] for layer in range(LAYERS)}
    assert info.value.yielded == 0


async def test_http_token_refused(net: LocalNet, holder: KvspServer) -> None:
    _store(holder, cache(35))
    async with KvspClient(holder.url, "someone-else", pin_sha256=net.cert.sha256) as bad:
        consumer = KvConsumer([], SCOPE, DESC, PROMPT, http=bad, recompute_budget_s=2)
        with pytest.raises(RecomputeRequired) as info:
            _ = [x async for x in consumer.http_layers()]
    assert info.value.missing[0] == list(range(BLOCKS))
    assert consumer.stats.http_blocks == 0


async def test_relay_is_a_kvsp_holder(net: LocalNet, tmp_path: Path) -> None:
    """``kvsp_store``: the relay serves containers over HTTPS on its own port number (TCP),
    with its certificate and auth file; a spoiled object is recovered from it."""
    store = tmp_path / "relay-store"
    store.mkdir()
    relay = await net.relay(authorizer=AUTH_RELAY, kvsp_store=str(store))
    holder = await start_kvsp_beside(relay)
    try:
        assert holder.port == relay.port
        evil = await net.relay(TamperingRelay, upstream=relay,
                               upstream_token="prefill")  # type: ignore[arg-type]
        evil.drop = {(b"v.raw.s0", 2, 6)}  # type: ignore[misc]
        pub_ep = await net.client(relay, token=b"prefill")
        data = cache(36)
        from kvcs.kvnet.publisher import KvPublisher
        pub = KvPublisher(pub_ep, SCOPE, DESC, PROMPT)
        for i, (k, v) in enumerate(data):
            await pub.put_layer(i, k, v)
        await pub.finish()
        store_cache(BlockStore(store), DESC, SCOPE, PROMPT, [k for k, _ in data],
                    [v for _, v in data])
        async with KvspClient(holder.url, "decode-worker",
                              pin_sha256=net.cert.sha256) as client:
            assert await client.get_block(SID, DESC.compat_id, KEYS[0]) is not None
            consumer = KvConsumer(await net.client(evil, token=b"decode-worker"), SCOPE, DESC,
                                  PROMPT, recompute_budget_s=5, http=client)
            found = await consumer.discover()
            assert found is not None
            got = [x async for x in consumer.layers(found)]
            check_layers(got, data)
            assert consumer.stats.http_blocks == 1
        async with KvspClient(holder.url, "publish-only",
                              pin_sha256=net.cert.sha256) as other:  # may publish, not read
            with pytest.raises(KvspError, match="403"):
                await other.get_block(SID, DESC.compat_id, KEYS[0])
    finally:
        await holder.aclose()
