"""Secure Objects through a real relay over QUIC on 127.0.0.1: the relay forwards and
caches protected objects without the keys, keeps the Immutable Properties (Key ID 0x78)
byte-exact and the Publisher Priority as sent, so subscribers and fetchers decrypt."""

from __future__ import annotations

import asyncio

import pytest

from kvcs.kv.scopefile import ScopeFile, parse_scope_file
from kvcs.kv.secure import SecureObjects, UnknownKeyIdError
from kvcs.moqt.wire import LocationFilter, ObjectStatus, Parameters
from kvcs.testing import LocalNet

NS = (b"kvcs-1", bytes(range(16)), b"\x00" * 32, b"\xff" * 32, bytes(range(16, 32)))
NAME = b"k.raw.s0"
GROUPS, OBJECTS = 3, 5


def _payload(g: int, o: int) -> bytes:
    return bytes([g, o]) * 3000


def _decrypt_all(keys: SecureObjects, objs: list) -> dict[tuple[int, int], bytes]:
    out = {}
    for obj in objs:
        if obj.status != ObjectStatus.NORMAL:
            continue
        assert obj.publisher_priority is not None  # sent explicitly on protected tracks
        plain = keys.decrypt_object(NS, NAME, obj.group_id, obj.object_id, obj.payload,
                                    publisher_priority=obj.publisher_priority,
                                    properties=obj.properties)
        out[(obj.group_id, obj.object_id)] = bytes(plain)
    return out


async def test_protected_objects_through_relay(net: LocalNet) -> None:
    scope = ScopeFile.new().rotated()  # Key IDs 1 and 2, encrypting with 2
    publisher_keys = scope.secure_objects()
    relay = await net.relay()
    pub = await net.client(relay)
    await pub.announce(NS)
    track = pub.create_track(NS, NAME)
    sub_ep = await net.client(relay)
    sub = await sub_ep.subscribe(NS, NAME, location_filter=LocationFilter.next_object(),
                                 fill=Parameters(location_filter=LocationFilter.none()))
    collecting = asyncio.create_task(sub.collect(timeout=10))
    for g in range(GROUPS):
        priority = 128 * g // GROUPS  # kvcs: floor(128 * g / L)
        for o in range(OBJECTS):
            obj = publisher_keys.encrypt_object(NS, NAME, g, o, _payload(g, o),
                                                publisher_priority=priority)
            pub.publish(track, g, o, obj.payload, priority=priority, properties=obj.properties)
        pub.publish(track, g, OBJECTS, b"", status=ObjectStatus.END_OF_GROUP)
    pub.publish(track, GROUPS, 0, b"", status=ObjectStatus.END_OF_TRACK)
    expected = {(g, o): _payload(g, o) for g in range(GROUPS) for o in range(OBJECTS)}

    subscriber_keys = parse_scope_file(scope.to_json()).secure_objects()  # the shared file
    received = await collecting
    assert _decrypt_all(subscriber_keys, received) == expected
    assert all(bytes(o.payload) != expected[(o.group_id, o.object_id)]
               for o in received if o.status == ObjectStatus.NORMAL)

    # from the relay's cache, by FETCH
    fetcher = await net.client(relay)
    res = await fetcher.fetch(NS, NAME, location_filter=LocationFilter.none())
    assert _decrypt_all(subscriber_keys, await res.collect(timeout=10)) == expected

    # a consumer without Key ID 2 is told which key it lacks
    old_only = SecureObjects(scope.content_keys[:1])
    first = next(o for o in received if o.status == ObjectStatus.NORMAL)
    with pytest.raises(UnknownKeyIdError) as info:
        _decrypt_all(old_only, [first])
    assert info.value.key_id == 2
