"""An edge relay whose upstream relay restarts reconnects by itself (jittered backoff) and
watches its downstream prefixes upstream again: a publication made on the restarted
upstream is discovered and retrieved through the edge, and a completed one the edge held
before stays discoverable while the upstream is away (real QUIC on 127.0.0.1)."""

from __future__ import annotations

from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.relay import Relay
from kvcs.testing import LocalNet, until

from .conftest import DESC, LAYERS, PROMPT, SCOPE, cache, same


async def _publish(net: LocalNet, relay: Relay, seed: int) -> tuple[list, tuple]:  # type: ignore[type-arg]
    """Publish cache ``seed`` at ``relay`` and hand it over: (its layers, its fields)."""
    data = cache(seed)
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT,
                      PublisherOptions(hand_over_s=10))
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()
    return data, pub.fields


async def _retrieve_whole(net: LocalNet, edge: Relay, data: list,  # type: ignore[type-arg]
                          fields: tuple) -> None:  # type: ignore[type-arg]
    """Discover the publication ``fields`` through ``edge`` and check every layer."""
    consumer = KvConsumer(await net.client(edge), SCOPE, DESC, PROMPT)
    found = [p for p in await consumer.discover_all() if p.fields == fields]
    assert found, "not discovered through the edge"
    got = [layer async for layer in consumer.layers(found[0])]
    assert [layer.index for layer in got] == list(range(LAYERS))
    assert all(same(g.k, data[g.index][0]) and same(g.v, data[g.index][1]) for g in got)


async def test_edge_reconnects_to_a_restarted_upstream(net: LocalNet) -> None:
    up = await net.relay()
    port = up.port
    edge = await net.relay(upstream=up)
    watcher = await net.client(edge)  # a decode worker watching for publications
    await watcher.subscribe_namespace((b"kvcs-1",))
    first = await _publish(net, up, 3)
    await _retrieve_whole(net, edge, *first)  # the edge now holds it complete
    await up.stop(grace=0)
    await until(lambda: edge.upstream is None, 5)
    # while the upstream is away the edge still offers what it holds
    await _retrieve_whole(net, edge, *first)
    up = await net.relay(listen=f"127.0.0.1:{port}")
    await until(lambda: edge.upstream is not None, 10)
    assert edge.metrics.get("kvcs_relay_upstream_reconnects_total") == 1
    # a new publication on the restarted upstream: found and pulled through the edge
    second = await _publish(net, up, 4)
    await _retrieve_whole(net, edge, *second)
