"""MOQT variable-length integers (vi64, digest 3.1).

The number of leading 1-bits of the first byte is the number of extra bytes (0..8). This is
not the QUIC varint. Encoders emit the minimal form; decoders accept non-minimal forms.
"""

from __future__ import annotations

from .buffer import NeedMore
from .types import MAX_VI64

__all__ = ["decode_vi64", "encode_vi64", "vi64_len"]

#: Total encoded length indexed by the first byte.
VI64_LEN: tuple[int, ...] = tuple(
    next((n + 1 for n in range(8) if not (b & (0x80 >> n))), 9) for b in range(256)
)
#: Value mask for an encoding of ``n`` total bytes (n in 1..8), applied to the n bytes.
VI64_MASK: tuple[int, ...] = tuple((1 << (7 * n)) - 1 if n else 0 for n in range(9))
#: Prefix bits OR-ed into the big-endian value for an encoding of ``n`` bytes (n in 1..8).
_PREFIX: tuple[int, ...] = tuple(
    ((0xFF << (8 - (n - 1))) & 0xFF) << (8 * (n - 1)) if n else 0 for n in range(9)
)
_SMALL: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(128))


def vi64_len(v: int) -> int:
    """Number of bytes of the minimal vi64 encoding of ``v``."""
    if v < 0x80:
        if v < 0:
            raise ValueError(f"vi64 out of range: {v}")
        return 1
    if v > MAX_VI64:
        raise ValueError(f"vi64 out of range: {v}")
    bits = v.bit_length()
    n = (bits + 6) // 7
    return 9 if n > 8 else n


def encode_vi64(v: int) -> bytes:
    """Encode ``v`` as a minimal vi64; ValueError if ``v`` < 0 or ``v`` >= 2**64."""
    if 0 <= v < 0x80:
        return _SMALL[v]
    if v < 0 or v > MAX_VI64:
        raise ValueError(f"vi64 out of range: {v}")
    if v < 0x4000:
        return (v | 0x8000).to_bytes(2, "big")
    n = (v.bit_length() + 6) // 7
    if n > 8:
        return b"\xff" + v.to_bytes(8, "big")
    return (v | _PREFIX[n]).to_bytes(n, "big")


def decode_vi64(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode a vi64 at ``pos``; return ``(value, new_pos)``.

    Accepts non-minimal encodings. Raises :class:`NeedMore` if ``buf`` ends early.
    """
    try:
        b = buf[pos]
    except IndexError:
        raise NeedMore from None
    if b < 0x80:
        return b, pos + 1
    n = VI64_LEN[b]
    end = pos + n
    if end > len(buf):
        raise NeedMore
    if n == 9:
        return int.from_bytes(buf[pos + 1 : end], "big"), end
    return int.from_bytes(buf[pos:end], "big") & VI64_MASK[n], end
