"""Tests of the 68-octet object payload header."""

from __future__ import annotations

import hashlib
import os

import pytest

from kvcs.kv.errors import DigestError, HeaderError, VerificationError
from kvcs.kv.payload import (
    HEADER_SIZE,
    build_headers,
    build_payload,
    build_payload_bytes,
    data_digests,
    parse_header,
    verify_payload,
)

# KVCS document appendix: "k" Object at Group 0, Object 1, Token Start 4, Token Count 4,
# codec raw, Data = 0x00..0x0f.
APPENDIX_HEADER = bytes.fromhex(
    "4b 56 4f 31 01 01 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 04 00 00 00 04"
    " 00 01 00 00 00 00 00 10 be 45 cb 26 05 bf 36 be bd e6 84 84 1a 28 f0 fd 43 c6 98 50"
    " a3 dc e5 fe db a6 99 28 ee 3a 89 91"
)


def test_appendix_header_byte_for_byte():
    data = bytes(range(16))
    header, body = build_payload("k", 0, 1, 4, 4, "raw", data)
    assert HEADER_SIZE == 68 == len(header)
    assert header == APPENDIX_HEADER
    assert body is data  # no copy
    hdr = verify_payload(APPENDIX_HEADER + data, group=0, object_id=1)
    assert (hdr.component, hdr.layer, hdr.block_index, hdr.token_start, hdr.token_count) == (
        1,
        0,
        1,
        4,
        4,
    )
    assert (hdr.codec, hdr.flags, hdr.reserved, hdr.data_length) == (1, 0, 0, 16)
    assert bytes(hdr.data) == data
    assert hdr.header_bytes() == APPENDIX_HEADER


def test_build_returns_same_data_object_and_joined():
    data = memoryview(os.urandom(100))
    header, body = build_payload(2, 7, 3, 1 << 40, 16, 1, data)
    assert body is data
    joined = build_payload_bytes(2, 7, 3, 1 << 40, 16, 1, data)
    assert joined == header + bytes(data)
    hdr = verify_payload(memoryview(joined), group=7, object_id=3)
    assert hdr.token_start == 1 << 40 and hdr.component == 2
    assert isinstance(hdr.data, memoryview)
    assert parse_header(joined).digest == hashlib.sha256(data).digest()


def test_expected_digest():
    p = build_payload_bytes("kv", 0, 0, 0, 4, "zstd", b"abc")
    d = hashlib.sha256(b"abc").digest()
    verify_payload(p, group=0, object_id=0, expected_digest=d)
    with pytest.raises(DigestError, match="expected"):
        verify_payload(p, group=0, object_id=0, expected_digest=bytes(32))


def mutate(p: bytes, offset: int, value: bytes) -> bytes:
    return p[:offset] + value + p[offset + len(value) :]


GOOD = build_payload_bytes("v", 2, 5, 20, 4, "raw", bytes(range(64)))


@pytest.mark.parametrize(
    ("payload", "group", "obj", "exc", "match"),
    [
        (GOOD[:67], 2, 5, HeaderError, "shorter"),
        (b"", 2, 5, HeaderError, "shorter"),
        (GOOD[:-1], 2, 5, HeaderError, "data length"),
        (GOOD + b"\x00", 2, 5, HeaderError, "data length"),
        (mutate(GOOD, 0, b"KVO2"), 2, 5, HeaderError, "magic"),
        (mutate(GOOD, 4, b"\x02"), 2, 5, HeaderError, "version"),
        (mutate(GOOD, 5, b"\x00"), 2, 5, HeaderError, "component"),
        (mutate(GOOD, 5, b"\x04"), 2, 5, HeaderError, "component"),
        (GOOD, 3, 5, HeaderError, "group"),
        (GOOD, 2, 4, HeaderError, "object"),
        (mutate(GOOD, 32, b"\x00\x00\x00\x41"), 2, 5, HeaderError, "data length"),
        (mutate(GOOD, 36, b"\x00"), 2, 5, DigestError, "digest"),
        (mutate(GOOD, 100, b"\xff"), 2, 5, DigestError, "digest"),
    ],
)
def test_rejections(payload, group, obj, exc, match):
    with pytest.raises(exc, match=match):
        verify_payload(payload, group=group, object_id=obj)
    assert issubclass(exc, VerificationError)


def test_flags_and_reserved_ignored():
    p = mutate(mutate(GOOD, 6, b"\x12\x34"), 30, b"\xab\xcd")
    hdr = verify_payload(p, group=2, object_id=5)
    assert hdr.flags == 0x1234 and hdr.reserved == 0xABCD


@pytest.mark.parametrize(
    "args",
    [
        ("x", 0, 0, 0, 4, 1),
        ("k", -1, 0, 0, 4, 1),
        ("k", 1 << 32, 0, 0, 4, 1),
        ("k", 0, 0, 1 << 64, 4, 1),
        ("k", 0, 0, 0, 4, "lz4"),
        ("k", 0, 0, 0, 4, 1 << 16),
    ],
)
def test_build_rejects(args):
    with pytest.raises(ValueError):
        build_payload(*args, b"")


def test_build_headers_equal_build_payload_per_block():
    sections = [os.urandom(96) for _ in range(5)]
    digests = data_digests(sections)
    assert digests == [hashlib.sha256(x).digest() for x in sections]
    headers = build_headers("v", 9, 1 << 33, 16, "zstd", sections, digests)
    for b, (header, data) in enumerate(zip(headers, sections, strict=True)):
        assert header == build_payload("v", 9, b, (1 << 33) + 16 * b, 16, "zstd", data)[0]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("x", 0, 0, 4, 1), "component"),
        (("k", 1 << 32, 0, 4, 1), "layer"),
        (("k", 0, (1 << 64) - 4, 4, 1), "token_start"),
        (("k", 0, 0, 4, "lz4"), "lz4"),
    ],
)
def test_build_headers_rejects(args, match):
    sections = [b"ab", b"cd"]
    with pytest.raises(ValueError, match=match):
        build_headers(*args, sections, data_digests(sections))


def test_build_headers_needs_a_digest_per_section():
    with pytest.raises(ValueError, match="1 digests for 2 sections"):
        build_headers("k", 0, 0, 4, 1, [b"ab", b"cd"], [bytes(32)])
    with pytest.raises(ValueError, match="not 32"):
        build_headers("k", 0, 0, 4, 1, [b"ab"], [bytes(31)])


def test_verify_with_a_digest_computed_beforehand():
    data = bytes(range(64))
    verify_payload(GOOD, group=2, object_id=5, data_sha256=hashlib.sha256(data).digest())
    with pytest.raises(DigestError, match="does not match the data"):
        verify_payload(GOOD, group=2, object_id=5, data_sha256=bytes(32))
