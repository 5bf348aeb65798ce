"""A protected KVCS publication (MOQT Secure Objects) through moq.Server (moq-dev/moq).

moq-dev/moq drops object properties (it delivers its own timestamp property instead) and
rewrites Publisher Priorities (128 on subscriptions, 0 in FETCH), so the Key ID and the
authenticated priority cannot travel the draft's way through it: the publisher selects the
in-band carriage (``secure_in_band``), which the consumer reads without being told. The
relay forwards and caches ciphertext it cannot read; the consumer's tensors equal the
publisher's. Hex namespaces and relay profile "moq-dev", as for unprotected publications.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

pytest.importorskip("moq")

from moq_helpers import FfiServer
from test_kv_via_ffi_relay import (
    DESC,
    MOQ_DEV,
    ROWS,
    SCOPE,
    TOKENS,
    endpoints,
    kv_layers,
    publish_live,
)

from kvcs.endpoint import Endpoint
from kvcs.kv.scopefile import ScopeFile
from kvcs.kv.secure import SecureObjectError
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher
from kvcs.moqt.wire import LocationFilter, ObjectStatus
from kvcs.transport import QuicSettings

pytestmark = pytest.mark.interop

__all__ = ["endpoints"]  # the fixture, shared with the unprotected interop tests

CONTENT = ScopeFile.new(SCOPE).rotated()


def protected_options() -> object:
    return dataclasses.replace(MOQ_DEV, secure=CONTENT.secure_objects(), secure_in_band=True)


async def test_protected_publication_live_and_completed(
        endpoints: tuple[FfiServer, Endpoint, Endpoint]) -> None:
    srv, pub_ep, con_ep = endpoints
    kv = kv_layers(9)
    pub = KvPublisher(pub_ep, SCOPE, DESC, TOKENS, protected_options())  # type: ignore[arg-type]
    feeder = await publish_live(pub, kv)
    live = KvConsumer(con_ep, SCOPE, DESC, TOKENS, hex_namespace=True, relay_profile="moq-dev",
                      discovery_timeout=0.5, recompute_budget_s=3.0,
                      secure=CONTENT.secure_objects())
    found = await asyncio.wait_for(live.discover(), 5)
    assert found is not None and live.manifests[found.fields].protection is not None
    # a consumer without the content keys is refused the publication (while it is live:
    # moq-dev/moq forgets the manifest track once it has ended)
    keyless_ep = await Endpoint.connect(f"moqt://127.0.0.1:{srv.port}/", verify=False,
                                        settings=QuicSettings.loopback())
    try:
        keyless = KvConsumer(keyless_ep, SCOPE, DESC, TOKENS, hex_namespace=True,
                             relay_profile="moq-dev", discovery_timeout=0.1)
        assert await asyncio.wait_for(keyless.discover(max_blocks=12), 5) is None
        assert "no content keys" in keyless.discarded[0][1]
    finally:
        keyless_ep.close()
        await asyncio.wait_for(keyless_ep.wait_closed(), 5)
    seen = []
    # the manifest from discovery: moq-dev/moq answers a manifest read that follows another
    # session's SUBSCRIBE + cancel of the manifest track (the keyless discovery above)
    # with INTERNAL_ERROR "dropped", protected or not
    async with asyncio.timeout(10):
        async for layer in live.layers(found, manifest=live.manifests[found.fields]):
            k, v = kv[layer.index]
            assert np.array_equal(layer.k, k[:ROWS]) and np.array_equal(layer.v, v[:ROWS])
            seen.append(layer.index)
    await feeder
    assert seen == list(range(DESC.layers)) and live.stats.rejected == 0

    # what the relay holds and serves is ciphertext: the payload of a K block read
    # straight from the relay contains none of the block's bytes, and does not decode
    res = await con_ep.fetch(pub.fields, b"k.raw.s0",
                             location_filter=LocationFilter.absolute_group_end(5, 0, 0))
    objs = [o for o in await res.collect(5) if o.status == ObjectStatus.NORMAL]
    assert objs and all(t != 0x0B for o in objs for t, _ in o.properties)
    k5 = kv[5][0][:16].tobytes()
    assert all(k5[i:i + 64] not in bytes(o.payload) for o in objs for i in range(0, 2048, 64))

    with pytest.raises(SecureObjectError):  # the in-band form does not decrypt shifted
        CONTENT.secure_objects().decrypt_object(
            pub.fields, b"k.raw.s0", 5, 0, bytes(objs[0].payload)[1:], publisher_priority=0,
            properties=())
