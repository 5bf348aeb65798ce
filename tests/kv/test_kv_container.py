"""Tests of the KVSP container."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kvcs.kv.codecs import layer_digest
from kvcs.kv.container import (
    Container,
    ContainerLayer,
    build_container,
    decode_container,
    max_container_size,
    read_container,
    write_container,
)
from kvcs.kv.errors import ContainerError
from kvcs.kv.ids import CompatDescriptor
from kvcs.kv.vectors import FIXED_DESCRIPTOR, element_block

DESC = CompatDescriptor.from_dict(FIXED_DESCRIPTOR)
BK = bytes(range(32))
KS = [element_block(DESC, lyr, 1) for lyr in range(2)]
VS = [element_block(DESC, lyr, 1, v=True) for lyr in range(2)]


@pytest.mark.parametrize("codec", ["raw", "zstd", "q8"])
def test_roundtrip(codec):
    data = build_container(DESC, codec, BK, 4, KS, VS)
    c = read_container(data, descriptor=DESC, expected_block_key=BK, accept_unverified_q8=True)
    assert (c.compat_id, c.block_key, c.token_start, c.token_count) == (DESC.compat_id, BK, 4, 4)
    assert len(c.layers) == 2
    assert c.layers[0].digest == layer_digest(KS[0].tobytes(), VS[0].tobytes())
    ks, vs = decode_container(c, DESC)
    if codec != "q8":
        assert all(a.tobytes() == b.tobytes() for a, b in zip(ks + vs, KS + VS, strict=True))
    else:  # small integers are exact in q8 here: max |x| = 125 -> scale < 1
        assert all(np.allclose(a.astype(np.float32), b.astype(np.float32), atol=1)
                   for a, b in zip(ks + vs, KS + VS, strict=True))  # fmt: skip


def test_layout():
    data = build_container(DESC, "raw", BK, 4, KS, VS)
    assert data[:8] == b"KVSP\x01\x00\x00\x01"
    assert data[8:40] == DESC.compat_id and data[40:72] == BK
    assert struct.unpack(">QII", data[72:88]) == (4, 4, 2)
    assert struct.unpack(">II", data[88:96]) == (8192, 8192)
    assert data[128 : 128 + 8192] == KS[0].tobytes()
    assert len(data) == 88 + 2 * (40 + 2 * 8192)
    assert read_container(data).codec == 1  # raw verifies without a descriptor


RAW = build_container(DESC, "raw", BK, 4, KS, VS)


def m(data: bytes, off: int, val: bytes) -> bytes:
    return data[:off] + val + data[off + len(val) :]


@pytest.mark.parametrize(
    ("data", "kwargs", "match"),
    [
        (RAW[:50], {}, "shorter"),
        (m(RAW, 0, b"KVSQ"), {}, "magic"),
        (m(RAW, 4, b"\x02"), {}, "version"),
        (m(RAW, 6, b"\x00\x09"), {}, "codec"),
        (m(RAW, 200, b"\xff"), {}, "digest"),
        (m(RAW, 100, b"\x00"), {}, "digest"),
        (RAW[:-1], {}, "exceed"),
        (RAW + b"\x00", {}, "trailing"),
        (m(RAW, 84, b"\x00\x00\x00\x03"), {}, "too short|truncated|exceed"),
        (m(RAW, 84, b"\xff\xff\xff\xff"), {}, "too short"),
        (m(RAW, 88, b"\xff\xff\xff\xff"), {}, "exceed"),
        (m(RAW, 8, b"\x00"), {"descriptor": DESC}, "Compatibility ID"),
        (m(RAW, 80, b"\x00\x00\x00\x05"), {"descriptor": DESC}, "token count"),
        (m(RAW, 84, b"\x00\x00\x00\x01"), {"descriptor": DESC}, "layers"),
        (RAW, {"expected_block_key": bytes(32)}, "block key"),
    ],
)
def test_rejections(data, kwargs, match):
    with pytest.raises(ContainerError, match=match):
        read_container(data, **kwargs)


def test_raw_section_size_checked_with_descriptor():
    lay = ContainerLayer(b"ab", b"cd", layer_digest(b"ab", b"cd"))
    data = write_container(Container(1, DESC.compat_id, BK, 0, 4, [lay, lay]))
    read_container(data)  # structurally fine
    with pytest.raises(ContainerError, match="raw sections"):
        read_container(data, descriptor=DESC)


def test_zstd_and_q8_policies():
    z = build_container(DESC, "zstd", BK, 4, KS, VS)
    with pytest.raises(ContainerError, match="needs the Compatibility Descriptor"):
        read_container(z)
    zc = read_container(z, descriptor=DESC)
    # corrupt the digest of a zstd container: detected after decoding
    bad = m(z, 96, bytes(32))
    with pytest.raises(ContainerError, match="digest"):
        read_container(bad, descriptor=DESC)
    # corrupt compressed data
    k_len = len(zc.layers[0].k)
    bad = m(z, 128 + k_len // 2, b"\x00\x00\x00\x00")
    with pytest.raises(ContainerError):
        read_container(bad, descriptor=DESC)
    q = build_container(DESC, "q8", BK, 4, KS, VS)
    with pytest.raises(ContainerError, match="q8"):
        read_container(q, descriptor=DESC)


def test_build_rejects_wrong_geometry():
    with pytest.raises(ValueError):
        build_container(DESC, "raw", BK, 0, KS[:1], VS[:1])
    with pytest.raises(ValueError):
        build_container(DESC, "raw", BK, 0, [k[:2] for k in KS], VS)


def test_max_container_size_bounds_raw_and_incompressible_zstd():
    rng = np.random.default_rng(5)
    ks = [rng.integers(0, 1 << 16, DESC.k_shape(), dtype=np.uint16).view(DESC.dtype)
          for _ in range(DESC.layers)]
    vs = [rng.integers(0, 1 << 16, DESC.v_shape(), dtype=np.uint16).view(DESC.dtype)
          for _ in range(DESC.layers)]
    raw = build_container(DESC, "raw", BK, 4, ks, vs)
    limit = max_container_size(DESC)
    assert len(raw) < limit and len(build_container(DESC, "zstd", BK, 4, ks, vs)) < limit
    assert limit - len(raw) <= len(raw) // 64 + 4096
