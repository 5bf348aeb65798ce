"""KVCS Track Names (ABNF of the KVCS document, section "Track Names").

::

    track-name = "manifest" / "manifest.cose" / data-track
    data-track = component "." codec-name "." "s" segment
    component  = "k" / "v" / "kv"
    codec-name = 1*32( %x61-7A / DIGIT / "-" )
    segment    = "0" / ( %x31-39 *DIGIT )
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .component import Component

__all__ = [
    "MANIFEST",
    "MANIFEST_COSE",
    "Component",
    "TrackName",
]

MANIFEST = "manifest"
MANIFEST_COSE = "manifest.cose"

_DATA_RE = re.compile(r"(k|v|kv)\.([a-z0-9-]{1,32})\.s(0|[1-9][0-9]*)")
_CODEC_RE = re.compile(r"[a-z0-9-]{1,32}")


@dataclass(frozen=True)
class TrackName:
    """A parsed KVCS track name.

    For the manifest tracks ``kind`` is ``"manifest"`` or ``"manifest.cose"`` and the other
    fields are None; for data tracks ``kind`` is ``"data"`` and ``component`` a
    :class:`Component` (equal to its token, e.g. ``"k"``).
    """

    kind: str
    component: Component | None = None
    codec: str | None = None
    segment: int | None = None

    @classmethod
    def data(cls, component: Component | str, codec: str, segment: int) -> TrackName:
        """Build and validate a data-track name."""
        kind = Component.from_token(component)
        if not isinstance(codec, str) or not _CODEC_RE.fullmatch(codec):
            raise ValueError(f"codec name {codec!r} is not 1-32 of [a-z0-9-]")
        if isinstance(segment, bool) or not isinstance(segment, int) or segment < 0:
            raise ValueError(f"segment {segment!r} is not a non-negative integer")
        return cls("data", kind, codec, segment)

    @classmethod
    def manifest(cls, *, cose: bool = False) -> TrackName:
        """The manifest track name (``manifest`` or ``manifest.cose``)."""
        return cls(MANIFEST_COSE if cose else MANIFEST)

    @classmethod
    def parse(cls, name: bytes | bytearray | memoryview | str) -> TrackName:
        """Parse a track name; raises ValueError with the reason if it does not match."""
        if isinstance(name, bytes | bytearray | memoryview):
            try:
                text = bytes(name).decode("ascii")
            except UnicodeDecodeError:
                raise ValueError("track name is not ASCII") from None
        elif isinstance(name, str):
            text = name
        else:
            raise ValueError(f"track name must be bytes or str, got {type(name).__name__}")
        if text in (MANIFEST, MANIFEST_COSE):
            return cls(text)
        m = _DATA_RE.fullmatch(text)
        if m is None:
            raise ValueError(f"track name {text!r}: {_reason(text)}")
        return cls("data", Component(m.group(1)), m.group(2), int(m.group(3)))

    @property
    def is_manifest(self) -> bool:
        """True for ``manifest`` and ``manifest.cose``."""
        return self.kind != "data"

    @property
    def component_value(self) -> int:
        """Component field value (k=1, v=2, kv=3); ValueError for manifest tracks."""
        if self.component is None:
            raise ValueError("manifest tracks have no component")
        return self.component.field

    def format(self) -> str:
        """The track name as text."""
        if self.kind != "data":
            return self.kind
        return f"{self.component}.{self.codec}.s{self.segment}"

    def to_bytes(self) -> bytes:
        """The track name as ASCII octets (the MOQT Track Name)."""
        return self.format().encode("ascii")

    def __str__(self) -> str:
        return self.format()


def _reason(text: str) -> str:
    parts = text.split(".")
    if len(parts) != 3:
        return "expected 'manifest', 'manifest.cose' or component.codec.sN"
    comp, codec, seg = parts
    try:
        Component.from_token(comp)
    except ValueError:
        return f"component {comp!r} is not one of k, v, kv"
    if not _CODEC_RE.fullmatch(codec):
        return f"codec name {codec!r} is not 1-32 of [a-z0-9-]"
    if not seg.startswith("s"):
        return "segment must start with 's'"
    digits = seg[1:]
    if not digits or not digits.isascii() or not digits.isdigit():
        return f"segment {digits!r} is not a decimal number"
    return f"segment {digits!r} has a leading zero"
