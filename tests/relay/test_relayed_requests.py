"""The relay's table of relayed requests (sans-IO): one record per request, its state."""

from __future__ import annotations

from typing import Any

from kvcs.moqt import events as ev
from kvcs.moqt.wire import Fetch, Parameters, Subscribe, TrackStatus
from kvcs.relay.requests import RelayedRequests, RelayedState

NS = (b"kv", b"t")


def _req(rid: int, kind: type = Subscribe) -> ev.RequestReceived:
    return ev.RequestReceived(rid, kind(rid, NS, b"t", Parameters()))


class _Stand:
    """A session or link (the table only needs identity)."""


def test_a_request_waits_then_is_served_then_ends() -> None:
    table = RelayedRequests()
    peer: Any = _Stand()
    link: Any = _Stand()
    r = table.wait(peer, _req(2), link)
    f = table.wait(peer, _req(4, Fetch), link)
    assert r.state is RelayedState.WAITING and table.needs(link)
    assert not table.feeds_served(link)
    assert (table.open_requests(peer), table.open_fetches(peer)) == (2, 1)
    assert table.on_link(link, RelayedState.WAITING) == [r, f]
    served = table.serve(peer, r.event, link)
    assert served is r and r.state is RelayedState.SERVED
    assert table.on_link(link, RelayedState.SERVED) == [r] and table.feeds_served(link)
    table.end(f)
    assert f.state is RelayedState.ENDED and table.open_fetches(peer) == 0
    table.detach(r)  # its link ended: the track stays, the request is served on
    assert not table.needs(link) and table.get(peer, 2) is r
    table.end(r)
    assert len(table) == 0 and table.of_peer(peer) == []


def test_a_forwarded_track_status_is_found_by_its_upstream_request() -> None:
    table = RelayedRequests()
    peer: Any = _Stand()
    source: Any = _Stand()
    r = table.forward(peer, _req(6, TrackStatus), source, 10)
    assert table.answered_by(source, 10) is r and table.forwarded_to(source) == [r]
    assert table.answered_by(source, 12) is None
    table.end(r)
    assert table.answered_by(source, 10) is None and table.forwarded_to(source) == []
