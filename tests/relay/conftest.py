"""Fixtures for relay tests: a dev certificate, relay factory, client helpers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from kvcs.endpoint import Endpoint
from kvcs.moqt.wire import AuthToken, LocationFilter, ObjectStatus, Parameters
from kvcs.relay import Authorizer, Relay, RelayConfig
from kvcs.transport import DevCertificate, QuicSettings, ensure_dev_certificate

SETTINGS = QuicSettings.loopback()


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> DevCertificate:
    return ensure_dev_certificate(Path(tmp_path_factory.mktemp("relay-certs")))


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``cond`` until true or fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def token(value: bytes) -> tuple[AuthToken, ...]:
    """A USE_VALUE token as our clients send it."""
    return (AuthToken(3, token_type=0, value=value),)


class Env:
    """Relays and endpoints of one test; everything is closed at the end."""

    def __init__(self, cert: DevCertificate) -> None:
        self.cert = cert
        self.relays: list[Relay] = []
        self.endpoints: list[Endpoint] = []

    async def relay(self, authorizer: Authorizer | None = None, **kw: Any) -> Relay:
        cfg = RelayConfig(listen="127.0.0.1:0", tls_cert=str(self.cert.certfile),
                          tls_key=str(self.cert.keyfile), quic_preset="loopback",
                          goaway_grace=0.2, **kw)
        if authorizer is None and not cfg.auth:
            cfg.anonymous = True
        relay = Relay(cfg, authorizer, SETTINGS)
        await relay.start()
        self.relays.append(relay)
        return relay

    async def client(self, relay: Relay, tok: bytes | None = None,
                     scheme: str = "moqt") -> Endpoint:
        ep = await Endpoint.connect(f"{scheme}://127.0.0.1:{relay.port}/relay",
                                    cafile=str(self.cert.certfile), settings=SETTINGS,
                                    auth_tokens=token(tok) if tok else ())
        self.endpoints.append(ep)
        return ep

    async def aclose(self) -> None:
        for ep in self.endpoints:
            ep.close()
        for ep in self.endpoints:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ep.wait_closed(), 2)
        for relay in reversed(self.relays):
            await relay.stop(grace=0)


@pytest.fixture
async def env(cert: DevCertificate) -> AsyncIterator[Env]:
    e = Env(cert)
    try:
        yield e
    finally:
        await e.aclose()


def payload(g: int, o: int, size: int = 2048) -> bytes:
    """Deterministic payload for object g/o."""
    head = f"{g}/{o}|".encode()
    return (head * (size // len(head) + 1))[:size]


def publish_group(pub: Endpoint, track: Any, g: int, n: int, size: int = 2048,
                  end_of_group: bool = True) -> None:
    """Publish objects 0..n-1 of group g (and an End of Group marker)."""
    for o in range(n):
        pub.publish(track, g, o, payload(g, o, size))
    if end_of_group:
        pub.publish(track, g, n, b"", status=ObjectStatus.END_OF_GROUP)


def end_track(pub: Endpoint, track: Any, g: int) -> None:
    """End of Track at {g, 0}."""
    pub.publish(track, g, 0, b"", status=ObjectStatus.END_OF_TRACK)


WHOLE = Parameters(location_filter=LocationFilter.none())
NEXT = LocationFilter.next_object()

Collector = Callable[[], Awaitable[list[Any]]]
