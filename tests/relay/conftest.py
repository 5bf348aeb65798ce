"""Fixtures for relay tests: a dev certificate, relay factory, client helpers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from kvcs.endpoint import Endpoint
from kvcs.moqt import events as ev
from kvcs.moqt.wire import AuthToken, LocationFilter, ObjectStatus, Parameters
from kvcs.relay import Authorizer, Relay
from kvcs.testing import LocalNet
from kvcs.transport import DevCertificate, QuicSettings

SETTINGS = QuicSettings.loopback()


def token(value: bytes) -> tuple[AuthToken, ...]:
    """A USE_VALUE token as our clients send it."""
    return (AuthToken(3, token_type=0, value=value),)


class SilentEndpoint(Endpoint):
    """A publisher that takes every request of its peer and never answers it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[ev.RequestReceived] = []

    def handle_request(self, e: ev.RequestReceived) -> None:
        self.requests.append(e)


class Env(LocalNet):
    """Relays and endpoints of one test (positional authorizer); closed at the end."""

    async def relay(self, authorizer: Authorizer | None = None,  # type: ignore[override]
                    **kw: Any) -> Relay:
        return await super().relay(authorizer=authorizer, goaway_grace=0.2, **kw)

    async def live_track(self, relay: Relay, ns: tuple[bytes, ...], name: bytes
                         ) -> tuple[Endpoint, Any, Endpoint, Any, asyncio.Task[list[Any]]]:
        """A publisher that announced ``ns`` and made track ``name`` through ``relay``, and
        another client subscribed to it whole: (publisher, track, subscriber, subscription,
        the task collecting the subscription for up to 8 s)."""
        pub = await self.client(relay)
        await pub.announce(ns)
        track = pub.create_track(ns, name)
        client = await self.client(relay)
        sub = await client.subscribe(ns, name, location_filter=NEXT, fill=WHOLE)
        return pub, track, client, sub, asyncio.create_task(sub.collect(timeout=8))


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
