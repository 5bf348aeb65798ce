"""A KVCS publication through moq.Server (moq-dev/moq) end to end, at draft 22.

moq-dev/moq accepts only UTF-8 namespace fields, so both ends select the hex namespace
encoding (a documented deviation from the KVCS document). Its relay has no TRACK_STATUS,
one group per FETCH, fills only inside the current group, forgets a track once its upstream
subscription ends and caps groups at 32 MiB / 8192 objects; the consumer runs with
``relay_profile="moq-dev"`` and the publisher with ``data_end_of_track=False`` and the caps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

pytest.importorskip("moq")

from moq_helpers import FfiServer

from kvcs.endpoint import Endpoint
from kvcs.kv.ids import CompatDescriptor, ScopeKey
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher, PublicationError, PublisherOptions
from kvcs.transport import QuicSettings

pytestmark = pytest.mark.interop

SCOPE = ScopeKey(bytes(range(32)))
DESC = CompatDescriptor.from_dict({
    "kvsp": 1, "model": "interop", "revision": "0", "tokenizer": "t0", "layers": 8,
    "kv_heads": 2, "head_dim": 64, "dtype": "float16", "block_tokens": 16, "layout": "tnd",
    "rope": "post",
})
TOKENS = list(range(16 * 12 + 5))  # 12 blocks and a partial one
ROWS = 16 * 12
CAP = 32 << 20  # moq-dev/moq group size limit
MOQ_DEV = PublisherOptions(hex_namespace=True, max_group_bytes=CAP, max_group_objects=8192,
                           data_end_of_track=False)


def kv_layers(seed: int = 7) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shape = (len(TOKENS), DESC.kv_heads, DESC.head_dim)
    return [(rng.standard_normal(shape).astype(np.float16),
             rng.standard_normal(shape).astype(np.float16)) for _ in range(DESC.layers)]


@pytest.fixture
async def endpoints() -> AsyncIterator[tuple[FfiServer, Endpoint, Endpoint]]:
    async with FfiServer() as srv:
        url = f"moqt://127.0.0.1:{srv.port}/"
        pub = await Endpoint.connect(url, verify=False, settings=QuicSettings.loopback())
        con = await Endpoint.connect(url, verify=False, settings=QuicSettings.loopback())
        try:
            yield srv, pub, con
        finally:
            for ep in (pub, con):
                ep.close()
            for ep in (pub, con):
                await asyncio.wait_for(ep.wait_closed(), 5)
    assert srv.session_errors == []


async def publish_live(pub: KvPublisher,
                       kv: list[tuple[np.ndarray, np.ndarray]]) -> asyncio.Task[None]:
    """Publish layers 0-2 now, and the rest (one every 50 ms, then finish) in the returned
    task: a consumer that starts now joins while layers 3.. are still being computed."""
    for i in range(3):
        await pub.put_layer(i, *kv[i])

    async def rest() -> None:
        for i in range(3, DESC.layers):
            await asyncio.sleep(0.05)
            await pub.put_layer(i, *kv[i])
        await pub.finish()

    return asyncio.create_task(rest())


def consumer(ep: Endpoint) -> KvConsumer:
    return KvConsumer(ep, SCOPE, DESC, TOKENS, hex_namespace=True, relay_profile="moq-dev",
                      discovery_timeout=0.5, recompute_budget_s=3.0)


async def collect(con: KvConsumer, kv: list[tuple[np.ndarray, np.ndarray]]) -> list[int]:
    pub = await asyncio.wait_for(con.discover(), 5)
    assert pub is not None and pub.prefix_blocks == 12
    seen: list[int] = []
    async with asyncio.timeout(10):
        async for layer in con.layers(pub):
            k, v = kv[layer.index]
            assert np.array_equal(layer.k, k[:ROWS]) and np.array_equal(layer.v, v[:ROWS])
            seen.append(layer.index)
    return seen


async def test_completed_publication(endpoints: tuple[FfiServer, Endpoint, Endpoint]) -> None:
    _srv, pub_ep, con_ep = endpoints
    kv = kv_layers()
    pub = KvPublisher(pub_ep, SCOPE, DESC, TOKENS, MOQ_DEV)
    assert all(f.isascii() for f in pub.fields)  # hex namespace: UTF-8-safe fields
    for i, (k, v) in enumerate(kv):
        await pub.put_layer(i, k, v)
    await pub.finish()
    con = consumer(con_ep)
    assert await collect(con, kv) == list(range(DESC.layers))
    assert con.stats.rejected == 0
    assert con.manifests[pub.fields].segment(0).complete  # type: ignore[union-attr]


async def test_live_publication(endpoints: tuple[FfiServer, Endpoint, Endpoint]) -> None:
    _srv, pub_ep, con_ep = endpoints
    kv = kv_layers(8)
    pub = KvPublisher(pub_ep, SCOPE, DESC, TOKENS, MOQ_DEV)
    feeder = await publish_live(pub, kv)
    con = consumer(con_ep)
    assert await collect(con, kv) == list(range(DESC.layers))
    await feeder


def test_group_over_relay_cap_is_refused() -> None:
    # 1100 blocks of 16 tokens x 8 heads x 128 dims in float16: 32 KiB a block, over 32 MiB
    desc = CompatDescriptor.from_dict({**DESC.members, "kv_heads": 8, "head_dim": 128})
    tokens = list(range(16 * 1100))

    class NoTarget:  # the check happens before anything is created on the endpoint
        def create_track(self, *a: object, **kw: object) -> None:
            raise AssertionError("no track expected")

    with pytest.raises(PublicationError, match=r"over the relay's limit of 33554432 bytes"):
        KvPublisher(NoTarget(), SCOPE, desc, tokens, MOQ_DEV)  # type: ignore[arg-type]
    opts = PublisherOptions(hex_namespace=True, max_group_objects=1024)
    with pytest.raises(PublicationError, match=r"over the relay's limit of 1024"):
        KvPublisher(NoTarget(), SCOPE, desc, tokens, opts)  # type: ignore[arg-type]


async def test_encoded_group_over_cap_publishes_nothing() -> None:
    """A non-raw codec is checked once the layer is encoded: nothing of it is published."""
    from kvcs.hosting import TrackHost

    host = TrackHost()
    opts = PublisherOptions(codec="q8", hex_namespace=True, max_group_bytes=4096)
    pub = KvPublisher(host, SCOPE, DESC, TOKENS, opts)
    kv = kv_layers()
    await pub.start()
    with pytest.raises(PublicationError, match="exceeds the 4096-byte group limit"):
        await pub.put_layer(0, *kv[0])
    assert all(t.count == 0 for name, t in host.tracks.items() if name[1] != b"manifest")
    with pytest.raises(PublicationError, match="publication stopped"):
        await pub.put_layer(0, *kv[0])
