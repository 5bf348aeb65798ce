"""Tests of the on-disk container store (kvcs.kv.store)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvcs.kv.container import decode_container, read_container
from kvcs.kv.ids import block_keys
from kvcs.kv.store import BlockStore, parse_hex_id, store_cache

from .tiny import SCOPE, SID, tiny_descriptor

DESC = tiny_descriptor("store-tiny", 3)


def test_put_get_has_roundtrip(tmp_path: Path) -> None:
    store = BlockStore(tmp_path)
    key = bytes(range(32))
    assert store.get(SID, DESC.compat_id, key) is None
    assert not store.has(SID, DESC.compat_id, key)
    path = store.put(SID, DESC.compat_id, key, b"container bytes")
    assert path == tmp_path / SID.hex() / DESC.compat_id.hex() / f"{key.hex()}.kvsp"
    assert store.has(SID, DESC.compat_id, key)
    assert store.get(SID, DESC.compat_id, key) == b"container bytes"
    store.put(SID, DESC.compat_id, key, b"replaced")
    assert store.get(SID, DESC.compat_id, key) == b"replaced"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


@pytest.mark.parametrize("scope,compat,key", [
    (b"\x00" * 15, b"\x00" * 32, b"\x00" * 32),
    (b"\x00" * 16, b"\x00" * 31, b"\x00" * 32),
    (b"\x00" * 16, b"\x00" * 32, b"\x00" * 33),
    ("../" * 8, b"\x00" * 32, b"\x00" * 32),
])
def test_bad_identifiers_are_refused(tmp_path: Path, scope: bytes, compat: bytes,
                                     key: bytes) -> None:
    with pytest.raises(ValueError):
        BlockStore(tmp_path).put(scope, compat, key, b"x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["AB" * 16, "ab" * 15, "ab" * 17, "../" + "a" * 29,
                                  "g" * 32, " " + "a" * 31, "a" * 31 + "\n", 12, None])
def test_parse_hex_id_is_strict(text: object) -> None:
    with pytest.raises(ValueError):
        parse_hex_id(text, 16)


def test_parse_hex_id() -> None:
    assert parse_hex_id("00ff" * 8, 16) == bytes.fromhex("00ff" * 8)


def test_store_cache_writes_every_complete_block(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    tokens = np.arange(50, 64)  # 14 tokens: 3 complete blocks of 4, 2 left over
    ks = [rng.standard_normal((14, 2, 8)).astype(np.float16) for _ in range(3)]
    vs = [rng.standard_normal((14, 2, 8)).astype(np.float16) for _ in range(3)]
    store = BlockStore(tmp_path)
    keys = store_cache(store, DESC, SCOPE, tokens, ks, vs)
    assert keys == block_keys(SCOPE, DESC.compat_id, tokens, 4)
    assert len(keys) == 3
    for i, key in enumerate(keys):
        data = store.get(SID, DESC.compat_id, key)
        assert data is not None
        c = read_container(data, descriptor=DESC, expected_block_key=key)
        assert c.token_start == 4 * i and c.codec == 1
        k, v = decode_container(c, DESC)
        for layer in range(3):
            assert np.array_equal(k[layer], ks[layer][4 * i: 4 * i + 4])
            assert np.array_equal(v[layer], vs[layer][4 * i: 4 * i + 4])
    with pytest.raises(ValueError):
        store_cache(store, DESC, SCOPE, tokens, ks[:2], vs)


def test_expired_containers_are_not_served_and_are_removed(tmp_path: Path) -> None:
    import time

    store = BlockStore(tmp_path)
    keys = [bytes([i]) * 32 for i in range(4)]
    now = time.time()
    store.put(SID, DESC.compat_id, keys[0], b"old", expires_at=now + 100)
    store.put(SID, DESC.compat_id, keys[1], b"fresh", expires_at=now + 200)
    store.put(SID, DESC.compat_id, keys[2], b"forever")
    assert store.expires_at(SID, DESC.compat_id, keys[0]) == now + 100
    assert store.expires_at(SID, DESC.compat_id, keys[2]) is None
    assert store.remove_expired(now=now + 150) == 1
    assert not store.path(SID, DESC.compat_id, keys[0]).exists()
    assert not store.path(SID, DESC.compat_id, keys[0]).with_suffix(".expires").exists()
    assert store.get(SID, DESC.compat_id, keys[1]) == b"fresh"
    # reading an expired container removes it
    store.put(SID, DESC.compat_id, keys[1], b"stale", expires_at=now - 1)
    assert store.get(SID, DESC.compat_id, keys[1]) is None
    assert not store.has(SID, DESC.compat_id, keys[1])
    assert [p.name for p in store.path(SID, DESC.compat_id, keys[2]).parent.iterdir()] == [
        f"{keys[2].hex()}.kvsp"]
    # a new put without retention makes a container permanent again
    store.put(SID, DESC.compat_id, keys[3], b"x", expires_at=now - 1)
    store.put(SID, DESC.compat_id, keys[3], b"y")
    assert store.get(SID, DESC.compat_id, keys[3]) == b"y"


def test_store_cache_retention(tmp_path: Path) -> None:
    import time

    rng = np.random.default_rng(0)
    ks = [rng.standard_normal((8, 2, 8)).astype(np.float16) for _ in range(3)]
    store = BlockStore(tmp_path)
    before = time.time()
    keys = store_cache(store, DESC, SCOPE, np.arange(8), ks, ks, retention_s=60)
    for key in keys:
        until = store.expires_at(SID, DESC.compat_id, key)
        assert until is not None and before + 60 <= until <= time.time() + 60
