"""A relay in the path that flips bytes, drops objects or swaps publications: bad objects
are discarded, recovered elsewhere or reported for recompute; no wrong tensor is yielded."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcs.kv.errors import ManifestError
from kvcs.kv.manifest import Manifest
from kvcs.kvnet.consumer import KvConsumer, RecomputeRequired
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.moqt import events as ev
from kvcs.moqt.track import Track
from kvcs.moqt.wire import ObjectRecord
from kvcs.relay import Relay
from kvcs.relay.links import Link, Links
from kvcs.testing import LocalNet, reached

from .conftest import BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache
from .helpers import check_layers, produce_slowly, publish_cache, signing_key


class RewritingRelay(Relay):
    """A relay that may change or drop each object it receives from upstream before
    caching and forwarding it: subclasses override :meth:`rewrite`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.links = _RewritingLinks(self)

    def rewrite(self, track: Track, record: ObjectRecord) -> bool:
        """Change ``record`` in place; False drops it."""
        return True


class _RewritingLinks(Links):
    """Upstream subscriptions whose objects a :class:`RewritingRelay` rewrites."""

    def __init__(self, relay: RewritingRelay) -> None:
        super().__init__(relay)
        self.evil = relay

    def on_objects(self, link: Link, events: list[ev.ObjectReceived]) -> None:
        # the relay takes received objects as runs (Links.on_objects) since ca2ae5c: an
        # on_object override was no longer called and nothing was tampered with
        super().on_objects(link, [e for e in events if self.evil.rewrite(link.track, e.record)])


class TamperingRelay(RewritingRelay):
    """A relay that corrupts what it caches: ``flip``/``drop`` sets of
    (track name, group, object), and ``swap`` payload replacements."""

    flip: set[tuple[bytes, int, int]] = set()
    drop: set[tuple[bytes, int, int]] = set()
    swap: dict[tuple[bytes, int, int], bytes] = {}

    def rewrite(self, track: Track, record: ObjectRecord) -> bool:
        key = (track.name, record.group_id, record.object_id)
        if key in self.drop:
            return False
        if key in self.flip:
            bad = bytearray(record.payload)
            bad[-1] ^= 0x40
            record.payload = memoryview(bytes(bad))
        if key in self.swap:
            record.payload = memoryview(self.swap[key])
        return True


@pytest.mark.parametrize("mode", ["flip", "drop"])
async def test_bad_objects_recovered_from_another_relay(net: LocalNet, mode: str,
                                                        hashing: str) -> None:
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    bad = {(b"k.raw.s0", 2, 3), (b"v.raw.s0", 4, 0)}
    evil.flip, evil.drop = (bad, set()) if mode == "flip" else (set(), bad)  # type: ignore
    _, data = await publish_cache(net, clean, 11)
    consumer = KvConsumer([await net.client(evil), await net.client(clean)], SCOPE, DESC,
                          PROMPT, recompute_budget_s=5)
    found = await consumer.discover()
    assert found is not None
    got = [x async for x in consumer.layers(found)]
    assert [x.index for x in got] == list(range(LAYERS))
    check_layers(got, data)
    assert consumer.stats.retries >= 1
    if mode == "flip":
        assert consumer.stats.rejected == 2


async def test_unrecoverable_objects_reported_for_recompute(net: LocalNet) -> None:
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    evil.flip = {(b"k.raw.s0", 3, 5)}  # type: ignore[misc]
    evil.drop = {(b"v.raw.s0", 3, 9)}  # type: ignore[misc]
    _, data = await publish_cache(net, clean, 12)
    consumer = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT, recompute_budget_s=2)
    found = await consumer.discover()
    assert found is not None
    got = []
    with pytest.raises(RecomputeRequired) as info:
        async for layer in consumer.layers(found):
            got.append(layer)
    assert [x.index for x in got] == [0, 1, 2]  # nothing wrong, nothing out of order
    check_layers(got, data)
    assert info.value.missing[3] == [5, 9]
    assert info.value.yielded == 3


async def test_swapped_publication_detected_by_signed_digests(net: LocalNet,
                                                               hashing: str) -> None:
    key, keyring = signing_key("prefill-1")
    clean = await net.relay()
    evil = await net.relay(TamperingRelay, upstream=clean)
    opts = PublisherOptions(producer_key=key)
    _, data_a = await publish_cache(net, clean, 13, opts)
    # a second, independent publication of the same prefix (different bits)
    pub_b, _ = await publish_cache(net, clean, 14, opts)
    swapped = {}
    track_b = pub_b.endpoint.tracks[(pub_b.fields, b"k.raw.s0")]
    for g in (1, 4):
        obj = track_b.get(type(track_b.largest)(g, 2))  # type: ignore[arg-type, misc]
        swapped[(b"k.raw.s0", g, 2)] = bytes(obj.payload)
    evil.swap = swapped  # type: ignore[misc]
    consumer = KvConsumer([await net.client(evil), await net.client(clean)], SCOPE, DESC,
                          PROMPT, keyring=keyring, require_signed=True, recompute_budget_s=5)
    pubs = await consumer.discover_all()
    assert len(pubs) == 2
    target = next(p for p in pubs if p.namespace.publication_id != pub_b.publication_id)
    got = [x async for x in consumer.layers(target)]
    check_layers(got, data_a)  # objects of the other publication never made it into a tensor
    assert consumer.stats.rejected >= 2 and consumer.stats.retries >= 1


async def test_manifest_with_another_compat_id_is_discarded(net: LocalNet) -> None:
    class LyingPublisher(KvPublisher):
        def manifest(self) -> Manifest:
            m = super().manifest()
            m.compat = {**m.compat, "revision": "something-else"}
            return m

    relay = await net.relay()
    ep = await net.client(relay)
    liar = LyingPublisher(ep, SCOPE, DESC, PROMPT)
    for i, (k, v) in enumerate(cache(15)):
        await liar.put_layer(i, k, v)
    await liar.finish()
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT)
    assert await consumer.discover() is None
    assert consumer.discarded and "Compatibility ID" in consumer.discarded[0][1]
    pubs = await consumer.discover_all()
    with pytest.raises(ManifestError):
        await consumer.manifest(pubs[0])
    # an honest publication of the same prefix is then found and used
    _, data = await publish_cache(net, relay, 16)
    found = await consumer.discover()
    assert found is not None and found.prefix_blocks == BLOCKS
    check_layers([x async for x in consumer.layers(found, range(0, 2))], data)
    assert np.array_equal(found.namespace.compat_id, DESC.compat_id)


async def test_live_signed_layers_confirmed_by_later_manifest_versions(net: LocalNet) -> None:
    """Live + authenticity required: each layer is yielded once a newer signed manifest
    lists its digests (object_digests), while production goes on."""
    key, keyring = signing_key("prefill-live")
    relay = await net.relay()
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT,
                      PublisherOptions(producer_key=key, manifest_every=2))
    await pub.start()
    data = cache(17)
    task, started = produce_slowly(pub, data, started_after=0, pause=0.1)
    await reached(started, task)
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT, keyring=keyring,
                          require_signed=True)
    found = await consumer.discover()
    assert found is not None
    got = [x async for x in consumer.layers(found)]
    await task
    assert [x.index for x in got] == list(range(LAYERS))
    check_layers(got, data)
    assert consumer.stats.rejected == 0
