"""Abandoned retrievals: a consumer that stops reading (``break``, then ``aclose()``, or
``contextlib.aclosing``) ends its transfer at once: its feeders stop and the relay
serves nothing more to it, while the session stays up for the next retrieval."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from kvcs.testing import LocalNet, until
from kvcs.transport import DevCertificate

from .workload import SMALL, consume, consumer, kv_cache


@pytest.fixture
async def net(cert: DevCertificate) -> AsyncIterator[LocalNet]:
    async with LocalNet(cert) as n:
        yield n


def _feeders() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if "_feed" in repr(t.get_coro())
            or "_follow_manifest" in repr(t.get_coro())]


@pytest.mark.parametrize("live", [True, False], ids=["live", "completed"])
async def test_abandoned_retrieval_ends_at_once(net: LocalNet, live: bool) -> None:
    relay = await net.relay()
    data = kv_cache(5)
    pub = SMALL.publisher(await net.client(relay))
    await pub.start()
    if not live:
        for i, (k, v) in enumerate(data):
            await pub.put_layer(i, k, v)
        await pub.finish()
    else:
        await pub.put_layer(0, *data[0])
        await pub.put_layer(1, *data[1])  # the rest never comes while we read
    ep = await net.client(relay)
    kv = consumer(ep, recompute_budget_s=30)
    found = await kv.discover()
    assert found is not None
    session = relay.sessions[max(relay.sessions)]  # the consumer's
    async with contextlib.aclosing(kv.layers(found)) as layers:
        async for layer in layers:
            if layer.index == 1:
                break
        if live:
            assert _feeders()  # still subscribed until the generator is closed
    assert not _feeders()  # closed: the feeders are gone at once, not at collection
    await until(lambda: session.server.active == 0)
    assert not ep.is_closed
    if live:
        for i, (k, v) in enumerate(data[2:], 2):
            await pub.put_layer(i, k, v)
        await pub.finish()
    again = (await consume(consumer(ep), found)).judge(data)
    assert again.complete and again.wrong_tensors == 0
