"""Helpers: filter bounds, namespace prefix/rendering, writer guards, payload limit."""

from __future__ import annotations

import pytest

from kvcs.moqt.errors import ProtocolError, SessionCode
from kvcs.moqt.wire import (
    MAX_VI64,
    DataStreamParser,
    FetchWriter,
    Location,
    LocationFilter,
    ObjectRecord,
    SubgroupHeader,
    SubgroupWriter,
    encode_datagram,
    encode_vi64,
    namespace_has_prefix,
    prop_get,
    render_full_name,
)

L = Location


def test_location_filter_bounds() -> None:
    lg = L(10, 4)
    assert LocationFilter.none().bounds(lg) == (L(0, 0), None)
    assert LocationFilter.relative_start(0).bounds(lg) == (L(11, 0), None)
    assert LocationFilter.relative_start(1).bounds(lg) == (L(10, 0), None)
    assert LocationFilter.relative_start(3).bounds(lg) == (L(8, 0), None)
    assert LocationFilter.relative_start(50).bounds(lg) == (L(0, 0), None)
    assert LocationFilter.relative_start(2).bounds(None) == (L(0, 0), None)
    assert LocationFilter.relative_start(0).bounds(L(MAX_VI64, 0)) == (L(MAX_VI64, 0), None)
    assert LocationFilter.absolute_start(12, 5).bounds(lg) == (L(12, 5), None)
    assert LocationFilter.absolute_group_end(12, 5, 3).bounds(lg) == (L(12, 5), L(15, MAX_VI64))
    assert LocationFilter.absolute_range(12, 5, 3, 7).bounds(None) == (L(12, 5), L(15, 7))
    assert LocationFilter.next_object().bounds(lg) == (L(10, 5), None)
    assert LocationFilter.next_object().bounds(None) == (L(0, 0), None)
    assert L(1, 5) < L(2, 0) < L(2, 1)


def test_namespace_helpers() -> None:
    assert namespace_has_prefix((b"foo", b"bar"), (b"foo",))
    assert namespace_has_prefix((b"foo",), ())
    assert not namespace_has_prefix((b"foobar",), (b"foo",))
    assert not namespace_has_prefix((b"foo",), (b"foo", b"bar"))
    name = render_full_name((b"example.net", b"team2", b"project_x"), b"report")
    assert name == "example.2enet-team2-project_x--report"
    assert render_full_name((), b"a-b\xff") == "--a.2db.ff"


def test_prop_get() -> None:
    props = ((0x04, 100), (0x0B, b"imm"), (0x04, 5))
    assert prop_get(props, 0x04) == 100
    assert prop_get(props, 0x0B) == b"imm"
    assert prop_get(props, 0x0E, 128) == 128


def test_writer_guards() -> None:
    w = SubgroupWriter(SubgroupHeader(1, 2))
    w.object_prefix(5, 1)
    with pytest.raises(ValueError):
        w.object_prefix(5, 1)  # not increasing
    with pytest.raises(ValueError):
        w.object_prefix(6, 3, status=3)  # status with payload
    with pytest.raises(ValueError):
        w.object_prefix(7, 0, properties=((0x78, 1),))  # no PROPERTIES bit
    with pytest.raises(ValueError):
        SubgroupWriter(SubgroupHeader(1, 2, 4, subgroup_id_mode=1)).object_prefix(3, 1)
    f = FetchWriter(1)
    f.object_prefix(5, 0, 0, 1, 1)
    with pytest.raises(ValueError):
        f.object_prefix(4, 0, 0, 1, 1)  # ascending fetch going back
    fd = FetchWriter(1, descending=True)
    fd.object_prefix(5, 0, 0, 1, 1)
    with pytest.raises(ValueError):
        fd.object_prefix(6, 0, 0, 1, 1)
    with pytest.raises(ValueError):
        f.end_of_range(0x8D, 1, 1)
    rec = ObjectRecord(1, 1, 0, None, 3, (), memoryview(b""), True)
    with pytest.raises(ValueError):
        encode_datagram(1, rec, end_of_group=True)
    with pytest.raises(ValueError):
        encode_vi64(2**64)
    with pytest.raises(ValueError):
        encode_vi64(-1)


def test_payload_limit() -> None:
    hdr = SubgroupWriter(SubgroupHeader(1, 2))
    raw = hdr.header_bytes() + hdr.object_prefix(0, 2**40) + b"x"
    with pytest.raises(ProtocolError) as ei:
        DataStreamParser().feed(raw)
    assert ei.value.code == SessionCode.PROTOCOL_VIOLATION
    p = DataStreamParser(max_payload=10)
    with pytest.raises(ProtocolError):
        p.feed(hdr.header_bytes() + b"\x00\x0b" + b"x" * 5)
