"""Tests of the raw, q8 and zstd codecs, joint kv sections and the layer digest."""

from __future__ import annotations

import hashlib
import struct
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvcs.kv import codecs
from kvcs.kv.codecs import (
    CODECS,
    block_decoder,
    block_run_decoder,
    codec_name,
    codec_value,
    decode_kv,
    decode_section,
    decode_section_into,
    decode_sections_into,
    encode_kv,
    encode_section,
    encode_sections,
    layer_digest,
    q8_compiled,
    raw_section,
)
from kvcs.kv.dtypes import DTYPE_NAMES, dtype_for, dtype_name
from kvcs.kv.errors import CodecError, DescriptorError, UnsupportedCodecError

SHAPE = (4, 3, 16)


@pytest.fixture(params=["compiled", "numpy"])
def q8_impl(request, monkeypatch):
    """Run a q8 test on the compiled kernels and again on the numpy fallback."""
    if request.param == "numpy":
        monkeypatch.setattr(codecs, "_q8_kernels", None)
    else:
        assert q8_compiled(), "kvcs.kv._q8 is not built: run make install (needs a C compiler)"
    return request.param


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
def test_q8_roundtrip_error_bound(name, seed, q8_impl):
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


def test_q8_layout_and_zero_rows(q8_impl):
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


def test_q8_large_values(q8_impl):
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


def test_q8_clamps_quotients_of_subnormal_scales(q8_impl):
    # 190 * 2^-149 / 127 rounds to the float32 subnormal 2^-149: 190/1 is clamped to 127
    tiny = 2.0**-149
    block = np.array([[[190 * tiny, -190 * tiny, 64 * tiny, 0.0]]], dtype=np.float32)
    data = encode_section("q8", block)
    assert data == bytes(2) + np.int8([127, -127, 64, 0]).tobytes()  # float16 scale 0
    assert not decode_section("q8", data, "float32", (1, 1, 4)).any()


def test_q8_rejects_bad_data(q8_impl):
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
def test_q8_decode_saturates_to_dtype_range(name, q8_impl):
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


# --- q8: compiled kernels and batched entry points against the numpy reference -----------

Q8_LIMIT = 127 * 65504  # the largest max|row| whose scale fits float16 (65520*127 overflows)
#: float16 scales worth meeting in a decode: zeros, inf, NaNs, the largest, subnormals, 1.0
SPECIAL_SCALES = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFE00, 0x7BFF, 0xFBFF,
                  0x0001, 0x8001, 0x03FF, 0x3C00]


def outcome(fn, *args):
    """``fn(*args)``, or the type and message of the ValueError it raised."""
    with np.errstate(all="ignore"):
        try:
            return fn(*args)
        except ValueError as exc:
            return type(exc), str(exc)


def reference_sections(layer, block_tokens):
    """What encoding each block with the numpy reference gives (or its first error)."""
    out = []
    for i in range(layer.shape[0] // block_tokens):
        one = outcome(codecs._q8_encode_reference, layer[i * block_tokens:][:block_tokens])
        if isinstance(one, tuple):
            return one
        out.append(one)
    return out


@st.composite
def q8_layers(draw):
    """A layer (blocks * B, H, D) and B. Values: typical, any bit pattern (NaN, inf),
    subnormal (float32 scales of a few bits, so max|x|/scale can exceed 127), rows of zeros
    and signed zeros, rows at the float16 scale limit (or the dtype's max), or quotients
    at a rounding tie or next to one."""
    name = draw(st.sampled_from(["float16", "bfloat16", "float32", "float8_e4m3fn"]))
    dt = dtype_for(name)
    blocks, b = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    shape = (blocks * b, draw(st.integers(1, 3)), draw(st.integers(1, 40)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["typical", "bits", "subnormal", "zero_rows", "near_limit",
                                 "ties"]))
    if kind == "bits":
        raw = rng.integers(0, 256, int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        return raw.view(dt).reshape(shape), b
    if kind == "subnormal":  # float32: scales of a few bits, quotients beyond 127
        tiny = float(ml_dtypes.finfo(dt).smallest_subnormal)
        k = rng.integers(-(2 ** draw(st.integers(1, 12))), 2**12, shape)
        return (k * tiny).astype(dt), b
    top = min(Q8_LIMIT, float(ml_dtypes.finfo(dt).max))  # float16, float8: the dtype's max
    low = {"float32": -140, "bfloat16": -130, "float16": -24}.get(name, -8)  # subnormals
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.float32(2.0 ** draw(st.integers(low, int(np.log2(top)) - 2)))
    if kind == "zero_rows":
        x[rng.random(shape[:2]) < 0.5] = 0.0
        x[rng.random(shape) < 0.1] = -0.0
    elif kind == "near_limit":
        peak = np.abs(x).max(axis=-1, keepdims=True)
        x = x / np.where(peak == 0, 1, peak) * np.float32(top * draw(st.floats(0.999, 1.001)))
    elif kind == "ties":  # x / scale at k + 1/2 or next to it: where a wrong rounding shows
        with np.errstate(all="ignore"):
            peak = np.abs(x).max(axis=-1, keepdims=True).astype(dt).astype(np.float32)
        k = rng.integers(-127, 127, shape).astype(np.float32)
        x = (k + np.float32(0.5)) * (peak / np.float32(127))
        x = np.nextafter(x, rng.choice(np.float32([-np.inf, 0, np.inf]), shape))
        x[..., :1] = peak  # the row's maximum, hence its scale
    with np.errstate(all="ignore"):
        return x.astype(dt), b


@settings(max_examples=300, deadline=None)
@given(q8_layers())
def test_q8_encode_matches_reference(case):
    layer, b = case
    expected = reference_sections(layer, b)
    event(f"{layer.dtype}: {'refused' if isinstance(expected, tuple) else 'encoded'}")
    assert outcome(encode_sections, "q8", layer, b) == expected
    if not isinstance(expected, tuple):
        assert outcome(encode_section, "q8", layer[:b]) == expected[0]


@st.composite
def q8_section_lists(draw):
    """Sections of (B, H, D) blocks with any scale bits and q in -127..127; maybe one bad."""
    name = draw(st.sampled_from(list(DTYPE_NAMES)))
    blocks, b, h, d = (draw(st.integers(1, n)) for n in (3, 4, 3, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sections = []
    for _ in range(blocks):
        if draw(st.booleans()):
            scales = rng.integers(0, 2**16, b * h).astype(np.uint16)
        else:  # typical magnitudes, with a special value
            scales = np.abs(rng.standard_normal(b * h)).astype(np.float16).view(np.uint16)
            scales[rng.integers(b * h)] = draw(st.sampled_from(SPECIAL_SCALES))
        q = rng.integers(-127, 128, b * h * d).astype(np.int8)
        sections.append(scales.tobytes() + q.tobytes())
    bad, where = draw(st.sampled_from([None, "-128", "short", "long"])), draw(st.integers(0, 2))
    if bad is not None and where < blocks:
        data = bytearray(sections[where])
        if bad == "-128":
            data[2 * b * h + int(rng.integers(b * h * d))] = 0x80
        elif bad == "short":
            del data[-1]
        else:
            data.append(0)
        sections[where] = bytes(data)
    return name, (b, h, d), sections


@settings(max_examples=300, deadline=None)
@given(q8_section_lists())
def test_q8_decode_matches_reference(case):
    name, (b, h, d), sections = case
    dt = dtype_for(name)
    expected, error = [], None
    for data in sections:
        one = outcome(codecs._q8_decode_reference, data, dt, (b, h, d))
        if isinstance(one, tuple):
            error = one
            break
        expected.append(one.tobytes())
    event(f"{name}: {'refused' if error else 'decoded'}")
    out = np.zeros((len(sections) * b, h, d), dtype=dt)
    got = outcome(decode_sections_into, "q8", sections, out)
    assert got == error  # None, or the same error for the first bad section
    assert out[: len(expected) * b].tobytes() == b"".join(expected)  # the blocks before it
    for data, want in zip(sections, expected, strict=False):
        assert outcome(decode_section, "q8", data, name, (b, h, d)).tobytes() == want


@pytest.mark.parametrize("d", [16, 40, 128, 131])
def test_q8_bfloat16_rows_match_reference(d):
    """The compiled kernel's bfloat16 rows (a vector path for rows whose scale is finite,
    the scalar one otherwise and for a row's tail) give the numpy reference's bits, for
    every kind of scale: typical, any bit pattern (inf, NaN, subnormal, negative)."""
    assert q8_compiled(), "kvcs.kv._q8 is not built: run make install (needs a C compiler)"
    rng = np.random.default_rng(d)
    b, h = 16, 8
    typical = np.abs(rng.standard_normal(b * h)).astype(np.float16).view(np.uint16)
    typical[: len(SPECIAL_SCALES)] = SPECIAL_SCALES
    for scales in (typical, rng.integers(0, 2**16, b * h).astype(np.uint16)):
        q = rng.integers(-127, 128, b * h * d).astype(np.int8)
        q[:d] = np.arange(d) % 255 - 127  # every value, -127..127
        data = scales.tobytes() + q.tobytes()
        with np.errstate(all="ignore"):
            want = codecs._q8_decode_reference(data, dtype_for("bfloat16"), (b, h, d))
        got = decode_section("q8", data, "bfloat16", (b, h, d))
        assert got.tobytes() == want.tobytes()


def test_q8_layer_roundtrip_and_batched_errors(q8_impl):
    b, layer = 16, rand_block("float16", shape=(64, 8, 128), seed=5)
    sections = encode_sections("q8", layer, b)
    assert sections == [encode_section("q8", layer[i:i + b]) for i in range(0, 64, b)]
    # decode into whole tokens of a bigger buffer, as a consumer fills its layer
    buf = np.zeros((80, 8, 128), dtype=np.float16)
    decode_sections_into("q8", sections, buf[16:])
    assert not buf[:16].any()
    want = [decode_section("q8", s, "float16", (b, 8, 128)) for s in sections]
    assert buf[16:].tobytes() == np.concatenate(want).tobytes()
    one = np.empty((b, 8, 128), dtype=np.float16)
    decode_section_into("q8", sections[2], one)
    assert one.tobytes() == want[2].tobytes()
    # strided and big-endian outputs take the copying path
    strided = np.zeros((64, 8, 256), dtype=np.float16)[:, :, ::2]
    decode_sections_into("q8", sections, strided)
    assert np.array_equal(strided, buf[16:])
    big = np.zeros((64, 8, 128), dtype=">f2")
    decode_sections_into("q8", sections, big)
    assert np.array_equal(big, buf[16:])
    # the first block that cannot be encoded raises, with its own error
    bad = layer.copy()
    bad[40, 0, 0] = np.nan  # block 2
    with pytest.raises(ValueError, match="NaN"):
        encode_sections("q8", bad, b)
    wide = bad.astype(np.float32)
    wide[20, 1, 1] = 1e30  # block 1: scale overflow comes first
    with pytest.raises(ValueError, match="float16 scale range"):
        encode_sections("q8", wide, b)
    # the first section refused raises; the blocks before it are decoded
    broken = [*sections[:2], sections[2][:-1], sections[3]]
    out = np.zeros((64, 8, 128), dtype=np.float16)
    with pytest.raises(CodecError, match="octets"):
        decode_sections_into("q8", broken, out)
    assert out[:32].tobytes() == buf[16:48].tobytes()
    minus = bytearray(sections[1])
    minus[-1] = 0x80
    with pytest.raises(CodecError, match="-128"):
        decode_sections_into("q8", [sections[0], bytes(minus)], out[:32])


def test_q8_unaligned_buffers():
    """Arrays and sections at odd addresses (views into received payloads) decode the same."""
    block = rand_block("float16", shape=(16, 8, 128), seed=7)
    data = encode_section("q8", block)
    odd = np.frombuffer(b"\x00" + block.tobytes(), dtype=np.float16, offset=1).reshape(16, 8, 128)
    assert not odd.flags.aligned and encode_section("q8", odd) == data
    payload = memoryview(b"\x00" + data)[1:]
    want = decode_section("q8", data, "float16", (16, 8, 128))
    assert decode_section("q8", payload, "float16", (16, 8, 128)).tobytes() == want.tobytes()
    raw = bytearray(1 + block.nbytes)
    out = np.frombuffer(raw, dtype=np.float16, offset=1).reshape(16, 8, 128)
    decode_section_into("q8", payload, out)
    assert not out.flags.aligned and out.tobytes() == want.tobytes()


@pytest.mark.parametrize("codec", ["raw", "q8", "zstd"])
def test_batched_entry_points(codec):
    layer = rand_block("bfloat16", shape=(12, 3, 16), seed=6)
    sections = encode_sections(codec, layer, 4)
    assert [bytes(s) for s in sections] == [
        bytes(encode_section(codec, layer[i:i + 4])) for i in (0, 4, 8)]
    if codec == "raw":
        assert all(np.shares_memory(np.frombuffer(s, np.uint8), layer) for s in sections)
    out = np.empty_like(layer)
    decode_sections_into(codec, sections, out)
    want = [decode_section(codec, s, "bfloat16", (4, 3, 16)) for s in sections]
    assert out.tobytes() == np.concatenate(want).tobytes()
    assert encode_sections(codec, layer[:0], 4) == []
    with pytest.raises(ValueError, match="blocks of 5"):
        encode_sections(codec, layer, 5)
    with pytest.raises(ValueError, match="3 sections"):
        decode_sections_into(codec, sections, out[:10])
    with pytest.raises(ValueError, match="0 sections"):
        decode_sections_into(codec, [], out)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        decode_sections_into(codec, sections, out)


@pytest.mark.parametrize("codec", ["raw", "q8", "zstd"])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "big-endian"])
def test_block_decoder_is_decode_sections_into_per_block(codec, layout, q8_impl):
    """A block decoder writes what decode_sections_into writes, block by block, and
    refuses what it refuses (the fast raw and q8 paths and the generic one)."""
    layer = rand_block("bfloat16", shape=(12, 3, 16), seed=7)
    sections = encode_sections(codec, layer, 4)
    want = np.empty_like(layer)
    decode_sections_into(codec, sections, want)
    if layout == "strided":  # every other head of a wider buffer: not C-contiguous
        out = np.zeros((12, 6, 16), dtype=layer.dtype)[:, ::2]
    elif layout == "big-endian":  # float16: the generic path converts the byte order
        layer = rand_block("float16", shape=(12, 3, 16), seed=7)
        sections = encode_sections(codec, layer, 4)
        want = np.empty_like(layer)
        decode_sections_into(codec, sections, want)
        out = np.zeros(layer.shape, dtype=layer.dtype.newbyteorder(">"))
    else:
        out = np.zeros_like(layer)
    decode = block_decoder(codec, out, 4)
    for i in (2, 0, 1):
        decode(sections[i], i)
    assert np.array_equal(out.astype(want.dtype).view(np.uint16), want.view(np.uint16))
    with pytest.raises(CodecError):
        decode(bytes(sections[0])[:-1], 0)
    with pytest.raises(ValueError, match="blocks of 5"):
        block_decoder(codec, out, 5)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        block_decoder(codec, out, 4)


@pytest.mark.parametrize("codec", ["raw", "q8", "zstd"])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_block_run_decoder_is_the_block_decoder_per_run(codec, layout, q8_impl):
    """A run decoder writes what the block decoder writes for each block of the run, and
    stops at the first section it refuses (returns its index; nothing of it written)."""
    layer = rand_block("bfloat16", shape=(24, 3, 16), seed=9)
    sections = encode_sections(codec, layer, 4)  # six blocks
    want = np.empty_like(layer)
    decode_sections_into(codec, sections, want)

    def fresh():
        if layout == "strided":
            return np.zeros((24, 6, 16), dtype=layer.dtype)[:, ::2]
        return np.zeros_like(layer)

    out = fresh()
    run = block_run_decoder(codec, out, 4)
    assert run(sections[1:4], 1) == -1 and run(sections[4:], 4) == -1
    assert run(sections[:1], 0) == -1
    assert out.tobytes() == want.tobytes()
    bad = bytearray(sections[2])
    if codec == "q8":
        bad[-1] = 0x80  # -128: only the decoder sees it
    else:
        del bad[-1]
    out = fresh()
    run = block_run_decoder(codec, out, 4)
    assert run([sections[1], bytes(bad), sections[3]], 1) == 1
    u16 = out.view(np.uint16)
    assert u16[4:8].tobytes() == want.view(np.uint16)[4:8].tobytes()  # block 1 decoded
    assert not u16[8:].any()  # the refused block 2 and block 3 after it: not written
    with pytest.raises(CodecError):
        block_decoder(codec, out, 4)(bytes(bad), 2)  # the error a caller reports


def test_block_decoder_refuses_q8_minus_128(q8_impl):
    layer = rand_block("bfloat16", shape=(8, 3, 16), seed=8)
    bad = bytearray(encode_sections("q8", layer, 4)[1])
    bad[-1] = 0x80  # -128 as int8
    decode = block_decoder("q8", np.empty_like(layer), 4)
    with pytest.raises(CodecError, match="-128"):
        decode(bytes(bad), 1)


def test_q8_kernels_run_in_threads():
    """The kernels release the GIL: threads encoding and decoding at once get the same bytes."""
    layers = [rand_block("bfloat16", shape=(256, 8, 128), seed=s) for s in range(4)]
    serial = [encode_sections("q8", x, 16) for x in layers]
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda x: encode_sections("q8", x, 16), layers)) == serial

        def decode(sections):
            out = np.empty((256, 8, 128), dtype=ml_dtypes.bfloat16)
            decode_sections_into("q8", sections, out)
            return out.tobytes()

        want = [decode(s) for s in serial]
        assert list(pool.map(decode, serial)) == want


@pytest.mark.parametrize("codec", ["raw", "q8", "zstd"])
def test_component_sections_and_decoding_into_a_layer(codec: str) -> None:
    """encode_component_sections gives what encode_component gives block by block, and
    decode_component_into writes what decode_component returns, for k, v and joint kv."""
    from kvcs.kv.codecs import (
        decode_component,
        decode_component_into,
        encode_component,
        encode_component_sections,
    )
    from kvcs.kv.component import Component

    rng = np.random.default_rng(5)
    b, blocks = 4, 3
    k = rng.standard_normal((b * blocks, 3, 16)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((b * blocks, 3, 8)).astype(ml_dtypes.bfloat16)
    for kind in Component:
        sections = encode_component_sections(kind, codec, k, v, b)
        assert len(sections) == blocks
        k_out, v_out = np.zeros_like(k), np.zeros_like(v)
        for i, data in enumerate(sections):
            rows = slice(i * b, (i + 1) * b)
            assert bytes(data) == bytes(encode_component(kind, codec, k[rows], v[rows]))
            decode_component_into(kind, codec, data, k_out[rows], v_out[rows])
            want_k, want_v = decode_component(kind, codec, data, k.dtype, (b, 3, 16),
                                              (b, 3, 8))
            if want_k is not None:
                assert np.array_equal(k_out[rows].view(np.uint16), want_k.view(np.uint16))
            if want_v is not None:
                assert np.array_equal(v_out[rows].view(np.uint16), want_v.view(np.uint16))
        assert kind.carries_k or not k_out.any()  # a v object writes no K row
        assert kind.carries_v or not v_out.any()
    with pytest.raises(CodecError):
        decode_component_into(Component.KV, codec, bytes(sections[0])[:-5], k_out[:b],
                              v_out[:b])
