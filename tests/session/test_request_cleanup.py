"""Finished requests are forgotten on both ends (digest 8.2 graceful closure, 8.4 fetch
state): a long-lived session that makes thousands of requests keeps no state for the ones
that are over."""

from __future__ import annotations

import pytest

from kvcs.moqt import events as ev
from kvcs.moqt.actions import SendStreamData
from kvcs.moqt.errors import StreamResetCode
from kvcs.moqt.wire import Location, Parameters

from .pair import Pair, established, kinds, of_type

NS = (b"kv", b"fetch")


def _fetch_received(p: Pair) -> int:
    """The client sends FETCH and the server has it (its events drained); the Request ID."""
    rid = p.client.fetch(NS, b"t")
    p.pump()
    p.events(p.server)
    return rid


def _fetch_stream_opened(p: Pair, end: Location) -> tuple[int, int]:
    """A FETCH the server answers with FETCH_OK (End Location ``end``) and whose fetch
    stream it opens; (request id, stream id)."""
    rid = _fetch_received(p)
    p.server.fetch_ok(rid, end)
    return rid, p.server.open_fetch_stream(rid)


def _serve_fetch(p: Pair, rid: int, payload: bytes, *, ok_first: bool = True) -> None:
    """The server answers FETCH ``rid`` with FETCH_OK and one object, then FINs."""
    if ok_first:
        p.server.fetch_ok(rid, Location(0, 0))
    sid = p.server.open_fetch_stream(rid)
    p.server.write_fetch_object(sid, 0, 0, 0, 128, payload)
    p.server.end_data_stream(sid)
    if not ok_first:
        p.server.fetch_ok(rid, Location(0, 0))


def test_ten_thousand_sequential_fetches_leave_no_request_state() -> None:
    """A decode worker's pattern: FETCH after FETCH on one session. Each one ends on both
    ends (the responder FINs once its fetch stream is done, the requester FINs when the
    stream has ended) and is forgotten, so nothing grows with the number of fetches."""
    p = established()
    for i in range(10_000):
        rid = p.client.fetch(NS, b"t")
        p.pump()
        (req,) = p.events(p.server)
        assert isinstance(req, ev.RequestReceived)
        payload = i.to_bytes(4, "big")
        _serve_fetch(p, rid, payload)
        p.pump()
        evs = p.events(p.client)
        assert kinds(evs) == ["FetchAccepted", "ObjectReceived", "DataStreamEnded"]
        assert bytes(evs[1].record.payload) == payload
        p.events(p.server)
        assert p.client.open_requests == 0 and p.server.open_requests == 0
    assert not p.closed
    for s in (p.client, p.server):
        usage = s.usage
        assert usage.requests == 0 and usage.data_streams == 0, usage
        assert usage.draining_streams == 0 and usage.control_bytes == 0, usage
        assert usage.data_bytes == 0, usage


@pytest.mark.parametrize("ok_first", [True, False])
def test_fetch_ends_whichever_of_fetch_ok_and_stream_end_comes_first(ok_first: bool) -> None:
    p = established()
    rid = _fetch_received(p)
    _serve_fetch(p, rid, b"x", ok_first=ok_first)
    p.pump()
    assert set(kinds(p.events(p.client))) == {"FetchAccepted", "ObjectReceived",
                                                 "DataStreamEnded"}
    assert p.client.open_requests == 0 and p.server.open_requests == 0
    # both halves of the request stream were FINed
    fins = {n for n, a in p.wire if isinstance(a, SendStreamData) and a.stream_id == 0
            and a.end}
    assert fins == {"client", "server"}


def test_fetch_stream_overtaking_fetch_ok_on_the_wire() -> None:
    """The fetch stream (and its FIN) reaches the requester before FETCH_OK: the request
    lives until FETCH_OK is in, then both ends forget it."""
    p = established()
    rid, sid = _fetch_stream_opened(p, Location(0, 0))
    p.server.write_fetch_object(sid, 0, 0, 0, 128, b"x")
    p.server.end_data_stream(sid)
    acts = [a for a in p.server.actions() if isinstance(a, SendStreamData)]
    control = [a for a in acts if a.stream_id == 0]
    data = [a for a in acts if a.stream_id != 0]
    for a in data:  # the data stream first
        p.client.stream_data(a.stream_id, bytes(a.data), a.end)
    assert p.client.has_request(rid)  # FETCH_OK not in yet
    for a in control:
        p.client.stream_data(a.stream_id, bytes(a.data), a.end)
    assert not p.client.has_request(rid)
    assert kinds(p.events(p.client)) == ["ObjectReceived", "DataStreamEnded",
                                         "FetchAccepted"]
    p.pump()
    assert p.server.open_requests == 0 and not p.closed


def test_request_fin_overtaking_the_fetch_stream() -> None:
    """FETCH_OK and the responder's FIN reach the requester before the fetch stream
    (streams are not ordered): the request stays until its fetch stream has ended (digest
    8.4), so the stream is still attributed to it."""
    p = established()
    rid = _fetch_received(p)
    _serve_fetch(p, rid, b"late")
    acts = [a for a in p.server.actions() if isinstance(a, SendStreamData)]
    for a in sorted(acts, key=lambda a: a.stream_id != 0):  # the request stream first
        p.client.stream_data(a.stream_id, bytes(a.data), a.end)
    evs = p.events(p.client)
    assert kinds(evs) == ["FetchAccepted", "ObjectReceived", "DataStreamEnded"]
    assert bytes(evs[1].record.payload) == b"late"
    assert p.client.open_requests == 0
    p.pump()
    assert p.server.open_requests == 0 and not p.closed


def test_fetch_stream_reset_ends_the_fetch() -> None:
    p = established()
    _, sid = _fetch_stream_opened(p, Location(0, 5))
    p.server.reset_data_stream(sid, StreamResetCode.INTERNAL_ERROR)
    p.pump()
    (end,) = of_type(p.events(p.client), ev.DataStreamEnded)
    assert end.reset_code == StreamResetCode.INTERNAL_ERROR
    assert p.client.open_requests == 0 and p.server.open_requests == 0


def test_fetch_cancelled_by_stop_sending_on_its_data_stream() -> None:
    """The requester stops the fetch stream (digest 8.3): the responder resets it and the
    request ends on both ends."""
    p = established()
    _, sid = _fetch_stream_opened(p, Location(0, 5))
    p.pump()
    p.server.stop_sending(sid, StreamResetCode.CANCELLED)
    p.pump()
    assert p.client.open_requests == 0 and p.server.open_requests == 0
    assert not p.closed


def test_fetch_update_after_the_fetch_ended_is_dropped() -> None:
    p = established()
    rid = p.client.fetch(NS, b"t")
    p.client.request_update(rid, Parameters(subscriber_priority=3))  # crosses the end
    p.pump()
    assert kinds(p.events(p.server)) == ["RequestReceived", "UpdateReceived"]
    _serve_fetch(p, rid, b"x")  # the update is left unanswered: the fetch is complete
    p.pump()
    assert p.client.open_requests == 0 and p.server.open_requests == 0 and not p.closed


def test_publish_done_ends_a_publish_on_both_ends() -> None:
    p = established()
    rid = p.client.publish(NS, b"t")
    p.pump()
    p.events(p.server)
    p.server.request_ok(rid)
    p.pump()
    sid = p.client.open_subgroup(rid, 0)
    p.client.write_object(sid, 0, b"x", end=True)
    p.client.publish_done(rid, 2)
    p.pump()
    assert "SubscriptionEnded" in kinds(p.events(p.server))
    assert p.client.open_requests == 0 and p.server.open_requests == 0


def test_refused_publish_is_forgotten_by_the_publisher() -> None:
    p = established()
    rid = p.client.publish(NS, b"t")
    p.pump()
    p.events(p.server)
    p.server.request_error(rid, 0x20, "uninterested")
    p.pump()
    assert "RequestRejected" in kinds(p.events(p.client))
    assert p.client.open_requests == 0 and p.server.open_requests == 0


@pytest.mark.parametrize("method", ["publish_namespace", "subscribe_namespace",
                                    "subscribe_tracks"])
def test_namespace_request_withdrawn_by_fin_ends_on_both_ends(method: str) -> None:
    p = established()
    rid = getattr(p.client, method)(NS)
    p.pump()
    p.events(p.server)
    p.server.request_ok(rid)
    p.pump()
    p.client.finish_request(rid)
    p.pump()
    assert kinds(p.events(p.server)) == ["RequestCancelled"]
    assert p.client.open_requests == 0 and p.server.open_requests == 0
