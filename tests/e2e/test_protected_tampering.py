"""A relay in the path of a protected publication that tampers with what it caches: wrong
key, wrong or unknown Key ID, a flipped ciphertext or tag byte, an object moved to another
group, object or track, a truncated payload. Each such object is discarded as missing and
recovered from another relay or reported for recompute; nothing wrong is yielded. A member
of the scope without the producer key cannot get a forged manifest accepted by a consumer
that requires producer authenticity."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from kvcs.kv.codecs import encode_component
from kvcs.kv.component import Component
from kvcs.kv.cose import ProducerKey, sign_manifest
from kvcs.kv.manifest import Manifest
from kvcs.kv.payload import build_payload_bytes
from kvcs.kv.scopefile import ScopeFile
from kvcs.kv.secure import ContentKey, SecureObjects, build_immutable_properties
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.moqt.track import CachedObject, Track
from kvcs.moqt.wire import IMMUTABLE_PROPERTIES, Location, ObjectRecord
from kvcs.relay import Relay
from kvcs.testing import LocalNet

from .conftest import BLOCK, DESC, LAYERS, PROMPT, SCOPE, cache
from .helpers import check_layers, publish_cache, signing_key
from .retrieval import layers_until_recompute
from .test_tampering import RewritingRelay

SCOPE_FILE = ScopeFile.new(SCOPE).rotated()  # content keys 1 and 2; 2 is current
K_TRACK, V_TRACK = b"k.raw.s0", b"v.raw.s0"

Edit = Callable[[ObjectRecord], None]


class EditingRelay(RewritingRelay):
    """A relay that rewrites chosen objects it receives from upstream before caching and
    forwarding them: ``edits`` maps (track name, group or None for any, object) to a
    function that changes the record in place; ``only``: edit only this namespace's."""

    edits: dict[tuple[bytes, int | None, int], Edit] = {}
    only: tuple[bytes, ...] | None = None

    def rewrite(self, track: Track, record: ObjectRecord) -> bool:
        edit = (self.edits.get((track.name, record.group_id, record.object_id))
                or self.edits.get((track.name, None, record.object_id)))
        if self.only is not None and tuple(track.namespace) != self.only:
            edit = None
        if edit is not None and record.payload.nbytes:
            edit(record)
        return True


def _bytes_edit(change: Callable[[bytearray], bytes | bytearray]) -> Edit:
    def edit(r: ObjectRecord) -> None:
        r.payload = memoryview(bytes(change(bytearray(r.payload))))
    return edit


def _flip(index: int) -> Edit:
    def change(b: bytearray) -> bytearray:
        b[index] ^= 0x01
        return b
    return _bytes_edit(change)


def _replace(obj: CachedObject) -> Edit:
    """Serve ``obj`` (another Location's object: payload and properties) instead."""
    def edit(r: ObjectRecord) -> None:
        r.payload = memoryview(bytes(obj.payload))
        r.properties = obj.properties
    return edit


def _key_id(key_id: int) -> Edit:
    def edit(r: ObjectRecord) -> None:
        r.properties = ((IMMUTABLE_PROPERTIES, build_immutable_properties(key_id)),)
    return edit


def _forged(fields: tuple[bytes, ...], name: bytes, group: int, block: int) -> Edit:
    """An outsider's object: a well-formed KVCS payload of other data, encrypted under the
    right Key ID with a key that is not the scope's."""
    kind = Component.K if name == K_TRACK else Component.V
    k, v = cache(99)[group]
    rows = slice(block * BLOCK, (block + 1) * BLOCK)
    payload = build_payload_bytes(kind, group, block, block * BLOCK, BLOCK, "raw",
                                  encode_component(kind, "raw", k[rows], v[rows]))
    outsider = SecureObjects([ContentKey(2, SCOPE_FILE.content_keys[1].suite, bytes(32))])
    prio = 128 * group // LAYERS
    forged = outsider.encrypt_object(fields, name, group, block, payload,
                                     publisher_priority=prio)

    def edit(r: ObjectRecord) -> None:
        r.payload = memoryview(forged.payload)
        r.properties = forged.properties
    return edit


TAMPERING: dict[str, Callable[[KvPublisher], dict[tuple[bytes, int | None, int], Edit]]] = {
    "wrong key": lambda p: {(K_TRACK, 2, 3): _forged(p.fields, K_TRACK, 2, 3),
                            (V_TRACK, 4, 0): _forged(p.fields, V_TRACK, 4, 0)},
    "wrong key id": lambda p: {(K_TRACK, 2, 3): _key_id(1), (V_TRACK, 4, 0): _key_id(1)},
    "unknown key id": lambda p: {(K_TRACK, 2, 3): _key_id(7), (V_TRACK, 4, 0): _key_id(7)},
    "flipped ciphertext byte": lambda p: {(K_TRACK, 2, 3): _flip(0), (V_TRACK, 4, 0): _flip(500)},
    "flipped tag byte": lambda p: {(K_TRACK, 2, 3): _flip(-1), (V_TRACK, 4, 0): _flip(-16)},
    "moved to another group": lambda p: {(K_TRACK, 2, 3): _replace(_sent(p, K_TRACK, 1, 3)),
                                         (V_TRACK, 4, 0): _replace(_sent(p, V_TRACK, 5, 0))},
    "moved to another object": lambda p: {(K_TRACK, 2, 3): _replace(_sent(p, K_TRACK, 2, 4)),
                                          (V_TRACK, 4, 0): _replace(_sent(p, V_TRACK, 4, 1))},
    "moved to another track": lambda p: {(K_TRACK, 2, 3): _replace(_sent(p, V_TRACK, 2, 3)),
                                         (V_TRACK, 4, 0): _replace(_sent(p, K_TRACK, 4, 0))},
    "truncated payload": lambda p: {(K_TRACK, 2, 3): _bytes_edit(lambda b: b[: len(b) // 2]),
                                    (V_TRACK, 4, 0): _bytes_edit(lambda b: b[:-1])},
}


def _sent(pub: KvPublisher, name: bytes, group: int, block: int) -> CachedObject:
    """The protected object the publisher sent at (name, group, block)."""
    track = pub.endpoint.tracks[(pub.fields, name)]  # type: ignore[attr-defined]
    obj = track.get(Location(group, block))
    assert obj is not None
    return obj


async def _publish(net: LocalNet, relay: Relay, seed: int,
                   opts: PublisherOptions | None = None) -> tuple[KvPublisher, list]:
    """:func:`publish_cache`, protected with the scope file's content keys by default."""
    return await publish_cache(net, relay, seed,
                               opts or PublisherOptions(secure=SCOPE_FILE.secure_objects()))


@pytest.mark.parametrize("mode", sorted(TAMPERING))
async def test_tampered_object_recovered_from_another_relay(net: LocalNet, mode: str) -> None:
    clean = await net.relay()
    evil = await net.relay(EditingRelay, upstream=clean)
    pub, data = await _publish(net, clean, 41)
    evil.edits = TAMPERING[mode](pub)  # type: ignore[attr-defined]
    consumer = KvConsumer([await net.client(evil), await net.client(clean)], SCOPE, DESC,
                          PROMPT, secure=SCOPE_FILE.secure_objects(), key_wait_s=0.2,
                          recompute_budget_s=5)
    got = [x async for x in consumer.layers(await _found(consumer))]
    assert [x.index for x in got] == list(range(LAYERS))
    check_layers(got, data)
    assert consumer.stats.rejected == 2 and consumer.stats.retries >= 1
    assert consumer.stats.held == (2 if mode == "unknown key id" else 0)


async def _found(consumer: KvConsumer) -> Any:
    found = await consumer.discover()
    assert found is not None
    return found


async def test_tampered_objects_without_another_source_are_reported(net: LocalNet) -> None:
    clean = await net.relay()
    evil = await net.relay(EditingRelay, upstream=clean)
    pub, data = await _publish(net, clean, 42)
    evil.edits = {(K_TRACK, 3, 5): _flip(7), (V_TRACK, 3, 9): _flip(-1),  # type: ignore[attr-defined]
                  (K_TRACK, 4, 0): _replace(_sent(pub, K_TRACK, 4, 1))}
    consumer = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT,
                          secure=SCOPE_FILE.secure_objects(), recompute_budget_s=1)
    got, short = await layers_until_recompute(consumer.layers(await _found(consumer)))
    assert [x.index for x in got] == [0, 1, 2]  # nothing wrong, nothing out of order
    check_layers(got, data)
    assert short.missing == {3: [5, 9], 4: [0]}
    assert short.yielded == 3


async def test_recovered_from_a_deterministic_alternate_publication(net: LocalNet) -> None:
    """A block tampered with in one protected publication comes from another, deterministic
    publication of the same prefix: it decrypts under that publication's own track keys."""
    relay = await net.relay()
    evil = await net.relay(EditingRelay, upstream=relay)
    opts = [PublisherOptions(secure=SCOPE_FILE.secure_objects(), deterministic=True)
            for _ in range(2)]
    pub_a, data = await _publish(net, relay, 45, opts[0])
    await _publish(net, relay, 45, opts[1])  # the same cache, another namespace
    evil.edits = {(K_TRACK, 2, 3): _flip(0), (V_TRACK, 4, 1): _flip(-1)}  # type: ignore[attr-defined]
    evil.only = pub_a.fields  # type: ignore[attr-defined]
    consumer = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT,
                          secure=SCOPE_FILE.secure_objects(), recompute_budget_s=5)
    pubs = await consumer.discover_all()
    target = next(p for p in pubs if p.fields == pub_a.fields)
    others = [p for p in pubs if p is not target]
    got = [x async for x in consumer.layers(target, alternates=others)]
    assert [x.index for x in got] == list(range(LAYERS))
    check_layers(got, data)
    # rejected by the first retrieval and by the retry of the same publication, then taken
    # from the alternate
    assert consumer.stats.rejected == 4 and consumer.stats.retries == 2


async def test_member_cannot_forge_a_signed_manifest(net: LocalNet) -> None:
    """A member (content keys, no producer key) rewrites the manifest.cose of the producer's
    publication with its own manifest, as a valid Secure Object signed with its own key:
    a consumer that requires producer authenticity discards the publication."""
    producer, keyring = signing_key("producer")
    member_key = ProducerKey.generate("producer")  # same kid, not the producer's key
    clean = await net.relay()
    evil = await net.relay(EditingRelay, upstream=clean)
    pub, _ = await _publish(net, clean, 43, PublisherOptions(
        secure=SCOPE_FILE.secure_objects(), producer_key=producer))
    member = SCOPE_FILE.secure_objects()
    honest = pub.manifest()

    def forge(r: ObjectRecord) -> None:
        lie = Manifest.from_dict({**honest.to_dict(), "deterministic": True})
        obj = member.encrypt_object(pub.fields, b"manifest.cose", r.group_id, r.object_id,
                                    sign_manifest(lie.to_json_bytes(), member_key),
                                    publisher_priority=0)
        r.payload = memoryview(obj.payload)
        r.properties = obj.properties

    evil.edits = {(b"manifest.cose", None, 0): forge}  # type: ignore[attr-defined]
    strict = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT, keyring=keyring,
                        require_signed=True, secure=SCOPE_FILE.secure_objects())
    assert await strict.discover() is None
    assert "signature" in strict.discarded[0][1]
    # through the honest relay the same strict consumer accepts the producer's manifest
    direct = KvConsumer(await net.client(clean), SCOPE, DESC, PROMPT, keyring=keyring,
                        require_signed=True, secure=SCOPE_FILE.secure_objects())
    found = await direct.discover()
    assert found is not None and not direct.manifests[found.fields].deterministic


async def test_a_keyring_requires_the_signed_manifest_by_default(net: LocalNet) -> None:
    """A consumer given producer keys never falls back to an unsigned manifest: a member's
    publication (protected, decrypts, but unsigned) is refused."""
    _, keyring = signing_key("producer")
    relay = await net.relay()
    await _publish(net, relay, 44)  # protected, no producer key
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, PROMPT, keyring=keyring,
                          secure=SCOPE_FILE.secure_objects())
    assert consumer.require_signed
    assert await consumer.discover() is None
    assert "no signed manifest" in consumer.discarded[0][1]


async def test_tampered_manifest_version_discarded_while_following(
        net: LocalNet, caplog: pytest.LogCaptureFixture) -> None:
    """A live protected retrieval follows the newer manifest versions, each decrypted before
    its signature is checked; a version a relay tampered with is discarded and the next one
    confirms the layers it would have."""
    producer, keyring = signing_key("producer")
    clean = await net.relay()
    evil = await net.relay(EditingRelay, upstream=clean)
    evil.edits = {(b"manifest.cose", 1, 0): _flip(-1)}  # type: ignore[attr-defined]
    pub = KvPublisher(await net.client(clean), SCOPE, DESC, PROMPT, PublisherOptions(
        secure=SCOPE_FILE.secure_objects(), producer_key=producer, manifest_every=2))
    await pub.start()
    consumer = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT, keyring=keyring,
                          secure=SCOPE_FILE.secure_objects(), recompute_budget_s=5)
    found = await _found(consumer)
    data = cache(46)

    async def produce() -> None:
        for i, (k, v) in enumerate(data):
            await pub.put_layer(i, k, v)
            await asyncio.sleep(0.02)
        await pub.finish()

    producing = asyncio.create_task(produce())
    got = [x async for x in consumer.layers(found)]
    await producing
    assert [x.index for x in got] == list(range(LAYERS))
    check_layers(got, data)
    assert consumer.stats.rejected == 0
    assert consumer.stats.manifest_versions >= 3  # discovery's, the fill's, newer ones
    assert any("discarding manifest version" in r.getMessage() for r in caplog.records)
