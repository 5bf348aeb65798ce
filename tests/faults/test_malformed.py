"""Malformed input from every side, at every layer, while good traffic runs:

* QUIC: datagrams corrupted on the way (one byte changed, the AEAD tag catches it) and
  datagrams of garbage sent to the relay's port: dropped, nobody is cut off;
* MOQT control and data streams from an upstream relay: the edge relay closes the upstream
  session with PROTOCOL_VIOLATION, its clients keep their sessions and the completed
  publications it holds (MOQT garbage from clients: tests/faults/test_hostile_session.py,
  tests/session/test_hostile_input.py);
* KVCS payloads and manifests from a publisher: every bad object is discarded and reported
  missing, exactly; a bad manifest discards its publication (with the reason); another
  publication on the same relay is unaffected, and nobody's session is closed (relays do
  not read KVCS payloads).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import pytest

from kvcs.endpoint import Endpoint
from kvcs.errors import KvcsError
from kvcs.moqt import events as ev
from kvcs.moqt.actions import Action, SendStreamData, StreamOpener
from kvcs.moqt.errors import PublishDoneCode, SessionCode
from kvcs.moqt.origin import Origin
from kvcs.moqt.session import Session, SessionConfig
from kvcs.moqt.track import CachedObject, Track
from kvcs.moqt.wire import (
    ObjectStatus,
    Parameters,
    Properties,
    RequestOk,
    SubgroupHeader,
    SubgroupWriter,
    Subscribe,
    TrackNamespace,
    encode_message,
)
from kvcs.testing import LocalNet, until
from kvcs.transport import ConnectionInfo, DevCertificate, MoqtConnection, QuicSettings, serve

from .conftest import FaultNet
from .impair import Impairment
from .report import ScenarioRecord
from .workload import (
    SMALL,
    Workload,
    blocks_of,
    consume,
    consumer,
    indexes,
    kv_cache,
    publish,
)

# -- QUIC --------------------------------------------------------------------------------


async def test_corrupted_datagrams_of_one_client(faultnet: FaultNet,
                                                 scenario: ScenarioRecord) -> None:
    """One byte of every datagram one client sends is changed on the way, and datagrams of
    garbage go straight to the relay's port: QUIC drops every packet whose AEAD tag fails
    (a datagram of several coalesced packets may still carry an intact one, so on aioquic
    that client may even get connected: with bytes that passed the check), nothing
    corrupted reaches MOQT (no protocol error), and a transfer through the same relay is
    whole."""
    relay = await faultnet.relay()
    good = await faultnet.proxy(relay, seed=71)
    bad = await faultnet.proxy(relay, seed=72, up=Impairment(corrupt=1.0))
    pub_ep = await faultnet.client_via(good)
    cons_ep = await faultnet.client_via(good)
    data = kv_cache(71)
    await publish(pub_ep, data)
    attacker = asyncio.create_task(faultnet.client_via(bad))
    junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rng = os.urandom
        for size in (1, 20, 1200, 1350, 1500):
            for first in (0x00, 0x40, 0xC0, 0xFF):  # short, fixed bit, long, all bits
                junk.sendto(bytes([first]) + rng(size - 1), ("127.0.0.1", relay.port))
        got = (await consume(consumer(cons_ep))).judge(data)
    finally:
        junk.close()
    attacker.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await attacker  # connected (closed with the net) or not
    scenario.record(got)
    assert got.complete and got.wrong_tensors == 0 and got.bytes_lost == 0
    assert bad.up_counters.corrupted > 0
    assert relay.metrics.get("kvcs_relay_protocol_errors_total") == 0
    assert not pub_ep.is_closed and not cons_ep.is_closed


@pytest.mark.faults
async def test_undecryptable_handshake_forgotten_soon(faultnet: FaultNet,
                                                     scenario: ScenarioRecord) -> None:
    relay = await faultnet.relay()
    bad = await faultnet.proxy(relay, seed=72, up=Impairment(corrupt=1.0))
    attacker = asyncio.create_task(faultnet.client_via(bad))
    try:
        await until(lambda: bool(relay.server.connections))  # type: ignore[union-attr]
        await until(lambda: not relay.server.connections, timeout=5)  # type: ignore
    finally:
        attacker.cancel()
        with contextlib.suppress(BaseException):
            await attacker


# -- an upstream relay that breaks MOQT --------------------------------------------------


class RawSession(Session):
    """A server session that can also send raw bytes on any stream."""

    def __init__(self, config: SessionConfig, opener: StreamOpener) -> None:
        super().__init__(config, opener)
        self._opener = opener
        self._raw: list[Action] = []

    def write(self, data: bytes, *, unidirectional: bool = False, end: bool = False,
              stream_id: int | None = None) -> int:
        sid = self._opener.open_stream(unidirectional) if stream_id is None else stream_id
        self._raw.append(SendStreamData(sid, data, end))
        return sid

    def actions(self) -> list[Action]:
        out = super().actions()
        if self._raw:
            out += self._raw
            self._raw = []
        return out


class UpstreamEndpoint(Endpoint):
    """Serves the host's origin; answers a SUBSCRIBE to a track named ``broken`` itself,
    with an object after End of Group (a malformed track, digest 8.8)."""

    def handle_request(self, e: ev.RequestReceived) -> None:
        m = e.message
        if isinstance(m, Subscribe) and bytes(m.name) == b"broken":
            assert isinstance(self.session, RawSession)
            alias = self.session.subscribe_ok(e.request_id)
            w = SubgroupWriter(SubgroupHeader(alias, 0, 0, None))
            self.session.write(w.header_bytes() + w.object_prefix(0, 4) + b"good"
                               + w.object_prefix(1, 0, status=ObjectStatus.END_OF_GROUP)
                               + w.object_prefix(2, 3) + b"bad", unidirectional=True)
            self.schedule_flush()
            return
        super().handle_request(e)


class HostileUpstream:
    """A MOQT server standing in for an upstream relay: a publish target whose tracks
    every session serves, and whose sessions can send raw bytes."""

    def __init__(self) -> None:
        self.origin: Origin[Endpoint] = Origin()
        self.endpoints: list[Endpoint] = []
        self.port = 0
        self._server: Any = None

    async def listen(self, cert: DevCertificate, settings: QuicSettings) -> None:
        def factory(opener: StreamOpener, info: ConnectionInfo) -> Session:
            return RawSession(SessionConfig(is_client=False, implementation="hostile-up",
                                            max_filter_ranges=16), opener)

        def bind(conn: MoqtConnection) -> None:
            self.endpoints.append(UpstreamEndpoint(conn, origin=self.origin))

        self._server = await serve("127.0.0.1", 0, factory, settings, str(cert.certfile),
                                   str(cert.keyfile), on_session=bind)
        self.port = self._server.port

    async def aclose(self) -> None:
        if self._server is not None:
            await self._server.aclose(timeout=1.0)

    @property
    def session(self) -> RawSession:
        """The first session (the edge reconnects after we break one: later ones follow)."""
        ep = self.endpoints[0]
        assert isinstance(ep.session, RawSession)
        return ep.session

    def flush(self) -> None:
        for ep in self.endpoints:
            ep.flush()

    # PublishTarget
    def create_track(self, namespace: TrackNamespace, name: bytes,
                     properties: Properties = ()) -> Track:
        return self.origin.create_track(namespace, name, properties)

    def publish_run(self, track: Track, objects: Iterable[CachedObject]) -> None:
        track.extend(objects)  # the origin wakes the sessions it wrote to

    async def announce(self, namespace: TrackNamespace, params: Parameters | None = None) -> None:
        for n in self.origin.publish(tuple(namespace)):
            n.session.send_namespace(n.request_id, n.namespace, n.active)

    def withdraw(self, namespace: TrackNamespace) -> None:
        self.origin.withdraw(tuple(namespace))

    async def drain(self, limit: int = 0) -> None:
        await asyncio.gather(*(ep.drain(limit) for ep in self.endpoints if not ep.is_closed))


UPSTREAM_GARBAGE: dict[str, Callable[[RawSession], object]] = {
    "unknown control message": lambda s: s.write(b"\x7e\x00\x00",
                                                 stream_id=s.control_stream_id),
    "request stream opened with a response": lambda s: s.write(
        encode_message(RequestOk(Parameters(), ()))),
    "unknown data stream type": lambda s: s.write(b"\x03\x00\x00", unidirectional=True),
}


@contextlib.asynccontextmanager
async def _hostile_upstream(cert: DevCertificate) -> AsyncIterator[tuple[LocalNet,
                                                                        HostileUpstream]]:
    """A LocalNet and a HostileUpstream listening beside it (its relays name it as their
    upstream); both closed at the end."""
    up = HostileUpstream()
    async with LocalNet(cert) as net:
        try:
            await up.listen(cert, net.settings)
            yield net, up
        finally:
            await up.aclose()


SHORT = Workload(blocks=8)
"""A publication of the first 8 blocks: another namespace than SMALL's 16."""


@pytest.mark.parametrize("garbage", list(UPSTREAM_GARBAGE))
async def test_malicious_upstream_relay(cert: DevCertificate, scenario: ScenarioRecord,
                                        garbage: str) -> None:
    """The edge relay got a publication complete from its upstream; the upstream then
    sends MOQT garbage: the edge closes the upstream session (PROTOCOL_VIOLATION) and
    only that one; its consumers still get the publication it holds, and a local live
    publication goes on untouched."""
    async with _hostile_upstream(cert) as (net, up):
        data = kv_cache(61)
        edge = await net.relay(upstream=f"moqt://127.0.0.1:{up.port}/")
        await publish(up, data)  # complete on the upstream
        up.flush()
        cons_ep = await net.client(edge)
        kv = consumer(cons_ep)
        found = await kv.discover()
        assert found is not None
        first = (await consume(kv, found)).judge(data)
        assert first.complete and first.wrong_tensors == 0  # the edge holds it now
        local = SHORT.publisher(await net.client(edge))
        data2 = SHORT.cache(62)
        await local.start()
        kv2 = consumer(await net.client(edge), SHORT, recompute_budget_s=5)
        found2 = await kv2.discover()
        assert found2 is not None
        live = asyncio.create_task(consume(kv2, found2, workload=SHORT))
        for i, (k, v) in enumerate(data2[:4]):
            await local.put_layer(i, k, v)
        broken = edge.upstream
        UPSTREAM_GARBAGE[garbage](up.session)
        up.flush()
        await until(lambda: up.session.closed is not None)
        assert up.session.closed[0] == SessionCode.PROTOCOL_VIOLATION  # type: ignore
        await until(lambda: edge.upstream is not broken)  # lost (then reconnected)
        for i, (k, v) in enumerate(data2[4:], 4):
            await local.put_layer(i, k, v)
        await local.finish()
        got2 = (await live).judge(data2)
        again = (await consume(consumer(cons_ep), found)).judge(data)
        scenario.record(again)
        assert again.complete and again.wrong_tensors == 0 and again.bytes_lost == 0
        assert got2.complete and got2.wrong_tensors == 0 and got2.bytes_lost == 0
        downstream = [p for p in edge.sessions.values() if not p.upstream]
        assert len(downstream) == 3 and not cons_ep.is_closed


async def test_held_publication_discoverable_after_the_upstream_is_lost(
        cert: DevCertificate, scenario: ScenarioRecord) -> None:
    async with _hostile_upstream(cert) as (net, up):
        data = kv_cache(63)
        edge = await net.relay(upstream=f"moqt://127.0.0.1:{up.port}/")
        await publish(up, data)
        up.flush()
        cons_ep = await net.client(edge)
        first = (await consume(consumer(cons_ep))).judge(data)
        assert first.complete
        broken = edge.upstream
        UPSTREAM_GARBAGE["unknown control message"](up.session)
        up.flush()
        await until(lambda: edge.upstream is not broken)  # lost (then reconnected)
        assert await consumer(cons_ep).discover() is not None


async def test_malformed_track_from_the_upstream_relay(cert: DevCertificate,
                                                      scenario: ScenarioRecord) -> None:
    """The upstream answers a SUBSCRIBE with an object after End of Group: the edge keeps
    the upstream session, caches nothing of the track and ends its consumer's
    subscription with MALFORMED_TRACK."""
    async with _hostile_upstream(cert) as (net, up):
        ns = (b"hostile", b"up")
        await up.announce(ns)
        up.create_track(ns, b"broken")
        edge = await net.relay(upstream=f"moqt://127.0.0.1:{up.port}/")
        sub = await (await net.client(edge)).subscribe(ns, b"broken")
        await sub.collect(timeout=10)
        assert up.session.closed is None and edge.upstream is not None
        assert edge.origin.get((ns, b"broken")) is None
        assert sub.done is not None and sub.done.status == PublishDoneCode.MALFORMED_TRACK


# -- a publisher that sends bad KVCS payloads and manifests ------------------------------

Spoil = Callable[[bytes], bytes]


def _u32(p: bytes, at: int, delta: int) -> bytes:
    return p[:at] + (int.from_bytes(p[at:at + 4], "big") + delta).to_bytes(4, "big") + \
        p[at + 4:]


PAYLOAD_SPOILERS: dict[str, Spoil] = {
    "bad magic": lambda p: b"KVX1" + p[4:],
    "unknown version": lambda p: p[:4] + b"\x09" + p[5:],
    "layer is not the group": lambda p: _u32(p, 8, 1),
    "block is not the object": lambda p: _u32(p, 12, 1),
    "wrong token start": lambda p: p[:16] + bytes(8) + p[24:],
    "data digest mismatch": lambda p: p[:-1] + bytes([p[-1] ^ 1]),
    "truncated": lambda p: p[:-100],
    "trailing bytes": lambda p: p + b"\x00",
    "header only": lambda p: p[:68],
    "empty": lambda p: b"",
}


class SpoilingTarget:
    """A prefill worker gone wrong: a PublishTarget in front of an Endpoint that spoils
    chosen objects on their way out (``spoil(track name, group, object)`` returns the
    function to apply, or None)."""

    def __init__(self, ep: Endpoint,
                 spoil: Callable[[bytes, int, int], Spoil | None]) -> None:
        self.ep = ep
        self.spoil = spoil
        self.spoiled = 0

    def create_track(self, namespace: TrackNamespace, name: bytes,
                     properties: Properties = ()) -> Track:
        return self.ep.create_track(namespace, name, properties)

    def publish(self, track: Track, group_id: int, object_id: int, payload: bytes | memoryview,
                **kw: Any) -> None:
        f = self.spoil(track.name, group_id, object_id)
        if f is not None and kw.get("status", ObjectStatus.NORMAL) == ObjectStatus.NORMAL:
            payload = f(bytes(payload))
            self.spoiled += 1
        self.ep.publish(track, group_id, object_id, payload, **kw)

    def publish_run(self, track: Track, objects: Iterable[CachedObject]) -> None:
        for obj in objects:
            self.publish(track, obj.group_id, obj.object_id, obj.payload, status=obj.status,
                         priority=obj.publisher_priority, properties=obj.properties)

    async def announce(self, namespace: TrackNamespace, params: Parameters | None = None) -> None:
        await self.ep.announce(namespace, params)

    def withdraw(self, namespace: TrackNamespace) -> None:
        self.ep.withdraw(namespace)

    async def drain(self, limit: int = 0) -> None:
        await self.ep.drain(limit)


async def test_bad_kvcs_payloads_from_a_publisher(net_local: LocalNet,
                                                  scenario: ScenarioRecord) -> None:
    """Each kind of bad payload on one object (layers 2..7): each is discarded and its
    block reported missing, exactly those; layers 0 and 1 are yielded; every verified
    block of the partial layers is right; nobody's session is closed, and another
    publication on the same relay goes through."""
    net = net_local
    relay = await net.relay()
    spoiled: dict[tuple[bytes, int, int], Spoil] = {}
    for i, spoil in enumerate(PAYLOAD_SPOILERS.values()):
        name = b"k.raw.s0" if i % 2 == 0 else b"v.raw.s0"
        spoiled[(name, 2 + i % 6, (5 * i + 3) % SMALL.blocks)] = spoil
    pub_ep = await net.client(relay)
    bad = SpoilingTarget(pub_ep, lambda n, g, o: spoiled.get((n, g, o)))
    data = kv_cache(81)
    await publish(bad, data)
    assert bad.spoiled == len(PAYLOAD_SPOILERS)
    other_ep = await net.client(relay)
    data2 = SHORT.cache(82)
    await publish(other_ep, data2, workload=SHORT)
    kv = consumer(await net.client(relay), recompute_budget_s=1.0)
    got = (await consume(kv)).judge(data)
    scenario.record(got)
    want: dict[int, list[int]] = {}
    for _, g, o in spoiled:
        want.setdefault(g, []).append(o)
    assert got.missing == {g: sorted(set(b)) for g, b in sorted(want.items())}
    assert indexes(got.yielded) == [0, 1]
    assert got.wrong_tensors == 0 and got.bytes_lost == 0
    assert kv.stats.rejected >= len(PAYLOAD_SPOILERS)
    assert blocks_of(got.missing) == len(PAYLOAD_SPOILERS)
    got2 = (await consume(consumer(await net.client(relay), SHORT),
                          workload=SHORT)).judge(data2)
    assert got2.complete and got2.wrong_tensors == 0
    assert not pub_ep.is_closed and not other_ep.is_closed and len(relay.sessions) == 4


def _json(edit: Callable[[dict[str, Any]], object]) -> Spoil:
    def spoil(p: bytes) -> bytes:
        m = json.loads(p)
        edit(m)
        return json.dumps(m).encode()
    return spoil


MANIFEST_SPOILERS: dict[str, tuple[Spoil, str]] = {
    "not JSON": (lambda p: b"{not json", "manifest"),
    "a JSON array": (lambda p: b"[]", "manifest"),
    "another CompatID": (_json(lambda m: m["compat"].update(model="other")), "compat"),
    "another prompt": (_json(lambda m: m["segments"][0].update(
        block_keys_sha256="00" * 32)), "block_keys_sha256"),
    "no segment 0": (_json(lambda m: m.update(segments=[])), "segment 0"),
    "wrong layer count": (_json(lambda m: m.update(layers=3)), "layers"),
}


async def test_bad_manifests_from_publishers(net_local: LocalNet,
                                             scenario: ScenarioRecord) -> None:
    """Publications of the same prompt whose every manifest version is spoiled, then a
    good one: discovery discards each bad one (the reason names the check) and takes the
    good one, whose layers are all right; the bad publishers' sessions stay open."""
    net = net_local
    relay = await net.relay()
    bad_eps = []
    for spoil, _ in MANIFEST_SPOILERS.values():
        ep = await net.client(relay)
        bad_eps.append(ep)
        await publish(SpoilingTarget(ep, lambda n, g, o, f=spoil: f  # type: ignore[misc]
                                     if n == b"manifest" else None), kv_cache(90))
    good_ep = await net.client(relay)
    data = kv_cache(91)
    good = await publish(good_ep, data)
    kv = consumer(await net.client(relay), recompute_budget_s=2.0)
    found = await kv.discover()
    assert found is not None and found.namespace.publication_id == good.publication_id
    # discovery tries the candidates in an order of its own (one SUBSCRIBE_NAMESPACE
    # lists them since issue 26) and stops at the good one: every bad one is checked here
    bad = [p for p in await kv.lookup()
           if p.namespace.publication_id != good.publication_id]
    assert len(bad) == len(MANIFEST_SPOILERS)
    reasons = [why for _, why in kv.discarded]
    for pub in bad:
        with pytest.raises(KvcsError) as refused:
            await kv.manifest(pub)
        reasons.append(str(refused.value))
    # each spoiler's check is named by a reason of its own (the most specific words first:
    # "manifest.layers = 3 but compat.layers = 8" names compat too)
    left = list(dict.fromkeys(reasons[len(kv.discarded):]))
    assert len(left) == len(MANIFEST_SPOILERS), left
    specific = ["layers", "block_keys_sha256", "segment 0", "compat", "manifest"]
    for name, (_, words) in sorted(MANIFEST_SPOILERS.items(),
                                   key=lambda item: specific.index(item[1][1])):
        match = next((why for why in left if words.lower() in why.lower()), None)
        assert match is not None, (name, left)
        left.remove(match)
    got = (await consume(kv, found)).judge(data)
    scenario.record(got)
    assert got.complete and got.wrong_tensors == 0 and got.bytes_lost == 0
    assert not any(ep.is_closed for ep in bad_eps)


@pytest.fixture
async def net_local(cert: DevCertificate) -> Any:
    async with LocalNet(cert) as n:
        yield n
