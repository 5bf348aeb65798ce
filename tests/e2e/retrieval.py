"""Retrieval that is expected to fall short: the layers obtained before RecomputeRequired."""

from __future__ import annotations

from collections.abc import AsyncIterator

from kvcs.kv.assembly import KvLayer
from kvcs.kvnet.consumer import RecomputeRequired


async def layers_until_recompute(
        layers: AsyncIterator[KvLayer]) -> tuple[list[KvLayer], RecomputeRequired]:
    """The layers ``layers`` yields before it raises RecomputeRequired, and that error;
    AssertionError if it ends without it."""
    got: list[KvLayer] = []
    try:
        async for layer in layers:
            got.append(layer)
    except RecomputeRequired as exc:
        return got, exc
    raise AssertionError(f"no RecomputeRequired: all {len(got)} layers arrived")
