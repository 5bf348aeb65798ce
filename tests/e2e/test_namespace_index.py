"""The standing namespace listing (:class:`~kvcs.kvnet.discovery.NamespaceIndex`) through a
relay over real QUIC on 127.0.0.1: opened with the publications the relay holds, it
follows later ones, and a lookup finds the longest published prefix of a prompt without
another request (the vLLM connector's lookup)."""

from __future__ import annotations

import asyncio

from kvcs.kv.ids import CompatDescriptor, KvcsNamespace, ScopeKey, block_keys, scope_id
from kvcs.kvnet.discovery import NamespaceIndex
from kvcs.kvnet.publisher import KvPublisher
from kvcs.relay import Relay
from kvcs.testing import LocalNet

from .conftest import BLOCK, DESC, PROMPT, SCOPE, cache

SID = scope_id(SCOPE)
KEYS = block_keys(SCOPE, DESC.compat_id, PROMPT, BLOCK)


async def _publish(net: LocalNet, relay: Relay, blocks: int) -> KvPublisher:
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT[:blocks * BLOCK])
    for i, (k, v) in enumerate(cache(blocks, blocks * BLOCK)):
        await pub.put_layer(i, k, v)
    await pub.finish()
    return pub


async def test_standing_index_lists_then_follows(net: LocalNet) -> None:
    relay = await net.relay()
    short = await _publish(net, relay, 3)
    ep = await net.client(relay)
    index = NamespaceIndex(ep, SID, DESC.compat_id)
    await index.open(5.0)
    assert index.alive
    found = index.longest(KEYS)
    assert found is not None and found.prefix_blocks == 3 and found.fields == short.fields
    assert index.longest(KEYS[:2]) is None  # a prompt shorter than every publication
    requests = relay.metrics.get("kvcs_relay_requests_total", type="subscribe_namespace")
    longer = await _publish(net, relay, 9)
    async with asyncio.timeout(10):  # the NAMESPACE of the new publication arrives
        while (found := index.longest(KEYS)) is None or found.prefix_blocks != 9:
            await asyncio.sleep(0.01)
    assert found.fields == longer.fields and found.endpoint is ep
    assert index.longest(KEYS[:5]).prefix_blocks == 3  # type: ignore[union-attr]
    # lookups made no request
    assert relay.metrics.get("kvcs_relay_requests_total",
                             type="subscribe_namespace") == requests


def test_index_takes_only_its_scope_and_compat_id() -> None:
    index = NamespaceIndex(None, SID, DESC.compat_id)  # type: ignore[arg-type]
    other = CompatDescriptor.from_dict({**DESC.to_dict(), "revision": "other"})

    def ns(n: int, pub: bytes, compat: bytes = DESC.compat_id,
           scope: ScopeKey = SCOPE) -> tuple[bytes, ...]:
        return KvcsNamespace(scope_id(scope), compat, KEYS[n - 1], pub).to_fields()

    index.take(True, ns(2, b"a" * 16))
    index.take(True, ns(4, b"b" * 16))
    index.take(True, ns(6, b"c" * 16, compat=other.compat_id))
    index.take(True, ns(7, b"d" * 16, scope=ScopeKey.from_bytes(bytes(32))))
    index.take(True, (b"kvcs-1", b"not a publication"))
    found = index.longest(KEYS)
    assert found is not None and found.fields == ns(4, b"b" * 16) and found.prefix_blocks == 4
    index.take(False, ns(4, b"b" * 16))
    assert index.longest(KEYS).prefix_blocks == 2  # type: ignore[union-attr]
    index.take(False, ns(2, b"a" * 16))
    assert index.longest(KEYS) is None
