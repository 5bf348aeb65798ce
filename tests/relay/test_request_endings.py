"""How requests end through a relay: a call abandoned before its answer withdraws its
request on both ends, and a subscription ends only after everything it carried."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from kvcs.endpoint import Endpoint
from kvcs.relay import Relay
from kvcs.testing import until

from .conftest import NEXT, WHOLE, Env, SilentEndpoint

NS = (b"endings",)

CALLS: dict[str, Callable[[Endpoint], Awaitable[object]]] = {
    "subscribe": lambda ep: ep.subscribe(NS, b"t", location_filter=NEXT, fill=WHOLE),
    "fetch": lambda ep: ep.fetch(NS, b"t"),
    "track_status": lambda ep: ep.track_status(NS, b"t"),
}


def _relay_requests(relay: Relay) -> int:
    return sum(p.open_requests() for p in relay.sessions.values())


@pytest.mark.parametrize("call", list(CALLS))
async def test_a_call_abandoned_before_its_answer_withdraws_the_request(
        env: Env, call: str) -> None:
    """A caller that gives up waiting (a timeout cancels the call) leaves no request
    behind: the endpoint cancels it, so the relay forgets it too."""
    relay = await env.relay()
    pub = await env.client(relay, endpoint_class=SilentEndpoint)  # never answers
    await pub.announce(NS)
    consumer = await env.client(relay)
    baseline = _relay_requests(relay)  # the publisher's PUBLISH_NAMESPACE
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(CALLS[call](consumer), 0.3)
    await until(lambda: consumer.session.open_requests == 0)
    await until(lambda: _relay_requests(relay) == baseline)
    assert not consumer.is_closed
