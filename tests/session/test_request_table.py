"""The request state table (kvcs.moqt.requests), exercised through an in-memory Pair.

For every request kind and every state of the peer's side, each control message is
injected as raw bytes on the request stream, as a misbehaving peer would send it. The
messages the digest allows (sections 4.2, 4.5, 4.11, 4.12, 4.17-4.20) are accepted; every
other one closes the session with PROTOCOL_VIOLATION. The expectations are written out
here from the digest, not read from the table. Then the same table refuses the
application's calls that would send a forbidden message (SessionUsageError, nothing sent),
and judges what a side's FIN means.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvcs.moqt import events as ev
from kvcs.moqt import wire
from kvcs.moqt.errors import SessionCode, SessionUsageError
from kvcs.moqt.requests import TRANSITIONS, RequestKind, RequestState, Side
from kvcs.moqt.session import Session

from .pair import Pair, close_codes, established, kinds

NS = (b"kv", b"t")
PV = SessionCode.PROTOCOL_VIOLATION
K = RequestKind

# --------------------------------------------------------------------- the messages

MESSAGES: dict[str, Callable[[int], list[wire.Message]]] = {
    "GOAWAY": lambda uid: [wire.GoAway(b"", 0)],
    "REQUEST_UPDATE": lambda uid: [wire.RequestUpdate(uid, wire.Parameters())],
    "REQUEST_OK": lambda uid: [wire.RequestOk(wire.Parameters(), ())],
    "REQUEST_ERROR": lambda uid: [wire.RequestError(0x10, 0, "no")],
    "SUBSCRIBE_OK": lambda uid: [wire.SubscribeOk(7, wire.Parameters(), ())],
    "FETCH_OK": lambda uid: [wire.FetchOk(False, wire.Location(0, 0), wire.Parameters(), ())],
    "PUBLISH_DONE": lambda uid: [wire.PublishDone(2, 0, "")],
    "PUBLISH_STATE_NOTIFY": lambda uid: [wire.PublishStateNotify(wire.Parameters())],
    "NAMESPACE": lambda uid: [wire.NamespaceMsg((b"x",))],
    # NAMESPACE_DONE is only valid after its NAMESPACE
    "NAMESPACE_DONE": lambda uid: [wire.NamespaceMsg((b"x",)), wire.NamespaceDone((b"x",))],
    "PUBLISH_SKIPPED": lambda uid: [wire.PublishSkipped((b"x",), b"t")],
    # SUBSCRIBE starts requests only
    "SUBSCRIBE": lambda uid: [wire.Subscribe(uid, NS, b"t", wire.Parameters())],
}

# What the digest allows the peer to send, by kind and the peer side's situation.
RESPONDER_UNANSWERED = {  # 4.2 "Which response starts each request stream's reply"
    K.SUBSCRIBE: {"SUBSCRIBE_OK", "REQUEST_ERROR", "GOAWAY"},
    K.PUBLISH: {"REQUEST_OK", "REQUEST_ERROR", "GOAWAY"},
    K.FETCH: {"FETCH_OK", "REQUEST_ERROR", "GOAWAY"},
    K.TRACK_STATUS: {"REQUEST_OK", "REQUEST_ERROR", "GOAWAY"},
    K.PUBLISH_NAMESPACE: {"REQUEST_OK", "REQUEST_ERROR", "GOAWAY"},
    K.SUBSCRIBE_NAMESPACE: {"REQUEST_OK", "REQUEST_ERROR", "GOAWAY"},
    K.SUBSCRIBE_TRACKS: {"REQUEST_OK", "REQUEST_ERROR", "GOAWAY"},
}
UPDATE_ANSWERS = {"REQUEST_OK", "REQUEST_ERROR"}
RESPONDER_ACCEPTED = {  # 4.2 "Later messages on stream", with one of our updates pending
    K.SUBSCRIBE: {"PUBLISH_STATE_NOTIFY", "PUBLISH_DONE", "GOAWAY"} | UPDATE_ANSWERS,
    K.PUBLISH: {"REQUEST_UPDATE", "GOAWAY"},  # the responder subscribes: it may update
    K.FETCH: {"GOAWAY"} | UPDATE_ANSWERS,
    K.PUBLISH_NAMESPACE: {"GOAWAY"} | UPDATE_ANSWERS,
    K.SUBSCRIBE_NAMESPACE: {"NAMESPACE", "NAMESPACE_DONE", "GOAWAY"} | UPDATE_ANSWERS,
    K.SUBSCRIBE_TRACKS: {"PUBLISH_SKIPPED", "GOAWAY"} | UPDATE_ANSWERS,
}
REQUESTER_REQUESTED = {  # 4.5 who may send REQUEST_UPDATE; 4.10-4.12 the publisher's part
    K.SUBSCRIBE: {"REQUEST_UPDATE", "GOAWAY"},
    K.PUBLISH: {"PUBLISH_STATE_NOTIFY", "PUBLISH_DONE", "GOAWAY"} | UPDATE_ANSWERS,
    K.FETCH: {"REQUEST_UPDATE", "GOAWAY"},
    K.TRACK_STATUS: {"GOAWAY"},  # no REQUEST_UPDATE on TRACK_STATUS
    K.PUBLISH_NAMESPACE: {"REQUEST_UPDATE", "GOAWAY"},
    K.SUBSCRIBE_NAMESPACE: {"REQUEST_UPDATE", "GOAWAY"},
    K.SUBSCRIBE_TRACKS: {"REQUEST_UPDATE", "GOAWAY"},
}

UPDATABLE_BY_REQUESTER = {K.SUBSCRIBE, K.FETCH, K.PUBLISH_NAMESPACE, K.SUBSCRIBE_NAMESPACE,
                          K.SUBSCRIBE_TRACKS}


def start(p: Pair, kind: RequestKind) -> int:
    """The client starts a ``kind`` request; the server has received it."""
    c = p.client
    rid = {
        K.SUBSCRIBE: lambda: c.subscribe(NS, b"t"),
        K.PUBLISH: lambda: c.publish(NS, b"t"),
        K.FETCH: lambda: c.fetch(NS, b"t"),
        K.TRACK_STATUS: lambda: c.track_status(NS, b"t"),
        K.PUBLISH_NAMESPACE: lambda: c.publish_namespace(NS),
        K.SUBSCRIBE_NAMESPACE: lambda: c.subscribe_namespace(NS),
        K.SUBSCRIBE_TRACKS: lambda: c.subscribe_tracks(NS),
    }[kind]()
    p.pump()
    (got,) = p.events(p.server)
    assert isinstance(got, ev.RequestReceived) and got.request_id == rid
    return rid


def accept(p: Pair, kind: RequestKind, rid: int) -> None:
    """The server accepts the client's request through its API."""
    if kind is K.SUBSCRIBE:
        p.server.subscribe_ok(rid)
    elif kind is K.FETCH:
        p.server.fetch_ok(rid, wire.Location(0, 0))
    else:
        p.server.request_ok(rid)
    p.pump()
    p.events(p.client)


def inject(receiver: Session, stream_id: int, name: str, update_id: int) -> list:
    """Feed the message(s) for ``name`` to ``receiver`` as if from its peer; returns the
    receiver's actions."""
    for msg in MESSAGES[name](update_id):
        receiver.stream_data(stream_id, wire.encode_message(msg), False)
    return receiver.actions()


def check(acts: list, allowed: bool, what: str) -> None:
    if allowed:
        assert close_codes(acts) == [], f"{what} refused"
    else:
        assert close_codes(acts) == [PV], f"{what} accepted"


def _cases(table: dict[RequestKind, set[str]]) -> list:
    return [pytest.param(k, m, id=f"{k.name}-{m}") for k in table for m in MESSAGES]


# ------------------------------------------------------------ what the peer may send


@pytest.mark.parametrize(("kind", "name"), _cases(RESPONDER_UNANSWERED))
def test_responder_unanswered(kind: RequestKind, name: str) -> None:
    p = established()
    rid = start(p, kind)
    sid = p.client.subscription_info(rid).stream_id
    check(inject(p.client, sid, name, 101), name in RESPONDER_UNANSWERED[kind],
          f"{name} answering {kind.name}")


@pytest.mark.parametrize(("kind", "name"), _cases(RESPONDER_ACCEPTED))
def test_responder_accepted(kind: RequestKind, name: str) -> None:
    p = established()
    rid = start(p, kind)
    accept(p, kind, rid)
    if kind in UPDATABLE_BY_REQUESTER:  # so that an answer to an update can be valid
        p.client.request_update(rid, wire.Parameters())
        p.pump()
    sid = p.client.subscription_info(rid).stream_id
    check(inject(p.client, sid, name, 101), name in RESPONDER_ACCEPTED[kind],
          f"{name} on accepted {kind.name}")


@pytest.mark.parametrize("final", ["REQUEST_ERROR", "PUBLISH_DONE", "TRACK_STATUS_OK"])
@pytest.mark.parametrize("name", list(MESSAGES))
def test_responder_done_sends_nothing_more(final: str, name: str) -> None:
    """After its last message (no FIN yet) the responder may send nothing."""
    p = established()
    kind = {"PUBLISH_DONE": K.SUBSCRIBE, "TRACK_STATUS_OK": K.TRACK_STATUS}.get(final,
                                                                               K.FETCH)
    rid = start(p, kind)
    if final == "PUBLISH_DONE":
        accept(p, kind, rid)
    sid = p.client.subscription_info(rid).stream_id
    inject(p.client, sid, "REQUEST_OK" if final == "TRACK_STATUS_OK" else final, 101)
    assert p.client.subscription_info(rid).responder_state is RequestState.DONE
    check(inject(p.client, sid, name, 101), False, f"{name} after {final}")


@pytest.mark.parametrize(("kind", "name"), _cases(REQUESTER_REQUESTED))
def test_requester(kind: RequestKind, name: str) -> None:
    p = established()
    rid = start(p, kind)
    if kind is K.PUBLISH:  # the server subscribes and updates: the publisher answers
        p.server.request_ok(rid)
        p.server.request_update(rid, wire.Parameters(forward=0))
        p.pump()
        p.events(p.client)
    sid = p.server.subscription_info(rid).stream_id
    check(inject(p.server, sid, name, 100), name in REQUESTER_REQUESTED[kind],
          f"{name} from the requester of {kind.name}")


@pytest.mark.parametrize("name", list(MESSAGES))
def test_publisher_done_sends_nothing_more(name: str) -> None:
    p = established()
    rid = start(p, K.PUBLISH)
    sid = p.server.subscription_info(rid).stream_id
    inject(p.server, sid, "PUBLISH_DONE", 100)
    check(inject(p.server, sid, name, 100), False, f"{name} after PUBLISH_DONE")


def test_refusal_reason_names_message_kind_and_state() -> None:
    p = established()
    rid = start(p, K.TRACK_STATUS)
    sid = p.server.subscription_info(rid).stream_id
    (close,) = [a for a in inject(p.server, sid, "REQUEST_UPDATE", 100)
                if close_codes([a])]
    assert close.reason == f"REQUEST_UPDATE from the requester of TRACK_STATUS {rid} " \
                           "(requested)"


def test_table_rows_cover_every_kind_and_live_state() -> None:
    for kind in RequestKind:
        assert (kind, Side.REQUESTER, RequestState.REQUESTED) in TRANSITIONS
        assert (kind, Side.RESPONDER, RequestState.UNANSWERED) in TRANSITIONS
    for (_, _, state), allowed in TRANSITIONS.items():
        assert state is not RequestState.DONE and wire.GoAway in allowed


# -------------------------------------------------------------- messages that cross


def test_update_crossing_publish_done_is_dropped() -> None:
    """The subscriber's REQUEST_UPDATE sent before it saw PUBLISH_DONE is legal; the
    publisher, done with the request, drops it instead of reporting it."""
    p = established()
    rid = start(p, K.SUBSCRIBE)
    accept(p, K.SUBSCRIBE, rid)
    p.server.publish_done(rid, 2)
    p.client.request_update(rid, wire.Parameters(subscriber_priority=1))
    p.pump()
    assert not p.closed
    assert [e for e in p.events(p.server) if isinstance(e, ev.UpdateReceived)] == []
    assert "SubscriptionEnded" in kinds(p.events(p.client))


def test_publish_answer_crossing_publish_done() -> None:
    """The subscriber's REQUEST_OK to a PUBLISH may arrive after the publisher's
    PUBLISH_DONE."""
    p = established()
    rid = start(p, K.PUBLISH)
    p.client.publish_done(rid, 2)
    p.server.request_ok(rid)
    p.pump()
    assert not p.closed
    assert "RequestAccepted" in kinds(p.events(p.client))


# ------------------------------------------------------- what the application may send


def _usage_error(p: Pair, call: Callable[[], object]) -> None:
    p.client.actions()
    p.server.actions()
    with pytest.raises(SessionUsageError):
        call()
    assert p.client.actions() == [] and p.server.actions() == []


def test_answers_to_our_own_request_are_refused() -> None:
    p = established()
    rid = start(p, K.SUBSCRIBE)
    _usage_error(p, lambda: p.client.subscribe_ok(rid))  # wrong side
    _usage_error(p, lambda: p.client.request_error(rid, 0x10))
    _usage_error(p, lambda: p.client.publish_done(rid, 2))


def test_answers_of_the_wrong_kind_are_refused() -> None:
    p = established()
    sub, fetch = start(p, K.SUBSCRIBE), start(p, K.FETCH)
    _usage_error(p, lambda: p.server.fetch_ok(sub, wire.Location(0, 0)))
    _usage_error(p, lambda: p.server.subscribe_ok(fetch))
    _usage_error(p, lambda: p.server.request_ok(sub))  # SUBSCRIBE needs SUBSCRIBE_OK
    _usage_error(p, lambda: p.server.namespace(sub, NS))
    _usage_error(p, lambda: p.server.publish_done(sub, 2))  # not accepted yet
    _usage_error(p, lambda: p.server.open_subgroup(fetch, 0))
    _usage_error(p, lambda: p.server.open_fetch_stream(sub))  # a fill needs a fill id
    _usage_error(p, lambda: p.server.open_subgroup(sub, 0))  # no alias before SUBSCRIBE_OK


def test_second_answer_is_refused() -> None:
    p = established()
    rid = start(p, K.SUBSCRIBE)
    p.server.subscribe_ok(rid)
    _usage_error(p, lambda: p.server.subscribe_ok(rid))
    _usage_error(p, lambda: p.server.request_error(rid, 0x10))  # use publish_done
    p.server.publish_done(rid, 2)
    _usage_error(p, lambda: p.server.publish_state_notify(rid, wire.Parameters()))


def test_objects_on_the_wrong_stream_kind_are_refused() -> None:
    p = established()
    sub, fetch = start(p, K.SUBSCRIBE), start(p, K.FETCH)
    p.server.subscribe_ok(sub)
    p.server.fetch_ok(fetch, wire.Location(0, 0))
    subgroup, fetch_stream = p.server.open_subgroup(sub, 0), p.server.open_fetch_stream(fetch)
    _usage_error(p, lambda: p.server.write_object(fetch_stream, 0, b"x"))
    _usage_error(p, lambda: p.server.write_fetch_object(subgroup, 0, 0, 0, 128, b"x"))
    _usage_error(p, lambda: p.server.write_end_of_range(subgroup, 0x8C, 0, 0))


def test_updates_and_their_answers_are_checked() -> None:
    p = established()
    ts, sub = start(p, K.TRACK_STATUS), start(p, K.SUBSCRIBE)
    _usage_error(p, lambda: p.client.request_update(ts, wire.Parameters()))
    _usage_error(p, lambda: p.server.request_update(sub, wire.Parameters()))  # not the requester
    _usage_error(p, lambda: p.server.request_ok(sub, update_id=4))  # before the answer
    p.server.subscribe_ok(sub)
    _usage_error(p, lambda: p.server.request_ok(sub, update_id=99))  # no such update
    uid = p.client.request_update(sub, wire.Parameters())
    p.pump()
    p.server.request_ok(sub, update_id=uid)
    _usage_error(p, lambda: p.server.request_ok(sub, update_id=uid))  # answered already


def test_unknown_and_forgotten_requests_are_refused() -> None:
    p = established()
    _usage_error(p, lambda: p.server.request_ok(41))
    rid = start(p, K.TRACK_STATUS)
    p.server.request_ok(rid)
    p.pump()
    assert not p.server.has_request(rid) and not p.client.has_request(rid)
    _usage_error(p, lambda: p.server.request_ok(rid))
    _usage_error(p, lambda: p.client.subscription_info(rid))
    _usage_error(p, lambda: p.server.send_datagram(rid, wire.ObjectRecord(0, 0, 0, 128, 0, (),
                                                                        b"x")))


def test_nothing_after_our_fin() -> None:
    p = established()
    rid = start(p, K.SUBSCRIBE)
    p.client.finish_request(rid)  # no more updates from us
    _usage_error(p, lambda: p.client.request_update(rid, wire.Parameters()))
    p.pump()
    assert p.events(p.server) == [] and not p.closed  # a requester's FIN is no cancel


def test_calls_on_a_closed_session_do_nothing() -> None:
    p = established()
    rid = start(p, K.SUBSCRIBE)
    p.server.close()
    p.server.actions()
    p.server.subscribe_ok(rid)
    p.server.request_error(rid, 0x10)
    p.server.cancel(rid)
    assert p.server.actions() == []
    with pytest.raises(SessionUsageError):
        p.server.subscribe(NS, b"t")


# ------------------------------------------------------------------ ends of streams


@pytest.mark.parametrize(("kind", "accepted", "event"), [
    (K.SUBSCRIBE, False, "RequestFailed"),
    (K.SUBSCRIBE, True, "RequestFailed"),  # no PUBLISH_DONE
    (K.FETCH, False, "RequestFailed"),
    (K.FETCH, True, None),  # FETCH_OK then FIN: complete
    (K.TRACK_STATUS, False, "RequestFailed"),
    (K.SUBSCRIBE_NAMESPACE, True, "RequestFailed"),
])
def test_responder_fin(kind: RequestKind, accepted: bool, event: str | None) -> None:
    p = established()
    rid = start(p, kind)
    if accepted:
        accept(p, kind, rid)
    sid = p.client.subscription_info(rid).stream_id
    p.client.stream_data(sid, b"", True)
    evs = kinds(p.events(p.client))
    assert evs == ([event] if event else [])
    p.pump()
    if kind is K.FETCH and accepted:
        # digest 8.4: the requester keeps an accepted FETCH until its fetch stream ends
        # (that stream may arrive after the request stream's FIN)
        assert p.client.has_request(rid)
        p.server.end_data_stream(p.server.open_fetch_stream(rid))
        p.pump()
    assert not p.client.has_request(rid) and not p.closed  # we FINed back and forgot it


@pytest.mark.parametrize(("kind", "cancelled"), [
    (K.SUBSCRIBE, False), (K.FETCH, False), (K.TRACK_STATUS, False),
    (K.PUBLISH, True), (K.PUBLISH_NAMESPACE, True), (K.SUBSCRIBE_NAMESPACE, True),
    (K.SUBSCRIBE_TRACKS, True),
])
def test_requester_fin(kind: RequestKind, cancelled: bool) -> None:
    p = established()
    rid = start(p, kind)
    p.client.finish_request(rid)
    p.pump()
    assert kinds(p.events(p.server)) == (["RequestCancelled"] if cancelled else [])
    assert not p.closed
    # a withdrawn request is over: the responder FINs back and both ends forget it; the
    # others are still being answered (the requester merely sends no more updates)
    assert p.server.has_request(rid) is not cancelled
    assert p.client.has_request(rid) is not cancelled
