"""The disk tier (``kvcs relay --store DIR --store-bytes N``, issue #25): a restarted
relay serves the completed publications it held, through real QUIC; torn or corrupt files
are skipped and logged; the budget evicts least recently used publications."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from kvcs.endpoint import Endpoint, MoqtRequestError
from kvcs.moqt.errors import RequestErrorCode
from kvcs.moqt.track import Track
from kvcs.moqt.wire import MAX_CACHE_DURATION, LocationFilter, ObjectStatus
from kvcs.relay import Relay
from kvcs.relay.store import Store
from kvcs.testing import until

from .conftest import NEXT, WHOLE, Env, end_track, payload, publish_group

NS = (b"kvcs-1", b"\x42" * 16, b"\x5e" * 32, b"\x65" * 32, b"\x09" * 16)
NAMES = (b"manifest", b"k.raw.s0", b"v.raw.s0")


def _publish(pub: Endpoint, ns: tuple[bytes, ...] = NS, duration_ms: int = 600_000) -> None:
    for name in NAMES:
        track = pub.create_track(ns, name, ((MAX_CACHE_DURATION, duration_ms),))
        for g in range(3):
            publish_group(pub, track, g, 4)
        end_track(pub, track, 3)


async def _publish_and_go(env: Env, relay: Relay) -> None:
    pub = await env.client(relay)
    await pub.announce(NS)
    _publish(pub)
    await pub.hand_over(NS, timeout=10)
    pub.close()
    await pub.wait_closed()
    assert relay.tier is not None
    await until(lambda: all(relay.tier.store.has((NS, n)) for n in NAMES), 10)


async def _fetch_all(ep: Endpoint, name: bytes) -> list[bytes]:
    res = await ep.fetch(NS, name, location_filter=LocationFilter.none())
    got = await res.collect(timeout=10)
    assert [(o.group_id, o.object_id) for o in got] == [(g, o) for g in range(3)
                                                        for o in range(4)]
    return [bytes(o.payload) for o in got]


async def test_restarted_relay_serves_its_stored_publications(env: Env, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = await env.relay(store=str(store), sweep_interval=0.05)
    await _publish_and_go(env, first)
    await first.stop()
    env.relays.remove(first)
    # a new relay on the same directory, no upstream: everything comes from the disk
    again = await env.relay(store=str(store))
    assert again.upstream is None
    c = await env.client(again)
    watch = await c.subscribe_namespace(NS[:4])
    assert await watch.next(3) == (True, NS)
    for name in NAMES:
        got = await _fetch_all(c, name)
        assert got == [payload(g, o) for g in range(3) for o in range(4)]
    sub = await c.subscribe(NS, b"k.raw.s0", location_filter=NEXT, fill=WHOLE)
    objs = [o for o in await sub.collect(timeout=10) if o.status == ObjectStatus.NORMAL]
    assert len(objs) == 12
    assert sub.done is not None and sub.done.status == 2  # TRACK_ENDED
    assert again.metrics.get("kvcs_relay_store_loads_total") == 3
    assert again.metrics.get("kvcs_relay_cache_misses_total") == 0  # nobody asked upstream
    # the MAX_CACHE_DURATION property came back with the objects
    assert again.origin.get((NS, b"k.raw.s0")).max_cache_duration_ms == 600_000


async def test_corrupt_file_is_skipped_and_logged(env: Env, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "store"
    first = await env.relay(store=str(store), sweep_interval=0.05)
    await _publish_and_go(env, first)
    await first.stop()
    env.relays.remove(first)
    # flip one payload byte of the k track's file, truncate (tear) the v track's
    scan = Store(store, 1 << 30)
    scan.scan()
    k_path = scan.entries[(NS, b"k.raw.s0")].path
    v_path = scan.entries[(NS, b"v.raw.s0")].path
    data = bytearray(k_path.read_bytes())
    data[-100] ^= 0x01
    k_path.write_bytes(bytes(data))
    v_path.write_bytes(v_path.read_bytes()[:-10])
    caplog.set_level(logging.INFO, logger="kvcs.relay.store")
    again = await env.relay(store=str(store))
    assert any("torn" in r.getMessage() for r in caplog.records)  # v: found at start
    c = await env.client(again)
    assert await _fetch_all(c, b"manifest")
    for name in (b"k.raw.s0", b"v.raw.s0"):
        with pytest.raises(MoqtRequestError) as info:
            await (await c.fetch(NS, name, location_filter=LocationFilter.none())).collect(5)
        assert info.value.code == RequestErrorCode.DOES_NOT_EXIST
    assert any("digest mismatch" in r.getMessage() for r in caplog.records)  # k: on load
    assert again.metrics.get("kvcs_relay_store_skipped_total") == 2
    assert not k_path.exists() and not v_path.exists()


def _track(ns: tuple[bytes, ...], size: int) -> Track:
    t = Track(ns, b"k.raw.s0")
    for o in range(4):
        t.append(0, o, bytes([o]) * size)
    t.append(0, 4, b"", status=ObjectStatus.END_OF_TRACK)
    t.finish()
    return t


def test_lru_eviction_by_bytes(tmp_path: Path) -> None:
    clock = [1000.0]
    store = Store(tmp_path, 3 * 4 * 10_000 + 3000, wall=lambda: clock[0])
    store.scan()
    nss = [(b"kvcs-1", bytes([i]) * 16) for i in range(4)]
    for ns in nss[:3]:
        clock[0] += 1
        assert store.save(_track(ns, 10_000))
    assert len(store.entries) == 3 and store.bytes <= store.budget
    clock[0] += 1
    assert store.load((nss[0], b"k.raw.s0")) is not None  # the oldest becomes the newest
    clock[0] += 1
    assert store.save(_track(nss[3], 10_000))
    assert {k[0] for k in store.entries} == {nss[0], nss[2], nss[3]}  # nss[1] was LRU
    assert store.bytes <= store.budget and store.evicted == 1
    # the order survives a restart (a file's mtime is its last use)
    again = Store(tmp_path, store.budget)
    again.scan()
    assert set(again.entries) == set(store.entries)
    t = again.load((nss[3], b"k.raw.s0"))
    assert t is not None and t.complete and bytes(t.get(t.largest).payload) == b"" \
        and t.count == 5
    assert not store.save(_track((b"kvcs-1", b"\xee" * 16), 100_000))  # larger than all


async def test_stored_track_larger_than_the_cache(env: Env, tmp_path: Path) -> None:
    """A stored track the memory cache cannot keep is refused once, not loaded again and
    again."""
    store = tmp_path / "store"
    first = await env.relay(store=str(store), sweep_interval=0.05)
    await _publish_and_go(env, first)
    await first.stop()
    env.relays.remove(first)
    small = await env.relay(store=str(store), cache_bytes=8 << 10)
    c = await env.client(small)
    with pytest.raises(MoqtRequestError) as info:
        await (await c.fetch(NS, b"k.raw.s0", location_filter=LocationFilter.none())).collect(5)
    assert info.value.code == RequestErrorCode.DOES_NOT_EXIST
    assert small.metrics.get("kvcs_relay_store_loads_total") == 1


async def test_unwritable_store_is_logged_once_per_track(
        env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A full disk: each completed track is tried once and logged, not every sweep; the
    relay goes on serving from memory."""
    import errno

    def full(_plan: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Store, "write", staticmethod(full))
    caplog.set_level(logging.ERROR, logger="kvcs.relay.tier")
    relay = await env.relay(store=str(tmp_path / "store"), sweep_interval=0.02)
    pub = await env.client(relay)
    await pub.announce(NS)
    _publish(pub)
    await pub.hand_over(NS, timeout=10)
    await until(lambda: len(caplog.records) >= len(NAMES), 10)
    await asyncio.sleep(0.2)  # ten more sweeps
    assert len(caplog.records) == len(NAMES)
    assert relay.tier is not None and not relay.tier.store.entries
    c = await env.client(relay)
    assert await _fetch_all(c, b"k.raw.s0")
