"""KVSP HTTP retrieval (profile section 8): KvspServer and KvspClient over real HTTPS on
127.0.0.1 (ephemeral ports)."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from kvcs.auth import Authorizer
from kvcs.kv.container import read_container
from kvcs.kv.errors import ContainerError
from kvcs.kv.ids import ScopeKey, block_keys, scope_id
from kvcs.kv.store import BlockStore, store_cache
from kvcs.kvnet.kvsp_http import CONTENT_TYPE, MAX_LOOKUP_KEYS, KvspClient, KvspError, KvspServer
from kvcs.testing import until
from kvcs.transport import DevCertificate

from .tiny import SCOPE, SID, tiny_descriptor

DESC = tiny_descriptor("http-tiny", 2)
OTHER = scope_id(ScopeKey.from_bytes(bytes(range(1, 33))))
TOKENS = np.arange(100, 112)  # 3 blocks
KEYS = block_keys(SCOPE, DESC.compat_id, TOKENS, 4)
AUTH = Authorizer.from_mapping({"tokens": [
    {"token": "reader", "subscribe": [["kvcs-1", "hex:" + SID.hex()]]},
    {"token": "hex-reader", "subscribe": [["kvcs-1", SID.hex()]]},  # hex namespace grant
    {"token": "publisher-only", "publish": [["kvcs-1", "hex:" + SID.hex()]]},
]})


@pytest.fixture
async def server(tmp_path: Path, cert: DevCertificate) -> AsyncIterator[KvspServer]:
    rng = np.random.default_rng(3)
    ks = [rng.standard_normal((12, 2, 8)).astype(np.float16) for _ in range(2)]
    vs = [rng.standard_normal((12, 2, 8)).astype(np.float16) for _ in range(2)]
    store = BlockStore(tmp_path / "store")
    store_cache(store, DESC, SCOPE, TOKENS[:8], ks, vs)  # blocks 0 and 1 only
    async with KvspServer(store, authorizer=AUTH, certfile=str(cert.certfile),
                          keyfile=str(cert.keyfile)) as srv:
        yield srv


def _client(server: KvspServer, cert: DevCertificate, token: str | None = "reader",
            **kw: object) -> KvspClient:
    return KvspClient(server.url, token, cafile=str(cert.certfile), **kw)  # type: ignore[arg-type]


async def test_get_block(server: KvspServer, cert: DevCertificate) -> None:
    async with _client(server, cert) as client:
        data = await client.get_block(SID, DESC.compat_id, KEYS[1])
        assert data is not None
        c = read_container(data, descriptor=DESC, expected_block_key=KEYS[1])
        assert c.token_start == 4
        assert await client.get_block(SID, DESC.compat_id, KEYS[2]) is None  # 404


async def test_status_codes(server: KvspServer, cert: DevCertificate) -> None:
    base = f"{server.url}/kvsp/v1"
    good = f"{base}/{SID.hex()}/{DESC.compat_id.hex()}/blocks/{KEYS[0].hex()}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            ssl=ssl.create_default_context(cafile=str(cert.certfile)))) as s:
        async def get(url: str, token: str | None = "reader") -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with s.get(url, headers=headers) as r:
                if r.status == 200:
                    assert r.content_type == CONTENT_TYPE
                return r.status

        assert await get(good) == 200
        assert await get(good, "hex-reader") == 200
        assert await get(good, None) == 403
        assert await get(good, "wrong") == 403
        assert await get(good, "publisher-only") == 403
        other = good.replace(SID.hex(), OTHER.hex())
        assert await get(other) == 403  # token not valid for that scope
        assert await get(good.replace(KEYS[0].hex(), KEYS[2].hex())) == 404
        assert await get(good.replace(KEYS[0].hex(), KEYS[0].hex().upper())) == 400
        assert await get(good.replace(KEYS[0].hex(), KEYS[0].hex()[:-2])) == 400
        assert await get(good.replace(SID.hex(), "..%2F" * 8)) in (400, 404)
        async with s.get(good, headers={"Authorization": "Basic cmVhZGVy"}) as r:
            assert r.status == 403


async def test_lookup(server: KvspServer, cert: DevCertificate) -> None:
    async with _client(server, cert) as client:
        got = await client.lookup(SID, DESC.compat_id, KEYS)
        assert sorted(got) == sorted(KEYS[:2])
        url = got[KEYS[0]][0]
        assert url == (f"{server.url}/kvsp/v1/{SID.hex()}/{DESC.compat_id.hex()}/blocks/"
                       f"{KEYS[0].hex()}")
    async with _client(server, cert, token="wrong") as client:
        with pytest.raises(KvspError, match="403"):
            await client.lookup(SID, DESC.compat_id, KEYS)


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b'{"compat": "00", "block_keys": []}',
    json.dumps({"compat": DESC.compat_id.hex(), "block_keys": "x"}).encode(),
    json.dumps({"compat": DESC.compat_id.hex(), "block_keys": ["zz" * 32]}).encode(),
    json.dumps({"compat": DESC.compat_id.hex(),
                "block_keys": [KEYS[0].hex()] * (MAX_LOOKUP_KEYS + 1)}).encode(),
    b"\xff\xfe",
])
async def test_lookup_rejects_malformed_bodies(server: KvspServer, cert: DevCertificate,
                                               body: bytes) -> None:
    url = f"{server.url}/kvsp/v1/{SID.hex()}/lookup"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            ssl=ssl.create_default_context(cafile=str(cert.certfile)))) as s:
        async with s.post(url, data=body, headers={"Authorization": "Bearer reader"}) as r:
            assert r.status == 400
        async with s.post(url, data=b"x" * (1 << 20),
                          headers={"Authorization": "Bearer reader"}) as r:
            assert r.status == 413  # bounded body


async def test_pinned_certificate(server: KvspServer, cert: DevCertificate) -> None:
    async with KvspClient(server.url, "reader", pin_sha256=cert.sha256) as client:
        assert await client.get_block(SID, DESC.compat_id, KEYS[0]) is not None
    async with KvspClient(server.url, "reader", pin_sha256="00" * 32) as client:
        with pytest.raises(KvspError):
            await client.get_block(SID, DESC.compat_id, KEYS[0])
    async with KvspClient(server.url, "reader") as client:  # system trust: dev CA unknown
        with pytest.raises(KvspError):
            await client.get_block(SID, DESC.compat_id, KEYS[0])


async def test_several_holders_and_limits(server: KvspServer, cert: DevCertificate,
                                          tmp_path: Path) -> None:
    empty = KvspServer(BlockStore(tmp_path / "empty"), authorizer=Authorizer(anonymous=True),
                       certfile=str(cert.certfile), keyfile=str(cert.keyfile))
    async with empty:
        async with KvspClient([empty.url, server.url], "reader",
                              cafile=str(cert.certfile)) as client:
            assert await client.get_block(SID, DESC.compat_id, KEYS[0]) is not None
            with pytest.raises(KvspError, match="exceeds"):
                await client.get_block(SID, DESC.compat_id, KEYS[0], max_bytes=100)
        async with KvspClient([empty.url], cafile=str(cert.certfile)) as client:
            assert await client.get_block(SID, DESC.compat_id, KEYS[0]) is None  # anonymous
    async with KvspClient(f"https://127.0.0.1:{empty.port}", cafile=str(cert.certfile),
                          timeout=2) as client:
        with pytest.raises(KvspError):  # nobody listens any more
            await client.get_block(SID, DESC.compat_id, KEYS[0])
    with pytest.raises(ValueError):
        KvspClient("http://127.0.0.1:1")


async def test_corrupted_container_is_served_but_rejected(server: KvspServer,
                                                          cert: DevCertificate) -> None:
    path = server.store.path(SID, DESC.compat_id, KEYS[0])
    bad = bytearray(path.read_bytes())
    bad[-1] ^= 0x01
    path.write_bytes(bytes(bad))
    async with _client(server, cert) as client:
        data = await client.get_block(SID, DESC.compat_id, KEYS[0])
    assert data == bytes(bad)
    with pytest.raises(ContainerError, match="digest"):
        read_container(data, descriptor=DESC, expected_block_key=KEYS[0])
    with pytest.raises(ContainerError, match="block key"):
        read_container(server.store.get(SID, DESC.compat_id, KEYS[1]) or b"",
                       descriptor=DESC, expected_block_key=KEYS[0])


# ---------------------------------------------------------------------- index and retention

NS_URI = ("moqt://relay.example:4443/#kvcs-1/" + SID.hex() + "/" + DESC.compat_id.hex()
          + "/" + KEYS[2].hex() + "/" + "ab" * 16)  # a hex-namespace publication


async def test_registered_replicas_are_answered_until_they_expire(
        server: KvspServer, cert: DevCertificate) -> None:
    async with _client(server, cert, token="publisher-only") as pub:
        await pub.register(SID, DESC.compat_id, KEYS, NS_URI, ttl=0.5)
        await pub.register(SID, DESC.compat_id, KEYS[2:], "https://other.example:8443", ttl=60)
        with pytest.raises(KvspError, match="403"):  # may publish, not read
            await pub.lookup(SID, DESC.compat_id, KEYS)
    async with _client(server, cert) as reader:
        got = await reader.lookup(SID, DESC.compat_id, KEYS)
        assert got[KEYS[0]][1:] == [NS_URI]  # after the holder's own copy
        assert got[KEYS[2]] == [NS_URI, "https://other.example:8443/kvsp/v1/" + SID.hex()
                                + "/" + DESC.compat_id.hex() + "/blocks/" + KEYS[2].hex()]
        with pytest.raises(KvspError, match="403"):  # may read, not register
            await reader.register(SID, DESC.compat_id, KEYS, NS_URI, ttl=60)
        import asyncio

        await asyncio.sleep(0.6)
        got = await reader.lookup(SID, DESC.compat_id, KEYS)
        assert NS_URI not in got[KEYS[0]] and len(got[KEYS[2]]) == 1


@pytest.mark.parametrize("change", [
    {"holder": "moqt://relay:4443/"},  # names no namespace
    {"holder": "http://holder:80"}, {"holder": "https://holder:1/some/path"},
    {"holder": 7}, {"ttl": 0}, {"ttl": 10 ** 9}, {"ttl": True}, {"block_keys": ["00"]},
])
async def test_register_rejects_malformed_records(server: KvspServer, cert: DevCertificate,
                                                  change: dict) -> None:
    body = {"compat": DESC.compat_id.hex(), "block_keys": [KEYS[0].hex()], "holder": NS_URI,
            "ttl": 60, **change}
    url = f"{server.url}/kvsp/v1/{SID.hex()}/replicas"
    ctx = ssl.create_default_context(cafile=str(cert.certfile))
    headers = {"Authorization": "Bearer publisher-only"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
            s.post(url, json=body, headers=headers) as r:
        assert r.status == 400
    assert len(server.index) == 0


async def test_expired_containers_are_not_served_and_are_swept(
        tmp_path: Path, cert: DevCertificate) -> None:
    rng = np.random.default_rng(4)
    ks = [rng.standard_normal((12, 2, 8)).astype(np.float16) for _ in range(2)]
    store = BlockStore(tmp_path / "short")
    # 3 s: the server's start and the first requests come well within it on a loaded
    # machine (with 0.4 s they did not, at load 8); the sweep is waited for, bounded
    store_cache(store, DESC, SCOPE, TOKENS, ks, ks, retention_s=3.0)
    srv = KvspServer(store, authorizer=AUTH, certfile=str(cert.certfile),
                     keyfile=str(cert.keyfile), sweep_interval=0.1)
    async with srv, _client(srv, cert) as client:
        assert await client.get_block(SID, DESC.compat_id, KEYS[0]) is not None
        assert sorted(await client.lookup(SID, DESC.compat_id, KEYS)) == sorted(KEYS)
        # swept: gone from disk without anyone asking for them
        await until(lambda: not any(store.root.rglob("*.kvsp")), timeout=30)
        assert await client.get_block(SID, DESC.compat_id, KEYS[0]) is None
        assert await client.lookup(SID, DESC.compat_id, KEYS) == {}
