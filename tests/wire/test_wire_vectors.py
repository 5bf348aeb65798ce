"""Every draft-22 vector decodes to the fields its ``encodes`` text describes and re-encodes."""

from __future__ import annotations

import pytest

from kvcs.moqt import wire
from kvcs.moqt.errors import ProtocolError, SessionCode

from .vectors import BY_NAME, VECTORS, vec

P = wire.Parameters
LF = wire.LocationFilter
LV = (b"live",)

#: Expected decoded message for every control vector (concrete field values).
CONTROL: dict[str, object] = {
    "client_setup": wire.Setup(wire.SetupOptions(path=b"/moq", authority=b"relay.example.com")),
    "publish_namespace": wire.PublishNamespace(0, LV, P()),
    "publish": wire.Publish(2, LV, b"video", 1, P(), ()),
    "subscribe_ok_no_largest": wire.SubscribeOk(1, P(), ()),
    "subscribe_ok_largest_3_7": wire.SubscribeOk(1, P(largest_object=wire.Location(3, 7))),
    "request_update_ok_largest_3_7": wire.RequestOk(P(largest_object=wire.Location(3, 7))),
    "publish_done_track_ended_unknown_count": wire.PublishDone(2, 2**64 - 1, "done"),
    "server_setup_filter_ranges_16_request_updates_4": wire.Setup(
        wire.SetupOptions(max_filter_ranges=16, max_request_updates=4)
    ),
    "subscribe_location_filter_empty": wire.Subscribe(
        9, LV, b"video", P(location_filter=LF.none())
    ),
    "subscribe_location_filter_next_group": wire.Subscribe(
        9, LV, b"video", P(location_filter=LF.relative_start(0))
    ),
    "subscribe_location_filter_relative_3": wire.Subscribe(
        9, LV, b"video", P(location_filter=LF.relative_start(3))
    ),
    "subscribe_location_filter_next_object": wire.Subscribe(
        9, LV, b"video", P(location_filter=LF.next_object())
    ),
    "subscribe_location_filter_start_12_5": wire.Subscribe(
        9, LV, b"video", P(location_filter=LF.absolute_start(12, 5))
    ),
    "subscribe_location_filter_range_12_5_delta_3": wire.Subscribe(
        9, LV, b"video", P(location_filter=LF.absolute_group_end(12, 5, 3))
    ),
    "subscribe_location_filter_range_12_5_delta_3_end_object_7": wire.Subscribe(
        9, LV, b"video", P(location_filter=LF.absolute_range(12, 5, 3, 7))
    ),
    # Count-less FILL_PARAMETERS (moqxr form): decodes, re-encodes in the counted form.
    "subscribe_join_current_group_with_fill_include_properties_0": wire.Subscribe(
        9,
        LV,
        b"video",
        P(
            location_filter=LF.next_object(),
            fill=P(location_filter=LF.relative_start(1)),
            include_properties=0,
        ),
    ),
    "subscribe_tracks_next_object_group_order_descending": wire.SubscribeTracks(
        0x5D, LV, P(location_filter=LF.next_object(), group_order=2)
    ),
    # Empty FILL_PARAMETERS value: decodes as an empty inner list.
    "request_update_fill_whole_track": wire.RequestUpdate(0x5F, P(fill=P())),
    "publish_ok_expires_30000": wire.RequestOk(P(expires=30000)),
    "fetch_range_12_5_to_15_9": wire.Fetch(
        7, LV, b"video", P(location_filter=LF.absolute_range(12, 5, 3, 9))
    ),
    "fetch_ok_inclusive_end_15_9": wire.FetchOk(False, wire.Location(15, 9), P(), ()),
    "goaway_no_uri_timeout_5000": wire.GoAway(b"", 5000),
    "publish_state_notify_largest_3_7_forward_0": wire.PublishStateNotify(
        P(largest_object=wire.Location(3, 7), forward=0)
    ),
    "publish_skipped_cam2_video": wire.PublishSkipped((b"cam2",), b"video"),
    "capture_subscribe_objectid_filter": wire.Subscribe(
        1, (b"media",), b"vide_1", P(range_filters=(wire.RangeFilter(0x26, 0, ((1, 1),)),))
    ),
    "capture_subscribe_ok_alias1": wire.SubscribeOk(1),
    "capture_publish_done_track_ended_2streams": wire.PublishDone(2, 2, ""),
    "capture_publish_minimal": wire.Publish(1, (b"media",), b"test", 2),
    "capture_request_error_unauthorized": wire.RequestError(1, 0, "invalid SUBSCRIBE", None),
    "capture_request_update_subscriber_priority_100": wire.RequestUpdate(
        3, P(subscriber_priority=100)
    ),
    "capture_track_status": wire.TrackStatus(5, (b"media",), b"vide_1", P()),
    "capture_request_ok_largest_0_1": wire.RequestOk(P(largest_object=wire.Location(0, 1))),
    "capture_request_ok_empty": wire.RequestOk(P(), ()),
    "capture_goaway_timeout_10000": wire.GoAway(b"", 10000),
    "capture_subscribe_auth_use_alias0": wire.Subscribe(
        1, (b"media",), b"vide_1", P(auth_tokens=(wire.AuthToken(2, 0),))
    ),
    "capture_publish_state_notify_empty": wire.PublishStateNotify(P()),
    "derived_subscribe_exactly_once_fill_countprefixed": wire.Subscribe(
        0,
        (b"kv", b"sess1"),
        b"layer0",
        P(location_filter=LF.next_object(), fill=P(location_filter=LF.none())),
    ),
    "derived_subscribe_exactly_once_fill_nocount": wire.Subscribe(
        0,
        (b"kv", b"sess1"),
        b"layer0",
        P(location_filter=LF.next_object(), fill=P(location_filter=LF.none())),
    ),
    "derived_subscribe_ok_alias7_largest_4_2": wire.SubscribeOk(
        7, P(largest_object=wire.Location(4, 2))
    ),
    "derived_publish_done_track_ended_3_streams": wire.PublishDone(2, 3, ""),
    "derived_request_update_forward1_fill_relative1": wire.RequestUpdate(
        2, P(forward=1, fill=P(location_filter=LF.relative_start(1)))
    ),
    "derived_client_setup_impl": wire.Setup(
        wire.SetupOptions(implementation="kvmoq/0.1", max_request_updates=4)
    ),
}

#: Vectors whose FILL_PARAMETERS use the count-less form: we re-encode count-prefixed (U1).
COUNTLESS_FILL = {
    "subscribe_join_current_group_with_fill_include_properties_0": (
        "0300180901046c69766505766964656f0321050204012101011200"
    ),
    "request_update_fill_whole_track": "0200055f01230100",
    "derived_subscribe_exactly_once_fill_nocount": (
        "03001a0002026b76057365737331066c61796572300221050203012100"
    ),
}

CONTROL_NAMES = [v["name"] for v in VECTORS if v["kind"] == "control"]


def test_every_vector_is_covered() -> None:
    covered = set(CONTROL) | {
        "capture_unknown_control_type_0x7e",
        "fetch_header_fill_req_95",
        "subgroup_header_alias1_g3_sg0",
        "param_subgroup_filter_set0_3to5_10to15",
        "param_object_property_filter_set1_prop16_from100",
        "fetch_object_end_of_timed_out_range_g2_o4",
        "capture_padding_stream_prefix",
        "capture_unknown_datagram_type",
        "derived_subgroup_stream_0x14",
        "derived_subgroup_stream_props_0x15",
        "derived_subgroup_end_of_group_status_0x30",
        "derived_datagram_0x00",
        "derived_datagram_0x0c_default_prio_obj0",
        "derived_datagram_0x28_status_eot",
        "derived_fetch_stream_asc",
    }
    assert covered == set(BY_NAME)


@pytest.mark.parametrize("name", [n for n in CONTROL_NAMES if n in CONTROL])
def test_control_vector(name: str) -> None:
    raw = vec(name)
    msgs = wire.ControlStreamParser().feed(raw)
    assert len(msgs) == 1
    assert msgs[0] == CONTROL[name]
    # decode_message on the body directly gives the same
    r = wire.Reader(raw)
    t = r.vi64()
    ln = r.u16()
    assert ln == r.remaining
    assert wire.decode_message(t, r.rest()) == CONTROL[name]
    enc = wire.encode_message(msgs[0])
    if name in COUNTLESS_FILL:
        # U1: we send the count-prefixed form; that form round-trips too.
        assert enc == bytes.fromhex(COUNTLESS_FILL[name])
        assert wire.ControlStreamParser().feed(enc) == [CONTROL[name]]
    else:
        assert enc == raw


def test_unknown_control_type_vector() -> None:
    with pytest.raises(ProtocolError) as ei:
        wire.ControlStreamParser().feed(vec("capture_unknown_control_type_0x7e"))
    assert ei.value.code == SessionCode.PROTOCOL_VIOLATION


def test_fetch_header_vector() -> None:
    p = wire.DataStreamParser()
    assert p.feed(vec("fetch_header_fill_req_95")) == [wire.FetchHeader(95)]
    assert p.kind == "fetch"
    p.finish()
    assert wire.FetchHeader(95).encode() == vec("fetch_header_fill_req_95")
    assert wire.FetchWriter(95).header_bytes() == vec("fetch_header_fill_req_95")


def test_subgroup_header_vector() -> None:
    raw = vec("subgroup_header_alias1_g3_sg0")
    hdr = wire.SubgroupHeader.decode(raw)
    assert hdr == wire.SubgroupHeader(1, 3, 0, None)
    assert hdr.subgroup_id_mode == 0 and not hdr.has_properties and not hdr.end_of_group
    assert hdr.encode() == raw
    p = wire.DataStreamParser()
    assert p.feed(raw) == [hdr]
    p.finish()


def _range_param(raw: bytes) -> wire.RangeFilter:
    r = wire.Reader(raw)
    t = r.vi64()
    return wire.RangeFilter.read_value(t, r.sub(r.vi64()))


def test_subgroup_filter_param_vector() -> None:
    raw = vec("param_subgroup_filter_set0_3to5_10to15")
    rf = _range_param(raw)
    assert rf == wire.RangeFilter(0x25, 0, ((3, 5), (10, 15)))
    assert wire.encode_parameters(wire.Parameters(range_filters=(rf,))) == b"\x01" + raw


def test_object_property_filter_param_vector() -> None:
    raw = vec("param_object_property_filter_set1_prop16_from100")
    rf = _range_param(raw)
    assert rf == wire.RangeFilter(0x28, 1, ((100, None),), property_type=16)
    assert rf.is_valid()
    assert wire.encode_parameters(wire.Parameters(range_filters=(rf,))) == b"\x01" + raw


def test_end_of_timed_out_range_vector() -> None:
    raw = vec("fetch_object_end_of_timed_out_range_g2_o4")
    p = wire.DataStreamParser()
    items = p.feed(b"\x05\x00" + raw)
    assert items == [wire.FetchHeader(0), wire.EndOfRange(0x20C, 2, 4)]
    p.finish()
    assert wire.FetchWriter(0).end_of_range(0x20C, 2, 4) == raw


def test_padding_stream_vector() -> None:
    p = wire.DataStreamParser()
    assert p.feed(vec("capture_padding_stream_prefix") + bytes(100)) == []
    assert p.kind == "padding"
    assert p.feed(bytes(1000)) == []
    p.finish()


def test_unknown_datagram_vector() -> None:
    with pytest.raises(ProtocolError) as ei:
        wire.decode_datagram(vec("capture_unknown_datagram_type"))
    assert ei.value.code == SessionCode.PROTOCOL_VIOLATION


def _rec(g, sg, o, prio, payload, status=0, props=(), dg=False):  # type: ignore[no-untyped-def]
    return wire.ObjectRecord(g, o, sg, prio, status, props, memoryview(payload), dg)


def test_derived_subgroup_streams() -> None:
    # 0x14: explicit subgroup id, priority byte present.
    raw = vec("derived_subgroup_stream_0x14")
    items = wire.DataStreamParser().feed(raw)
    hdr = wire.SubgroupHeader(2, 0, 0, 0, subgroup_id_mode=2)
    assert items == [hdr, _rec(0, 0, 0, 0, b"abcd"), _rec(0, 0, 1, 0, b"efgh")]
    w = wire.SubgroupWriter(hdr)
    assert (
        w.header_bytes() + w.object_prefix(0, 4) + b"abcd" + w.object_prefix(1, 4) + b"efgh" == raw
    )

    raw = vec("derived_subgroup_stream_props_0x15")
    items = wire.DataStreamParser().feed(raw)
    hdr = wire.SubgroupHeader(2, 0, 0, 0, has_properties=True, subgroup_id_mode=2)
    assert items == [hdr, _rec(0, 0, 0, 0, b"abcd", props=((0x78, 5),)), _rec(0, 0, 1, 0, b"efgh")]
    w = wire.SubgroupWriter(hdr)
    out = w.header_bytes() + w.object_prefix(0, 4, properties=((0x78, 5),)) + b"abcd"
    assert out + w.object_prefix(1, 4) + b"efgh" == raw

    raw = vec("derived_subgroup_end_of_group_status_0x30")
    items = wire.DataStreamParser().feed(raw)
    hdr = wire.SubgroupHeader(1, 9)
    assert items == [hdr, _rec(9, 0, 0, None, b"x"), _rec(9, 0, 1, None, b"", status=3)]
    w = wire.SubgroupWriter(hdr)
    assert w.header_bytes() + w.object_prefix(0, 1) + b"x" + w.object_prefix(1, 0, status=3) == raw


def test_derived_datagrams() -> None:
    raw = vec("derived_datagram_0x00")
    alias, rec, eog = wire.decode_datagram(raw)  # type: ignore[misc]
    assert (alias, eog) == (1, False)
    assert rec == _rec(5, 0, 3, 0x80, b"hi", dg=True)
    assert wire.encode_datagram(alias, rec, eog) == raw

    raw = vec("derived_datagram_0x0c_default_prio_obj0")
    alias, rec, eog = wire.decode_datagram(raw)  # type: ignore[misc]
    assert (alias, eog) == (1, False)
    assert rec == _rec(5, 0, 0, None, b"hi", dg=True)
    assert wire.encode_datagram(alias, rec, eog) == raw

    raw = vec("derived_datagram_0x28_status_eot")
    alias, rec, eog = wire.decode_datagram(raw)  # type: ignore[misc]
    assert (alias, eog) == (1, False)
    assert rec == _rec(5, 0, 3, None, b"", status=4, dg=True)
    assert wire.encode_datagram(alias, rec, eog) == raw


def test_derived_fetch_stream() -> None:
    raw = vec("derived_fetch_stream_asc")
    items = wire.DataStreamParser().feed(raw)
    assert items == [
        wire.FetchHeader(0),
        _rec(0, 0, 0, 0x80, b"A"),
        _rec(0, 0, 1, 0x80, b"B"),
        _rec(1, 0, 0, 0x80, b"C"),
        wire.EndOfRange(0x8C, 1, 5),
        _rec(1, 0, 6, 0x80, b"D"),
    ]
    w = wire.FetchWriter(0)
    out = w.header_bytes()
    out += w.object_prefix(0, 0, 0, 0x80, 1) + b"A"
    out += w.object_prefix(0, 0, 1, 0x80, 1) + b"B"
    out += w.object_prefix(1, 0, 0, 0x80, 1) + b"C"
    out += w.end_of_range(0x8C, 1, 5)
    out += w.object_prefix(1, 0, 6, 0x80, 1) + b"D"
    assert out == raw
