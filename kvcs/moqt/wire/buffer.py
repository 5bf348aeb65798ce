"""Bounded, zero-copy reader over a length-framed body.

:class:`Reader` is used for bodies whose full length is already known (control messages,
parameter values, datagrams); running out of bytes there is a PROTOCOL_VIOLATION, never an
IndexError. :class:`NeedMore` is the internal signal of incremental parsers that a
structure is not complete yet.
"""

from __future__ import annotations

from ..errors import ProtocolError, SessionCode, violation
from .types import Location

__all__ = ["ByteBudget", "NeedMore", "Reader"]


class NeedMore(Exception):
    """Internal: not enough bytes buffered yet to finish the current structure."""


class ByteBudget:
    """How many bytes of state a session lets its peer make it hold: parts of the session
    :meth:`take` before they keep something and :meth:`give` back when they let go.
    Accounting only; nothing is allocated here."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        """Charge ``n`` bytes; False (nothing charged) if that would exceed the limit."""
        used = self.used + n
        if used > self.limit:
            return False
        self.used = used
        return True

    def force(self, n: int) -> None:
        """Charge ``n`` bytes even over the limit (state already held; the caller reacts
        to :attr:`over`)."""
        self.used += n

    def give(self, n: int) -> None:
        """Release ``n`` bytes charged earlier."""
        self.used -= n

    @property
    def over(self) -> bool:
        """True while more is charged than the limit allows."""
        return self.used > self.limit


# Local copies to avoid an import cycle with vi64.py (which imports NeedMore from here).
_VI64_LEN: tuple[int, ...] = tuple(
    next((n + 1 for n in range(8) if not (b & (0x80 >> n))), 9) for b in range(256)
)
_VI64_MASK: tuple[int, ...] = tuple((1 << (7 * n)) - 1 if n else 0 for n in range(9))


class Reader:
    """Cursor over a memoryview, bounded by ``end``.

    Truncation raises ``ProtocolError(code)`` (PROTOCOL_VIOLATION unless another ``code``
    is given, e.g. KEY_VALUE_FORMATTING_ERROR for self-describing values).
    """

    __slots__ = ("buf", "code", "end", "pos")

    def __init__(
        self,
        buf: bytes | bytearray | memoryview,
        pos: int = 0,
        end: int | None = None,
        code: int = SessionCode.PROTOCOL_VIOLATION,
    ) -> None:
        mv = buf if isinstance(buf, memoryview) else memoryview(buf)
        if mv.ndim != 1 or mv.itemsize != 1 or mv.format != "B":
            mv = mv.cast("B")
        self.buf = mv
        self.pos = pos
        self.end = len(mv) if end is None else end
        self.code = int(code)

    def _short(self, what: str) -> ProtocolError:
        return ProtocolError(self.code, f"truncated {what}")

    @property
    def remaining(self) -> int:
        """Bytes left before ``end``."""
        return self.end - self.pos

    @property
    def at_end(self) -> bool:
        """True when every byte up to ``end`` has been consumed."""
        return self.pos >= self.end

    def vi64(self) -> int:
        """Read one vi64 (non-minimal encodings accepted)."""
        pos = self.pos
        if pos >= self.end:
            raise self._short("vi64")
        buf = self.buf
        b = buf[pos]
        if b < 0x80:
            self.pos = pos + 1
            return b
        n = _VI64_LEN[b]
        end = pos + n
        if end > self.end:
            raise self._short("vi64")
        self.pos = end
        if n == 9:
            return int.from_bytes(buf[pos + 1 : end], "big")
        return int.from_bytes(buf[pos:end], "big") & _VI64_MASK[n]

    def u8(self) -> int:
        """Read one unsigned byte."""
        pos = self.pos
        if pos >= self.end:
            raise self._short("uint8")
        self.pos = pos + 1
        return self.buf[pos]

    def u16(self) -> int:
        """Read a 16-bit big-endian unsigned integer."""
        pos = self.pos
        if pos + 2 > self.end:
            raise self._short("uint16")
        self.pos = pos + 2
        return (self.buf[pos] << 8) | self.buf[pos + 1]

    def bytes(self, n: int) -> memoryview:
        """Return the next ``n`` bytes as a zero-copy memoryview slice."""
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise self._short("bytes")
        self.pos = pos + n
        return self.buf[pos : pos + n]

    def rest(self) -> memoryview:
        """Return everything up to ``end`` (zero-copy) and consume it."""
        pos = self.pos
        self.pos = self.end
        return self.buf[pos : self.end]

    def sub(self, n: int, code: int | None = None) -> Reader:
        """Consume ``n`` bytes and return a Reader bounded to them."""
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise self._short("length-prefixed value")
        self.pos = pos + n
        return Reader(self.buf, pos, pos + n, self.code if code is None else code)

    def location(self) -> Location:
        """Read a Location (two bare vi64: group, object)."""
        g = self.vi64()
        return Location(g, self.vi64())

    def expect_end(self, what: str) -> None:
        """Raise PROTOCOL_VIOLATION unless the reader is exactly at its end."""
        if self.pos != self.end:
            raise violation(f"{self.end - self.pos} trailing bytes after {what}")
