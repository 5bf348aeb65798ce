"""A misbehaving peer (raw bytes injected with Session.stream_data): each case ends in the
session close code the digest names, and nothing already delivered is lost."""

from __future__ import annotations

import pytest

from kvcs.moqt import events as ev
from kvcs.moqt.actions import CloseSession, SendStreamData, StopSending
from kvcs.moqt.errors import SessionCode, StreamResetCode
from kvcs.moqt.serving import TrackServer
from kvcs.moqt.session import SessionConfig
from kvcs.moqt.track import CachedObject, Track
from kvcs.moqt.wire import (
    GoAway,
    Parameters,
    Setup,
    SetupOptions,
    SubgroupHeader,
    SubgroupWriter,
    Subscribe,
    encode_message,
)

from .pair import Pair, close_codes, established, of_type, raw_server

PV = SessionCode.PROTOCOL_VIOLATION
NS = (b"kv", b"bad")
SETUP = encode_message(Setup(SetupOptions()))


def _subscribe(rid: int, name: bytes = b"t") -> bytes:
    return encode_message(Subscribe(rid, NS, name, Parameters()))


def _closed_with(actions: list, code: int) -> None:
    assert close_codes(actions) == [code], actions
    (c,) = [a for a in actions if isinstance(a, CloseSession)]
    assert c.reason


# --------------------------------------------------------------------- control stream


@pytest.mark.parametrize(("stream_id", "data", "fin"), [
    (2, b"\x7e\x00\x00", False),
    (0, b"\x7e\x00\x00", False),
    (0, _subscribe(0) + b"\x7e\x00\x00", False),
    (2, SETUP, False),
    (6, SETUP, False),
    (2, _subscribe(0), False),
    (2, encode_message(GoAway(b"", 5000))[:-1], True),
    (2, b"", True),
], ids=["unknown-type-on-control-stream", "unknown-type-on-request-stream",
        "unknown-type-after-a-request", "second-setup", "second-control-stream",
        "request-message-on-control-stream", "truncated-control-message-then-fin",
        "control-stream-fin"])
def test_control_stream_violation(stream_id: int, data: bytes, fin: bool) -> None:
    s, _ = raw_server()
    s.stream_data(stream_id, data, fin)
    _closed_with(s.actions(), PV)
    assert s.is_closed


def test_control_stream_reset() -> None:
    s, _ = raw_server()
    s.stream_reset(2, 0)
    _closed_with(s.actions(), PV)


def test_setup_fin_in_the_middle() -> None:
    s, _ = raw_server(setup=False)
    s.stream_data(2, SETUP[:3], True)
    _closed_with(s.actions(), PV)


def test_path_option_from_server_is_invalid_path() -> None:
    from kvcs.moqt.session import Session

    from .pair import Opener

    c = Session(SessionConfig(is_client=True), Opener(True))
    c.actions()
    c.stream_data(3, encode_message(Setup(SetupOptions(path=b"/x"))), False)
    _closed_with(c.actions(), SessionCode.INVALID_PATH)


# ------------------------------------------------------------------------ request IDs


def test_wrong_parity_request_id() -> None:
    s, _ = raw_server()
    s.stream_data(0, _subscribe(1), False)
    _closed_with(s.actions(), SessionCode.INVALID_REQUEST_ID)
    assert of_type(list(s.events()), ev.RequestReceived) == []


def test_reused_request_id() -> None:
    s, _ = raw_server()
    s.stream_data(0, _subscribe(0), False)
    s.stream_data(4, _subscribe(0, b"u"), False)
    _closed_with(s.actions(), SessionCode.INVALID_REQUEST_ID)


def test_request_ids_arriving_out_of_order() -> None:
    """Each request has its own stream, so a lower ID may arrive after a higher one
    (seen with aioquic over WebTransport); only an ID already used is a violation."""
    s, _ = raw_server()
    s.stream_data(0, _subscribe(4), False)
    s.stream_data(4, _subscribe(2, b"u"), False)
    s.stream_data(8, _subscribe(0, b"w"), False)
    assert close_codes(s.actions()) == []
    assert [e.request_id for e in of_type(list(s.events()), ev.RequestReceived)] == [4, 2, 0]
    s.stream_data(12, _subscribe(2, b"x"), False)  # now 2 is reused
    _closed_with(s.actions(), SessionCode.INVALID_REQUEST_ID)


def test_request_id_skipping_too_many() -> None:
    from kvcs.moqt.session import MAX_SKIPPED_REQUEST_IDS

    s, _ = raw_server()
    s.stream_data(0, _subscribe(2 * MAX_SKIPPED_REQUEST_IDS + 2), False)
    _closed_with(s.actions(), SessionCode.INVALID_REQUEST_ID)


def test_wrong_parity_request_update_id() -> None:
    from kvcs.moqt.wire import RequestUpdate

    s, _ = raw_server()
    s.stream_data(0, _subscribe(0), False)
    s.stream_data(0, encode_message(RequestUpdate(3, Parameters())), False)
    _closed_with(s.actions(), SessionCode.INVALID_REQUEST_ID)


def test_wrong_parity_in_pipelined_request_before_setup() -> None:
    s, _ = raw_server(setup=False)
    s.stream_data(0, _subscribe(1), False)
    assert close_codes(s.actions()) == []  # buffered until SETUP
    s.stream_data(2, SETUP, False)
    _closed_with(s.actions(), SessionCode.INVALID_REQUEST_ID)


# ----------------------------------------------------------------- request streams


def test_request_stream_starting_with_a_response() -> None:
    from kvcs.moqt.wire import RequestOk

    s, _ = raw_server()
    s.stream_data(0, encode_message(RequestOk(Parameters(), ())), False)
    _closed_with(s.actions(), PV)


def test_truncated_request_then_fin() -> None:
    s, _ = raw_server()
    s.stream_data(0, _subscribe(0)[:-2], True)
    _closed_with(s.actions(), PV)


def test_fin_inside_second_message_on_request_stream() -> None:
    from kvcs.moqt.wire import RequestUpdate

    s, _ = raw_server()
    upd = encode_message(RequestUpdate(2, Parameters(subscriber_priority=1)))
    s.stream_data(0, _subscribe(0) + upd[:-1], True)
    _closed_with(s.actions(), PV)


def test_request_before_setup_is_buffered_until_limit() -> None:
    # each piece of early input is charged its bytes plus EARLY_ITEM_COST (its record)
    s, _ = raw_server(SessionConfig(is_client=False, setup_buffer_limit=300), setup=False)
    s.stream_data(0, _subscribe(0), False)
    assert close_codes(s.actions()) == []
    s.stream_data(4, _subscribe(2) * 10, False)  # far more than the limit
    _closed_with(s.actions(), PV)


def test_unknown_uni_stream_type() -> None:
    s, _ = raw_server()
    s.stream_data(6, b"\x7e\x01\x02", False)
    _closed_with(s.actions(), PV)


# --------------------------------------------------------------------- data streams


def _live_subscription(groups: int = 1) -> tuple[Pair, Track, TrackServer, int, int]:
    """An established subscription; returns (pair, track, server, request id, alias)."""
    p = established()
    track = Track(NS, b"t", origin=True)
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    server = TrackServer(p.server)
    for e in p.events(p.server):
        if isinstance(e, ev.RequestReceived):
            server.serve_subscribe(e.request_id, e.message, track)  # type: ignore[arg-type]
    p.pump()
    (ok,) = of_type(p.events(p.client), ev.SubscribeAccepted)
    return p, track, server, rid, ok.message.track_alias


def _raw_subgroup(alias: int, group: int, objects: list[bytes]) -> bytes:
    w = SubgroupWriter(SubgroupHeader(alias, group, 0, None))
    out = bytearray(w.header_bytes())
    for i, payload in enumerate(objects):
        out += w.object_prefix(i, len(payload), 0, None)
        out += payload
    return bytes(out)


def test_data_stream_ending_inside_an_object() -> None:
    p, track, _, _rid, alias = _live_subscription()
    track.add(CachedObject(0, 0, 0, 128, 0, (), b"good"))
    p.pump()
    delivered = of_type(p.events(p.client), ev.ObjectReceived)
    assert [bytes(o.record.payload) for o in delivered] == [b"good"]
    # a raw server stream: one complete object, then FIN in the middle of the second
    raw = _raw_subgroup(alias, 5, [b"complete", b"partial-object-payload"])
    p.client.stream_data(7 + 400, raw[:-5], True)
    acts = p.client.actions()
    _closed_with(acts, PV)
    evs = list(p.client.events())
    objs = of_type(evs, ev.ObjectReceived)
    assert [bytes(o.record.payload) for o in objs] == [b"complete"]  # never the partial one
    assert isinstance(evs[-1], ev.SessionClosed) and evs[-1].code == PV
    # what was delivered before stays delivered (the views are still valid)
    assert bytes(delivered[0].record.payload) == b"good"


def test_data_stream_ending_inside_an_object_chunked() -> None:
    p, _, _, _, alias = _live_subscription()
    raw = _raw_subgroup(alias, 1, [b"a" * 100, b"b" * 100])
    sid = 1003
    for i in range(0, len(raw) - 50, 7):
        p.client.stream_data(sid, raw[i:i + 7], False)
    p.client.stream_data(sid, b"", True)
    _closed_with(p.client.actions(), PV)
    objs = of_type(list(p.client.events()), ev.ObjectReceived)
    assert [bytes(o.record.payload) for o in objs] == [b"a" * 100]


def test_data_stream_ending_inside_its_header() -> None:
    p, _, _, _, alias = _live_subscription()
    p.client.stream_data(1003, bytes([0x30, alias]), True)  # group id missing
    _closed_with(p.client.actions(), PV)


def test_unknown_track_alias_is_abandoned_without_harm() -> None:
    p, track, _, rid, alias = _live_subscription()
    stray = _raw_subgroup(alias + 40, 0, [b"stray"])
    p.client.stream_data(1003, stray, False)
    acts = p.client.actions()
    assert StopSending(1003, StreamResetCode.CANCELLED) in acts
    assert close_codes(acts) == []
    p.client.stream_data(1003, b"more bytes", True)  # ignored
    assert close_codes(p.client.actions()) == []
    # the real track keeps flowing
    track.add(CachedObject(0, 0, 0, 128, 0, (), b"real"))
    p.pump()
    objs = of_type(p.events(p.client), ev.ObjectReceived)
    assert [(o.request_id, bytes(o.record.payload)) for o in objs] == [(rid, b"real")]
    assert not p.closed


def test_stream_for_alias_of_pending_subscribe_is_held_then_delivered() -> None:
    p = established()
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    (req,) = p.events(p.server)
    # the server's data stream overtakes its SUBSCRIBE_OK
    p.client.stream_data(1003, _raw_subgroup(9, 0, [b"early"]), True)
    assert of_type(list(p.client.events()), ev.ObjectReceived) == []
    p.server.subscribe_ok(req.request_id, track_alias=9)
    p.pump()
    evs = p.events(p.client)
    objs = of_type(evs, ev.ObjectReceived)
    assert [(o.request_id, bytes(o.record.payload)) for o in objs] == [(rid, b"early")]
    assert of_type(evs, ev.DataStreamEnded)
    assert not p.closed


def test_held_stream_abandoned_when_subscribe_fails() -> None:
    p = established()
    p.client.subscribe(NS, b"t")
    p.pump()
    (req,) = p.events(p.server)
    p.client.stream_data(1003, _raw_subgroup(9, 0, [b"early"]), False)
    p.server.request_error(req.request_id, 0x10, "no")
    p.pump()
    stops = [a for n, a in p.wire if n == "server" and isinstance(a, StopSending)]
    assert [s.stream_id for s in stops] == [1003]
    assert of_type(p.events(p.client), ev.ObjectReceived) == []
    assert not p.closed


def test_fetch_stream_for_unknown_request_is_abandoned() -> None:
    p, _, _, _, _ = _live_subscription()
    p.client.stream_data(1003, bytes([0x05, 77, 0x1C, 0, 0, 0x80, 1]) + b"x", False)
    acts = p.client.actions()
    assert StopSending(1003, StreamResetCode.CANCELLED) in acts
    assert close_codes(acts) == []


def test_data_on_our_own_uni_stream_is_violation() -> None:
    s, _ = raw_server()
    s.stream_data(3 + 4, b"\x30\x00\x00", False)
    _closed_with(s.actions(), PV)


def test_nothing_sent_after_close() -> None:
    s, _ = raw_server()
    s.stream_data(2, b"\x7e\x00\x00", False)
    s.actions()
    s.stream_data(0, _subscribe(0), False)
    assert s.actions() == []
    assert of_type(list(s.events()), ev.RequestReceived) == []
    assert not any(isinstance(a, SendStreamData) for a in s.actions())


# ----------------------------------------------------------------------- track aliases


def _two_subscribes(second: bytes) -> tuple[Pair, int, int]:
    p = established()
    first = p.client.subscribe(NS, b"t")
    other = p.client.subscribe(NS, second)
    p.pump()
    p.events(p.server)
    return p, first, other


def test_one_alias_for_two_tracks_is_duplicate_track_alias() -> None:
    p, first, other = _two_subscribes(b"u")
    p.server.subscribe_ok(first, track_alias=5)
    p.server.subscribe_ok(other, track_alias=5)
    p.pump()
    assert p.closed_by["client"][0] == SessionCode.DUPLICATE_TRACK_ALIAS


def test_subscriptions_to_one_track_may_share_an_alias() -> None:
    p, first, other = _two_subscribes(b"t")
    p.server.subscribe_ok(first, track_alias=5)
    p.server.subscribe_ok(other, track_alias=5)
    p.pump()
    assert not p.closed


def test_alias_of_an_ended_subscription_may_be_reused() -> None:
    p, first, other = _two_subscribes(b"u")
    p.server.subscribe_ok(first, track_alias=5)
    p.server.publish_done(first, 2)
    p.server.subscribe_ok(other, track_alias=5)
    p.pump()
    assert not p.closed
    assert [e.request_id for e in of_type(p.events(p.client), ev.SubscribeAccepted)] == [
        first, other]


def test_publish_with_the_alias_of_another_live_track() -> None:
    p = established()
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    p.events(p.server)
    p.server.subscribe_ok(rid, track_alias=5)
    p.server.publish(NS, b"other", track_alias=5)
    p.pump()
    assert p.closed_by["client"][0] == SessionCode.DUPLICATE_TRACK_ALIAS
