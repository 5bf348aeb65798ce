"""Publish and go (issue #16): a prefill worker publishes a completed cache and leaves; decode
workers that come later find it at the relay and at a relay chained behind it, until its
MAX_CACHE_DURATION has passed (real QUIC on 127.0.0.1)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher, PublicationError, PublisherOptions
from kvcs.testing import LocalNet, until

from .cli_run import cli_inputs, run_kvcs
from .conftest import BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same

RETENTION_S = 4.0


async def _retrieve(net: LocalNet, relay, data: list) -> None:  # type: ignore[no-untyped-def]
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT)
    found = await consumer.discover()
    assert found is not None and found.prefix_blocks == BLOCKS
    got = [layer async for layer in consumer.layers(found)]
    assert [layer.index for layer in got] == list(range(LAYERS))
    for layer in got:
        k, v = data[layer.index]
        assert same(layer.k, k) and same(layer.v, v)
    assert consumer.stats.rejected == 0


async def test_publisher_exits_after_finish_and_the_publication_stays(net: LocalNet) -> None:
    a = await net.relay(sweep_interval=0.05)
    b = await net.relay(upstream=a, sweep_interval=0.05)
    pub_ep = await net.client(a)
    data = cache(41)
    pub = KvPublisher(pub_ep, SCOPE, DESC, PROMPT, PublisherOptions(
        joint_codec="q8", retention_s=RETENTION_S, hand_over_s=10))
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()  # the relay holds every track now, also kv.q8 nobody asked for
    t_done = time.monotonic()
    pub_ep.close()
    await pub_ep.wait_closed()
    await until(lambda: not a.publishers)
    assert {name for _ns, name in a.origin.tracks} == {b"manifest", b"k.raw.s0", b"v.raw.s0",
                                                     b"kv.q8.s0"}
    # decode workers arriving afterwards: at A, and at B which asks A
    await _retrieve(net, a, data)
    await _retrieve(net, b, data)
    assert time.monotonic() - t_done < RETENTION_S, "retrieval slower than the retention"
    # MAX_CACHE_DURATION later the publication is gone everywhere
    await until(lambda: not a.origin.tracks and not b.origin.tracks, RETENTION_S + 3)
    await until(lambda: not a.namespaces.retained and not b.namespaces.retained, 2)
    for relay in (a, b):
        consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT)
        assert await consumer.discover() is None


async def test_hand_over_from_start_pulls_each_layer_as_it_is_published(
        net: LocalNet) -> None:
    """``hand_over_from_start``: the relay holds layer 0 while the later layers are still to
    come (before, it pulled the whole publication only once finish() was called); finish()
    also hands over the tracks of a segment added after the start; then the publisher
    leaves and decode workers get the whole publication."""
    from .test_segments import EXTRA

    a = await net.relay()
    pub_ep = await net.client(a)
    data, more = cache(44), cache(45, len(EXTRA))
    pub = KvPublisher(pub_ep, SCOPE, DESC, PROMPT, PublisherOptions(
        retention_s=60, hand_over_s=10, hand_over_from_start=True))
    await pub.put_layer(0, *data[0])

    def relay_has(name: bytes, group: int) -> bool:
        track = a.origin.tracks.get((tuple(pub.fields), name))
        return track is not None and track.largest is not None and track.largest.group >= group

    await until(lambda: relay_has(b"k.raw.s0", 0) and relay_has(b"v.raw.s0", 0))
    for i, (k, v) in enumerate(data[1:], 1):
        await pub.put_layer(i, k, v)
    pub.add_segment(EXTRA)
    for i, (k, v) in enumerate(more):
        await pub.put_layer(i, k, v, segment=1)
    await pub.finish()
    pub_ep.close()
    await pub_ep.wait_closed()
    await until(lambda: not a.publishers)
    held = {name: t.complete for (ns, name), t in a.origin.tracks.items()
            if ns == tuple(pub.fields)}
    assert held == {b"manifest": True, b"k.raw.s0": True, b"v.raw.s0": True,
                    b"k.raw.s1": True, b"v.raw.s1": True}
    await _retrieve(net, a, data)


async def test_hand_over_only_through_a_relay() -> None:
    from kvcs.hosting import TrackHost

    host = TrackHost()
    pub = KvPublisher(host, SCOPE, DESC, PROMPT, PublisherOptions(hand_over_s=1))
    for i, (k, v) in enumerate(cache(42)):
        await pub.put_layer(i, k, v)
    with pytest.raises(PublicationError, match="needs an endpoint connected to a relay"):
        await pub.finish()


async def test_kvcs_publish_exits_once_the_relay_holds_it(net: LocalNet,
                                                          tmp_path: Path) -> None:
    relay = await net.relay()
    f = cli_inputs(tmp_path, seed=43)
    data = cache(43)
    common = ["--relay", f"moqt://127.0.0.1:{relay.port}/", "--cafile",
              str(net.cert.certfile), "--descriptor", f["desc"], "--scope-key", f["scope"],
              "--loopback"]
    rc, out, err = await run_kvcs("publish", *common, "--tokens", f["tokens"], "--kv", f["kv"])
    assert rc == 0, err
    assert "publication complete" in out and "the relay holds the whole publication" in out
    await until(lambda: not relay.publishers)  # the publisher is gone
    out_path = tmp_path / "got.npz"
    rc, out, err = await run_kvcs("fetch", *common, "--tokens", f["tokens"], "--out",
                                  str(out_path))
    assert rc == 0, err
    with np.load(out_path) as z:
        for i, (k, v) in enumerate(data):
            assert np.array_equal(z[f"k.{i}"], k.view(np.uint16))
            assert np.array_equal(z[f"v.{i}"], v.view(np.uint16))


def test_options_refuse_a_retention_that_cannot_be_sent() -> None:
    """A negative retention fails at once, in one exception, not in three tasks after the
    publication started (it then waited the whole hand-over timeout)."""
    for bad in ({"retention_s": -5.0}, {"retention_s": 0.0}, {"hand_over_s": -1.0}):
        with pytest.raises(PublicationError, match="must be positive"):
            PublisherOptions(**bad)  # type: ignore[arg-type]
    assert PublisherOptions(retention_s=None).retention_s is None
