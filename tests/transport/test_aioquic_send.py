"""kvcs's narrowed packet writing for aioquic (kvcs/transport/quic/aioquic_send.py) against
aioquic's own: two connection pairs in memory, one client on each class, fed the same
seeded sequence of stream writes (many streams, FINs, resets, a STOP_SENDING to the
peer), lost datagrams and acknowledgements. On both, the peer must receive every byte
and end written on every stream, and the client must keep only its unfinished streams."""

from __future__ import annotations

import random
from typing import Any

import pytest
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection as AioquicConnection

from kvcs.transport import DevCertificate
from kvcs.transport.quic.aioquic_send import QuicConnection

from .memory_pair import CLIENT, SERVER, connection_pair


def _pair(cls: type[AioquicConnection], cert: DevCertificate) -> tuple[Any, Any]:
    options: dict[str, Any] = dict(alpn_protocols=["x"], max_datagram_size=1452,
                                   max_data=1 << 24, max_stream_data=1 << 20)
    client, server = connection_pair(QuicConfiguration, cls, AioquicConnection, cert,
                                     client_options=options, server_options=options)
    for step in range(8):  # the handshake
        now = step * 0.001
        for data, _ in client.datagrams_to_send(now=now):
            server.receive_datagram(data, CLIENT, now=now)
        for data, _ in server.datagrams_to_send(now=now):
            client.receive_datagram(data, SERVER, now=now)
    return client, server


def _stream_events(server: Any) -> list[tuple[Any, ...]]:
    seen = []
    while (event := server.next_event()) is not None:
        if isinstance(event, events.StreamDataReceived):
            seen.append(("data", event.stream_id, event.data, event.end_stream))
        elif isinstance(event, events.StreamReset):
            seen.append(("reset", event.stream_id, event.error_code))
    return seen


def _run(cls: type[AioquicConnection], cert: DevCertificate, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    client, server = _pair(cls, cert)
    _stream_events(server)
    received: dict[int, bytearray] = {}
    outcome: dict[int, Any] = {}
    streams: list[int] = []
    now = 0.01

    def exchange(loss: float, acks: float) -> None:
        nonlocal now
        now += 0.05
        for data, _ in client.datagrams_to_send(now=now):
            if rng.random() >= loss:
                server.receive_datagram(data, CLIENT, now=now + 0.02)
        if rng.random() < acks:  # the peer's acknowledgements (and its own frames)
            for data, _ in server.datagrams_to_send(now=now + 0.02):
                client.receive_datagram(data, SERVER, now=now + 0.04)
        if (client.get_timer() or 1e9) <= now + 0.04:
            client.handle_timer(now=now + 0.04)
        for event in _stream_events(server):
            if event[0] == "data":
                received.setdefault(event[1], bytearray()).extend(event[2])
                if event[3]:
                    outcome[event[1]] = "fin"
            else:
                outcome[event[1]] = ("reset", event[2])

    expected: dict[int, bytearray] = {}
    ended: dict[int, Any] = {}
    for step in range(120):
        # what is written depends on the draws only, never on the connection's state
        if rng.random() < 0.5 or not streams:  # a new group: a new unidirectional stream
            stream_id = client.get_next_available_stream_id(is_unidirectional=True)
            client.send_stream_data(stream_id, b"")
            streams.append(stream_id)
            expected[stream_id] = bytearray()
        for stream_id in rng.sample(streams, min(len(streams), 3)):
            if rng.random() < 0.03:
                client.reset_stream(stream_id, 7)
                ended[stream_id] = ("reset", 7)
            else:
                data = bytes([step % 251]) * rng.randint(1, 9000)
                fin = rng.random() < 0.3
                client.send_stream_data(stream_id, data, end_stream=fin)
                expected[stream_id] += data
                if fin:
                    ended[stream_id] = "fin"
            if stream_id in ended:
                streams.remove(stream_id)
        if step == 40:  # the peer opens a bidirectional stream (we have to receive on it)
            bidi = server.get_next_available_stream_id()
            server.send_stream_data(bidi, b"hello")
        if step == 60:  # ... and we stop it: a STOP_SENDING to write
            client.stop_stream(bidi, 5)
        exchange(loss=0.05, acks=0.7)
    for _ in range(150):  # no more loss: everything arrives and is acknowledged
        exchange(loss=0.0, acks=1.0)
    # a reset stream delivers what arrived before its reset (timing); the others all
    return {"received": {k: bytes(v) for k, v in received.items() if outcome.get(k) == "fin"},
            "outcome": outcome, "stopped": server._streams[bidi].sender._reset_error_code,
            "client_streams": sorted(client._streams),
            "expected": ({k: bytes(v) for k, v in expected.items() if ended.get(k) == "fin"},
                         ended, [bidi, *streams])}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cls", [QuicConnection, AioquicConnection], ids=["kvcs", "aioquic"])
def test_every_stream_arrives_as_with_aioquic(cert: DevCertificate, seed: int,
                                             cls: type[AioquicConnection]) -> None:
    """Which of several streams writing at once goes first follows aioquic's set order
    (object addresses), so no two runs interleave alike, even of aioquic itself: what
    each stream delivers and how it ends are what must be right, on both classes."""
    run = _run(cls, cert, seed)
    received, ended, open_streams = run["expected"]
    assert run["received"] == received and run["outcome"] == ended
    assert run["stopped"] == 5
    assert run["client_streams"] == sorted(open_streams)  # the others were discarded
    assert len(received) >= 30 and ("reset", 7) in ended.values()
    assert sum(map(len, received.values())) > 300_000
