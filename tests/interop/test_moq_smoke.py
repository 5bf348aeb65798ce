"""Smoke test: moq-ffi publisher -> moq.Server (relay) -> moq-ffi subscriber on loopback.

Two moq-ffi peers negotiate moq-lite, not MOQT draft 22; this only checks that the
helpers and the moq-dev/moq stack work here. Later interop tests put kvcs in the middle.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("moq")

from moq_helpers import FfiServer, collect_track, make_groups, publish_track

pytestmark = pytest.mark.interop

GROUPS = 80
OBJECTS = 64
BIG = (40, 10)  # (group, object) carrying a 1 MiB payload


async def test_ffi_pub_sub_through_ffi_relay() -> None:
    groups = make_groups(
        GROUPS, OBJECTS, size=lambda g, o: 64 + (g * 31 + o * 7) % 1500, overrides={BIG: 1 << 20}
    )
    assert len(groups[BIG[0]][BIG[1]]) == 1 << 20

    async with FfiServer() as server:
        done = asyncio.Event()
        sub = asyncio.create_task(
            collect_track(server.quic_url, "interop/smoke", "kv", expected_groups=GROUPS, done=done)
        )
        await publish_track(server.quic_url, "interop/smoke", "kv", groups, release=done)
        received = await sub

    assert [g.sequence for g in received] == list(range(GROUPS))
    for g in received:
        assert len(g.objects) == OBJECTS, f"group {g.sequence}"
        assert g.objects == groups[g.sequence], f"group {g.sequence} payload mismatch"
