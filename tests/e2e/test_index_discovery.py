"""Discovery through a KVSP Index (kvcs-draft "Discovering Publications"; KVSP profile
section 8), over real QUIC and HTTPS on 127.0.0.1: replica records name moqt://
publications (also of a longer prefix than the consumer's prompt, which prefix probing
cannot find) and https:// holders; a consumer configured with the index reveals no prefix
to the relay and follows holders it learns from another holder's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcs.auth import Authorizer
from kvcs.endpoint import Endpoint
from kvcs.kv.ids import block_keys, scope_id
from kvcs.kv.index import publication_uri
from kvcs.kv.store import BlockStore, store_cache
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.kvsp_http import KvspClient, KvspServer
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.relay import Relay
from kvcs.testing import LocalNet

from .conftest import BLOCK, BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .helpers import signing_key

SID = scope_id(SCOPE)
KEYS = block_keys(SCOPE, DESC.compat_id, PROMPT, BLOCK)
AUTH = Authorizer.from_mapping({"tokens": [
    {"token": "reader", "subscribe": [["kvcs-1", "hex:" + SID.hex()]]},
    {"token": "prefill", "publish": [["kvcs-1", "hex:" + SID.hex()]]}]})
SHORT = PROMPT[: 10 * BLOCK + 2]  # ten blocks (and a partial one) of the published prompt


@pytest.fixture
async def index(net: LocalNet, tmp_path: Path) -> KvspServer:
    """A KVSP Index that holds no containers itself."""
    return await net.kvsp_server(BlockStore(tmp_path / "index"), AUTH)


def _client(net: LocalNet, server: KvspServer, token: str) -> KvspClient:
    return KvspClient(server.url, token, pin_sha256=net.cert.sha256)


async def _publish_registered(net: LocalNet, relay: Relay, index: KvspServer, seed: int,
                              opts: PublisherOptions | None = None) -> list:
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT, opts)
    data = cache(seed)
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()
    async with _client(net, index, "prefill") as reg:
        await reg.register(SID, DESC.compat_id, KEYS,
                           publication_uri(f"moqt://127.0.0.1:{relay.port}/", pub.fields),
                           ttl=60)
    return data


def _subscribe_namespace_count(relay: Relay) -> float:
    return sum(relay.metrics.get("kvcs_relay_requests_total", type="subscribe_namespace",
                                 result=r) for r in ("ok", "unauthorized"))


async def test_longer_publication_found_only_through_the_index(
        net: LocalNet, index: KvspServer) -> None:
    relay = await net.relay()
    data = await _publish_registered(net, relay, index, 80)
    probing = KvConsumer(await net.client(relay), SCOPE, DESC, SHORT, discovery="prefix")
    assert await probing.discover() is None  # its Anchor Key is not one of the prompt's
    assert _subscribe_namespace_count(relay) == 10  # probing: ten prefixes revealed
    async with _client(net, index, "reader") as idx:
        c = KvConsumer(await net.client(relay), SCOPE, DESC, SHORT, index=idx)
        assert c.discovery == "index-first"
        found = await c.discover()
        assert found is not None and found.prefix_blocks == 10 and found.index_blocks == 10
        got = [x async for x in c.prefix_layers(found)]
        assert [x.index for x in got] == list(range(LAYERS))
        for x in got:
            k, v = data[x.index]
            assert x.blocks == 10 and same(x.k, k[: 10 * BLOCK]) and same(x.v, v[: 10 * BLOCK])
        assert c.stats.excess == 0  # OBJECTID_FILTER 0..9


async def test_index_only_discovery_reveals_no_prefix_to_the_relay(
        net: LocalNet, index: KvspServer) -> None:
    """discovery="index" with no endpoint: the consumer connects to the relay the index
    names and never sends SUBSCRIBE_NAMESPACE."""
    relay = await net.relay()
    data = await _publish_registered(net, relay, index, 81)
    before = _subscribe_namespace_count(relay)
    opened: list[str] = []

    async def connect(url: str) -> Endpoint:
        opened.append(url)
        return await Endpoint.connect(url, cafile=str(net.cert.certfile), settings=net.settings)

    async with _client(net, index, "reader") as idx, \
            KvConsumer([], SCOPE, DESC, PROMPT, index=idx, discovery="index",
                       connect=connect) as c:
        found = await c.discover()
        assert found is not None and found.prefix_blocks == BLOCKS and found.index_blocks == 0
        got = [x async for x in c.prefix_layers(found, range(2, 4))]
        assert [x.index for x in got] == [2, 3] and same(got[1].k, data[3][0])
        assert opened == [f"moqt://127.0.0.1:{relay.port}/"]
    assert _subscribe_namespace_count(relay) == before


async def test_index_coverage_is_not_enough_for_producer_authenticity(
        net: LocalNet, index: KvspServer) -> None:
    key, keyring = signing_key("prefill-index")
    relay = await net.relay()
    await _publish_registered(net, relay, index, 82, PublisherOptions(producer_key=key))
    async with _client(net, index, "reader") as idx:
        c = KvConsumer(await net.client(relay), SCOPE, DESC, SHORT, index=idx,
                       discovery="index", keyring=keyring, require_signed=True)
        assert await c.discover() is None  # the prompt cannot check the longer segment
        assert "block_keys_sha256" in c.discarded[0][1]
        full = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT, index=idx,
                          discovery="index", keyring=keyring, require_signed=True)
        found = await full.discover()
        assert found is not None and found.index_blocks == 0


async def test_https_holders_learned_from_another_holders_answer(
        net: LocalNet, index: KvspServer, tmp_path: Path) -> None:
    """The consumer knows only the index; the index's lookup names holder B, which has the
    containers: every block comes from B, verified."""
    data = cache(83)
    store_b = BlockStore(tmp_path / "b")
    store_cache(store_b, DESC, SCOPE, PROMPT, [k for k, _ in data], [v for _, v in data])
    holder_b = await net.kvsp_server(store_b, AUTH)
    async with _client(net, index, "prefill") as reg:
        await reg.register(SID, DESC.compat_id, KEYS, holder_b.url, ttl=60)
    async with _client(net, index, "reader") as http:
        c = KvConsumer([], SCOPE, DESC, PROMPT, http=http)
        got = [x async for x in c.http_layers()]
    assert [x.index for x in got] == list(range(LAYERS))
    for x in got:
        assert same(x.k, data[x.index][0]) and same(x.v, data[x.index][1])
    assert c.stats.http_blocks == BLOCKS


def test_index_options_are_checked() -> None:
    with pytest.raises(ValueError, match="needs index"):
        KvConsumer([], SCOPE, DESC, PROMPT, http=object(), discovery="index")  # type: ignore
    with pytest.raises(ValueError, match="discovery must be"):
        KvConsumer([], SCOPE, DESC, PROMPT, index=object(), discovery="guess")  # type: ignore
