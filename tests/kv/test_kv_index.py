"""KVSP Index records and holder URIs (kvcs.kv.index)."""

from __future__ import annotations

import pytest

from kvcs.kv.ids import KvcsNamespace
from kvcs.kv.index import (
    MAX_HOLDERS_PER_KEY,
    IndexFullError,
    ReplicaIndex,
    parse_publication_uri,
    publication_uri,
)

NS = KvcsNamespace(bytes(range(16)), bytes(range(32)), bytes(range(32, 64)), b"\xff" * 16)


@pytest.mark.parametrize("hex_fields", [False, True])
def test_publication_uri_roundtrip(hex_fields: bool) -> None:
    fields = NS.to_fields(hex_fields=hex_fields)
    uri = publication_uri("moqt://relay.example:4443/", fields)
    assert uri.startswith("moqt://relay.example:4443/#kvcs-1/")
    relay, got = parse_publication_uri(uri)
    assert relay == "moqt://relay.example:4443/" and got == tuple(fields)
    assert KvcsNamespace.from_fields(got, hex_fields=hex_fields) == NS
    if hex_fields:
        assert "%" not in uri  # hex text stays readable
    assert parse_publication_uri(publication_uri("moqt://h:1", fields))[0] == "moqt://h:1/"


@pytest.mark.parametrize("uri", [
    "https://holder:8443/kvsp/v1/x", "moqt://relay:4443/", "moqt:///#kvcs-1",
    "moqt://relay:1/#" + "a" * 9000,
])
def test_bad_publication_uris(uri: str) -> None:
    with pytest.raises(ValueError):
        parse_publication_uri(uri)


def test_publication_uri_needs_a_moqt_relay() -> None:
    with pytest.raises(ValueError, match="moqt://"):
        publication_uri("https://relay:4443/", NS.to_fields())


def test_index_records_expire_and_are_bounded() -> None:
    index = ReplicaIndex(max_records=MAX_HOLDERS_PER_KEY + 1)
    s, c, k = b"s" * 16, b"c" * 32, b"k" * 32
    index.register(s, c, k, "moqt://a/#x", 100.0)
    index.register(s, c, k, "https://b/blk", 50.0)
    index.register(s, c, k, "moqt://a/#x", 200.0)  # moves its expiry, keeps its place
    assert len(index) == 2
    assert index.holders(s, c, k, now=10.0) == ["moqt://a/#x", "https://b/blk"]
    assert index.holders(s, c, k, now=60.0) == ["moqt://a/#x"]
    assert index.holders(s, c, b"x" * 32, now=0.0) == []
    assert index.expire(now=60.0) == 1 and len(index) == 1
    for i in range(MAX_HOLDERS_PER_KEY + 3):  # per key: the one expiring first goes
        index.register(s, c, k, f"https://h{i}/", 300.0 + i)
    held = index.holders(s, c, k, now=0.0)
    assert len(held) == MAX_HOLDERS_PER_KEY and "moqt://a/#x" not in held
    index.register(s, c, b"y" * 32, "https://y/", 1e9)
    with pytest.raises(IndexFullError):
        index.register(s, c, b"z" * 32, "https://z/", 1e9)
