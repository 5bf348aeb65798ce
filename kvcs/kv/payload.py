"""The 68-octet KVCS object payload header (KVCS document, section "Object Payload").

Layout, all integers big-endian::

    magic "KVO1" (4) | version (1) | component (1) | flags (2) | layer (4) | block index (4)
    token start (8) | token count (4) | codec (2) | reserved (2) | data length (4)
    data digest SHA-256 (32) | data (data length)
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha256

from .codecs import Buffer, codec_value
from .component import Component
from .errors import DigestError, HeaderError

__all__ = [
    "HEADER_SIZE",
    "HEADER_STRUCT",
    "MAGIC",
    "VERSION",
    "PayloadHeader",
    "build_headers",
    "build_payload",
    "build_payload_bytes",
    "data_digest",
    "data_digests",
    "parse_header",
    "verify_payload",
]

MAGIC = b"KVO1"
VERSION = 1
HEADER_STRUCT = struct.Struct(">4sBBHIIQIHHI32s")
"""The header's layout: (magic, version, component, flags, layer, block index, token start,
token count, codec, reserved, data length, data digest); for a caller that reads many
headers in one loop (:meth:`~kvcs.kv.assembly.LayerAssembler.accept_run`)."""
#: Size of the payload header in octets.
HEADER_SIZE = HEADER_STRUCT.size
assert HEADER_SIZE == 68
_DIGEST_AT = HEADER_SIZE - 32  # the Data Digest is the header's last field

_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF


@dataclass(slots=True)
class PayloadHeader:
    """A parsed payload header; ``data`` is a memoryview slice of the payload (no copy).

    Not frozen (frozen dataclasses cost a microsecond per object on the hot path); treat it
    as read-only.
    """

    component: int
    flags: int
    layer: int
    block_index: int
    token_start: int
    token_count: int
    codec: int
    reserved: int
    data_length: int
    digest: bytes
    data: memoryview

    def header_bytes(self) -> bytes:
        """Re-encode the 68-octet header."""
        return HEADER_STRUCT.pack(
            MAGIC,
            VERSION,
            self.component,
            self.flags,
            self.layer,
            self.block_index,
            self.token_start,
            self.token_count,
            self.codec,
            self.reserved,
            self.data_length,
            self.digest,
        )


def _component_value(component: Component | str | int) -> int:
    try:
        if isinstance(component, str):
            return Component.from_token(component).field
        return Component.from_field(component).field
    except ValueError:
        raise ValueError(f"component {component!r} is not k/v/kv (1..3)") from None


def _check_uint(name: str, value: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ValueError(f"{name} = {value!r} is outside 0..{maximum}")


def build_payload(
    component: Component | str | int,
    layer: int,
    block_index: int,
    token_start: int,
    token_count: int,
    codec: str | int,
    data: Buffer,
) -> tuple[bytes, Buffer]:
    """Return ``(header, data)`` for an object payload; ``data`` is returned as given (no copy).

    Write the header and then the data to the stream; their concatenation is the payload.
    """
    comp = _component_value(component)
    codec_v = codec_value(codec) if isinstance(codec, str) else codec
    _check_uint("codec", codec_v, 0xFFFF)
    _check_uint("layer", layer, _U32_MAX)
    _check_uint("block_index", block_index, _U32_MAX)
    _check_uint("token_start", token_start, _U64_MAX)
    _check_uint("token_count", token_count, _U32_MAX)
    mv = memoryview(data)
    n = mv.nbytes
    _check_uint("data length", n, _U32_MAX)
    digest = hashlib.sha256(mv).digest()
    header = HEADER_STRUCT.pack(
        MAGIC, VERSION, comp, 0, layer, block_index, token_start, token_count, codec_v, 0, n, digest
    )
    return header, data


def data_digests(sections: Sequence[Buffer]) -> list[bytes]:
    """SHA-256 of each section: the Data Digests of the objects that carry them.

    Safe to call from a worker thread: hashlib releases the GIL while it hashes a buffer
    above 2 KiB, so a layer's digests can be computed off the event-loop thread (the
    sections must not change meanwhile)."""
    return [sha256(s).digest() for s in sections]


def build_headers(
    component: Component | str | int,
    layer: int,
    token_start: int,
    token_count: int,
    codec: str | int,
    sections: Sequence[Buffer],
    digests: Sequence[bytes],
) -> list[bytes]:
    """The 68-octet headers of the objects of one layer's blocks 0, 1, ...: block ``i``
    carries ``sections[i]``, whose SHA-256 is ``digests[i]`` (:func:`data_digests`), and
    starts at token ``token_start + i * token_count``. The checks of
    :func:`build_payload`, made once for the layer."""
    if len(digests) != len(sections):
        raise ValueError(f"{len(digests)} digests for {len(sections)} sections")
    comp = _component_value(component)
    codec_v = codec_value(codec) if isinstance(codec, str) else codec
    _check_uint("codec", codec_v, 0xFFFF)
    _check_uint("layer", layer, _U32_MAX)
    last = max(0, len(sections) - 1)
    _check_uint("block_index", last, _U32_MAX)
    _check_uint("token_start", token_start, _U64_MAX)
    _check_uint("token_count", token_count, _U32_MAX)
    _check_uint("token_start", token_start + last * token_count, _U64_MAX)
    sizes = [memoryview(data).nbytes for data in sections]
    if sizes:
        _check_uint("data length", max(sizes), _U32_MAX)
    for i, digest in enumerate(digests):
        if len(digest) != 32:
            raise ValueError(f"digest of block {i} is {len(digest)} octets, not 32")
    pack = HEADER_STRUCT.pack
    return [pack(MAGIC, VERSION, comp, 0, layer, i, token_start + i * token_count, token_count,
                 codec_v, 0, n, digest)
            for i, (n, digest) in enumerate(zip(sizes, digests, strict=True))]


def build_payload_bytes(
    component: Component | str | int,
    layer: int,
    block_index: int,
    token_start: int,
    token_count: int,
    codec: str | int,
    data: Buffer,
) -> bytes:
    """Like :func:`build_payload` but return the joined payload."""
    header, body = build_payload(
        component, layer, block_index, token_start, token_count, codec, data
    )
    return b"".join((header, body))


def _parse(mv: memoryview) -> PayloadHeader:
    if len(mv) < HEADER_SIZE:
        raise HeaderError(f"payload is {len(mv)} octets, shorter than the 68-octet header")
    (magic, version, comp, flags, layer, block, tstart, tcount, codec, reserved, dlen, digest) = (
        HEADER_STRUCT.unpack_from(mv)
    )
    if magic != MAGIC:
        raise HeaderError(f"bad magic {magic!r}")
    if version != VERSION:
        raise HeaderError(f"unsupported payload version {version}")
    if not 1 <= comp <= 3:
        raise HeaderError(f"bad component {comp}")
    if HEADER_SIZE + dlen != len(mv):
        raise HeaderError(
            f"header + data length = {HEADER_SIZE + dlen} octets, payload is {len(mv)}"
        )
    return PayloadHeader(
        comp, flags, layer, block, tstart, tcount, codec, reserved, dlen, digest, mv[HEADER_SIZE:]
    )


def data_digest(payload: Buffer) -> bytes:
    """The Data Digest field of a payload, or of its 68-octet header alone: the value a
    manifest lists in ``object_digests``. Reads the field only; received objects are
    checked with :func:`verify_payload`."""
    mv = memoryview(payload).cast("B")
    if len(mv) < HEADER_SIZE:
        raise HeaderError(f"payload is {len(mv)} octets, shorter than the 68-octet header")
    return bytes(mv[_DIGEST_AT:HEADER_SIZE])


def parse_header(payload: Buffer) -> PayloadHeader:
    """Parse and check the header structure (magic, version, component, length) only.

    Does not check the Location or the digest; use :func:`verify_payload` for received objects.
    """
    mv = payload if type(payload) is memoryview else memoryview(payload)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return _parse(mv)


def verify_payload(
    payload: Buffer,
    *,
    group: int,
    object_id: int,
    expected_digest: bytes | None = None,
    data_sha256: bytes | None = None,
) -> PayloadHeader:
    """Verify a received object payload at Location (``group``, ``object_id``).

    Checks magic, version, component (1..3), Layer == group, Block Index == object_id,
    68 + Data Length == payload length, SHA-256 of Data == Data Digest, and, when given,
    Data Digest == ``expected_digest`` (e.g. from a signed manifest). Raises HeaderError or
    DigestError; the caller discards the object and treats it as missing.
    ``data_sha256``: the SHA-256 of the payload's octets after the header, computed
    beforehand (:func:`data_digests`, e.g. in a worker thread); None: hashed here.
    """
    mv = payload if type(payload) is memoryview else memoryview(payload)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    hdr = _parse(mv)
    if hdr.layer != group:
        raise HeaderError(f"layer {hdr.layer} does not match group {group}")
    if hdr.block_index != object_id:
        raise HeaderError(f"block index {hdr.block_index} does not match object {object_id}")
    computed = sha256(hdr.data).digest() if data_sha256 is None else data_sha256
    if computed != hdr.digest:
        raise DigestError("data digest does not match the data")
    if expected_digest is not None and expected_digest != hdr.digest:
        raise DigestError("data digest differs from the expected (manifest) digest")
    return hdr
