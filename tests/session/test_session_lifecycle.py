"""Sans-IO session: SETUP, request IDs and the lifecycle of every request type (Pair)."""

from __future__ import annotations

from kvcs.moqt import events as ev
from kvcs.moqt.actions import ResetStream, SendStreamData, StopSending
from kvcs.moqt.errors import PublishDoneCode, RequestErrorCode, SessionCode, StreamResetCode
from kvcs.moqt.serving import TrackServer
from kvcs.moqt.session import SessionConfig
from kvcs.moqt.track import CachedObject, Track
from kvcs.moqt.wire import (
    Location,
    ObjectStatus,
    Parameters,
    Publish,
    PublishNamespace,
    RequestUpdate,
    Subscribe,
    SubscribeNamespace,
    TrackStatus,
    encode_message,
)

from .pair import Pair, close_codes, established, kinds, of_type

NS = (b"kv", b"m")


def _track(groups: int = 3, objects: int = 4, prio: int = 10) -> Track:
    t = Track(NS, b"t", origin=True)
    for g in range(groups):
        for o in range(objects):
            t.add(CachedObject(g, o, 0, prio, 0, (), bytes([g, o]) * 8))
    return t


def _serve(p: Pair, track: Track) -> TrackServer:
    """Answer every pending SUBSCRIBE/FETCH/TRACK_STATUS on the server from ``track``."""
    server = TrackServer(p.server)
    _drain_server(p, server, track)
    return server


def _drain_server(p: Pair, server: TrackServer, track: Track) -> list:
    out = []
    for e in p.events(p.server):
        if server.handle(e):
            continue
        if isinstance(e, ev.RequestReceived):
            m = e.message
            if isinstance(m, Subscribe):
                server.serve_subscribe(e.request_id, m, track)
            elif isinstance(m, TrackStatus):
                server.serve_track_status(e.request_id, m, track)
            else:
                server.serve_fetch(e.request_id, m, track)  # type: ignore[arg-type]
        out.append(e)
    p.pump()
    return out


# ----------------------------------------------------------------------------- SETUP


def test_setup_options_seen_both_ways() -> None:
    p = Pair(
        SessionConfig(is_client=True, path=b"/moq", authority=b"relay.example.com",
                      implementation="cli/1", max_request_updates=4),
        SessionConfig(is_client=False, implementation="srv/2", max_filter_ranges=7),
    )
    p.pump()
    (c,) = p.events(p.client)
    (s,) = p.events(p.server)
    assert isinstance(c, ev.SessionEstablished) and isinstance(s, ev.SessionEstablished)
    assert s.options.path == b"/moq" and s.options.authority == b"relay.example.com"
    assert s.options.implementation == "cli/1" and s.options.max_request_updates == 4
    assert c.options.implementation == "srv/2" and c.options.max_filter_ranges == 7
    assert c.options.path is None and c.options.authority is None
    assert p.client.peer_setup == c.options and p.server.peer_setup == s.options
    # the control stream is the client's first uni stream and starts with af 00
    first = next(a for _, a in p.wire if isinstance(a, SendStreamData))
    assert first.stream_id == 2
    assert bytes(first.data)[:2] == b"\xaf\x00"


def test_webtransport_client_sends_no_path_or_authority() -> None:
    p = Pair(SessionConfig(is_client=True, webtransport=True, path=b"/x", authority=b"h"),
             SessionConfig(is_client=False, webtransport=True))
    p.pump()
    (s,) = p.events(p.server)
    assert s.options.path is None and s.options.authority is None
    assert not p.closed


def test_requests_pipelined_before_peer_setup_are_buffered() -> None:
    p = Pair()
    track = _track()
    # the client sends SUBSCRIBE right after its SETUP; deliver the request stream first
    rid = p.client.subscribe(NS, b"t", Parameters())
    acts = p.client.actions()
    control = [a for a in acts if getattr(a, "stream_id", None) == 2]
    rest = [a for a in acts if a not in control]
    p._deliver(rest, p.server, "server")
    assert kinds(p.events(p.server)) == []  # nothing processed before SETUP
    p._deliver(control, p.server, "server")
    got = p.events(p.server)
    assert kinds(got) == ["SessionEstablished", "RequestReceived"]
    assert got[1].request_id == rid
    server = TrackServer(p.server)
    server.serve_subscribe(rid, got[1].message, track)
    p.pump()
    assert "SubscribeAccepted" in kinds(p.events(p.client))
    assert not p.closed


def test_data_reset_and_datagram_before_peer_setup_are_replayed_in_order() -> None:
    from kvcs.moqt.wire import ObjectRecord

    p = Pair()
    rid = p.client.subscribe(NS, b"t")
    p._deliver(p.client.actions(), p.server, "server")
    p.events(p.server)
    p.server.subscribe_ok(rid, track_alias=4)
    sid = p.server.open_subgroup(rid, 0)
    p.server.write_object(sid, 0, b"early")
    p.server.reset_data_stream(sid, StreamResetCode.DELIVERY_TIMEOUT)
    p.server.send_datagram(rid, ObjectRecord(1, 0, 0, 128, 0, (), b"dgram"))
    acts = p.server.actions()
    control = [a for a in acts if getattr(a, "stream_id", None) == 3]
    p._deliver([a for a in acts if a not in control], p.client, "client")
    assert kinds(p.events(p.client)) == ["SubscribeAccepted"]  # on our own request stream
    p._deliver(control, p.client, "client")
    evs = p.events(p.client)
    assert kinds(evs) == ["SessionEstablished", "ObjectReceived", "DataStreamEnded",
                          "ObjectReceived"]
    assert bytes(evs[1].record.payload) == b"early"
    assert evs[2].reset_code == StreamResetCode.DELIVERY_TIMEOUT
    assert bytes(evs[3].record.payload) == b"dgram"
    assert not p.closed


def test_request_id_parity_and_sequence() -> None:
    p = established()
    ids_c = [p.client.track_status(NS, b"t"), p.client.fetch(NS, b"t"),
             p.client.subscribe(NS, b"t")]
    ids_s = [p.server.track_status(NS, b"t"), p.server.subscribe_namespace((b"kv",))]
    assert ids_c == [0, 2, 4]
    assert ids_s == [1, 3]
    p.pump()
    got = [e.request_id for e in p.events(p.server) if isinstance(e, ev.RequestReceived)]
    assert got == ids_c
    # REQUEST_UPDATE consumes a fresh ID of the same sequence
    uid = p.client.request_update(ids_c[2], Parameters(subscriber_priority=3))
    assert uid == 6
    p.pump()
    (upd,) = of_type(p.events(p.server), ev.UpdateReceived)
    assert (upd.request_id, upd.update_id) == (4, 6)
    assert not p.closed


# ------------------------------------------------------------------------- SUBSCRIBE


def test_subscribe_ok_objects_publish_done_stream_count() -> None:
    p = established()
    track = Track(NS, b"t", origin=True)
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    server = _serve(p, track)
    (ok,) = of_type(p.events(p.client), ev.SubscribeAccepted)
    assert ok.message.params.largest_object is None  # empty track
    for g in range(3):
        for sg in range(2):  # two subgroups per group: 6 streams
            for o in range(3):
                track.add(CachedObject(g, o * 2 + sg, sg, 5, 0, (), b"x" * (o + 1)))
        track.close_group(g)
    track.add(CachedObject(3, 0, 0, 5, ObjectStatus.END_OF_TRACK, (), b""))  # 7th stream
    p.pump()
    evs = p.events(p.client)
    objs = of_type(evs, ev.ObjectReceived)
    assert len(objs) == 19
    ended = of_type(evs, ev.DataStreamEnded)
    assert len({e.stream_id for e in ended}) == 7
    assert all(e.reset_code is None for e in ended)
    (done,) = of_type(evs, ev.SubscriptionEnded)
    assert done.request_id == rid
    assert done.message.status == PublishDoneCode.TRACK_ENDED
    assert done.message.stream_count == 7
    assert kinds(evs)[-1] == "SubscriptionEnded"
    assert server.active == 0
    # both sides forgot the request
    assert not p.client.has_request(rid) and not p.server.has_request(rid)
    assert not p.closed


def test_subscribe_rejected_surfaces_request_error() -> None:
    p = established()
    rid = p.client.subscribe(NS, b"none")
    p.pump()
    (req,) = p.events(p.server)
    p.server.request_error(req.request_id, RequestErrorCode.DOES_NOT_EXIST, "no track", 5)
    p.pump()
    (rej,) = p.events(p.client)
    assert isinstance(rej, ev.RequestRejected) and rej.request_id == rid
    assert rej.message.code == RequestErrorCode.DOES_NOT_EXIST
    assert rej.message.reason == "no track" and rej.message.retry_interval == 5
    assert rej.update_id is None


# ----------------------------------------------------------------------------- FETCH


def test_fetch_ok_and_fetch_stream() -> None:
    p = established()
    track = _track(3, 4)
    from kvcs.moqt.wire import LocationFilter

    rid = p.client.fetch(NS, b"t", Parameters(location_filter=LocationFilter.absolute_range(
        0, 2, 1, 1)))
    p.pump()
    _serve(p, track)
    evs = p.events(p.client)
    assert kinds(evs)[0] == "FetchAccepted"
    assert evs[0].message.end_location == Location(1, 1)
    assert evs[0].message.end_of_track is False
    locs = [e.location for e in of_type(evs, ev.ObjectReceived)]
    assert locs == [Location(0, 2), Location(0, 3), Location(1, 0), Location(1, 1)]
    assert all(e.request_id == rid and e.fill_id is None for e in of_type(evs, ev.ObjectReceived))
    (end,) = of_type(evs, ev.DataStreamEnded)
    assert end.kind == "fetch" and end.reset_code is None
    payloads = [bytes(e.record.payload) for e in of_type(evs, ev.ObjectReceived)]
    assert payloads[0] == bytes([0, 2]) * 8


def test_fetch_past_largest_is_invalid_range() -> None:
    p = established()
    from kvcs.moqt.wire import LocationFilter

    p.client.fetch(NS, b"t", Parameters(location_filter=LocationFilter.absolute_start(9, 0)))
    p.pump()
    _serve(p, _track(2, 2))
    (rej,) = p.events(p.client)
    assert isinstance(rej, ev.RequestRejected)
    assert rej.message.code == RequestErrorCode.INVALID_RANGE


# ----------------------------------------------------------------------- TRACK_STATUS


def test_track_status_request_ok_then_fin() -> None:
    p = established()
    track = _track(2, 3)
    track.properties = ((0x04, 5000),)
    rid = p.client.track_status(NS, b"t")
    p.pump()
    _serve(p, track)
    (ok,) = p.events(p.client)
    assert isinstance(ok, ev.RequestAccepted) and ok.request_id == rid
    assert ok.message.params.largest_object == Location(1, 2)
    assert tuple(ok.message.track_properties) == ((0x04, 5000),)
    # the server FINed its side right after REQUEST_OK
    fins = [a for n, a in p.wire if n == "client" and isinstance(a, SendStreamData)
            and a.stream_id == 0 and a.end]
    assert fins, "no FIN after TRACK_STATUS_OK"
    # REQUEST_UPDATE is not allowed on TRACK_STATUS
    if p.client.has_request(rid):
        try:
            p.client.request_update(rid, Parameters())
        except ValueError:
            pass
        else:  # pragma: no cover
            raise AssertionError("REQUEST_UPDATE on TRACK_STATUS accepted")


# ------------------------------------------------------------------ namespace requests


def test_publish_namespace_ok_and_withdraw() -> None:
    p = established()
    rid = p.client.publish_namespace(NS)
    p.pump()
    (req,) = p.events(p.server)
    assert isinstance(req.message, PublishNamespace) and tuple(req.message.namespace) == NS
    p.server.request_ok(req.request_id)
    p.pump()
    (ok,) = p.events(p.client)
    assert isinstance(ok, ev.RequestAccepted) and ok.request_id == rid
    p.client.cancel(rid)
    p.pump()
    (cancelled,) = p.events(p.server)
    assert isinstance(cancelled, ev.RequestCancelled) and cancelled.request_id == rid
    assert not p.closed


def test_subscribe_namespace_namespace_and_done() -> None:
    p = established()
    rid = p.client.subscribe_namespace((b"kv",))
    p.pump()
    (req,) = p.events(p.server)
    assert isinstance(req.message, SubscribeNamespace)
    p.server.request_ok(req.request_id)
    p.server.namespace(req.request_id, (b"kv", b"a"))
    p.server.namespace(req.request_id, (b"kv", b"b", b"c"))
    p.server.namespace_done(req.request_id, (b"kv", b"a"))
    p.pump()
    evs = p.events(p.client)
    assert kinds(evs) == ["RequestAccepted", "NamespaceAnnounced", "NamespaceAnnounced",
                          "NamespaceWithdrawn"]
    assert [e.namespace for e in evs[1:]] == [(b"kv", b"a"), (b"kv", b"b", b"c"),
                                              (b"kv", b"a")]
    # the suffix is what travels on the wire
    msgs = [bytes(a.data) for n, a in p.wire if n == "client" and isinstance(a, SendStreamData)
            and a.stream_id == 0]
    assert any(m.startswith(b"\x08\x00\x03\x01\x01a") for m in msgs)
    # the responder ending the stream withdraws what is left
    p.server.cancel(req.request_id)
    p.pump()
    evs = p.events(p.client)
    assert ev.NamespaceWithdrawn(rid, (b"kv", b"b", b"c")) in evs


def test_namespace_done_before_namespace_is_violation() -> None:
    p = established()
    rid = p.client.subscribe_namespace((b"kv",))
    p.pump()
    (req,) = p.events(p.server)
    p.server.request_ok(req.request_id)
    from kvcs.moqt.wire import NamespaceDone

    # what a misbehaving server would send on the request stream
    sid = p.client.subscription_info(rid).stream_id
    p.client.stream_data(sid, encode_message(NamespaceDone((b"zz",))), False)
    p.pump()
    assert p.closed_by["client"][0] == SessionCode.PROTOCOL_VIOLATION


# ----------------------------------------------------------------------------- PUBLISH


def test_publish_from_peer_request_ok_objects_and_done() -> None:
    p = established()
    rid = p.server.publish(NS, b"pushed", Parameters(), ((0x0E, 7),))
    assert rid % 2 == 1
    p.pump()
    (req,) = p.events(p.client)
    assert isinstance(req, ev.RequestReceived) and isinstance(req.message, Publish)
    assert req.message.track_alias == p.server.subscription_info(rid).track_alias
    p.client.request_ok(req.request_id)
    sid = p.server.open_subgroup(rid, 0, 0, 3)
    p.server.write_object(sid, 0, b"hello")
    p.server.write_object(sid, 1, b"world", end=True)
    p.pump()
    evs = p.events(p.server)
    assert kinds(evs) == ["RequestAccepted"]
    evs = p.events(p.client)
    objs = of_type(evs, ev.ObjectReceived)
    assert [bytes(o.record.payload) for o in objs] == [b"hello", b"world"]
    assert all(o.request_id == rid for o in objs)
    # the subscriber of a PUBLISH may update it
    uid = p.client.request_update(rid, Parameters(forward=0))
    p.pump()
    (upd,) = p.events(p.server)
    assert isinstance(upd, ev.UpdateReceived) and upd.update_id == uid
    p.server.request_ok(rid, update_id=uid)
    p.server.publish_done(rid, PublishDoneCode.TRACK_ENDED)
    p.pump()
    evs = p.events(p.client)
    assert kinds(evs) == ["RequestAccepted", "SubscriptionEnded"]
    assert evs[1].message.stream_count == 1
    assert not p.closed


# ---------------------------------------------------------------------- REQUEST_UPDATE


def test_request_update_ok_and_error() -> None:
    p = established()
    track = _track(1, 1)
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    _serve(p, track)
    p.events(p.client)
    u1 = p.client.request_update(rid, Parameters(subscriber_priority=1))
    u2 = p.client.request_update(rid, Parameters(subscriber_priority=2))
    p.pump()
    ups = p.events(p.server)
    assert [u.update_id for u in ups] == [u1, u2]
    p.server.request_ok(rid, Parameters(largest_object=Location(0, 0)), update_id=u1)
    p.server.request_error(rid, RequestErrorCode.INTERNAL_ERROR, "no", update_id=u2)
    p.pump()
    a, r = p.events(p.client)
    assert isinstance(a, ev.RequestAccepted) and a.update_id == u1
    assert a.message.params.largest_object == Location(0, 0)
    assert isinstance(r, ev.RequestRejected) and r.update_id == u2
    assert not p.closed


def test_max_request_updates_exceeded_closes_session() -> None:
    p = established(server_cfg=SessionConfig(is_client=False, max_request_updates=1))
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    p.events(p.server)
    p.client.request_update(rid, Parameters(subscriber_priority=1))
    try:
        p.client.request_update(rid, Parameters(subscriber_priority=2))
    except ValueError:
        pass  # our side refuses to exceed the peer's limit
    else:  # pragma: no cover
        raise AssertionError("client exceeded the peer's MAX_REQUEST_UPDATES")
    # a misbehaving peer does it anyway
    raw = encode_message(RequestUpdate(rid + 4, Parameters(subscriber_priority=2)))
    p.server.stream_data(p.client.subscription_info(rid).stream_id, raw, False)
    p.pump()
    assert p.closed_by["server"][0] == SessionCode.TOO_MANY_REQUEST_UPDATES


def test_answered_updates_return_credit() -> None:
    p = established(server_cfg=SessionConfig(is_client=False, max_request_updates=1))
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    track = _track(1, 1)
    server = _serve(p, track)
    for i in range(3):
        p.client.request_update(rid, Parameters(subscriber_priority=i))
        p.pump()
        _drain_server(p, server, track)  # TrackServer answers each
        assert of_type(p.events(p.client), ev.RequestAccepted)
    assert not p.closed


# ----------------------------------------------------------------------------- GOAWAY


def test_goaway_from_server_and_client() -> None:
    p = established()
    p.server.goaway(b"moqt://other/x", 5000)
    p.pump()
    (g,) = p.events(p.client)
    assert isinstance(g, ev.GoAwayReceived)
    assert (g.new_session_uri, g.timeout_ms, g.request_id) == (b"moqt://other/x", 5000, None)
    try:
        p.client.goaway(b"moqt://x")
    except ValueError:
        pass
    else:  # pragma: no cover
        raise AssertionError("client GOAWAY with a URI")
    p.client.goaway()
    p.pump()
    (g2,) = p.events(p.server)
    assert isinstance(g2, ev.GoAwayReceived) and g2.new_session_uri == b""
    assert not p.closed


def test_second_goaway_is_violation() -> None:
    p = established()
    from kvcs.moqt.wire import GoAway

    p.server.goaway()
    p.client.stream_data(p.server.control_stream_id, encode_message(GoAway(b"", 0)), False)
    p.pump()
    assert close_codes([a for n, a in p.wire if n == "client"]) == []  # server sent none
    assert p.closed_by["client"][0] == SessionCode.PROTOCOL_VIOLATION


# ----------------------------------------------------------------------- cancellation


def test_cancel_subscription_resets_data_streams() -> None:
    p = established()
    track = _track(1, 2)
    rid = p.client.subscribe(NS, b"t")
    p.pump()
    server = _serve(p, track)
    track.add(CachedObject(1, 0, 0, 10, 0, (), b"live"))
    p.pump()
    objs = of_type(p.events(p.client), ev.ObjectReceived)
    assert len(objs) == 1
    data_sid = objs[0].stream_id
    p.client.cancel(rid)
    acts = p.client.actions()
    assert ResetStream(0, StreamResetCode.CANCELLED) in acts
    assert StopSending(0, StreamResetCode.CANCELLED) in acts
    p._deliver(acts, p.server, "server")
    evs = p.events(p.server)
    assert any(isinstance(e, ev.RequestCancelled) and e.request_id == rid for e in evs)
    for e in evs:
        server.handle(e)
    sacts = p.server.actions()
    assert ResetStream(data_sid, StreamResetCode.CANCELLED) in sacts
    p._deliver(sacts, p.client, "client")
    # new objects are not sent any more
    track.add(CachedObject(1, 1, 0, 10, 0, (), b"late"))
    p.pump()
    assert of_type(p.events(p.client), ev.ObjectReceived) == []
    assert server.active == 0
    assert not p.closed


def test_stop_sending_on_a_data_stream_resets_only_it() -> None:
    p = established()
    track = _track(1, 1)
    p.client.subscribe(NS, b"t")
    p.pump()
    _serve(p, track)
    track.add(CachedObject(1, 0, 0, 10, 0, (), b"a"))
    track.add(CachedObject(1, 1, 1, 10, 0, (), b"b"))
    p.pump()
    objs = of_type(p.events(p.client), ev.ObjectReceived)
    sid_a, sid_b = objs[0].stream_id, objs[1].stream_id
    assert sid_a != sid_b
    p.server.stop_sending(sid_a, StreamResetCode.CANCELLED)  # from the client
    p.pump()
    resets = [a for n, a in p.wire if n == "client" and isinstance(a, ResetStream)]
    assert [r.stream_id for r in resets] == [sid_a]
    track.add(CachedObject(1, 3, 1, 10, 0, (), b"c"))
    p.pump()
    objs = of_type(p.events(p.client), ev.ObjectReceived)
    assert [(o.stream_id, bytes(o.record.payload)) for o in objs] == [(sid_b, b"c")]


def test_end_of_range_marker_and_requester_fin() -> None:
    """A fetch stream may carry End of Range markers; a requester may FIN its side early."""
    from kvcs.moqt import events as _ev
    from kvcs.moqt.wire import END_OF_UNKNOWN_RANGE, Location

    from .pair import Pair as _Pair

    p = _Pair()
    p.pump()
    rid = p.client.fetch((b"ns",), b"t")
    p.client.finish_request(rid)  # we will send no REQUEST_UPDATE
    p.pump()
    assert any(isinstance(e, _ev.RequestReceived) for e in p.server.events())
    p.server.fetch_ok(rid, Location(0, 9))
    sid = p.server.open_fetch_stream(rid)
    p.server.write_fetch_object(sid, 0, 0, 0, 128, b"a")
    p.server.write_end_of_range(sid, END_OF_UNKNOWN_RANGE, 0, 5)
    p.server.write_fetch_object(sid, 0, 0, 6, 128, b"b")
    p.server.end_data_stream(sid)
    p.pump()
    evs = list(p.client.events())
    objs = [e.record.object_id for e in evs if isinstance(e, _ev.ObjectReceived)]
    marks = [e.marker for e in evs if isinstance(e, _ev.RangeMarkerReceived)]
    assert objs == [0, 6]
    assert [(m.kind, m.group_id, m.object_id) for m in marks] == [(END_OF_UNKNOWN_RANGE, 0, 5)]
    assert any(isinstance(e, _ev.DataStreamEnded) and e.reset_code is None for e in evs)
    assert not p.closed
