"""Issue #19: a publisher and a consumer in one process, through a relay, keep the
configured datagram size when the relay answered the publisher's first handshake late.

qh3 2.1 clients whose first Initial goes unanswered for a loss-detection timeout (a busy or
just-started relay) cut their datagrams to 1200 bytes for the connection's life (probing
lifts them to 1472 at most): 1-2 KB datagrams instead of 60 KB on loopback, 3-4x slower.
Here the relay starts only after the publisher's first Initial reached its port.
"""

from __future__ import annotations

import asyncio
import socket

import numpy as np

from kvcs.endpoint import Endpoint
from kvcs.kv.ids import CompatDescriptor, ScopeKey
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher
from kvcs.relay import Relay, RelayConfig
from kvcs.testing import LocalNet, until
from kvcs.transport import DevCertificate, QuicSettings

LAYERS, TOKENS = 2, 64  # 4 blocks of 16 tokens: 32 KiB objects, larger than any fallback


def _descriptor() -> CompatDescriptor:
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": "issue-19", "revision": "0", "tokenizer": "t", "layers": LAYERS,
        "kv_heads": 8, "head_dim": 128, "dtype": "float16", "block_tokens": 16,
        "layout": "tnd", "rope": "post"})


def _layer(i: int) -> tuple[np.ndarray, np.ndarray]:
    k = np.random.default_rng(i).standard_normal((TOKENS, 8, 128)).astype(np.float16)
    return k, -k


def _has_datagram(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False


async def test_late_relay_keeps_the_configured_datagram_size(cert: DevCertificate) -> None:
    settings = QuicSettings.loopback()
    # the relay's port, bound but not answering: the publisher's first Initial gets lost
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    silent.setblocking(False)
    port = silent.getsockname()[1]
    async with LocalNet(cert, settings) as net:
        dialing = asyncio.ensure_future(Endpoint.connect(
            f"moqt://127.0.0.1:{port}/", cafile=str(cert.certfile), settings=settings,
            timeout=10))
        try:
            await until(lambda: _has_datagram(silent))
        finally:
            silent.close()
        relay = Relay(RelayConfig(listen=f"127.0.0.1:{port}", tls_cert=str(cert.certfile),
                                  tls_key=str(cert.keyfile), quic_preset="loopback",
                                  anonymous=True, goaway_grace=0.1), settings=settings)
        await relay.start()
        net.relays.append(relay)
        pub_ep = await dialing  # the publisher's retransmitted Initial gets the answer
        net.endpoints.append(pub_ep)
        con_ep = await net.client(relay)

        scope, tokens = ScopeKey.from_bytes(bytes(range(32))), np.arange(TOKENS) + 11
        layers = [_layer(i) for i in range(LAYERS)]
        publisher = KvPublisher(pub_ep, scope, _descriptor(), tokens)
        await publisher.put_layer(0, *layers[0])
        consumer = KvConsumer(con_ep, scope, _descriptor(), tokens)
        found = await consumer.discover()
        assert found is not None
        got = []
        for i in range(1, LAYERS):
            await publisher.put_layer(i, *layers[i])
        await publisher.finish()
        async for layer in consumer.layers(found):
            got.append(layer)
        assert [layer.index for layer in got] == list(range(LAYERS))
        assert all(np.array_equal(g.k[:TOKENS], layers[g.index][0]) for g in got)

        want = settings.max_datagram_size
        assert pub_ep.conn.max_datagram_size == want
        assert con_ep.conn.max_datagram_size == want
