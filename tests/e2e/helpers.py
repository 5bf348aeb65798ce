"""What many end-to-end tests do: publish the seeded test cache, check the layers that come
back, make a producer signing key."""

from __future__ import annotations

import asyncio
import time

from kvcs.kv.cose import Keyring, ProducerKey
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.relay import Relay
from kvcs.testing import LocalNet

from .conftest import DESC, LAYERS, PROMPT, SCOPE, cache, same


async def publish_cache(net: LocalNet, relay: Relay, seed: int,
                        opts: PublisherOptions | None = None) -> tuple[KvPublisher, list]:
    """Publish the seeded test cache through ``relay``; the publisher and the layers."""
    pub = KvPublisher(await net.client(relay), SCOPE, DESC, PROMPT, opts)
    data = cache(seed)
    for i, (k, v) in enumerate(data):
        await pub.put_layer(i, k, v)
    await pub.finish()
    return pub, data


def produce_slowly(pub: KvPublisher, data: list, *, started_after: int,
                   pause: float) -> tuple[asyncio.Task[float], asyncio.Event]:
    """Put the layers of ``data`` one every ``pause`` seconds, then finish, in a task: the
    task (its result: the perf_counter time production finished) and an event set once
    layer ``started_after`` is out, for a consumer that joins while production goes on."""
    started = asyncio.Event()

    async def produce() -> float:
        for i, (k, v) in enumerate(data):
            await pub.put_layer(i, k, v)
            if i == started_after:
                started.set()
            await asyncio.sleep(pause)
        await pub.finish()
        return time.perf_counter()

    return asyncio.create_task(produce()), started


def check_layers(layers: list, data: list) -> None:
    """Every retrieved layer equals the published one."""
    for layer in layers:
        k, v = data[layer.index]
        assert same(layer.k, k) and same(layer.v, v)


async def retrieve_all(consumer: KvConsumer, data: list) -> None:
    """Discover the publication and retrieve every layer of it, equal to ``data``."""
    found = await consumer.discover()
    assert found is not None
    got = [layer async for layer in consumer.layers(found)]
    assert [x.index for x in got] == list(range(LAYERS))
    check_layers(got, data)


def signing_key(kid: str) -> tuple[ProducerKey, Keyring]:
    """A new producer signing key and a keyring that trusts it."""
    key = ProducerKey.generate(kid)
    keyring = Keyring()
    keyring.add_producer(key)
    return key, keyring
