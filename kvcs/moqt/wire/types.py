"""Basic MOQT value types: Location, Track Namespace / Name rules, status and order enums."""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

from ..errors import violation

# ``Namespace`` (the tuple type) is not in __all__: the package re-exports it as
# ``TrackNamespace`` (messages), and its ``Namespace`` is the NAMESPACE message.
__all__ = [
    "MAX_NAMESPACE_FIELDS",
    "MAX_NAME_BYTES",
    "MAX_VI64",
    "GroupOrder",
    "Location",
    "ObjectStatus",
    "namespace_has_prefix",
    "render_full_name",
    "validate_full_name",
    "validate_namespace",
]

MAX_VI64 = (1 << 64) - 1
MAX_NAMESPACE_FIELDS = 32
MAX_NAME_BYTES = 4096

Namespace = tuple[bytes, ...]


class Location(NamedTuple):
    """A (group, object) position; tuple ordering equals MOQT Location ordering."""

    group: int
    object: int


class ObjectStatus(IntEnum):
    """Object Status values (digest 7.4)."""

    NORMAL = 0x0
    END_OF_GROUP = 0x3
    END_OF_TRACK = 0x4


VALID_STATUSES = frozenset((0, 3, 4))


class GroupOrder(IntEnum):
    """GROUP_ORDER / DEFAULT_PUBLISHER_GROUP_ORDER values."""

    ASCENDING = 1
    DESCENDING = 2


def validate_namespace(ns: Namespace) -> int:
    """Check the digest 3.6 namespace limits; return the sum of field lengths.

    Raises PROTOCOL_VIOLATION for >32 fields, an empty field or >4096 bytes in total.
    """
    if len(ns) > MAX_NAMESPACE_FIELDS:
        raise violation(f"namespace has {len(ns)} fields (max 32)")
    total = 0
    for f in ns:
        if not f:
            raise violation("empty namespace field")
        total += len(f)
    if total > MAX_NAME_BYTES:
        raise violation(f"namespace is {total} bytes (max 4096)")
    return total


def validate_full_name(ns: Namespace, name: bytes) -> None:
    """Check the namespace limits plus namespace bytes + name bytes <= 4096."""
    total = validate_namespace(ns) + len(name)
    if total > MAX_NAME_BYTES:
        raise violation(f"full track name is {total} bytes (max 4096)")


def namespace_has_prefix(ns: Namespace, prefix: Namespace) -> bool:
    """True if ``prefix``'s fields equal the first fields of ``ns`` (field-wise match)."""
    n = len(prefix)
    return len(ns) >= n and tuple(ns[:n]) == tuple(prefix)


_LITERAL = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_RENDER = tuple(chr(b) if b in _LITERAL else f".{b:02x}" for b in range(256))


def _render(field: bytes) -> str:
    return "".join([_RENDER[b] for b in field])


def render_full_name(ns: Namespace, name: bytes) -> str:
    """Canonical human-readable form (digest 3.6): ``f1-f2--name`` with ``.xx`` escapes."""
    return "-".join(_render(f) for f in ns) + "--" + _render(name)
