"""The relay's log says what happened in one short line at the right level: a discovery
probe for a namespace nobody published (DOES_NOT_EXIST) is not an info line per fetch, and
binary namespace fields are shortened."""

from __future__ import annotations

import logging

import pytest

from kvcs.auth import render_namespace
from kvcs.endpoint import MoqtRequestError

from .conftest import Env


def test_binary_fields_are_shortened() -> None:
    ns = (b"kvcs-1", bytes(range(16)), bytes(32), b"\xff" * 32, bytes(16))
    short = render_namespace(ns)
    assert short == "kvcs-1/hex:00010203../hex:00000000../hex:ffffffff../hex:00000000.."
    assert len(render_namespace(ns, short=False)) > 200 > 4 * len(short) // 3


async def test_a_miss_is_logged_at_debug(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    relay = await env.relay()
    ep = await env.client(relay)
    caplog.set_level(logging.DEBUG, logger="kvcs.relay")
    with pytest.raises(MoqtRequestError, match="DOES_NOT_EXIST"):
        await ep.subscribe((b"kvcs-1", bytes(16)), b"manifest")
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert refusals and all(r.levelno == logging.DEBUG for r in refusals)
    assert all(len(r.getMessage()) < 160 for r in caplog.records if r.name.startswith("kvcs"))
