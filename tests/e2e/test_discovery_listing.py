"""Discovery in one round trip whatever the prompt's length (issue #26): one namespace
listing per lookup, hit or miss, through a relay, through an edge relay whose upstream
holds the publication, and directly from a publisher's endpoint; ``kvcs fetch`` on a
4096-token miss answers at once. Requests are counted, not timed."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

from kvcs.endpoint import Endpoint
from kvcs.hosting import TrackHost
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher
from kvcs.relay import Relay
from kvcs.testing import LocalNet

from .cli_run import cli_inputs, run_kvcs
from .conftest import BLOCK, DESC, LAYERS, SCOPE

LONG = 4096
"""Prompt tokens of the long prompts (1024 blocks of 4 tokens)."""
PUBLISHED = np.arange(LONG, dtype=np.int64) + 5
OTHER = np.arange(LONG, dtype=np.int64) + 700_000


def _namespace_requests(relay: Relay) -> float:
    return sum(relay.metrics.get("kvcs_relay_requests_total", type="subscribe_namespace",
                                 result=r) for r in ("ok", "unauthorized", "rejected"))


async def _publish(target: object, tokens: np.ndarray) -> KvPublisher:
    pub = KvPublisher(target, SCOPE, DESC, tokens)  # type: ignore[arg-type]
    shape = (len(tokens), 2, 64)
    for layer in range(LAYERS):
        k = np.full(shape, layer, np.float32).astype(DESC.dtype)
        await pub.put_layer(layer, k, k)
    await pub.finish()
    return pub


async def test_long_prompt_hit_and_miss_in_one_request(net: LocalNet) -> None:
    relay = await net.relay()
    pub = await _publish(await net.client(relay), PUBLISHED)
    ep = await net.client(relay)
    before = _namespace_requests(relay)
    # a hit: the published 4096-token prompt, plus more tokens the publication lacks
    longer = np.concatenate([PUBLISHED, np.arange(64 * BLOCK) + 9_000_000])
    hit = KvConsumer(ep, SCOPE, DESC, longer)
    assert hit.discovery == "namespace"
    found = await hit.discover()
    assert found is not None and found.prefix_blocks == LONG // BLOCK
    assert found.namespace.publication_id == pub.publication_id
    assert hit.stats.discovery_requests == 1
    assert _namespace_requests(relay) - before == 1
    # a miss: another 4096-token prompt; one request too
    miss = KvConsumer(ep, SCOPE, DESC, OTHER)
    assert await miss.discover() is None
    assert miss.stats.discovery_requests == 1
    assert _namespace_requests(relay) - before == 2
    # a shorter prompt inside the published one finds nothing (its Anchor Key differs)
    # unless it ends where a publication ends; the lookup alone reads no manifest
    short = KvConsumer(ep, SCOPE, DESC, PUBLISHED[: 100 * BLOCK])
    assert await short.longest_prefix() is None
    again = KvConsumer(ep, SCOPE, DESC, longer)
    top = await again.longest_prefix(budget_s=2.0)
    assert top is not None and top.prefix_blocks == LONG // BLOCK
    assert again.stats.manifest_versions == 0 and not again.manifests
    # prefix probing only when asked for: one request per prefix length probed
    probing = KvConsumer(ep, SCOPE, DESC, PUBLISHED[: 8 * BLOCK], discovery="prefix")
    assert await probing.discover() is None
    assert probing.stats.discovery_requests == 8


async def test_listing_through_an_edge_relay_waits_for_its_upstream(net: LocalNet) -> None:
    """The edge knows nothing of the publication until it asks its upstream: it confirms
    the listing only after the upstream confirmed it, so a first lookup finds it."""
    origin = await net.relay()
    edge = await net.relay(upstream=origin)
    pub = await _publish(await net.client(origin), PUBLISHED)
    c = KvConsumer(await net.client(edge), SCOPE, DESC, PUBLISHED)
    found = await c.discover()
    assert found is not None and found.namespace.publication_id == pub.publication_id
    assert c.stats.discovery_requests == 1
    assert await KvConsumer(await net.client(edge), SCOPE, DESC, OTHER).discover() is None


async def test_listing_from_a_publishers_own_endpoint(net: LocalNet) -> None:
    """No relay: a TrackHost serving the publication answers the listing itself."""
    host = TrackHost()
    server = await host.listen("127.0.0.1", 0, certfile=str(net.cert.certfile),
                               keyfile=str(net.cert.keyfile), settings=net.settings)
    try:
        pub = await _publish(host, PUBLISHED)
        ep = await Endpoint.connect(f"moqt://127.0.0.1:{server.port}/",
                                    cafile=str(net.cert.certfile), settings=net.settings)
        net.endpoints.append(ep)
        c = KvConsumer(ep, SCOPE, DESC, PUBLISHED)
        found = await c.discover()
        assert found is not None and found.namespace.publication_id == pub.publication_id
        assert c.stats.discovery_requests == 1
        assert await KvConsumer(ep, SCOPE, DESC, OTHER).discover() is None
    finally:
        await net.close_endpoints()
        await host.aclose()


async def test_fetch_of_a_long_miss_exits_at_once(net: LocalNet, tmp_path: Path) -> None:
    """``kvcs fetch --recompute-budget 1`` on a 4096-token prompt nobody published says
    "no publication" after one request, its discovery within the 1.5 s the issue asks for
    (it took 26-27 s, one 0.1 s probe per block). The process's start-up is not the
    lookup: importing kvcs, numpy and a QUIC library took 3.7-16 s of wall time here at
    load 9 on 2 cores, so the whole run gets a generous bound (probing these 1024 blocks
    would take 100 s) and the discovery's own time, which the command logs, the 1.5 s."""
    relay = await net.relay()
    await _publish(await net.client(relay), PUBLISHED)
    f = cli_inputs(tmp_path)
    np.save(tmp_path / "other.npy", OTHER)
    before = _namespace_requests(relay)
    t0 = time.monotonic()
    rc, _, err = await run_kvcs(
        "fetch", "--relay", f"moqt://127.0.0.1:{relay.port}/", "--cafile",
        str(net.cert.certfile), "--descriptor", f["desc"], "--scope-key", f["scope"],
        "--loopback", "--tokens", str(tmp_path / "other.npy"), "--recompute-budget", "1",
        "--log-level", "info", "--out", str(tmp_path / "x.npz"))
    took = time.monotonic() - t0
    assert rc == 1 and "no publication" in err, err
    assert _namespace_requests(relay) - before == 1
    found = re.search(r"discovery: nothing in ([0-9.]+) ms \((\d+) request", err)
    assert found is not None, err
    assert float(found[1]) < 1500 and int(found[2]) == 1, found[0]
    assert took < 60, took
