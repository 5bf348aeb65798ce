"""A tree of relays as one cache, with KV caches (issue #25), real QUIC on 127.0.0.1: a
root and edges; a publisher at edge 1; consumers at the other edges discover and retrieve
it bit-exact; it outlives its publisher; consumers of an edge that dies mid-transfer go on
through another edge; a relay restarted with ``--store`` serves what it held without
asking upstream."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.relay import Relay
from kvcs.testing import LocalNet, until

from .conftest import DESC, LAYERS, PROMPT, SCOPE, cache, same
from .helpers import retrieve_all


async def test_root_and_edges(net: LocalNet) -> None:
    root = await net.relay()
    e1, e2, e3 = [await net.relay(upstream=root) for _ in range(3)]
    data = cache(31)
    pub = KvPublisher(await net.client(e1), SCOPE, DESC, PROMPT,
                      PublisherOptions(hand_over_s=10))
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()  # hands over: edge 1 holds the publication complete
    await asyncio.gather(*[retrieve_all(KvConsumer(await net.client(e), SCOPE, DESC, PROMPT),
                                     data) for e in (e2, e2, e3)])
    # the publisher leaves; a consumer at a fourth edge still finds and retrieves it
    pub.endpoint.close()
    await pub.endpoint.wait_closed()
    await until(lambda: bool(e1.namespaces.retained))
    e4 = await net.relay(upstream=root)
    await retrieve_all(KvConsumer(await net.client(e4), SCOPE, DESC, PROMPT), data)


async def test_edge_killed_mid_transfer(net: LocalNet) -> None:
    """A live publication: the consumer's edge dies after the first layers; the consumer
    goes on through the other edge it was given and gets every layer bit-exact."""
    root = await net.relay()
    e1, e2, e3 = [await net.relay(upstream=root) for _ in range(3)]
    data = cache(32)
    pub = KvPublisher(await net.client(e1), SCOPE, DESC, PROMPT)
    await pub.start()
    for i in range(2):
        await pub.put_layer(i, *data[i])
    consumer = KvConsumer([await net.client(e2), await net.client(e3)], SCOPE, DESC, PROMPT,
                          recompute_budget_s=20)
    found = await consumer.discover()
    assert found is not None
    got = []
    async for layer in consumer.layers(found):
        got.append(layer)
        if len(got) == 2:  # edge 2 dies mid-publication; the rest is produced after
            await e2.stop(grace=0)
            for i in range(2, LAYERS):
                await pub.put_layer(i, *data[i])
            await pub.finish()
    assert [x.index for x in got] == list(range(LAYERS))
    for layer in got:
        k, v = data[layer.index]
        assert same(layer.k, k) and same(layer.v, v)


async def test_restarted_edge_serves_from_its_store(net: LocalNet, tmp_path: Path) -> None:
    root = await net.relay()
    store = str(tmp_path / "store")
    edge = await net.relay(upstream=root, store=store, sweep_interval=0.05)
    data = cache(33)
    pub = KvPublisher(await net.client(root), SCOPE, DESC, PROMPT)
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()
    await retrieve_all(KvConsumer(await net.client(edge), SCOPE, DESC, PROMPT), data)
    await edge.stop()  # a graceful stop saves every completed track
    net.relays.remove(edge)
    # restarted on the same directory, its upstream still configured: nothing asked of it
    again: Relay = await net.relay(upstream=root, store=store)
    await retrieve_all(KvConsumer(await net.client(again), SCOPE, DESC, PROMPT), data)
    # (only manifest.cose, which the publication does not have, was asked upstream)
    assert again.metrics.get("kvcs_relay_objects_in_total") == 0
    assert again.metrics.get("kvcs_relay_link_bytes_in_total",
                             link=f"upstream {again.upstream_url}") == 0
    assert again.metrics.get("kvcs_relay_store_loads_total") == 3
