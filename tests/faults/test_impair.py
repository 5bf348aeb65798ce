"""The impairment proxy, measured with plain UDP sockets (numbered datagrams, fixed seeds),
and one real-QUIC publish/subscribe through it."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import pytest

from kvcs.moqt.wire import LocationFilter, ObjectStatus, Parameters
from kvcs.testing import until

from .conftest import FaultNet
from .impair import SOCKET_BUFFER, Counters, Impairment, ImpairmentProxy

N = 1000  # datagrams per statistical run


class Peer(asyncio.DatagramProtocol):
    """A UDP socket on 127.0.0.1 that records what it receives (payload, sender, loop
    time); an ``echo`` peer sends every datagram back to its sender."""

    def __init__(self, echo: bool = False) -> None:
        self.echo = echo
        self.received: list[tuple[bytes, Any, float]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.received.append((data, addr, asyncio.get_running_loop().time()))
        if self.echo and self.transport is not None:
            self.transport.sendto(data, addr)

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    @property
    def seqs(self) -> list[int]:
        """Sequence numbers of the numbered datagrams received, in arrival order."""
        return [int.from_bytes(data[:4], "big") for data, _, _ in self.received]

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.sendto(data)

    def send_numbered(self, seqs: range, size: int = 100) -> None:
        for seq in seqs:
            self.send(seq.to_bytes(4, "big") + bytes(size - 4))


class Rig:
    """A target peer, a proxy to it, and client peers talking to the proxy."""

    def __init__(self) -> None:
        self.peers: list[asyncio.DatagramTransport] = []
        self.proxies: list[ImpairmentProxy] = []

    async def peer(self, *, echo: bool = False, remote_port: int | None = None) -> Peer:
        loop = asyncio.get_running_loop()
        remote = ("127.0.0.1", remote_port) if remote_port else None
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):  # as large as the proxy's
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
        sock.bind(("127.0.0.1", 0))
        if remote:
            sock.connect(remote)
        transport, peer = await loop.create_datagram_endpoint(lambda: Peer(echo), sock=sock)
        self.peers.append(transport)
        return peer

    async def proxy(self, target: Peer, seed: int = 1, **up: Any) -> ImpairmentProxy:
        proxy = ImpairmentProxy("127.0.0.1", target.port, seed=seed, up=Impairment(**up))
        await proxy.start()
        self.proxies.append(proxy)
        return proxy

    async def line(self, seed: int = 1, **up: Any) -> tuple[Peer, ImpairmentProxy, Peer]:
        """(client, proxy, target) with ``up`` impairing client -> target."""
        target = await self.peer(echo=True)
        proxy = await self.proxy(target, seed, **up)
        client = await self.peer(remote_port=proxy.port)
        return client, proxy, target

    async def aclose(self) -> None:
        for proxy in self.proxies:
            await proxy.aclose()
        for transport in self.peers:
            transport.close()
        await asyncio.sleep(0)  # let the transports finish closing


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        await r.aclose()


async def settle(proxy: ImpairmentProxy, target: Peer, sent: int) -> Counters:
    """Wait until ``sent`` datagrams entered the proxy's up direction, the proxy holds
    nothing back and the target got everything the proxy sent; return the counters."""
    c = proxy.up_counters
    await until(lambda: c.datagrams_in == sent and proxy.idle)
    await until(lambda: len(target.received) == c.sent)
    assert c.send_errors == 0
    assert c.sent == c.datagrams_in + c.duplicated - c.dropped
    return c


Run = Callable[[int], Awaitable[list[int]]]


def numbered_run(rig: Rig, **up: Any) -> Run:
    """A function of a seed: N numbered datagrams through a new proxy with ``up``; returns
    the sequence numbers the target received, in order."""

    async def run(seed: int) -> list[int]:
        client, proxy, target = await rig.line(seed, **up)
        client.send_numbered(range(N))
        await settle(proxy, target, N)
        return target.seqs

    return run


# -- pass-through ---------------------------------------------------------------------------


async def test_pass_through_both_ways_one_upstream_socket_per_client(rig: Rig) -> None:
    client, proxy, target = await rig.line()
    other = await rig.peer(remote_port=proxy.port)
    client.send_numbered(range(200), size=1350)
    other.send_numbered(range(1000, 1040), size=60000)
    await until(lambda: len(client.received) == 200 and len(other.received) == 40)
    assert client.seqs == list(range(200))  # echoed back, in order, to the right client
    assert other.seqs == list(range(1000, 1040))
    assert all(len(data) == 60000 for data, _, _ in other.received)
    sources = {addr for _, addr, _ in target.received}
    assert len(sources) == 2 and proxy.clients == 2  # one upstream address per client
    assert proxy.port not in {port for _, port in sources}
    for c in (proxy.up_counters, proxy.down_counters):
        assert c.datagrams_in == c.sent == 240
        assert c.bytes_in == c.bytes_sent == 200 * 1350 + 40 * 60000
        assert c.dropped == c.duplicated == c.reordered == c.delayed == c.queued == 0


# -- each impairment, on counted datagrams ----------------------------------------------------


async def test_loss_is_counted_exactly_and_reproducible(rig: Rig) -> None:
    run = numbered_run(rig, loss=0.2)
    got = await run(7)
    proxy = rig.proxies[-1]
    lost = proxy.up_counters.lost
    assert len(got) == N - lost and got == sorted(set(got))  # the rest arrive, in order
    assert lost == 211  # of Random("7:up")'s first 1000 draws, 211 are below 0.2
    assert await run(7) == got  # same seed: the very same datagrams are lost
    assert await run(8) != got


async def test_corrupt_changes_one_byte_and_is_reproducible(rig: Rig) -> None:
    client, proxy, target = await rig.line(11, corrupt=0.1)
    sent = [bytes([seq % 251]) * 200 for seq in range(N)]
    for data in sent:
        client.send(data)
    c = await settle(proxy, target, N)
    got = [data for data, _, _ in target.received]
    assert len(got) == N  # corrupted datagrams still go on, in order
    diffs = [sum(a != b for a, b in zip(x, y, strict=True)) for x, y in zip(got, sent,
                                                                            strict=True)]
    assert sorted(set(diffs)) == [0, 1] and diffs.count(1) == c.corrupted == 114
    again, proxy2, target2 = await rig.line(11, corrupt=0.1)
    for data in sent:
        again.send(data)
    await settle(proxy2, target2, N)
    assert [data for data, _, _ in target2.received] == got


async def test_duplicate_copies_follow_their_original(rig: Rig) -> None:
    run = numbered_run(rig, duplicate=0.1)
    got = await run(3)
    dups = rig.proxies[-1].up_counters.duplicated
    assert len(got) == N + dups and dups == 106  # one draw per datagram, as for loss
    assert sorted(set(got)) == list(range(N))
    twice = [i for i in range(1, len(got)) if got[i] == got[i - 1]]
    assert len(twice) == dups  # each copy right behind its original
    assert await run(3) == got


async def test_reorder_holds_back_by_depth(rig: Rig) -> None:
    depth = 3
    client, proxy, target = await rig.line(5, reorder=0.1, reorder_depth=depth,
                                           reorder_timeout_ms=10_000)
    client.send_numbered(range(N))
    await until(lambda: proxy.up_counters.datagrams_in == N)
    proxy.up.reorder = 0.0  # a few in-order datagrams release the last held ones
    client.send_numbered(range(N, N + depth))
    c = await settle(proxy, target, N + depth)
    got = target.seqs
    assert sorted(got) == list(range(N + depth))
    late = [i for i, seq in enumerate(got) if seq < max(got[:i], default=-1)]
    assert len(late) == c.reordered == 104  # one draw per datagram, as for loss
    on_time = set(got) - {got[i] for i in late}
    for i in late:  # held until `depth` later datagrams that were not held had passed
        assert sum(1 for seq in got[:i] if seq > got[i] and seq in on_time) == depth


async def test_reorder_timeout_releases_a_lone_datagram(rig: Rig) -> None:
    client, proxy, target = await rig.line(reorder=1.0, reorder_timeout_ms=30)
    sent_at = asyncio.get_running_loop().time()
    client.send_numbered(range(1))
    await settle(proxy, target, 1)
    assert target.received[0][2] - sent_at >= 0.029
    assert proxy.up_counters.reordered == 1


async def test_delay_and_jitter_keep_order(rig: Rig) -> None:
    client, proxy, target = await rig.line(delay_ms=30, jitter_ms=10)
    loop = asyncio.get_running_loop()
    sent_at = []
    for seq in range(40):
        sent_at.append(loop.time())
        client.send_numbered(range(seq, seq + 1))
        await asyncio.sleep(0.005)  # apart, so that order-keeping rarely clamps a delay
    c = await settle(proxy, target, 40)
    assert target.seqs == list(range(40)) and c.delayed == 40
    delays = [at - sent_at[seq] for seq, (_, _, at) in zip(target.seqs, target.received,
                                                          strict=True)]
    assert min(delays) >= 0.020 - 1e-4  # delay - jitter
    assert max(delays) < 0.040 + 0.2  # delay + jitter, plus scheduling slack on a busy host
    assert max(delays) - min(delays) > 0.005  # the jitter shows


async def test_bandwidth_cap_rate_and_bounded_queue(rig: Rig) -> None:
    rate = 2 * 1024 * 1024
    client, proxy, target = await rig.line(bandwidth=rate, queue_bytes=32 * 1024,
                                           burst_bytes=16 * 1024)
    seq = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = start + 0.5
    while loop.time() < end:  # offer ~12 MB/s, six times the cap
        client.send_numbered(range(seq, seq + 100), size=1200)
        seq += 100
        await asyncio.sleep(0.01)
    c = await settle(proxy, target, seq)
    assert c.overflowed > 0 and c.queued > 0  # the excess was queued, then dropped
    # never faster than the cap: all it forwarded left between the first offer and the
    # last arrival, at most a burst at once. Slower is not asserted: a late event loop
    # on a loaded machine (0.64 of the cap at load 13) is not the proxy's doing
    times = [at for _, _, at in target.received]
    assert c.bytes_sent <= rate * (times[-1] - start) + 16 * 1024 + 1200, (
        c.bytes_sent, times[-1] - start)
    assert target.seqs == sorted(target.seqs)


async def test_blackhole_start_and_stop(rig: Rig) -> None:
    client, proxy, target = await rig.line()
    proxy.up.blackhole = True
    client.send_numbered(range(10))
    await settle(proxy, target, 10)
    assert target.received == [] and proxy.up_counters.blackholed == 10
    proxy.up.blackhole = False
    client.send_numbered(range(10, 20))
    await settle(proxy, target, 20)
    assert target.seqs == list(range(10, 20))
    assert client.seqs == list(range(10, 20))  # the echo came back
    # a period on the way down only: the target gets the datagrams, the client no echo
    proxy.blackhole(0.3, up=False)
    client.send_numbered(range(20, 30))
    await settle(proxy, target, 30)
    await until(lambda: proxy.down_counters.blackholed == 10)
    assert target.seqs[-10:] == list(range(20, 30)) and client.seqs[-1] == 19
    await until(lambda: asyncio.get_running_loop().time() > proxy.down.blackhole_until)
    client.send_numbered(range(30, 40))
    await until(lambda: len(client.received) == 20)
    assert client.seqs[-10:] == list(range(30, 40))


async def test_settings_change_live_and_are_validated(rig: Rig) -> None:
    client, proxy, target = await rig.line()
    proxy.up.loss = 1.0
    client.send_numbered(range(5))
    await settle(proxy, target, 5)
    assert proxy.up_counters.lost == 5
    proxy.up = Impairment(duplicate=1.0)
    client.send_numbered(range(5, 10))
    await settle(proxy, target, 10)
    assert target.seqs == [5, 5, 6, 6, 7, 7, 8, 8, 9, 9]
    with pytest.raises(ValueError, match=r"Impairment.loss must be a probability"):
        proxy.up.loss = 1.5
    with pytest.raises(ValueError, match=r"Impairment.bandwidth must be None or a rate"):
        Impairment(bandwidth=0)
    with pytest.raises(ValueError, match=r"Impairment.reorder_depth must be an integer"):
        Impairment(reorder_depth=0)


async def test_aclose_leaks_no_socket_and_drops_what_is_in_flight(rig: Rig) -> None:
    target = await rig.peer()
    fds = len(os.listdir("/proc/self/fd"))
    tasks = asyncio.all_tasks()
    async with ImpairmentProxy("127.0.0.1", target.port, seed=1,
                               up=Impairment(delay_ms=50, reorder=0.5),
                               down=Impairment(bandwidth=1000)) as proxy:
        for _ in range(3):  # three client addresses: three upstream sockets
            peer = await rig.peer(remote_port=proxy.port)
            peer.send_numbered(range(20))
        await until(lambda: proxy.up_counters.datagrams_in == 60)
        assert proxy.clients == 3 and not proxy.idle
        # the 3 peers, the listener and 3 upstream sockets
        assert len(os.listdir("/proc/self/fd")) == fds + 3 + 4
    await proxy.aclose()  # idempotent
    assert len(os.listdir("/proc/self/fd")) == fds + 3
    assert asyncio.all_tasks() == tasks and proxy.clients == 0
    await asyncio.sleep(0.1)  # past the delay: nothing was left scheduled to send
    assert target.received == [] and proxy.up_counters.sent == 0


# -- real QUIC through the proxy --------------------------------------------------------------

NS = (b"faults", b"smoke")
GROUPS, OBJECTS, SIZE = 8, 10, 4096  # 320 KiB


def payload(g: int, o: int) -> bytes:
    head = f"{g}/{o}|".encode()
    return (head * (SIZE // len(head) + 1))[:SIZE]


async def test_quic_publish_subscribe_through_one_percent_loss(faultnet: FaultNet) -> None:
    relay = await faultnet.relay()
    # seed 23 drops the 8th datagram going up and the 7th coming down (draws of
    # Random("23:up") and Random("23:down") below 0.01), handshake packets, whatever the
    # timing; about 300 datagrams cross each way, the next losses are at 71 and 104
    proxy = await faultnet.proxy(relay, seed=23, up=Impairment(loss=0.01),
                                 down=Impairment(loss=0.01))
    pub = await faultnet.client_via(proxy)
    sub_ep = await faultnet.client_via(proxy)
    await pub.announce(NS)
    track = pub.create_track(NS, b"t")
    sub = await sub_ep.subscribe(NS, b"t", location_filter=LocationFilter.next_object(),
                                 fill=Parameters(location_filter=LocationFilter.none()))
    collected = asyncio.create_task(sub.collect(timeout=30))
    for g in range(GROUPS):
        for o in range(OBJECTS):
            pub.publish(track, g, o, payload(g, o))
        await pub.drain(1 << 20)
    pub.publish(track, GROUPS, 0, b"", status=ObjectStatus.END_OF_TRACK)
    objects = sorted((o for o in await collected if o.status == ObjectStatus.NORMAL),
                     key=lambda o: (o.group_id, o.object_id))
    assert [(o.group_id, o.object_id) for o in objects] == [
        (g, o) for g in range(GROUPS) for o in range(OBJECTS)]
    assert all(bytes(o.payload) == payload(o.group_id, o.object_id) for o in objects)
    assert proxy.clients == 2
    assert proxy.up_counters.lost > 0 and proxy.down_counters.lost > 0
