"""KVSP codecs ``raw`` (1), ``q8`` (2) and ``zstd`` (3), joint ``kv`` sections and layer digests.

A *section* is the encoding of one block, one layer, one of K or V: an array of shape
``(B, H, D)`` (tokens, heads, dim; layout ``tnd``). See profile section 5.

``encode_sections`` and ``decode_sections_into`` do a whole layer's blocks in one call;
``encode_component_sections`` and ``decode_component_into`` are the same for the objects of
a ``k``, ``v`` or joint ``kv`` track (what publishers and the assembler call).
``q8`` runs in compiled kernels (``kvcs/kv/_q8.c``, built by ``make install`` where a C
compiler is present) for float32, float16 and bfloat16, and otherwise in numpy
(``_q8_encode_reference``, ``_q8_decode_reference``): the same bytes and values either way.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .component import Component
from .dtypes import DTYPE_NAMES, dtype_for, dtype_name
from .errors import CodecError, UnsupportedCodecError

try:  # optional: setup.py builds it when a C compiler is present
    from . import _q8 as _q8_kernels
except ImportError:  # pragma: no cover - depends on the build
    _q8_kernels = None  # type: ignore[assignment]

__all__ = [
    "CODECS",
    "CODEC_NAMES",
    "Buffer",
    "Codec",
    "codec_name",
    "codec_record",
    "codec_value",
    "decode_component",
    "decode_component_into",
    "decode_kv",
    "decode_section",
    "decode_section_into",
    "decode_sections_into",
    "encode_component",
    "encode_component_sections",
    "encode_kv",
    "encode_section",
    "encode_sections",
    "layer_digest",
    "q8_compiled",
    "raw_section",
    "zstd_available",
]

#: Bytes-like values accepted and returned by the codecs.
Buffer = bytes | bytearray | memoryview

_ZSTD_LEVEL = 3
_U32 = struct.Struct(">I")


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
    block = _c_order(block, _check_block(block))
    return block.reshape(-1).view(np.uint8).data


def _c_order(block: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``block`` as a C-contiguous little-endian array (itself when it already is one)."""
    if block.dtype != dt or not block.flags.c_contiguous:
        block = np.ascontiguousarray(block, dtype=dt)
    return block


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


_Q8_NONFINITE = "q8 cannot encode NaN or infinite values"
_Q8_SCALE_RANGE = (
    "q8 cannot encode this block: max|x|/127 exceeds the float16 scale range (65504)"
)
#: Element kinds of the compiled kernels (kvcs/kv/_q8.c) and the integer view they read.
@functools.cache
def _q8_kinds() -> dict[np.dtype, tuple[int, type[np.unsignedinteger]]]:
    return {  # built on first use: bfloat16 comes from ml_dtypes (imported lazily)
        np.dtype("<f4"): (0, np.uint32),
        np.dtype("<f2"): (1, np.uint16),
        dtype_for("bfloat16"): (2, np.uint16),
    }


#: Status codes of ``_q8.encode`` -> the ValueError raised.
_Q8_ENCODE_ERRORS = {1: _Q8_NONFINITE, 2: _Q8_SCALE_RANGE}
_Q8_MINUS_128 = "q8 value -128 is outside -127..127"


def _q8_size_error(size: int, expected: int) -> CodecError:
    return CodecError(f"q8 section is {size} octets, expected {expected}")


def q8_compiled() -> bool:
    """True if the compiled q8 kernels are installed (else q8 runs in numpy, ~10x slower)."""
    return _q8_kernels is not None


def _q8_encode_reference(block: np.ndarray) -> bytes:
    """numpy q8 encoder: the definition the compiled kernels match bit for bit."""
    x = np.asarray(block, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError(_Q8_NONFINITE)
    amax = np.max(np.abs(x), axis=-1)
    scale = amax / np.float32(127.0)
    with np.errstate(over="ignore"):
        scale16 = scale.astype("<f2")
    if np.isinf(scale16).any():
        raise ValueError(_Q8_SCALE_RANGE)
    safe = np.where(scale == 0, np.float32(1.0), scale)[..., None]
    q = np.clip(np.rint(x / safe), -127, 127).astype(np.int8)
    return scale16.tobytes() + q.tobytes()


def _q8_decode_reference(data: Buffer, dt: np.dtype, shape: tuple[int, int, int]) -> np.ndarray:
    """numpy q8 decoder: the definition the compiled kernels match bit for bit."""
    b, h, d = shape
    n_scales = b * h
    expected = 2 * n_scales + b * h * d
    if len(data) != expected:
        raise _q8_size_error(len(data), expected)
    scales = np.frombuffer(data, dtype="<f2", count=n_scales).astype(np.float32)
    q = np.frombuffer(data, dtype=np.int8, offset=2 * n_scales)
    if (q == -128).any():
        raise CodecError(_Q8_MINUS_128)
    out = q.reshape(b, h, d).astype(np.float32) * scales.reshape(b, h, 1)
    if dt.itemsize < 4:
        # The float16 scale can round up so that 127*scale exceeds the dtype's range (e.g.
        # -65504 in float16 decodes as -65532): saturate instead of producing inf/NaN.
        import ml_dtypes  # loaded already: dt is one of its types or float16

        limit = np.float32(ml_dtypes.finfo(dt).max)
        np.clip(out, -limit, limit, out=out)
    return out.astype(dt)


def _q8_encode_blocks(layer: np.ndarray, blocks: int) -> list[bytes]:
    """q8 sections of ``blocks`` equal blocks of a C-contiguous little-endian layer."""
    kernel = _q8_kinds().get(layer.dtype) if _q8_kernels is not None else None
    t, h, d = layer.shape
    if kernel is None or layer.size == 0:  # no compiled kernels, float8, or an empty array
        n = t // blocks if blocks else 0
        return [_q8_encode_reference(layer[i * n : (i + 1) * n]) for i in range(blocks)]
    if not layer.flags.aligned:  # e.g. a view at an odd offset of a buffer
        layer = layer.copy()
    kind, view = kernel
    result = _q8_kernels.encode(layer.view(view), kind, blocks, t // blocks * h, d)
    if isinstance(result, int):
        raise ValueError(_Q8_ENCODE_ERRORS[result])
    return result


def _q8_decode_blocks(sections: Sequence[Buffer], out: np.ndarray) -> None:
    """Decode q8 ``sections`` into equal consecutive blocks of ``out`` (t, h, d)."""
    t, h, d = out.shape
    n = t // len(sections)
    kernel = _q8_kinds().get(out.dtype) if _q8_kernels is not None else None
    # float8, or a strided or unaligned view: decode each block, then copy it into place
    if kernel is None or not (out.flags.c_contiguous and out.flags.aligned):
        dt = _check_block(out)
        for i, data in enumerate(sections):
            out[i * n : (i + 1) * n] = _q8_decode_reference(data, dt, (n, h, d))
        return
    kind, view = kernel
    bad = _q8_kernels.decode(sections, kind, n * h, d, out.view(view))
    if bad >= 0:  # the first section refused: a wrong size or a -128
        size, expected = len(sections[bad]), n * h * (2 + d)
        raise _q8_size_error(size, expected) if size != expected else CodecError(_Q8_MINUS_128)


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


def _raw_encode(block: np.ndarray) -> memoryview:
    return block.reshape(-1).view(np.uint8).data


def _raw_decode(data: Buffer, dt: np.dtype, shape: tuple[int, int, int]) -> np.ndarray:
    b, h, d = shape
    raw_len = b * h * d * dt.itemsize
    if len(data) != raw_len:
        raise CodecError(f"raw section is {len(data)} octets, expected {raw_len}")
    return np.frombuffer(data, dtype=dt).reshape(b, h, d)


def _q8_encode(block: np.ndarray) -> bytes:
    return _q8_encode_blocks(block, 1)[0]


def _q8_decode(data: Buffer, dt: np.dtype, shape: tuple[int, int, int]) -> np.ndarray:
    out = np.empty(shape, dtype=dt)
    _q8_decode_blocks((data,), out)
    return out


def _zstd_encode(block: np.ndarray) -> bytes:
    zstandard = _zstd()
    shuffled = _shuffle(_raw_encode(block), block.dtype.itemsize)
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(shuffled)


def _zstd_decode(data: Buffer, dt: np.dtype, shape: tuple[int, int, int]) -> np.ndarray:
    b, h, d = shape
    raw = _zstd_decompress(data, b * h * d * dt.itemsize)
    return _unshuffle(raw, dt.itemsize).view(dt).reshape(b, h, d)


@dataclass(frozen=True)
class Codec:
    """One KVSP codec: what every codec branch consults instead of its number.

    ``encode`` takes one C-contiguous little-endian ``(B, H, D)`` block of a KVSP dtype;
    ``decode`` returns the ``(B, H, D)`` array of a section (CodecError if it does not fit).
    ``encode_batch`` / ``decode_batch``, when set, do a layer's blocks in one call.
    """

    value: int
    """16-bit registry value (the payload header's and the container's codec field)."""
    name: str
    """Registry name (the ``<codec>`` of a data track name)."""
    lossless: bool
    """Decoding gives the elements back exactly, so a layer digest can be checked."""
    verbatim: bool
    """The section is the elements themselves (``raw``): its size follows from the shape,
    joint ``kv`` Data needs no length prefixes and the layer digest reads it as it is."""
    encode: Callable[[np.ndarray], Buffer]
    decode: Callable[[Buffer, np.dtype, tuple[int, int, int]], np.ndarray]
    encode_batch: Callable[[np.ndarray, int], Sequence[Buffer]] | None = None
    decode_batch: Callable[[Sequence[Buffer], np.ndarray], None] | None = None
    available: Callable[[], bool] = lambda: True
    """False if this build cannot run the codec (``zstd`` without ``zstandard``)."""

    def element_size(self, dt: np.dtype) -> int | None:
        """Octets per element of a section when the shape fixes them (``raw``), else None."""
        return dt.itemsize if self.verbatim else None

    def encode_blocks(self, layer: np.ndarray, n: int) -> list[Buffer]:
        """The sections of ``n`` equal blocks of a C-contiguous little-endian layer."""
        if self.encode_batch is not None:
            return [*self.encode_batch(layer, n)]
        b = layer.shape[0] // n if n else 0
        return [self.encode(layer[i * b : (i + 1) * b]) for i in range(n)]

    def decode_blocks(self, sections: Sequence[Buffer], out: np.ndarray) -> None:
        """Decode ``sections`` into equal consecutive blocks of ``out`` (t, h, d)."""
        if self.decode_batch is not None:
            self.decode_batch(sections, out)
            return
        t, h, d = out.shape
        b = t // len(sections)
        dt = out.dtype.newbyteorder("<") if out.dtype.byteorder == ">" else out.dtype
        for i, data in enumerate(sections):
            out[i * b : (i + 1) * b] = self.decode(data, dt, (b, h, d))


_RECORDS = (
    Codec(1, "raw", lossless=True, verbatim=True, encode=_raw_encode, decode=_raw_decode),
    Codec(2, "q8", lossless=False, verbatim=False, encode=_q8_encode, decode=_q8_decode,
          encode_batch=_q8_encode_blocks, decode_batch=_q8_decode_blocks),
    Codec(3, "zstd", lossless=True, verbatim=False, encode=_zstd_encode, decode=_zstd_decode,
          available=lambda: zstd_available()),
)
_BY_NAME = {c.name: c for c in _RECORDS}
_BY_VALUE = {c.value: c for c in _RECORDS}
#: Codec name -> 16-bit registry value.
CODECS: dict[str, int] = {c.name: c.value for c in _RECORDS}
#: Registry value -> codec name.
CODEC_NAMES: dict[int, str] = {c.value: c.name for c in _RECORDS}


def codec_record(codec: str | int | Codec) -> Codec:
    """The :class:`Codec` of a codec given by name, value or record; UnsupportedCodecError
    if this build does not know it."""
    if isinstance(codec, Codec):
        return codec
    found = (_BY_NAME.get(codec) if isinstance(codec, str)
             else _BY_VALUE.get(codec) if isinstance(codec, int) and not isinstance(codec, bool)
             else None)
    if found is None:
        raise UnsupportedCodecError(
            f"codec {codec!r} is not implemented (known: {', '.join(_BY_NAME)})")
    return found


def codec_value(codec: str | int | Codec) -> int:
    """Registry value of a codec given by name or value; UnsupportedCodecError if unknown."""
    return codec_record(codec).value


def codec_name(codec: str | int | Codec) -> str:
    """Registry name of a codec given by name or value."""
    return codec_record(codec).name


def encode_section(codec: str | int | Codec, block: np.ndarray) -> Buffer:
    """Encode one section (array ``(B, H, D)`` of a KVSP dtype) with ``codec``.

    ``raw`` returns a zero-copy memoryview when the array is C-contiguous little-endian.
    ``q8`` raises ValueError for non-finite values or a scale beyond float16 range.
    """
    rec = codec_record(codec)
    return rec.encode(_c_order(block, _check_block(block)))


def decode_section(
    codec: str | int | Codec,
    data: Buffer,
    dtype: np.dtype | type | str,
    shape: tuple[int, int, int],
) -> np.ndarray:
    """Decode one section into an array of ``dtype`` and ``shape`` (B, H, D).

    For ``raw`` the result is a read-only view of ``data`` (no copy). Raises CodecError if the
    data does not fit the shape, UnsupportedCodecError for an unknown or unavailable codec.
    """
    rec = codec_record(codec)
    dt = _as_dtype(dtype)
    if len(shape) != 3 or any(int(s) < 1 for s in shape):
        raise ValueError(f"shape must be three positive sizes, got {shape!r}")
    b, h, d = (int(s) for s in shape)
    return rec.decode(data, dt, (b, h, d))


def encode_sections(
    codec: str | int | Codec, layer: np.ndarray, block_tokens: int
) -> list[Buffer]:
    """Encode a layer's blocks in one call: ``layer`` is ``(n * block_tokens, H, D)``.

    Returns the n sections ``encode_section(codec, layer[i*B:(i+1)*B])`` would give, with the
    same errors (the first block that cannot be encoded raises). ``raw`` sections are
    zero-copy views; ``q8`` encodes every block in one compiled pass, which saves the fixed
    cost of a call per block.
    """
    rec = codec_record(codec)
    dt = _check_block(layer)
    t = layer.shape[0]
    if block_tokens < 1 or t % block_tokens:
        raise ValueError(f"a layer of {t} tokens is not made of blocks of {block_tokens}")
    return rec.encode_blocks(_c_order(layer, dt), t // block_tokens)


def decode_sections_into(
    codec: str | int | Codec, sections: Sequence[Buffer], out: np.ndarray
) -> None:
    """Decode a layer's blocks into the preallocated array ``out`` in one call.

    ``out`` is ``(n * B, H, D)`` in the descriptor dtype, for n = ``len(sections)``: section
    i is decoded into ``out[i*B:(i+1)*B]``, as ``decode_section`` would decode it. Raises
    as ``decode_section`` does for the first section refused (the blocks before it are
    written). ``q8`` decodes straight into ``out`` in one compiled pass when ``out`` is
    C-contiguous, e.g. a range of whole tokens of a C-contiguous ``(T, H, D)`` buffer.
    """
    rec = codec_record(codec)
    _check_block(out)
    t, h, d = out.shape
    n = len(sections)
    if min(t, h, d) < 1 or n < 1 or t % n:
        raise ValueError(f"cannot decode {n} sections into an array of shape {out.shape}")
    if not out.flags.writeable:
        raise ValueError("the output array is read-only")
    rec.decode_blocks(sections, out)


BlockDecoder = Callable[[Buffer, int], None]
"""Decodes one section into block ``i`` of the array it was made for."""


def block_decoder(codec: str | int | Codec, out: np.ndarray, block_tokens: int) -> BlockDecoder:
    """A :data:`BlockDecoder` into ``out``, ``(n * block_tokens, H, D)`` in a KVSP dtype:
    ``decoder(data, i)`` decodes one section into ``out[i*B:(i+1)*B]`` as
    :func:`decode_sections_into` would (the same errors for Data that does not fit), with
    the checks of ``out`` and the codec's lookups made once here instead of per section.
    ``raw`` into a C-contiguous little-endian ``out`` is one buffer copy; ``q8`` calls the
    compiled kernel with its arguments prepared."""
    rec = codec_record(codec)
    _check_block(out)
    t, h, d = out.shape
    if block_tokens < 1 or min(t, h, d) < 1 or t % block_tokens:
        raise ValueError(f"cannot decode blocks of {block_tokens} tokens into an array of "
                         f"shape {out.shape}")
    if not out.flags.writeable:
        raise ValueError("the output array is read-only")
    b = block_tokens
    whole = out.flags.c_contiguous and out.flags.aligned and out.dtype.byteorder != ">"
    if whole and rec.verbatim:
        size = b * h * d * out.dtype.itemsize
        target = out.reshape(-1).view(np.uint8).data  # a memoryview of out's bytes

        def raw_block(data: Buffer, i: int) -> None:
            if len(data) != size:
                raise CodecError(f"raw section is {len(data)} octets, expected {size}")
            target[i * size:(i + 1) * size] = data
        return raw_block
    kernel = _q8_kinds().get(out.dtype) if rec.name == "q8" and _q8_kernels is not None else None
    if whole and kernel is not None:
        kind, view = kernel
        flat = out.view(view)
        rows, decode = b * h, _q8_kernels.decode

        def q8_block(data: Buffer, i: int) -> None:
            if decode((data,), kind, rows, d, flat[i * b:(i + 1) * b]) >= 0:
                size, expected = len(data), rows * (2 + d)
                raise _q8_size_error(size, expected) if size != expected else \
                    CodecError(_Q8_MINUS_128)
        return q8_block
    decode_blocks = rec.decode_blocks

    def any_block(data: Buffer, i: int) -> None:
        decode_blocks((data,), out[i * b:(i + 1) * b])
    return any_block


BlockRunDecoder = Callable[[Sequence[Buffer], int], int]
"""Decodes sections into consecutive blocks ``first``, ``first + 1``, ... of the array it
was made for; returns -1, or the index of the first section it refused (its block and the
later ones are not written; the blocks before it are decoded)."""


def block_run_decoder(codec: str | int | Codec, out: np.ndarray,
                      block_tokens: int) -> BlockRunDecoder:
    """A :data:`BlockRunDecoder` into ``out``, with :func:`block_decoder`'s checks: a run of
    consecutive blocks (e.g. the objects of a layer that arrived together) decoded in one
    call. ``q8`` into a C-contiguous ``out`` is one call of the compiled kernel for the
    whole run (a section that does not fit, or holds -128, stops it there); any other
    codec decodes section by section as the :func:`block_decoder` would. A refused
    section's error is what the :func:`block_decoder` raises for it."""
    one = block_decoder(codec, out, block_tokens)
    rec = codec_record(codec)
    b = block_tokens
    _, h, d = out.shape
    kernel = _q8_kinds().get(out.dtype) if rec.name == "q8" and _q8_kernels is not None else None
    if kernel is not None and out.flags.c_contiguous and out.flags.aligned \
            and out.dtype.byteorder != ">":
        kind, view = kernel
        flat = out.view(view)
        rows, decode = b * h, _q8_kernels.decode

        def q8_run(sections: Sequence[Buffer], first: int) -> int:
            return decode(sections, kind, rows, d, flat[first * b:(first + len(sections)) * b])
        return q8_run

    def each(sections: Sequence[Buffer], first: int) -> int:
        for i, data in enumerate(sections):
            try:
                one(data, first + i)
            except ValueError:
                return i
        return -1
    return each


def decode_section_into(codec: str | int | Codec, data: Buffer, out: np.ndarray) -> None:
    """Decode one section into the preallocated ``(B, H, D)`` array ``out`` (see above)."""
    decode_sections_into(codec, (data,), out)


def _join_kv(rec: Codec, k: Buffer, v: Buffer) -> bytes:
    """Joint ``kv`` Data of two encoded sections."""
    if rec.verbatim:
        return b"".join((k, v))
    return b"".join((_U32.pack(len(k)), k, _U32.pack(len(v)), v))


def _split_kv(rec: Codec, mv: memoryview, k_raw_len: int) -> tuple[memoryview, memoryview]:
    """The K and V sections of joint ``kv`` Data (views); CodecError on bad framing."""
    if rec.verbatim:
        return mv[:k_raw_len], mv[k_raw_len:]
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
    return parts[0], parts[1]


def encode_kv(codec: str | int | Codec, k_block: np.ndarray, v_block: np.ndarray) -> bytes:
    """Joint ``kv`` Data: K section then V section; u32be length prefixes for q8 and zstd."""
    rec = codec_record(codec)
    return _join_kv(rec, encode_section(rec, k_block), encode_section(rec, v_block))


def decode_kv(
    codec: str | int | Codec,
    data: Buffer,
    dtype: np.dtype | type | str,
    k_shape: tuple[int, int, int],
    v_shape: tuple[int, int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Split and decode joint ``kv`` Data into (K, V)."""
    rec = codec_record(codec)
    dt = _as_dtype(dtype)
    mv = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    k, v = _split_kv(rec, mv, int(np.prod(k_shape)) * dt.itemsize)
    return decode_section(rec, k, dt, k_shape), decode_section(rec, v, dt, v_shape)


def layer_digest(k_raw: Buffer, v_raw: Buffer) -> bytes:
    """KVSP layer digest: SHA-256 of the raw K section followed by the raw V section."""
    h = hashlib.sha256(k_raw)
    h.update(v_raw)
    return h.digest()


def encode_component(
    component: Component, codec: str | int | Codec, k_block: np.ndarray, v_block: np.ndarray
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


def encode_component_sections(
    component: Component, codec: str | int | Codec, k_layer: np.ndarray, v_layer: np.ndarray,
    block_tokens: int,
) -> Sequence[Buffer]:
    """The Data of every ``component`` object of a layer, one per block, from the layer's
    K and V ``(n * block_tokens, H, D)``: :func:`encode_sections` (one compiled q8 pass per
    component), joined per block for ``kv``. Equal to :func:`encode_component` per block."""
    rec = codec_record(codec)
    if component is Component.K:
        return encode_sections(rec, k_layer, block_tokens)
    if component is Component.V:
        return encode_sections(rec, v_layer, block_tokens)
    if component is Component.KV:
        ks = encode_sections(rec, k_layer, block_tokens)
        vs = encode_sections(rec, v_layer, block_tokens)
        return [_join_kv(rec, k, v) for k, v in zip(ks, vs, strict=True)]
    raise TypeError(f"component must be a Component, got {component!r}")


def decode_component_into(
    component: Component, codec: str | int | Codec, data: Buffer, k_out: np.ndarray,
    v_out: np.ndarray,
) -> None:
    """Decode the Data of a ``component`` object of one block straight into the
    preallocated ``(B, H, D)`` arrays ``k_out`` / ``v_out`` (a ``k`` object writes only
    ``k_out``): no intermediate array for ``q8`` (:func:`decode_sections_into`). Raises as
    :func:`decode_component`; on an error the carried arrays may be partly written."""
    if component is Component.K:
        decode_section_into(codec, data, k_out)
    elif component is Component.V:
        decode_section_into(codec, data, v_out)
    elif component is Component.KV:
        rec = codec_record(codec)
        mv = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        k, v = _split_kv(rec, mv, k_out.nbytes)
        decode_section_into(rec, k, k_out)
        decode_section_into(rec, v, v_out)
    else:
        raise TypeError(f"component must be a Component, got {component!r}")


def decode_component(
    component: Component,
    codec: str | int | Codec,
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
