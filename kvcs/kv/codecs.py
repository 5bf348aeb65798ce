"""KVSP codecs ``raw`` (1), ``q8`` (2) and ``zstd`` (3), joint ``kv`` sections and layer digests.

A *section* is the encoding of one block, one layer, one of K or V: an array of shape
``(B, H, D)`` (tokens, heads, dim; layout ``tnd``). See profile section 5.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import ml_dtypes
import numpy as np

from .component import Component
from .dtypes import DTYPE_NAMES, dtype_for, dtype_name
from .errors import CodecError, UnsupportedCodecError

__all__ = [
    "CODECS",
    "CODEC_NAMES",
    "Buffer",
    "codec_name",
    "codec_value",
    "decode_component",
    "decode_kv",
    "decode_section",
    "encode_component",
    "encode_kv",
    "encode_section",
    "layer_digest",
    "raw_section",
    "zstd_available",
]

#: Codec name -> 16-bit registry value.
CODECS: dict[str, int] = {"raw": 1, "q8": 2, "zstd": 3}
#: Registry value -> codec name.
CODEC_NAMES: dict[int, str] = {v: k for k, v in CODECS.items()}

#: Bytes-like values accepted and returned by the codecs.
Buffer = bytes | bytearray | memoryview

_ZSTD_LEVEL = 3
_U32 = struct.Struct(">I")


def codec_value(codec: str | int) -> int:
    """Registry value of a codec given by name or value; UnsupportedCodecError if unknown."""
    if isinstance(codec, str):
        if codec in CODECS:
            return CODECS[codec]
    elif isinstance(codec, int) and not isinstance(codec, bool) and codec in CODEC_NAMES:
        return codec
    raise UnsupportedCodecError(f"codec {codec!r} is not implemented (known: raw, q8, zstd)")


def codec_name(codec: str | int) -> str:
    """Registry name of a codec given by name or value."""
    return CODEC_NAMES[codec_value(codec)]


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:  # pragma: no cover - depends on the environment
        raise UnsupportedCodecError(
            "codec 'zstd' needs the 'zstandard' package (pip install 'kvcs[zstd]')"
        ) from None
    return zstandard


def zstd_available() -> bool:
    """True if the optional ``zstandard`` package can be imported."""
    try:
        _zstd()
    except UnsupportedCodecError:  # pragma: no cover
        return False
    return True


def _as_dtype(dtype: np.dtype | type | str) -> np.dtype:
    if isinstance(dtype, str):
        return dtype_for(dtype)
    dt = np.dtype(dtype)
    dtype_name(dt)  # validates: must be one of the KVSP element types
    return dt


def _check_block(block: np.ndarray) -> np.dtype:
    if not isinstance(block, np.ndarray):
        raise TypeError(f"a section is a numpy array, got {type(block).__name__}")
    if block.ndim != 3:
        raise ValueError(f"a section has shape (tokens, heads, dim), got ndim={block.ndim}")
    dt = block.dtype
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    name = dtype_name(dt)
    if name not in DTYPE_NAMES:  # pragma: no cover - dtype_name raises first
        raise ValueError(name)
    return dt


def raw_section(block: np.ndarray) -> memoryview:
    """The ``raw`` section: the elements little-endian in tnd order.

    Zero-copy (a memoryview of the array's buffer) when ``block`` is C-contiguous and
    little-endian; otherwise a contiguous little-endian copy is made first.
    """
    dt = _check_block(block)
    if block.dtype != dt or not block.flags.c_contiguous:
        block = np.ascontiguousarray(block, dtype=dt)
    return block.reshape(-1).view(np.uint8).data


def _shuffle(raw: memoryview, itemsize: int) -> bytes:
    if itemsize == 1:
        return bytes(raw)
    a = np.frombuffer(raw, dtype=np.uint8).reshape(-1, itemsize)
    return a.T.tobytes()


def _unshuffle(data: bytes, itemsize: int) -> np.ndarray:
    a = np.frombuffer(data, dtype=np.uint8)
    if itemsize == 1:
        return a
    return np.ascontiguousarray(a.reshape(itemsize, -1).T)


def _q8_encode(block: np.ndarray) -> bytes:
    x = np.asarray(block, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("q8 cannot encode NaN or infinite values")
    amax = np.max(np.abs(x), axis=-1)
    scale = amax / np.float32(127.0)
    with np.errstate(over="ignore"):
        scale16 = scale.astype("<f2")
    if np.isinf(scale16).any():
        raise ValueError(
            "q8 cannot encode this block: max|x|/127 exceeds the float16 scale range (65504)"
        )
    safe = np.where(scale == 0, np.float32(1.0), scale)[..., None]
    q = np.clip(np.rint(x / safe), -127, 127).astype(np.int8)
    return scale16.tobytes() + q.tobytes()


def _q8_decode(data: Buffer, dt: np.dtype, shape: tuple[int, int, int]) -> np.ndarray:
    b, h, d = shape
    n_scales = b * h
    expected = 2 * n_scales + b * h * d
    if len(data) != expected:
        raise CodecError(f"q8 section is {len(data)} octets, expected {expected}")
    scales = np.frombuffer(data, dtype="<f2", count=n_scales).astype(np.float32)
    q = np.frombuffer(data, dtype=np.int8, offset=2 * n_scales)
    if (q == -128).any():
        raise CodecError("q8 value -128 is outside -127..127")
    out = q.reshape(b, h, d).astype(np.float32) * scales.reshape(b, h, 1)
    if dt.itemsize < 4:
        # The float16 scale can round up so that 127*scale exceeds the dtype's range (e.g.
        # -65504 in float16 decodes as -65532): saturate instead of producing inf/NaN.
        limit = np.float32(ml_dtypes.finfo(dt).max)
        np.clip(out, -limit, limit, out=out)
    return out.astype(dt)


def _zstd_decompress(data: Buffer, expected: int) -> bytes:
    zstandard = _zstd()
    try:
        params = zstandard.get_frame_parameters(bytes(data[:18]))
        dctx = zstandard.ZstdDecompressor()
        if params.content_size == expected:
            dobj = dctx.decompressobj()
            out = dobj.decompress(data)
            if not dobj.eof or dobj.unused_data:
                raise CodecError("zstd section is not exactly one complete frame")
        elif params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
            with dctx.stream_reader(data) as reader:
                out = reader.read(expected + 1)
        else:
            raise CodecError(f"zstd frame holds {params.content_size} octets, expected {expected}")
    except zstandard.ZstdError as exc:
        raise CodecError(f"zstd section cannot be decompressed: {exc}") from None
    if len(out) != expected:
        raise CodecError(f"zstd section decompresses to {len(out)} octets, expected {expected}")
    return out


def encode_section(codec: str | int, block: np.ndarray) -> bytes | memoryview:
    """Encode one section (array ``(B, H, D)`` of a KVSP dtype) with ``codec``.

    ``raw`` returns a zero-copy memoryview when the array is C-contiguous little-endian.
    ``q8`` raises ValueError for non-finite values or a scale beyond float16 range.
    """
    value = codec_value(codec)
    if value == 1:
        return raw_section(block)
    dt = _check_block(block)
    if value == 2:
        return _q8_encode(block)
    zstandard = _zstd()
    raw = raw_section(block)
    shuffled = _shuffle(raw, dt.itemsize)
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(shuffled)


def decode_section(
    codec: str | int,
    data: Buffer,
    dtype: np.dtype | type | str,
    shape: tuple[int, int, int],
) -> np.ndarray:
    """Decode one section into an array of ``dtype`` and ``shape`` (B, H, D).

    For ``raw`` the result is a read-only view of ``data`` (no copy). Raises CodecError if the
    data does not fit the shape, UnsupportedCodecError for an unknown or unavailable codec.
    """
    value = codec_value(codec)
    dt = _as_dtype(dtype)
    if len(shape) != 3 or any(int(s) < 1 for s in shape):
        raise ValueError(f"shape must be three positive sizes, got {shape!r}")
    b, h, d = (int(s) for s in shape)
    raw_len = b * h * d * dt.itemsize
    if value == 1:
        if len(data) != raw_len:
            raise CodecError(f"raw section is {len(data)} octets, expected {raw_len}")
        return np.frombuffer(data, dtype=dt).reshape(b, h, d)
    if value == 2:
        return _q8_decode(data, dt, (b, h, d))
    raw = _zstd_decompress(data, raw_len)
    return _unshuffle(raw, dt.itemsize).view(dt).reshape(b, h, d)


def encode_kv(codec: str | int, k_block: np.ndarray, v_block: np.ndarray) -> bytes:
    """Joint ``kv`` Data: K section then V section; u32be length prefixes for q8 and zstd."""
    value = codec_value(codec)
    k = encode_section(value, k_block)
    v = encode_section(value, v_block)
    if value == 1:
        return b"".join((k, v))
    return b"".join((_U32.pack(len(k)), k, _U32.pack(len(v)), v))


def decode_kv(
    codec: str | int,
    data: Buffer,
    dtype: np.dtype | type | str,
    k_shape: tuple[int, int, int],
    v_shape: tuple[int, int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Split and decode joint ``kv`` Data into (K, V)."""
    value = codec_value(codec)
    mv = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    if value == 1:
        dt = _as_dtype(dtype)
        k_len = int(np.prod(k_shape)) * dt.itemsize
        return (
            decode_section(value, mv[:k_len], dt, k_shape),
            decode_section(value, mv[k_len:], dt, v_shape),
        )
    parts: list[memoryview] = []
    off = 0
    for _ in range(2):
        if len(mv) - off < 4:
            raise CodecError("kv data truncated in a section length prefix")
        (n,) = _U32.unpack_from(mv, off)
        off += 4
        if n > len(mv) - off:
            raise CodecError("kv section length exceeds the data")
        parts.append(mv[off : off + n])
        off += n
    if off != len(mv):
        raise CodecError(f"kv data has {len(mv) - off} trailing octets")
    return (
        decode_section(value, parts[0], dtype, k_shape),
        decode_section(value, parts[1], dtype, v_shape),
    )


def layer_digest(k_raw: Buffer, v_raw: Buffer) -> bytes:
    """KVSP layer digest: SHA-256 of the raw K section followed by the raw V section."""
    h = hashlib.sha256(k_raw)
    h.update(v_raw)
    return h.digest()


def encode_component(
    component: Component, codec: str | int, k_block: np.ndarray, v_block: np.ndarray
) -> Buffer:
    """The Data of a ``component`` object of one block: the K section, the V section, or
    the joint ``kv`` Data (zero-copy for ``raw`` K or V, as :func:`encode_section`)."""
    if component is Component.K:
        return encode_section(codec, k_block)
    if component is Component.V:
        return encode_section(codec, v_block)
    if component is Component.KV:
        return encode_kv(codec, k_block, v_block)
    raise TypeError(f"component must be a Component, got {component!r}")


def decode_component(
    component: Component,
    codec: str | int,
    data: Buffer,
    dtype: np.dtype | type | str,
    k_shape: tuple[int, int, int],
    v_shape: tuple[int, int, int],
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Decode the Data of a ``component`` object into (K, V); the one a ``k`` or ``v``
    object does not carry is None. Views of ``data`` for ``raw``, as :func:`decode_section`."""
    if component is Component.K:
        return decode_section(codec, data, dtype, k_shape), None
    if component is Component.V:
        return None, decode_section(codec, data, dtype, v_shape)
    if component is Component.KV:
        return decode_kv(codec, data, dtype, k_shape, v_shape)
    raise TypeError(f"component must be a Component, got {component!r}")
