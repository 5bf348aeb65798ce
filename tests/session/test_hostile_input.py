"""Malformed input from a hostile peer, injected as raw bytes into a sans-IO session where
the message or stream would otherwise be allowed: each case ends with the exact code the
digest names, and only the offender is cut off (a malformed control message closes the
session; a malformed data stream stops that stream and its request, nothing else)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvcs.moqt import events as ev
from kvcs.moqt import wire
from kvcs.moqt.actions import ResetStream, StopSending
from kvcs.moqt.errors import SessionCode, StreamResetCode
from kvcs.moqt.session import Session, SessionConfig

from .pair import (
    Opener,
    Pair,
    close_codes,
    established,
    kinds,
    of_type,
    raw_server,
    subscribed,
)
from .test_request_table import K, accept, start

PV = SessionCode.PROTOCOL_VIOLATION
MALFORMED = StreamResetCode.MALFORMED_TRACK
NS = (b"kv", b"t")
PROPS = ((0x79, b"abc"),)  # a Track Property last: cutting a byte breaks it


# ------------------------------------------------------- malformed control messages

def _mutations(raw: bytes) -> dict[str, bytes]:
    """A well-formed framed message, spoiled three ways (the Length always matches the
    body actually sent, so the message is complete and must be rejected)."""
    t_len = len(wire.encode_vi64(int.from_bytes(raw[:1], "big") if raw[0] < 0x80
                                 else int.from_bytes(raw[:2], "big") & 0x3FFF))
    mtype, body = raw[:t_len], raw[t_len + 2:]

    def frame(b: bytes) -> bytes:
        return mtype + len(b).to_bytes(2, "big") + b

    return {
        "truncated": frame(body[:-1]),  # the last field cut short
        "trailing": frame(body + b"\xff"),  # a byte no field takes (a cut-off vi64)
        "bad-vi64": frame(b"\xff\x00"),  # the first vi64 says 9 bytes, 2 are there
    }


Inject = Callable[[bytes], tuple[Session, list]]


def _on_server_control(raw: bytes) -> tuple[Session, list]:
    s = Session(SessionConfig(is_client=False), Opener(False))
    s.actions()
    s.stream_data(2, raw, False)
    return s, s.actions()


def _after_setup_on(stream_id: int, before: bytes = b"") -> Inject:
    def inject(raw: bytes) -> tuple[Session, list]:
        s, _ = raw_server()
        s.stream_data(stream_id, before + raw, False)
        return s, s.actions()
    return inject


def _answer_to(kind: K, accepted: bool) -> Inject:
    """Into the client, on the stream of its ``kind`` request (answered or not)."""
    def inject(raw: bytes) -> tuple[Session, list]:
        p = established()
        rid = start(p, kind)
        if accepted:
            accept(p, kind, rid)
        p.client.stream_data(p.client.subscription_info(rid).stream_id, raw, False)
        return p.client, p.client.actions()
    return inject


SUB = wire.encode_message(wire.Subscribe(0, NS, b"t", wire.Parameters()))
CASES: list[tuple[str, wire.Message, Inject]] = [
    ("SETUP", wire.Setup(wire.SetupOptions(implementation="x/1")), _on_server_control),
    ("GOAWAY", wire.GoAway(b"", 5000), _after_setup_on(2)),
    ("SUBSCRIBE", wire.Subscribe(0, NS, b"t", wire.Parameters(subscriber_priority=5)),
     _after_setup_on(0)),
    ("FETCH", wire.Fetch(0, NS, b"t", wire.Parameters(subscriber_priority=5)), _after_setup_on(0)),
    ("TRACK_STATUS", wire.TrackStatus(0, NS, b"t", wire.Parameters(include_properties=1)),
     _after_setup_on(0)),
    ("PUBLISH", wire.Publish(0, NS, b"t", 1, wire.Parameters(), PROPS), _after_setup_on(0)),
    ("PUBLISH_NAMESPACE", wire.PublishNamespace(0, NS, wire.Parameters(subscriber_priority=None)),
     _after_setup_on(0)),
    ("SUBSCRIBE_NAMESPACE", wire.SubscribeNamespace(0, NS, wire.Parameters()), _after_setup_on(0)),
    ("SUBSCRIBE_TRACKS", wire.SubscribeTracks(0, NS, wire.Parameters(forward=1)),
     _after_setup_on(0)),
    ("REQUEST_UPDATE", wire.RequestUpdate(2, wire.Parameters(subscriber_priority=3)),
     _after_setup_on(0, SUB)),
    ("SUBSCRIBE_OK", wire.SubscribeOk(1, wire.Parameters(), PROPS), _answer_to(K.SUBSCRIBE, False)),
    ("FETCH_OK", wire.FetchOk(False, wire.Location(3, 300), wire.Parameters(), PROPS),
     _answer_to(K.FETCH, False)),
    ("REQUEST_OK", wire.RequestOk(wire.Parameters(), PROPS), _answer_to(K.TRACK_STATUS, False)),
    ("REQUEST_ERROR", wire.RequestError(0x10, 0, "no such track"),
     _answer_to(K.TRACK_STATUS, False)),
    ("PUBLISH_DONE", wire.PublishDone(2, 0, "done"), _answer_to(K.SUBSCRIBE, True)),
    ("PUBLISH_STATE_NOTIFY", wire.PublishStateNotify(wire.Parameters(forward=1)),
     _answer_to(K.SUBSCRIBE, True)),
    ("NAMESPACE", wire.NamespaceMsg((b"abc",)), _answer_to(K.SUBSCRIBE_NAMESPACE, True)),
    ("NAMESPACE_DONE", wire.NamespaceDone((b"abc",)), _answer_to(K.SUBSCRIBE_NAMESPACE, True)),
    ("PUBLISH_SKIPPED", wire.PublishSkipped((b"abc",), b"name"),
     _answer_to(K.SUBSCRIBE_TRACKS, True)),
]


@pytest.mark.parametrize(("name", "msg", "inject"), CASES, ids=[c[0] for c in CASES])
def test_each_control_message_kind_well_formed_is_accepted(name: str, msg: wire.Message,
                                                           inject: Inject) -> None:
    """The context is right: the unspoiled message does not close the session (except
    NAMESPACE_DONE, whose NAMESPACE never came)."""
    _s, acts = inject(wire.encode_message(msg))
    assert close_codes(acts) == ([PV] if name == "NAMESPACE_DONE" else []), name


@pytest.mark.parametrize("how", ["truncated", "trailing", "bad-vi64"])
@pytest.mark.parametrize(("name", "msg", "inject"), CASES, ids=[c[0] for c in CASES])
def test_each_control_message_kind_malformed_closes_with_protocol_violation(
        name: str, msg: wire.Message, inject: Inject, how: str) -> None:
    s, acts = inject(_mutations(wire.encode_message(msg))[how])
    assert close_codes(acts) == [PV], (name, how)
    assert s.is_closed and s.closed is not None and s.closed[0] == PV


@pytest.mark.parametrize(("what", "ns_fields", "name"), [
    ("33 namespace fields", [b"a"] * 33, b"t"),
    ("an empty namespace field", [b"a", b""], b"t"),
    ("a 4097-byte namespace", [b"a" * 4000, b"b" * 97], b""),
    ("a 4097-byte full track name", [b"a" * 4000], b"n" * 97),
    ("a 4097-byte track name", [b"a"], b"n" * 4097),
], ids=lambda v: v if isinstance(v, str) else "")
def test_oversized_names_close_with_protocol_violation(what: str, ns_fields: list[bytes],
                                                       name: bytes) -> None:
    """The digest's namespace limits (3.6), written out byte by byte."""
    def field(b: bytes) -> bytes:
        return wire.encode_vi64(len(b)) + b

    body = (b"\x00" + wire.encode_vi64(len(ns_fields)) + b"".join(field(f) for f in ns_fields)
            + field(name) + b"\x00")
    s, _ = raw_server()
    framed = wire.encode_vi64(wire.Subscribe.TYPE) + len(body).to_bytes(2, "big") + body
    s.stream_data(0, framed, False)
    assert close_codes(s.actions()) == [PV], what


def test_oversized_reason_and_goaway_uri_close_with_protocol_violation() -> None:
    p = established()
    rid = start(p, K.TRACK_STATUS)
    body = wire.encode_vi64(0x10) + b"\x00" + wire.encode_vi64(1025) + b"r" * 1025
    p.client.stream_data(p.client.subscription_info(rid).stream_id,
                         wire.encode_vi64(wire.RequestError.TYPE) + len(body).to_bytes(2, "big")
                         + body, False)
    assert close_codes(p.client.actions()) == [PV]
    c = Session(SessionConfig(is_client=True), Opener(True))
    c.stream_data(3, wire.encode_message(wire.Setup(wire.SetupOptions())), False)
    body = wire.encode_vi64(8193) + b"u" * 8193 + b"\x00"
    framed = wire.encode_vi64(wire.GoAway.TYPE) + len(body).to_bytes(2, "big") + body
    c.stream_data(3, framed, False)
    assert close_codes(c.actions()) == [PV]


# --------------------------------------------------------------- wrong stream types


@pytest.mark.parametrize(("what", "stream_id", "raw", "code"), [
    ("a control message type as a uni stream type", 6, b"\x03\x00\x00", PV),
    ("a reserved uni stream type", 6, wire.encode_vi64(0x2F01) + b"\x00", PV),
    ("a subgroup header on a request stream", 0, b"\x10\x00\x02\x00\x00", PV),  # GOAWAY
    ("a fetch header on a request stream", 0, b"\x05\x00\x00", PV),  # = REQUEST_ERROR
    ("a second control stream", 6, wire.encode_message(wire.Setup(wire.SetupOptions())), PV),
    ("data on our own uni stream", 7, b"\x30\x00\x00", PV),
])
def test_wrong_stream_types(what: str, stream_id: int, raw: bytes, code: int) -> None:
    s, _ = raw_server()
    s.stream_data(stream_id, raw, False)
    assert close_codes(s.actions()) == [code], what


def test_padding_stream_and_datagram_are_ignored() -> None:
    s, _ = raw_server()
    s.stream_data(6, wire.encode_vi64(0x132B3E28) + bytes(500), True)
    s.datagram(wire.encode_vi64(0x132B3E29) + bytes(100))
    assert s.actions() == [] and not s.is_closed


def test_datagram_of_unknown_type_closes() -> None:
    s, _ = raw_server()
    s.datagram(b"\x40\x01\x00\x00")
    assert close_codes(s.actions()) == [PV]


# -------------------------------------------------- data streams for unknown requests


def test_fetch_stream_naming_a_request_we_answer_is_abandoned() -> None:
    """A FETCH_HEADER naming the peer's own SUBSCRIBE (we publish it): not ours to
    receive. The stream is stopped, the session and the request go on."""
    s, _ = raw_server()
    s.stream_data(0, wire.encode_message(wire.Subscribe(0, NS, b"t", wire.Parameters())), False)
    list(s.events())
    s.stream_data(6, b"\x05\x00\x1c\x00\x00\x80\x01x", False)
    acts = s.actions()
    assert acts == [StopSending(6, StreamResetCode.CANCELLED)]
    assert s.has_request(0) and not s.is_closed


# ------------------------------------------------------------ malformed tracks


@pytest.mark.parametrize("final_status", [3, 4], ids=["end-of-group", "end-of-track"])
def test_object_beyond_end_of_group_cancels_the_subscription(final_status: int) -> None:
    p = established()
    rid, alias = subscribed(p, NS)
    other, other_alias = subscribed(p, NS)
    w = wire.SubgroupWriter(wire.SubgroupHeader(alias, 0, 0, None))
    raw = (w.header_bytes() + w.object_prefix(0, 4) + b"good"
           + w.object_prefix(1, 0, status=final_status) + w.object_prefix(2, 3) + b"bad")
    c = p.client
    c.stream_data(1003, raw, False)
    acts = c.actions()
    assert StopSending(1003, MALFORMED) in acts  # the data stream
    sid = 0  # the subscription's request stream: cancelled (digest 8.8)
    assert ResetStream(sid, MALFORMED) in acts and StopSending(sid, MALFORMED) in acts
    evs = list(c.events())
    assert kinds(evs) == ["ObjectReceived", "ObjectReceived", "RequestFailed",
                          "DataStreamEnded"]
    assert bytes(evs[0].record.payload) == b"good" and evs[1].record.status == final_status
    assert evs[2].request_id == rid and evs[2].code == MALFORMED
    assert not c.has_request(rid) and not c.is_closed
    # only the offender is cut off: the other subscription still delivers
    w2 = wire.SubgroupWriter(wire.SubgroupHeader(other_alias, 0, 0, None))
    c.stream_data(1007, w2.header_bytes() + w2.object_prefix(0, 2) + b"ok", True)
    objs = of_type(list(c.events()), ev.ObjectReceived)
    assert [(o.request_id, bytes(o.record.payload)) for o in objs] == [(other, b"ok")]


def test_repeated_fetch_object_fails_the_fetch() -> None:
    p = established()
    rid = p.client.fetch(NS, b"t")
    p.pump()
    p.events(p.server)
    p.server.fetch_ok(rid, wire.Location(0, 9))
    p.pump()
    p.events(p.client)
    w = wire.FetchWriter(rid)
    raw = w.header_bytes() + w.object_prefix(0, 0, 4, 128, 1) + b"a"
    raw += b"\x04\x00\x01b"  # same group, Object ID delta 0: object 4 again
    p.client.stream_data(1003, raw, True)
    acts = p.client.actions()
    assert StopSending(1003, MALFORMED) in acts and StopSending(0, MALFORMED) in acts
    evs = list(p.client.events())
    assert kinds(evs) == ["ObjectReceived", "RequestFailed", "DataStreamEnded"]
    assert bytes(evs[0].record.payload) == b"a" and evs[1].code == MALFORMED
    assert p.client.open_requests == 0 and not p.client.is_closed


def test_malformed_track_of_a_publish_we_receive() -> None:
    """The peer PUBLISHes to us and breaks its track: its request is cancelled."""
    p = established()
    rid = p.server.publish(NS, b"t", track_alias=4)
    p.pump()
    p.events(p.client)
    p.client.request_ok(rid)
    p.pump()
    w = wire.SubgroupWriter(wire.SubgroupHeader(4, 0, 0, None))
    raw = w.header_bytes() + w.object_prefix(0, 0, status=4) + w.object_prefix(1, 1) + b"x"
    p.client.stream_data(1003, raw, False)
    evs = list(p.client.events())
    assert ev.RequestCancelled(rid, MALFORMED) in evs
    assert not p.client.has_request(rid) and not p.client.is_closed


def test_malformed_stream_that_overtook_subscribe_ok() -> None:
    """The stream arrives while its SUBSCRIBE_OK is still on the way (held), and breaks
    its track: it is stopped at once, and the subscription fails when its alias is
    known."""
    p = established()
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    p.events(p.server)
    w = wire.SubgroupWriter(wire.SubgroupHeader(9, 0, 0, None))
    raw = w.header_bytes() + w.object_prefix(0, 0, status=3) + w.object_prefix(1, 1) + b"x"
    p.client.stream_data(1003, raw, False)
    assert p.client.actions() == [StopSending(1003, MALFORMED)]
    p.server.subscribe_ok(rid, track_alias=9)
    p.pump()
    evs = list(p.client.events())
    assert kinds(evs) == ["SubscribeAccepted", "RequestFailed", "DataStreamEnded"]
    assert evs[1].code == MALFORMED and evs[2].reset_code == MALFORMED
    assert not p.client.has_request(rid) and not p.client.is_closed


def test_held_stream_stopped_over_the_limit_still_counts_for_publish_done() -> None:
    """A held stream stopped for the data budget is counted once its alias is bound, so
    the subscription still ends after PUBLISH_DONE."""
    p = established(client_cfg=SessionConfig(is_client=True, max_data_bytes=4096))
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    p.events(p.server)
    w = wire.SubgroupWriter(wire.SubgroupHeader(9, 0, 0, None))
    p.client.stream_data(1003, w.header_bytes() + w.object_prefix(0, 5000) + b"x", False)
    assert p.client.actions() == [StopSending(1003, StreamResetCode.EXCESSIVE_LOAD)]
    p.server.subscribe_ok(rid, track_alias=9)
    p.pump()
    (end,) = of_type(list(p.client.events()), ev.DataStreamEnded)
    assert end.reset_code == StreamResetCode.EXCESSIVE_LOAD
    # the server counts one stream it opened (here: the one above)
    sid = p.client.subscription_info(rid).stream_id
    p.client.stream_data(sid, wire.encode_message(wire.PublishDone(2, 1, "")), True)
    assert "SubscriptionEnded" in kinds(list(p.client.events()))
    p.pump()
    assert not p.client.has_request(rid) and p.client.usage.data_bytes == 0


def test_publish_done_counting_streams_never_seen_ends_when_the_binding_stops_waiting() -> None:
    """PUBLISH_DONE counts 2 streams but none arrives (reset before their header): the
    session says how many are missing, keeps waiting, and ends the subscription when the
    binding's digest 4.11 timer calls stop_waiting_for_streams."""
    p = established()
    rid, _ = subscribed(p, NS, track_alias=9)
    sid = p.client.subscription_info(rid).stream_id
    p.client.stream_data(sid, wire.encode_message(wire.PublishDone(2, 2, "")), True)
    evs = list(p.client.events())
    assert of_type(evs, ev.StreamsOutstanding) == [ev.StreamsOutstanding(rid, 2)]
    assert "SubscriptionEnded" not in kinds(evs)
    p.client.stop_waiting_for_streams(rid)
    (done,) = of_type(list(p.client.events()), ev.SubscriptionEnded)
    assert done.request_id == rid and done.message.stream_count == 2
    assert done.streams_missing == 2  # what they carried is unknown (a relay's copy)
    p.client.stop_waiting_for_streams(rid)  # again, or for a request long gone: nothing
    assert list(p.client.events()) == []


def _publish_done_with_its_stream_open(p: Pair) -> tuple[int, int]:
    """The server opens one subgroup stream, writes an object on it and sends PUBLISH_DONE
    counting it, the stream still open; returns (request id, the server's stream)."""
    rid, _ = subscribed(p, NS, track_alias=9)
    data = p.server.open_subgroup(rid, 0)
    p.server.write_object(data, 0, b"x" * 100)
    p.pump()
    sid = p.client.subscription_info(rid).stream_id
    p.client.stream_data(sid, wire.encode_message(wire.PublishDone(2, 1, "")), True)
    return rid, data


def test_publish_done_timer_waits_for_a_stream_still_receiving() -> None:
    """The digest 4.11 timer is for streams never seen: while a counted stream is still
    open (a large fill on a loaded host), stop_waiting_for_streams keeps the subscription
    and says so; it ends when the stream does."""
    p = established()
    rid, data = _publish_done_with_its_stream_open(p)
    evs = list(p.client.events())
    assert "SubscriptionEnded" not in kinds(evs)
    assert p.client.stop_waiting_for_streams(rid) is True  # still receiving: wait again
    assert "SubscriptionEnded" not in kinds(list(p.client.events()))
    p.server.end_data_stream(data)
    p.pump()
    (done,) = of_type(list(p.client.events()), ev.SubscriptionEnded)
    assert done.request_id == rid and done.streams_missing == 0
    assert p.client.stop_waiting_for_streams(rid) is False


def test_publish_done_timer_gives_up_a_stream_that_stopped_receiving() -> None:
    """A counted stream that stays open after PUBLISH_DONE without a byte for
    publish_done_stall_s (its FIN lost for good: qh3 2.1, docs/reliability.md) is given up:
    STOP_SENDING, and the subscription ends with it missing; bytes still arriving restart
    the wait."""
    now = [100.0]
    p = established(client_cfg=SessionConfig(is_client=True, clock=lambda: now[0],
                                             publish_done_stall_s=20.0))
    rid, data = _publish_done_with_its_stream_open(p)
    list(p.client.events())
    assert p.client.stop_waiting_for_streams(rid) is True  # first look
    now[0] += 15
    assert p.client.stop_waiting_for_streams(rid) is True  # quiet, not for long enough
    p.server.write_object(data, 1, b"y" * 100)
    p.pump()
    now[0] += 15
    assert p.client.stop_waiting_for_streams(rid) is True  # it moved: wait again
    now[0] += 19
    assert p.client.stop_waiting_for_streams(rid) is True
    assert "SubscriptionEnded" not in kinds(list(p.client.events()))
    now[0] += 2
    assert p.client.stop_waiting_for_streams(rid) is False  # 21 s without a byte
    (done,) = of_type(list(p.client.events()), ev.SubscriptionEnded)
    assert done.request_id == rid and done.streams_missing == 1
    assert any(isinstance(a, StopSending) for a in p.client.actions())
