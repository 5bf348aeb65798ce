"""Hostile input: truncations, bad lengths, forbidden values, each with the right code."""

from __future__ import annotations

import pytest

from kvcs.moqt import wire
from kvcs.moqt.errors import ProtocolError, SessionCode, StreamError, StreamResetCode

from .vectors import VECTORS

PV = SessionCode.PROTOCOL_VIOLATION
KVFE = SessionCode.KEY_VALUE_FORMATTING_ERROR
#: Messages whose body ends with a KVP list: a cut at a KVP boundary is still well formed.
KVP_TAIL = (wire.Setup, wire.SubscribeOk, wire.RequestOk, wire.Publish, wire.FetchOk)


def _raises(code: int, fn, *args) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProtocolError) as ei:
        fn(*args)
    assert ei.value.code == code, ei.value


def _msg(t: int, body: bytes) -> bytes:
    return wire.encode_vi64(t) + len(body).to_bytes(2, "big") + body


def _decode_framed(raw: bytes) -> object:
    msgs = wire.ControlStreamParser().feed(raw)
    assert len(msgs) == 1
    return msgs[0]


CONTROL = [v for v in VECTORS if v["kind"] == "control" and "unknown" not in v["name"]]


@pytest.mark.parametrize("v", CONTROL, ids=lambda v: v["name"])
def test_truncated_control_vectors(v: dict) -> None:
    raw = bytes.fromhex(v["hex"])
    r = wire.Reader(raw)
    t = r.vi64()
    r.u16()
    body = bytes(r.rest())
    for k in range(len(body)):
        try:
            msg = wire.decode_message(t, body[:k])
        except ProtocolError as exc:
            assert exc.code == PV
        else:
            assert isinstance(msg, KVP_TAIL)
    for k in range(len(raw)):
        p = wire.ControlStreamParser()
        assert p.feed(raw[:k]) == []
        assert p.buffered == k


def test_length_field_too_long_or_short() -> None:
    # REQUEST_OK EXPIRES 30000, body declared one byte longer: trailing byte.
    _raises(PV, _decode_framed, bytes.fromhex("0700060108c0753000"))
    # GOAWAY body declared too long (trailing), too short (truncated vi64).
    _raises(PV, _decode_framed, bytes.fromhex("10000400938800"))
    _raises(PV, _decode_framed, bytes.fromhex("10000200930000"))
    # PUBLISH_DONE with a shorter length: reason truncated inside the body.
    _raises(PV, _decode_framed, bytes.fromhex("0b000e02ffffffffffffffffff04646f6e65"))


def test_unknown_message_type() -> None:
    _raises(PV, wire.ControlStreamParser().feed, bytes.fromhex("7e0000"))
    _raises(PV, wire.decode_message, 0x01, b"")  # reserved old SETUP type
    _raises(PV, wire.decode_message, 0x1E, b"")  # reserved old PUBLISH_OK


def test_unknown_and_disallowed_parameters() -> None:
    base = bytes.fromhex("0901046c69766505766964656f")  # SUBSCRIBE rid 9 live/video
    for t in (0x01, 0x05, 0x07, 0x24, 0x2A, 0x33, 0x36, 0x7F, 0x3FFF):
        _raises(PV, wire.decode_message, 0x03, base + b"\x01" + wire.encode_vi64(t) + b"\x00\x00")
    # EXPIRES (0x08) is known but not allowed in SUBSCRIBE; FORWARD not in SUBSCRIBE_OK.
    _raises(PV, wire.decode_message, 0x03, base + b"\x01\x08\x05")
    _raises(PV, wire.decode_message, 0x04, b"\x01\x01\x10\x01")
    # GROUP_ORDER never allowed in REQUEST_UPDATE; nothing allowed in FETCH_OK.
    _raises(PV, wire.decode_message, 0x02, b"\x01\x01\x22\x01")
    _raises(PV, wire.decode_message, 0x18, b"\x00\x00\x00\x01\x08\x01")
    # Repeated non-repeatable parameter (delta 0).
    _raises(PV, wire.decode_message, 0x07, b"\x02\x08\x01\x00\x02")
    # Repeatable: two auth tokens and two range filters are fine.
    msg = wire.decode_message(0x03, base + b"\x03\x03\x02\x02\x00\x00\x02\x02\x01\x22\x02\x00\x01")
    assert isinstance(msg, wire.Subscribe)
    assert len(msg.params.auth_tokens) == 2 and len(msg.params.range_filters) == 1
    # Parameter count larger than what follows.
    _raises(PV, wire.decode_message, 0x07, b"\x05\x08\x01")


def test_parameter_values() -> None:
    def params(raw: bytes) -> wire.Parameters:
        return wire.decode_parameters(wire.Reader(raw), wire.SUBSCRIBE_PARAMS | {0x09, 0x08})

    _raises(PV, params, b"\x01\x10\x02")  # FORWARD 2
    _raises(PV, params, b"\x01\x22\x00")  # GROUP_ORDER 0
    _raises(PV, params, b"\x01\x22\x03")  # GROUP_ORDER 3
    _raises(PV, params, b"\x01\x35\x02")  # INCLUDE_PROPERTIES 2
    _raises(PV, params, b"\x01\x21\x06")  # LOCATION_FILTER type 0x06
    _raises(PV, params, b"\x01\x21\x40")
    # LOCATION_FILTER start_group + delta overflows 2^64-1.
    _raises(PV, params, b"\x01\x21\x03" + b"\xff" * 9 + b"\x00\x01")
    _raises(PV, params, b"\x01\x21\x04\x01\x00" + b"\xff" * 9 + b"\x00")
    _raises(PV, params, b"\x01\x21\x04\x0c\x05")  # truncated filter fields
    # Undecodable Authorization Token -> KEY_VALUE_FORMATTING_ERROR.
    _raises(KVFE, params, b"\x01\x03\x01\x07")  # alias type 7
    _raises(KVFE, params, b"\x01\x03\x01\x02")  # USE_ALIAS without alias
    _raises(KVFE, params, b"\x01\x03\x03\x02\x00\x00")  # trailing bytes after USE_ALIAS
    _raises(KVFE, params, b"\x01\x03\x02\x01\x05")  # REGISTER without token type
    # Token length running past the body -> PROTOCOL_VIOLATION (framing).
    _raises(PV, params, b"\x01\x03\x09\x03\x00")
    # FILL_PARAMETERS: nested fill and TRACK_PROPERTY_FILTER forbidden inside.
    _raises(PV, params, b"\x01\x23\x03\x01\x23\x00")
    _raises(PV, params, b"\x01\x23\x02\x23\x00")
    _raises(PV, params, b"\x01\x23\x05\x01\x29\x02\x00\x00")
    _raises(PV, params, b"\x01\x23\x03\x01\x08\x01")  # EXPIRES not allowed inside
    # FILL_PARAMETERS both forms accepted.
    from_0 = wire.Parameters(location_filter=wire.LocationFilter(0))
    assert params(b"\x01\x23\x03\x01\x21\x00").fill == from_0
    assert params(b"\x01\x23\x02\x21\x00").fill == from_0
    assert params(b"\x01\x23\x00").fill == wire.Parameters()
    # Range filter overflow is an INVALID_FILTER matter: decoded, flagged invalid.
    p = params(b"\x01\x25\x0c\x00" + b"\xff" * 9 + b"\x00" + b"\x01")
    assert not p.range_filters[0].is_valid()
    p = params(b"\x01\x27\x04\x00\x00\x82\x00")  # priority range up to 512
    assert not p.range_filters[0].is_valid()
    p = params(b"\x01\x28\x03\x00\x03\x01")  # odd property type
    assert not p.range_filters[0].is_valid()


def test_namespace_limits() -> None:
    too_many = tuple(b"a" for _ in range(33))
    raw = wire.encode_message(wire.Subscribe(1, too_many, b"x"))
    _raises(PV, _decode_framed, raw)
    ok = tuple(b"a" for _ in range(32))
    ok_sub = wire.Subscribe(1, ok, b"x")
    assert _decode_framed(wire.encode_message(ok_sub)) == ok_sub
    _raises(PV, _decode_framed, wire.encode_message(wire.Subscribe(1, (b"a", b""), b"x")))
    _raises(PV, _decode_framed, wire.encode_message(wire.Subscribe(1, (b"a",), b"n" * 4096)))
    _raises(PV, _decode_framed, wire.encode_message(wire.Subscribe(1, (b"a" * 4000,), b"n" * 97)))
    _raises(PV, _decode_framed,
            wire.encode_message(wire.Subscribe(1, (b"a" * 2100, b"b" * 2000), b"")))
    ok_msg = wire.Subscribe(1, (b"a" * 4000,), b"n" * 96)
    assert _decode_framed(wire.encode_message(ok_msg)) == ok_msg
    _raises(PV, wire.validate_namespace, (b"",))
    _raises(PV, wire.validate_full_name, (b"a",), b"b" * 4096)
    # count announced over 32 without the fields present
    _raises(PV, wire.decode_message, 0x50, b"\x00\x21")


def test_reason_and_uri_limits() -> None:
    ok = wire.RequestError(1, 0, "r" * 1024)
    assert _decode_framed(wire.encode_message(ok)) == ok
    body = b"\x01\x00" + wire.encode_vi64(1025) + b"r" * 1025
    _raises(PV, wire.decode_message, 0x05, body)
    _raises(PV, wire.decode_message, 0x0B, b"\x02\x00" + wire.encode_vi64(1025) + b"r" * 1025)
    with pytest.raises(ValueError):
        wire.encode_message(wire.PublishDone(0, 0, "r" * 1025))
    # invalid UTF-8 is replaced, not an error
    msg = wire.decode_message(0x05, b"\x01\x00\x02\xff\xfe")
    assert isinstance(msg, wire.RequestError) and "\ufffd" in msg.reason
    uri = b"u" * 8192
    assert _decode_framed(wire.encode_message(wire.GoAway(uri, 1))) == wire.GoAway(uri, 1)
    _raises(PV, wire.decode_message, 0x10, wire.encode_vi64(8193) + b"u" * 8193 + b"\x00")


def test_request_error_redirect() -> None:
    # Code 0x34 requires the Redirect structure; missing -> truncated.
    _raises(PV, wire.decode_message, 0x05, b"\x34\x00\x00")
    # Redirect bytes after a non-redirect code are trailing bytes.
    _raises(PV, wire.decode_message, 0x05, b"\x01\x00\x00\x00\x00\x00")
    with pytest.raises(ValueError):
        wire.encode_message(wire.RequestError(0x34, 0, ""))


def test_message_too_large() -> None:
    with pytest.raises(ValueError):
        wire.encode_message(wire.PublishSkipped((b"a",), b"n" * 70000))


def test_kvp_errors() -> None:
    _raises(PV, wire.decode_kvps, b"\x01" + wire.encode_vi64(65536) + b"a" * 65536)
    _raises(PV, wire.decode_kvps, b"\x01\x05ab")  # truncated value
    _raises(PV, wire.decode_kvps, b"\x02")  # truncated even value
    _raises(PV, wire.decode_kvps, b"\xff" + b"\xff" * 8 + b"\x00\x02\x00")  # type overflow
    assert wire.decode_kvps(b"\x01" + wire.encode_vi64(65535) + b"a" * 65535)[0][0] == 1
    _raises(PV, wire.validate_track_properties, ((0x22, 3),))
    _raises(PV, wire.validate_track_properties, ((0x30, 2),))
    wire.validate_track_properties(((0x22, 2), (0x30, 1), (0x78, 9)))


def test_setup_option_errors() -> None:
    _raises(KVFE, wire.SetupOptions.decode, b"\x03\x01\x07")  # bad token
    _raises(PV, wire.SetupOptions.decode, b"\x03\x02\x02\x00")  # USE_ALIAS in SETUP
    _raises(PV, wire.SetupOptions.decode, b"\x03\x02\x00\x00")  # DELETE in SETUP
    _raises(KVFE, wire.SetupOptions.decode, b"\x07\x02\xff\xfe")  # implementation not UTF-8
    _raises(PV, wire.SetupOptions.decode, b"\x06\x01\x00\x02")  # duplicate MAX_FILTER_RANGES
    # Unknown and GREASE options ignored, duplicates accepted, kept in order.
    o = wire.SetupOptions.decode(b"\x06\x10\x10\x11\x00\x12\x80\x87\x01x\x00\x01y")
    assert o.max_filter_ranges == 16
    assert o.unknown == ((0x16, 0x11), (0x16, 0x12), (0x9D, b"x"), (0x9D, b"y"))
    tok = wire.AuthToken(3, None, 0, b"secret")
    encoded = wire.SetupOptions(auth_tokens=(tok,)).encode()
    assert wire.SetupOptions.decode(encoded).auth_tokens == (tok,)


# ------------------------------------------------------------------------ data streams


def _finish_raises(chunks: list[bytes], code: int = PV) -> None:
    p = wire.DataStreamParser()
    for c in chunks:
        p.feed(c)
    _raises(code, p.finish)


def _boundaries_subgroup() -> tuple[bytes, set[int]]:
    w = wire.SubgroupWriter(wire.SubgroupHeader(2, 0, 3, 1, has_properties=True))
    parts = [w.header_bytes()]
    parts.append(w.object_prefix(0, 4, properties=((0x78, 300), (0x79, b"zz"))) + b"abcd")
    parts.append(w.object_prefix(3, 0, status=3))
    raw = b""
    cuts = {0}
    for part in parts:
        raw += part
        cuts.add(len(raw))
    return raw, cuts


STREAM_VECTORS = [v for v in VECTORS if v["kind"] == "stream"]


@pytest.mark.parametrize("v", STREAM_VECTORS, ids=lambda v: v["name"])
def test_truncated_stream_vectors(v: dict) -> None:
    raw = bytes.fromhex(v["hex"])
    if v["name"].startswith("fetch_object"):
        raw = b"\x05\x00" + raw
    whole = wire.DataStreamParser()
    expected = whole.feed(raw)
    whole.finish()
    for k in range(len(raw)):
        p = wire.DataStreamParser()
        got = p.feed(raw[:k])
        assert got == expected[: len(got)]
        if k == 0 or p.in_progress:
            _raises(PV, p.finish)
        else:
            p.finish()
        assert got + p.feed(raw[k:]) == expected


def test_truncation_only_fails_inside_structures() -> None:
    raw, cuts = _boundaries_subgroup()
    for k in range(len(raw) + 1):
        p = wire.DataStreamParser()
        p.feed(raw[:k])
        if k in cuts and k:
            p.finish()
        else:
            _raises(PV, p.finish)


def test_bad_stream_types() -> None:
    for first in (
        b"\x00",
        b"\x06",
        b"\x0f",
        b"\x16",
        b"\x17",
        b"\x1e",
        b"\x1f",
        b"\x7e",
        b"\x80\x10",
        b"\x80\x30",
        b"\xf0\x13\x2b\x3e\x2a",
        b"\x40",
    ):
        _raises(PV, wire.DataStreamParser().feed, first + b"\x01\x02\x03\x04")
    assert wire.DataStreamParser().feed(b"\x80\x05\x01") != []  # non-minimal FETCH_HEADER type
    _raises(PV, wire.SubgroupHeader.decode, b"\x36\x01\x03")
    _raises(PV, wire.SubgroupHeader.decode, b"\x30\x01")
    _raises(PV, wire.SubgroupHeader.decode, b"\x30\x01\x03\x00")


def test_subgroup_object_errors() -> None:
    hdr = b"\x30\x01\x03"
    _raises(PV, wire.DataStreamParser().feed, hdr + b"\x00\x00\x01")  # status 1
    _raises(PV, wire.DataStreamParser().feed, hdr + b"\x00\x00\x05")  # status 5
    # properties on an End of Group status object
    _raises(PV, wire.DataStreamParser().feed, b"\x31\x01\x03" + b"\x00\x02\x78\x01\x00\x03")
    # object id overflow
    big = b"\xff" * 9
    _raises(PV, wire.DataStreamParser().feed, hdr + big + b"\x01x" + b"\x00\x01y")
    # FIN inside payload / object header
    _finish_raises([hdr + b"\x00\x05ab"])
    _finish_raises([hdr + b"\x00"])
    _finish_raises([b"\x30\x01"])
    _finish_raises([b""])


def test_fetch_object_errors() -> None:
    fh = b"\x05\x00"
    _raises(PV, wire.DataStreamParser().feed, fh + b"\x14\x00\x80\x00")  # first: no group
    _raises(PV, wire.DataStreamParser().feed, fh + b"\x18\x00\x80\x00")  # first: no object
    _raises(PV, wire.DataStreamParser().feed, fh + b"\x1d\x00\x00\x80\x00")  # sg = prior's
    _raises(PV, wire.DataStreamParser().feed, fh + b"\x1e\x00\x00\x80\x00")  # sg = prior+1
    _raises(PV, wire.DataStreamParser().feed, fh + b"\x0c\x00\x00\x00")  # no priority
    _raises(PV, wire.DataStreamParser().feed, fh + b"\x80\x8d\x00\x00")  # bad flags >= 0x80
    _raises(PV, wire.DataStreamParser().feed, fh + b"\x81\x00\x00\x00")
    # after a marker, group/object may be relative but subgroup/priority may not
    _raises(PV, wire.DataStreamParser().feed, fh + b"\x80\x8c\x01\x05\x00\x00")
    ok = wire.DataStreamParser().feed(fh + b"\x80\x8c\x01\x05\x10\x07\x00")
    assert ok[-1].object_id == 6 and ok[-1].group_id == 1  # type: ignore[union-attr]
    # descending underflow
    p = wire.DataStreamParser(lambda rid: True)
    _raises(PV, p.feed, fh + b"\x1c\x01\x00\x80\x00" + b"\x08\x01\x00")
    # ascending overflow
    w = wire.FetchWriter(0)
    raw = w.header_bytes() + w.object_prefix(2**64 - 1, 0, 0, 1, 0)
    _raises(PV, wire.DataStreamParser().feed, raw + b"\x08\x00\x00")
    _finish_raises([fh + b"\x1c\x00\x00"])
    _finish_raises([fh + b"\x80\x8c\x01"])


def test_datagram_errors() -> None:
    for t in (0x10, 0x22, 0x23, 0x40, 0x41, 0x7F):
        _raises(PV, wire.decode_datagram, bytes((t,)) + b"\x01\x05\x03\x80hi")
    _raises(PV, wire.decode_datagram, b"\x80\x40\x01\x05\x03\x80hi")
    _raises(PV, wire.decode_datagram, b"\x09\x01\x05\x03\x00hi")  # PROPERTIES with length 0
    _raises(PV, wire.decode_datagram, b"\x28\x01\x05\x03\x05")  # invalid status
    _raises(PV, wire.decode_datagram, b"\x29\x01\x05\x03\x02\x78\x01\x03")  # props + EOG status
    _raises(PV, wire.decode_datagram, b"\x28\x01\x05\x03\x04\x00")  # trailing after status
    _raises(PV, wire.decode_datagram, b"\x00\x01\x05")  # truncated
    _raises(PV, wire.decode_datagram, b"")
    assert wire.decode_datagram(wire.encode_vi64(0x132B3E29) + bytes(20)) is None
    res = wire.decode_datagram(b"\x29\x01\x05\x03\x02\x78\x01\x00")
    assert res is not None and res[1].properties == ((0x78, 1),)


# ------------------------------------------------- stream-only faults (StreamError)


def _stream_error(code: int, chunks: list[bytes], parser: wire.DataStreamParser | None = None,
                  ) -> list:
    """Feed ``chunks``; the last one must raise StreamError ``code``. Returns the items
    the stream yielded, those attached to the error included."""
    p = parser or wire.DataStreamParser()
    got: list = []
    for chunk in chunks[:-1]:
        got += p.feed(chunk)
    with pytest.raises(StreamError) as ei:
        p.feed(chunks[-1])
    assert ei.value.code == code, ei.value
    return got + ei.value.items


def test_object_after_end_of_group_is_a_malformed_track() -> None:
    w = wire.SubgroupWriter(wire.SubgroupHeader(1, 3))
    raw = (w.header_bytes() + w.object_prefix(0, 1) + b"a"
           + w.object_prefix(1, 0, status=3) + w.object_prefix(2, 1) + b"b")
    items = _stream_error(StreamResetCode.MALFORMED_TRACK, [raw])
    assert [getattr(i, "object_id", None) for i in items] == [None, 0, 1]  # before it: kept
    # End of Track too, and across chunks
    w = wire.SubgroupWriter(wire.SubgroupHeader(1, 3))
    raw = w.header_bytes() + w.object_prefix(0, 0, status=4) + w.object_prefix(1, 1) + b"z"
    _stream_error(StreamResetCode.MALFORMED_TRACK, [raw[:5], raw[5:]])


def test_repeated_fetch_object_is_a_malformed_track() -> None:
    fh = b"\x05\x00"
    first = b"\x1c\x02\x07\x80\x01a"  # group 2, object 7, priority 0x80, 1 byte
    again = b"\x04\x00\x01b"  # same group, object delta 0: object 7 again
    items = _stream_error(StreamResetCode.MALFORMED_TRACK, [fh + first + again])
    assert [getattr(i, "object_id", None) for i in items] == [None, 7]
    # after an End of Range marker, a delta of 0 lands after the marker: fine
    ok = wire.DataStreamParser().feed(fh + first + b"\x80\x8c\x02\x09" + again)
    assert ok[-1].object_id == 9  # type: ignore[union-attr]


def test_object_properties_over_the_limit() -> None:
    w = wire.SubgroupWriter(wire.SubgroupHeader(1, 3, 0, None, has_properties=True))
    raw = w.header_bytes() + w.object_prefix(0, 1, 0, ((0x79, b"p" * 300),)) + b"a"
    _stream_error(StreamResetCode.EXCESSIVE_LOAD, [raw], wire.DataStreamParser(max_properties=256))
    assert len(wire.DataStreamParser(max_properties=512).feed(raw)) == 2


def test_budget_charges_what_a_stream_keeps_between_chunks() -> None:
    budget = wire.ByteBudget(10_000)
    p = wire.DataStreamParser(budget=budget)
    w = wire.SubgroupWriter(wire.SubgroupHeader(1, 3))
    head = w.header_bytes() + w.object_prefix(0, 6000)
    p.feed(head + b"x" * 10)
    assert budget.used == 6000 == p.held  # allocated at its header
    p.feed(b"x" * 5990)
    assert budget.used == 0  # handed out
    prefix = w.object_prefix(1, 5000)
    p.feed(prefix[:1])  # an unfinished object header
    assert budget.used == 1
    p.feed(prefix[1:] + b"y")
    assert budget.used == 5000
    p.release()
    assert budget.used == 0 and p.held == 0
    # no room: EXCESSIVE_LOAD, nothing charged
    q = wire.DataStreamParser(budget=budget)
    w = wire.SubgroupWriter(wire.SubgroupHeader(1, 4))
    big = w.header_bytes() + w.object_prefix(0, 20_000) + b"z"
    _stream_error(StreamResetCode.EXCESSIVE_LOAD, [big], q)
    assert budget.used == 0
