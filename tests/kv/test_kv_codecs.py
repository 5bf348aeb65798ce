"""Tests of the raw, q8 and zstd codecs, joint kv sections and the layer digest."""

from __future__ import annotations

import hashlib
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcs.kv.codecs import (
    CODECS,
    codec_name,
    codec_value,
    decode_kv,
    decode_section,
    encode_kv,
    encode_section,
    layer_digest,
    raw_section,
)
from kvcs.kv.dtypes import DTYPE_NAMES, dtype_for, dtype_name
from kvcs.kv.errors import CodecError, DescriptorError, UnsupportedCodecError

SHAPE = (4, 3, 16)


def rand_block(name, shape=SHAPE, seed=0, scale=4.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype_for(name))


def test_registry():
    assert CODECS == {"raw": 1, "q8": 2, "zstd": 3}
    assert codec_value("q8") == 2 and codec_value(3) == 3 and codec_name(1) == "raw"
    for bad in ("lz4", 0, 4, True):
        with pytest.raises(UnsupportedCodecError):
            codec_value(bad)


def test_dtypes():
    assert dtype_for("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    assert dtype_for("float8_e4m3fn").itemsize == 1
    assert [dtype_name(dtype_for(n)) for n in DTYPE_NAMES] == list(DTYPE_NAMES)
    with pytest.raises(DescriptorError):
        dtype_for("float64")
    with pytest.raises(DescriptorError):
        dtype_name(np.float64)


@pytest.mark.parametrize("name", DTYPE_NAMES)
@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_lossless_roundtrip(name, codec):
    block = rand_block(name)
    data = encode_section(codec, block)
    out = decode_section(codec, data, name, SHAPE)
    assert out.dtype == block.dtype and out.shape == SHAPE
    assert out.tobytes() == block.tobytes()


def test_raw_is_zero_copy_and_little_endian():
    block = rand_block("float32")
    mv = encode_section("raw", block)
    assert isinstance(mv, memoryview)
    assert np.shares_memory(np.frombuffer(mv, dtype=np.uint8), block)
    assert bytes(mv) == block.astype("<f4").tobytes()
    # big-endian and non-contiguous inputs are converted
    be = block.astype(">f4")
    assert bytes(encode_section("raw", be)) == bytes(mv)
    nc = np.asfortranarray(block)
    assert bytes(encode_section("raw", nc)) == bytes(mv)
    # decode is a view of the data
    out = decode_section("raw", mv, "float32", SHAPE)
    assert np.shares_memory(out, block)


def test_zstd_is_byte_shuffled_level3_frame():
    import zstandard

    block = rand_block("float16")
    raw = block.tobytes()
    shuffled = raw[0::2] + raw[1::2]
    data = encode_section("zstd", block)
    assert zstandard.ZstdDecompressor().decompress(data) == shuffled
    assert data == zstandard.ZstdCompressor(level=3).compress(shuffled)


def q8_bound(block):
    x = block.astype(np.float32)
    scale = np.abs(x).max(axis=-1) / np.float32(127)
    s16 = scale.astype(np.float16).astype(np.float32)
    return (scale / 2 + 127 * np.abs(scale - s16) + 1e-6 * scale)[..., None], x


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_q8_roundtrip_error_bound(name, seed):
    block = rand_block(name, shape=(16, 8, 128), seed=seed)
    data = encode_section("q8", block)
    assert len(data) == 16 * 8 * 2 + 16 * 8 * 128
    out = decode_section("q8", data, name, (16, 8, 128))
    bound, x = q8_bound(block)
    # decoded values are cast to dtype: allow that rounding too
    eps = np.finfo(dtype_for(name)).eps if name != "bfloat16" else 2**-8
    err = np.abs(out.astype(np.float32) - x)
    assert (err <= bound + np.abs(x) * eps + 1e-30).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(1e-3, 6e4))
def test_q8_property_float32(seed, magnitude):
    rng = np.random.default_rng(seed)
    block = (rng.uniform(-1, 1, (2, 2, 8)) * magnitude).astype(np.float32)
    out = decode_section("q8", encode_section("q8", block), "float32", (2, 2, 8))
    bound, x = q8_bound(block)
    assert (np.abs(out - x) <= bound).all()


def test_q8_layout_and_zero_rows():
    block = np.zeros((2, 2, 4), dtype=np.float32)
    block[0, 1] = [127.0, -63.5, 0.0, 1.0]
    data = encode_section("q8", block)
    scales = np.frombuffer(data[:8], dtype="<f2")
    assert list(scales) == [0.0, 1.0, 0.0, 0.0]
    q = np.frombuffer(data[8:], dtype=np.int8).reshape(2, 2, 4)
    assert list(q[0, 1]) == [127, -64, 0, 1]  # round half to even: -63.5 -> -64
    assert not q[0, 0].any() and not q[1].any()
    out = decode_section("q8", data, "float32", (2, 2, 4))
    assert not out[1].any()
    assert list(out[0, 1]) == [127.0, -64.0, 0.0, 1.0]


def test_q8_large_values():
    f16 = np.full((1, 2, 4), 6e4, dtype=np.float16)
    f16[0, 1] = -65504
    out = decode_section("q8", encode_section("q8", f16), "float16", (1, 2, 4))
    assert np.isfinite(out).all()
    bound, x = q8_bound(f16)
    assert (np.abs(out.astype(np.float32) - x) <= bound + np.abs(x) * 2**-10).all()
    # float32 rows whose scale would overflow float16 cannot be represented: refused
    big = np.full((1, 1, 4), 1e30, dtype=np.float32)
    with pytest.raises(ValueError, match="float16 scale range"):
        encode_section("q8", big)
    # largest float32 magnitude that still fits: 127 * 65504
    ok = np.full((1, 1, 4), 127 * 65000, dtype=np.float32)
    out = decode_section("q8", encode_section("q8", ok), "float32", (1, 1, 4))
    assert np.allclose(out, ok, rtol=1e-3)
    with pytest.raises(ValueError, match="NaN"):
        encode_section("q8", np.full((1, 1, 2), np.nan, dtype=np.float32))


def test_q8_rejects_bad_data():
    with pytest.raises(CodecError):
        decode_section("q8", b"\x00" * 10, "float32", (1, 1, 4))
    bad = b"\x00\x3c" + bytes([0x80, 0, 0, 0])
    with pytest.raises(CodecError, match="-128"):
        decode_section("q8", bad, "float32", (1, 1, 4))


def test_decode_length_checks():
    with pytest.raises(CodecError):
        decode_section("raw", b"\x00" * 7, "float32", (1, 1, 2))
    data = encode_section("zstd", rand_block("float32"))
    with pytest.raises(CodecError):
        decode_section("zstd", data, "float32", (4, 3, 8))
    with pytest.raises(CodecError):
        decode_section("zstd", data[:-3], "float32", SHAPE)
    with pytest.raises(CodecError):
        decode_section("zstd", bytes(data) + b"junk", "float32", SHAPE)
    with pytest.raises(CodecError):
        decode_section("zstd", b"not zstd at all", "float32", SHAPE)
    with pytest.raises(UnsupportedCodecError):
        decode_section(9, b"", "float32", SHAPE)


def test_encode_rejects_bad_arrays():
    with pytest.raises(ValueError):
        encode_section("raw", np.zeros((2, 2), dtype=np.float32))
    with pytest.raises(DescriptorError):
        encode_section("raw", np.zeros((1, 1, 1), dtype=np.float64))


@pytest.mark.parametrize("codec", ["raw", "q8", "zstd"])
def test_joint_kv(codec):
    k = rand_block("bfloat16", seed=1)
    v = rand_block("bfloat16", shape=(4, 3, 8), seed=2)
    data = encode_kv(codec, k, v)
    if codec == "raw":
        assert data == k.tobytes() + v.tobytes()
    else:
        (n,) = struct.unpack(">I", data[:4])
        assert bytes(encode_section(codec, k)) == data[4 : 4 + n]
    dk, dv = decode_kv(codec, data, "bfloat16", SHAPE, (4, 3, 8))
    assert dk.shape == SHAPE and dv.shape == (4, 3, 8)
    if codec != "q8":
        assert dk.tobytes() == k.tobytes() and dv.tobytes() == v.tobytes()
    if codec != "raw":
        with pytest.raises(CodecError):
            decode_kv(codec, data[:-1], "bfloat16", SHAPE, (4, 3, 8))
        with pytest.raises(CodecError):
            decode_kv(codec, data + b"\x00", "bfloat16", SHAPE, (4, 3, 8))
        with pytest.raises(CodecError):
            decode_kv(codec, b"\xff\xff\xff\xff", "bfloat16", SHAPE, (4, 3, 8))


def test_layer_digest():
    k = rand_block("bfloat16", seed=3)
    v = rand_block("bfloat16", seed=4)
    kr, vr = encode_section("raw", k), encode_section("raw", v)
    assert layer_digest(kr, vr) == hashlib.sha256(k.tobytes() + v.tobytes()).digest()
    assert layer_digest(kr, vr) == hashlib.sha256(encode_kv("raw", k, v)).digest()
    assert bytes(raw_section(k)) == k.tobytes()


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_q8_decode_saturates_to_dtype_range(name):
    dt = dtype_for(name)
    top = float(ml_dtypes.finfo(dt).max)
    block = np.array([[[top, -top, 0.0, top / 3]]], dtype=np.float32).astype(dt)
    if top / 127 > 65504:
        # bfloat16's range exceeds what a float16 scale can express: q8 refuses it
        with pytest.raises(ValueError):
            encode_section("q8", block)
        return
    out = decode_section("q8", encode_section("q8", block), name, (1, 1, 4))
    assert np.isfinite(out.astype(np.float32)).all()
