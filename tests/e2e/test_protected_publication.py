"""Protected publications (MOQT Secure Objects on every data track and the manifest) end to
end over real QUIC: through one relay and two chained relays whose caches hold only
ciphertext, consumers with the content keys get the publisher's tensors, consumers
without them never see plaintext, and key rotation mid-publication loses no layer."""

from __future__ import annotations

import asyncio

import pytest

from kvcs.kv.codecs import encode_component
from kvcs.kv.component import Component
from kvcs.kv.payload import build_payload_bytes
from kvcs.kv.scopefile import ScopeFile
from kvcs.kv.secure import KEY_ID_PROPERTY, SecureObjects
from kvcs.kvnet.consumer import KvConsumer, RecomputeRequired
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.moqt.wire import IMMUTABLE_PROPERTIES, ObjectStatus, decode_kvps
from kvcs.relay import Relay
from kvcs.testing import LocalNet

from .conftest import BLOCK, BLOCKS, DESC, LAYERS, PROMPT, SCOPE, cache, same

SCOPE_FILE = ScopeFile.new(SCOPE).rotated()  # content keys 1 and 2; 2 is current


def keys(scope: ScopeFile = SCOPE_FILE) -> SecureObjects:
    """A member's own copy of the scope's content keys."""
    return scope.secure_objects()


def plaintexts(data: list, codec: str = "raw") -> dict[tuple[bytes, int, int], bytes]:
    """Every data object's plaintext payload as the publisher builds it."""
    out = {}
    for layer, (k, v) in enumerate(data):
        for kind in (Component.K, Component.V):
            for b in range(BLOCKS):
                rows = slice(b * BLOCK, (b + 1) * BLOCK)
                body = encode_component(kind, codec, k[rows], v[rows])
                name = f"{kind.value}.{codec}.s0".encode()
                out[(name, layer, b)] = build_payload_bytes(kind, layer, b, b * BLOCK, BLOCK,
                                                            codec, body)
    return out


def assert_cache_holds_no_plaintext(relay: Relay, data: list, fields: tuple) -> int:
    """Every cached object of the publication is ciphertext: no plaintext payload, header
    or 64-byte piece of block data occurs in it, and the manifest JSON is not readable.
    Returns how many data objects were checked."""
    plain = plaintexts(data)
    pieces = {key: [p[:68]] + [p[i:i + 64] for i in range(68, len(p) - 63, 64)]
              for key, p in plain.items()}
    checked = 0
    for (ns, name), track in relay.origin.tracks.items():
        if tuple(ns) != fields:
            continue
        for obj in track.objects(type(track.largest)(0, 0)):  # type: ignore[misc, arg-type]
            if obj.status != ObjectStatus.NORMAL:
                continue
            payload = bytes(obj.payload)
            immutable = [v for t, v in obj.properties if t == IMMUTABLE_PROPERTIES]
            assert len(immutable) == 1, "a cached object lost its Key ID"
            assert decode_kvps(immutable[0])[0][0] == KEY_ID_PROPERTY
            if name.startswith(b"manifest"):
                assert b"segments" not in payload and b"compat" not in payload
                continue
            key = (name, obj.group_id, obj.object_id)
            assert plain[key] not in payload
            assert not any(piece in payload for piece in pieces[key])
            checked += 1
    return checked


def check(layers: list, data: list) -> None:
    for layer in layers:
        k, v = data[layer.index]
        assert same(layer.k, k) and same(layer.v, v)


async def take(consumer: KvConsumer) -> list:
    found = await consumer.discover()
    assert found is not None
    return [x async for x in consumer.layers(found)]


async def test_through_a_relay_and_two_chained_relays(net: LocalNet, hashing: str) -> None:
    a = await net.relay()
    b = await net.relay(upstream=a)
    data = cache(31)
    pub = KvPublisher(await net.client(a), SCOPE, DESC, PROMPT,
                      PublisherOptions(secure=keys(), manifest_every=2))
    await pub.start()
    for i in range(2):
        await pub.put_layer(i, *data[i])

    live = KvConsumer(await net.client(b), SCOPE, DESC, PROMPT, secure=keys())
    found = await live.discover()
    assert found is not None
    assert live.manifests[found.fields].protection is not None

    async def rest() -> None:
        for i in range(2, LAYERS):
            await asyncio.sleep(0.02)
            await pub.put_layer(i, *data[i])
        await pub.finish()

    producing = asyncio.create_task(rest())
    got_live = [x async for x in live.layers(found)]  # joined mid-production, at B
    await producing
    check(got_live, data)
    assert [x.index for x in got_live] == list(range(LAYERS))
    # completed: pulled from A's cache, and from B's (a fresh session at each)
    for relay in (a, b):
        late = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT, secure=keys())
        got = await take(late)
        check(got, data)
        assert late.stats.rejected == 0
    assert live.stats.rejected == 0
    for relay in (a, b):
        assert assert_cache_holds_no_plaintext(relay, data, pub.fields) == LAYERS * BLOCKS * 2

    # no content keys: the publication is refused with the reason, nothing is decoded
    keyless = KvConsumer(await net.client(b), SCOPE, DESC, PROMPT)
    assert await keyless.discover() is None
    assert "protected" in keyless.discarded[0][1]


async def test_unprotected_publication_refused_by_a_consumer_with_keys(net: LocalNet) -> None:
    """A consumer that holds content keys accepts only objects that decrypt: a publication
    (or a relay's substitute) in the clear is refused, never used as a fallback."""
    relay = await net.relay()
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT)
    for i, (k, v) in enumerate(cache(32)):
        await pub.put_layer(i, k, v)
    await pub.finish()
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT, secure=keys())
    assert await consumer.discover() is None
    assert "Immutable Properties" in consumer.discarded[0][1]


async def test_key_rotation_mid_publication(net: LocalNet, hashing: str) -> None:
    """The publisher starts Key ID 2 at layer 3; a live consumer and one that joins after
    the publication ended, both holding keys 1 and 2, get every layer."""
    scope = ScopeFile.new(SCOPE)  # key 1 only
    rotated = scope.rotated()  # adds key 2
    relay = await net.relay()
    data = cache(33)
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT,
                      PublisherOptions(secure=scope.secure_objects()))
    await pub.start()
    live = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT,
                      secure=rotated.secure_objects())
    found = await live.discover()
    assert found is not None

    async def produce() -> None:
        for i, (k, v) in enumerate(data):
            if i == 3:
                pub.use_content_key(rotated.content_keys[1])
            await pub.put_layer(i, k, v)
            await asyncio.sleep(0.02)
        await pub.finish()

    producing = asyncio.create_task(produce())
    got = [x async for x in live.layers(found)]
    await producing
    check(got, data)
    late = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT,
                      secure=rotated.secure_objects())
    got_late = await take(late)
    check(got_late, data)
    assert [x.index for x in got_late] == list(range(LAYERS))
    assert live.stats.rejected == late.stats.rejected == 0
    track = pub.endpoint.tracks[(pub.fields, b"k.raw.s0")]  # type: ignore[attr-defined]
    kids = {g: decode_kvps(track.get(type(track.largest)(g, 0)).properties[0][1])[0][1]
            for g in range(LAYERS)}
    assert kids == {g: 1 if g < 3 else 2 for g in range(LAYERS)}


@pytest.mark.parametrize("key_arrives", [True, False])
async def test_unknown_key_id_held_then_decrypted_or_missing(net: LocalNet,
                                                             key_arrives: bool) -> None:
    """A live consumer that lacks the new key holds its objects ``key_wait_s``: the key
    arrives (add_content_key) and every layer is delivered, or it does not and the rotated
    layers are reported for recompute, nothing wrong yielded."""
    scope = ScopeFile.new(SCOPE)
    rotated = scope.rotated()
    relay = await net.relay()
    data = cache(34)
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT,
                      PublisherOptions(secure=scope.secure_objects()))
    await pub.start()
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT,
                          secure=scope.secure_objects(), key_wait_s=0.5, recompute_budget_s=1)
    found = await consumer.discover()
    assert found is not None
    manifest = consumer.manifests[found.fields]  # version 0, under key 1
    for i in range(LAYERS):
        if i == 4:
            pub.use_content_key(rotated.content_keys[1])
        await pub.put_layer(i, *data[i])
    await pub.finish()
    got: list = []

    async def deliver_key() -> None:
        while consumer.stats.held < 2 * BLOCKS:  # layer 4 of K and V waits for the key
            await asyncio.sleep(0.01)
        consumer.add_content_key(rotated.content_keys[1])

    if key_arrives:
        arrival = asyncio.create_task(deliver_key())
        got = [x async for x in consumer.layers(found, manifest=manifest)]
        await arrival
        assert [x.index for x in got] == list(range(LAYERS))
        assert consumer.stats.rejected == 0
    else:
        with pytest.raises(RecomputeRequired) as info:
            async for layer in consumer.layers(found, manifest=manifest):
                got.append(layer)
        assert [x.index for x in got] == [0, 1, 2, 3]
        assert sorted(info.value.missing) == [4, 5]
        assert info.value.missing[4] == list(range(BLOCKS))
    check(got, data)
