"""KVSP container: one block, all layers (profile section 7).

::

    magic "KVSP" (4) | version 1 (1) | flags 0 (1) | codec (2) | compat_id (32) | block_key (32)
    token_start (8) | token_count (4) | layers (4)
    per layer: k_len (4) | v_len (4) | layer digest (32) | K section | V section

All integers big-endian. The layer digest is SHA-256 of the *raw* K and V sections, so a
reader can check it directly for ``raw``, after decoding for ``zstd`` (which needs the
Compatibility Descriptor for element size and shapes), and not at all for the lossy ``q8``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .codecs import (
    Buffer,
    codec_record,
    codec_value,
    decode_section,
    encode_section,
    layer_digest,
    raw_section,
)
from .errors import CodecError, ContainerError, UnsupportedCodecError
from .ids import CompatDescriptor

__all__ = [
    "CONTAINER_MAGIC",
    "Container",
    "ContainerLayer",
    "build_container",
    "decode_container",
    "max_container_size",
    "read_container",
    "write_container",
]

CONTAINER_MAGIC = b"KVSP"
_VERSION = 1
_HEAD = struct.Struct(">4sBBH32s32sQII")
_LAYER = struct.Struct(">II32s")


@dataclass
class ContainerLayer:
    """One layer: encoded K and V sections and the raw layer digest."""

    k: Buffer = field(repr=False)
    v: Buffer = field(repr=False)
    digest: bytes


@dataclass
class Container:
    """A parsed or to-be-written KVSP container."""

    codec: int
    compat_id: bytes
    block_key: bytes
    token_start: int
    token_count: int
    layers: list[ContainerLayer]
    flags: int = 0


def write_container(c: Container) -> bytes:
    """Serialize a container (lengths are taken from the sections)."""
    if len(c.compat_id) != 32 or len(c.block_key) != 32:
        raise ValueError("compat_id and block_key are 32 octets each")
    parts: list[Any] = [
        _HEAD.pack(
            CONTAINER_MAGIC,
            _VERSION,
            0,
            codec_value(c.codec),
            c.compat_id,
            c.block_key,
            c.token_start,
            c.token_count,
            len(c.layers),
        )
    ]
    for layer in c.layers:
        if len(layer.digest) != 32:
            raise ValueError("a layer digest is 32 octets")
        k, v = memoryview(layer.k).cast("B"), memoryview(layer.v).cast("B")
        parts += [_LAYER.pack(len(k), len(v), layer.digest), k, v]
    return b"".join(parts)


def build_container(
    desc: CompatDescriptor,
    codec: str | int,
    block_key: bytes,
    token_start: int,
    k_layers: Sequence[np.ndarray],
    v_layers: Sequence[np.ndarray],
) -> bytes:
    """Encode one block (per-layer K and V arrays of shape (B, H, D)) as a container."""
    if len(k_layers) != desc.layers or len(v_layers) != desc.layers:
        raise ValueError(f"need {desc.layers} K and V layers")
    value = codec_value(codec)
    layers = []
    for k, v in zip(k_layers, v_layers, strict=True):
        if k.shape != desc.k_shape() or v.shape != desc.v_shape():
            raise ValueError(f"layer shapes {k.shape}/{v.shape} do not match the descriptor")
        k = np.asarray(k, dtype=desc.dtype)
        v = np.asarray(v, dtype=desc.dtype)
        digest = layer_digest(raw_section(k), raw_section(v))
        layers.append(ContainerLayer(encode_section(value, k), encode_section(value, v), digest))
    return write_container(
        Container(value, desc.compat_id, block_key, token_start, desc.block_tokens, layers)
    )


def max_container_size(desc: CompatDescriptor) -> int:
    """The most octets a container of one block of ``desc`` can take: the ``raw`` size, plus
    the worst-case expansion of ``zstd`` (a reader refuses larger responses)."""
    sections = int(np.prod(desc.k_shape())) + int(np.prod(desc.v_shape()))
    raw = _HEAD.size + desc.layers * (_LAYER.size + desc.dtype.itemsize * sections)
    return raw + raw // 64 + 4096


def read_container(
    data: Buffer,
    *,
    descriptor: CompatDescriptor | None = None,
    expected_block_key: bytes | None = None,
    accept_unverified_q8: bool = False,
) -> Container:
    """Parse and verify a container; raises ContainerError on any mismatch.

    Checks magic, version, every length against the remaining bytes, no trailing bytes, and
    every layer digest. With ``descriptor`` also CompatID, token count, layer count and the
    section sizes. ``zstd`` needs ``descriptor`` to check digests. ``q8`` layer digests cannot
    be checked (lossy); such containers are rejected unless ``accept_unverified_q8``.
    """
    mv = memoryview(data).cast("B")
    if len(mv) < _HEAD.size:
        raise ContainerError(f"container is {len(mv)} octets, shorter than its header")
    magic, version, flags, codec, cid, bkey, tstart, tcount, n_layers = _HEAD.unpack_from(mv)
    if magic != CONTAINER_MAGIC:
        raise ContainerError(f"bad container magic {magic!r}")
    if version != _VERSION:
        raise ContainerError(f"unsupported container version {version}")
    try:
        rec = codec_record(codec)
    except UnsupportedCodecError as exc:
        raise ContainerError(str(exc)) from None
    if expected_block_key is not None and bkey != expected_block_key:
        raise ContainerError("container block key differs from the requested one")
    if descriptor is not None:
        if cid != descriptor.compat_id:
            raise ContainerError("container Compatibility ID differs from the descriptor")
        if tcount != descriptor.block_tokens:
            raise ContainerError(f"token count {tcount} != block_tokens {descriptor.block_tokens}")
        if n_layers != descriptor.layers:
            raise ContainerError(f"container has {n_layers} layers, expected {descriptor.layers}")
    if not rec.lossless and not accept_unverified_q8:
        raise ContainerError(
            f"{rec.name} container layer digests cannot be verified (lossy codec)")
    if rec.lossless and not rec.verbatim and descriptor is None:
        raise ContainerError(
            f"verifying a {rec.name} container needs the Compatibility Descriptor")
    off = _HEAD.size
    if n_layers * _LAYER.size > len(mv) - off:
        raise ContainerError(f"container too short for {n_layers} layers")
    layers: list[ContainerLayer] = []
    for i in range(n_layers):
        if len(mv) - off < _LAYER.size:
            raise ContainerError(f"layer {i}: truncated layer header")
        k_len, v_len, digest = _LAYER.unpack_from(mv, off)
        off += _LAYER.size
        if k_len + v_len > len(mv) - off:
            raise ContainerError(f"layer {i}: section lengths exceed the container")
        k, v = mv[off : off + k_len], mv[off + k_len : off + k_len + v_len]
        off += k_len + v_len
        if rec.verbatim:
            if descriptor is not None:
                _check_raw_len(descriptor, i, k_len, v_len)
            actual = layer_digest(k, v)
        elif rec.lossless:
            assert descriptor is not None
            try:
                kd = decode_section(rec, k, descriptor.dtype, descriptor.k_shape())
                vd = decode_section(rec, v, descriptor.dtype, descriptor.v_shape())
            except CodecError as exc:
                raise ContainerError(f"layer {i}: {exc}") from None
            actual = layer_digest(raw_section(kd), raw_section(vd))
        else:
            actual = digest
        if actual != digest:
            raise ContainerError(f"layer {i}: layer digest mismatch")
        layers.append(ContainerLayer(k, v, digest))
    if off != len(mv):
        raise ContainerError(f"container has {len(mv) - off} trailing octets")
    return Container(rec.value, cid, bkey, tstart, tcount, layers, flags)


def _check_raw_len(desc: CompatDescriptor, i: int, k_len: int, v_len: int) -> None:
    want_k, want_v = desc.raw_bytes()
    if (k_len, v_len) != (want_k, want_v):
        raise ContainerError(f"layer {i}: raw sections {k_len}/{v_len}, expected {want_k}/{want_v}")


def decode_container(
    c: Container, desc: CompatDescriptor
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Decode every layer of a verified container into (K arrays, V arrays)."""
    try:
        ks = [decode_section(c.codec, layer.k, desc.dtype, desc.k_shape()) for layer in c.layers]
        vs = [decode_section(c.codec, layer.v, desc.dtype, desc.v_shape()) for layer in c.layers]
    except CodecError as exc:
        raise ContainerError(str(exc)) from None
    return ks, vs
