"""Authorization by ("kvcs-1", ScopeID) prefix; anonymous mode off unless asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcs.auth import PUBLISH, SUBSCRIBE, AuthError
from kvcs.endpoint import MoqtRequestError
from kvcs.moqt.errors import RequestErrorCode, SessionCode
from kvcs.moqt.wire import AuthToken, LocationFilter, Parameters
from kvcs.relay import Authorizer, ConfigError, RelayConfig

from .conftest import Env, publish_group

SCOPE_X = bytes.fromhex("6d1c6481cd428737da312c089db3832a")
SCOPE_Y = bytes.fromhex("00112233445566778899aabbccddeeff")
NS_X = (b"kvcs-1", SCOPE_X, b"\x01" * 32, b"\x02" * 32, b"\x03" * 16)
NS_Y = (b"kvcs-1", SCOPE_Y, b"\x01" * 32, b"\x02" * 32, b"\x03" * 16)


def write_auth(tmp: Path) -> str:
    path = tmp / "auth.json"
    path.write_text(json.dumps({"tokens": [
        {"token": "tok-x", "publish": [["kvcs-1", "hex:" + SCOPE_X.hex()]],
         "subscribe": ["kvcs-1/hex:" + SCOPE_X.hex()]},
        {"token": "hex:" + (b"tok-y").hex(), "publish": [["kvcs-1", "hex:" + SCOPE_Y.hex()]],
         "subscribe": [["kvcs-1", "hex:" + SCOPE_Y.hex()]]},
        {"token": "reader-x", "subscribe": [["kvcs-1", "hex:" + SCOPE_X.hex()]]},
    ]}))
    return str(path)


def test_auth_file_parsing(tmp_path: Path) -> None:
    auth = Authorizer.from_file(write_auth(tmp_path))
    assert auth.allowed([b"tok-x"], PUBLISH, NS_X)
    assert auth.allowed([b"tok-y"], SUBSCRIBE, NS_Y)
    assert not auth.allowed([b"tok-x"], PUBLISH, NS_Y)
    assert not auth.allowed([b"reader-x"], PUBLISH, NS_X)
    assert auth.allowed([b"reader-x"], SUBSCRIBE, NS_X)
    assert not auth.allowed([], SUBSCRIBE, NS_X)
    # field-wise prefix match: the scope field must match whole
    assert not auth.allowed([b"tok-x"], SUBSCRIBE, (b"kvcs-1", SCOPE_X + b"\x00"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"tokens": [{"token": "a", "publish": [["hex:zz"]]}]}')
    with pytest.raises(AuthError, match="bad hex"):
        Authorizer.from_file(str(bad))


def test_anonymous_is_off_by_default() -> None:
    with pytest.raises(ConfigError, match="refusing to start"):
        RelayConfig().validate()
    assert not Authorizer().allowed([b"anything"], SUBSCRIBE, NS_X)


async def test_scope_x_token_cannot_touch_scope_y(env: Env, tmp_path: Path) -> None:
    relay = await env.relay(auth=write_auth(tmp_path))
    px = await env.client(relay, b"tok-x")
    await px.announce(NS_X)
    tx = px.create_track(NS_X, b"k.raw.s0")
    publish_group(px, tx, 0, 3)
    py = await env.client(relay, b"tok-y")
    await py.announce(NS_Y)
    ty = py.create_track(NS_Y, b"k.raw.s0")
    publish_group(py, ty, 0, 3)

    async def refused(coro) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(MoqtRequestError) as info:
            await coro
        assert info.value.code == RequestErrorCode.UNAUTHORIZED

    x = await env.client(relay, b"tok-x")
    await refused(x.announce(NS_Y))  # publish
    await refused(x.subscribe_namespace((b"kvcs-1", SCOPE_Y)))  # discover
    await refused(x.subscribe_namespace((b"kvcs-1",)))  # broader than the grant
    await refused(x.subscribe(NS_Y, b"k.raw.s0"))  # subscribe
    await refused(x.fetch(NS_Y, b"k.raw.s0", location_filter=LocationFilter.none()))
    await refused(x.track_status(NS_Y, b"k.raw.s0"))
    # its own scope works
    watch = await x.subscribe_namespace((b"kvcs-1", SCOPE_X))
    assert await watch.next(2) == (True, NS_X)
    res = await x.fetch(NS_X, b"k.raw.s0", location_filter=LocationFilter.none())
    assert len(await res.collect(timeout=5)) == 3
    # a read-only token cannot publish; no token at all gets nothing
    r = await env.client(relay, b"reader-x")
    await refused(r.announce(NS_X))
    anon = await env.client(relay)
    await refused(anon.subscribe(NS_X, b"k.raw.s0"))
    # a token in the request parameters (not SETUP) works too
    await anon.subscribe(NS_Y, b"k.raw.s0", params=Parameters(
        auth_tokens=(AuthToken(3, token_type=0, value=b"tok-y"),)))
    assert relay.metrics.get("kvcs_relay_requests_total", type="subscribe",
                             result="unauthorized") >= 2


async def test_token_alias_is_rejected(env: Env, tmp_path: Path) -> None:
    relay = await env.relay(auth=write_auth(tmp_path))
    c = await env.client(relay)
    other = await env.client(relay, b"tok-x")
    c.session.subscribe(NS_X, b"t", Parameters(auth_tokens=(AuthToken(2, alias=7),)))
    c.flush()
    code, _ = await c.wait_closed()
    assert code == SessionCode.UNKNOWN_AUTH_TOKEN_ALIAS
    await other.subscribe_namespace((b"kvcs-1", SCOPE_X))  # others are unaffected
