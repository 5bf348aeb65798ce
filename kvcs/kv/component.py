"""Component kinds of KVCS data: the K tensor, the V tensor, or both jointly encoded.

One kind names a data track (``k.raw.s0``, ``v.raw.s0``, ``kv.zstd.s0``; KVCS document,
"Track Names") and fills the Component field of every object payload header (k = 1, v = 2,
kv = 3; "Object Payload").
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Component"]


class Component(StrEnum):
    """A component kind. Its value is the track-name token, so ``Component.K == "k"``;
    :attr:`field` is the value of the payload header's Component field."""

    K = "k"
    V = "v"
    KV = "kv"

    @classmethod
    def from_token(cls, token: str) -> Component:
        """The kind a track-name token names (``"k"``, ``"v"``, ``"kv"``); ValueError
        otherwise."""
        kind = _BY_TOKEN.get(token) if isinstance(token, str) else None
        if kind is None:
            raise ValueError(f"component {token!r} is not one of k, v, kv")
        return kind

    @classmethod
    def from_field(cls, value: int) -> Component:
        """The kind of a payload Component field value (1..3); ValueError otherwise."""
        kind = _BY_FIELD.get(value) if type(value) is int else None
        if kind is None:
            raise ValueError(f"component field {value!r} is not 1 (k), 2 (v) or 3 (kv)")
        return kind

    @property
    def field(self) -> int:
        """Value of the payload header's Component field (k = 1, v = 2, kv = 3)."""
        return _FIELDS[self]

    @property
    def carries_k(self) -> bool:
        """True for ``k`` and ``kv``."""
        return self is not Component.V

    @property
    def carries_v(self) -> bool:
        """True for ``v`` and ``kv``."""
        return self is not Component.K


_FIELDS: dict[Component, int] = {Component.K: 1, Component.V: 2, Component.KV: 3}
_BY_TOKEN: dict[str, Component] = {kind.value: kind for kind in Component}
_BY_FIELD: dict[int, Component] = {field: kind for kind, field in _FIELDS.items()}
