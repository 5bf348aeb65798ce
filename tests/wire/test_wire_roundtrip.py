"""Hypothesis round trips for every codec structure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcs.moqt import wire

from .strategies import (
    ALL,
    TEXT_ALPHABET,
    auth_tokens,
    location_filters,
    names,
    namespaces,
    parameters,
    properties,
    setup_options,
    u8s,
    vi64s,
)

MAXV = 2**64 - 1
reasons = st.text(alphabet=TEXT_ALPHABET, max_size=20)


@given(vi64s)
def test_vi64(v: int) -> None:
    enc = wire.encode_vi64(v)
    assert len(enc) == wire.vi64_len(v)
    assert wire.decode_vi64(enc, 0) == (v, len(enc))
    assert wire.decode_vi64(b"\x00" + enc + b"\x00", 1) == (v, len(enc) + 1)


def test_vi64_sizes() -> None:
    assert wire.encode_vi64(MAXV) == b"\xff" * 9
    assert len(wire.encode_vi64(2**56)) == 9 and len(wire.encode_vi64(2**56 - 1)) == 8
    assert wire.decode_vi64(b"\x80\x25", 0) == (37, 2)
    for v, h in [
        (37, "25"),
        (15293, "bbbd"),
        (226442877, "ed7f3e7d"),
        (0x2F00, "af00"),
        (0x8C, "808c"),
        (0x20C, "820c"),
        (30000, "c07530"),
        (5000, "9388"),
    ]:
        assert wire.encode_vi64(v).hex() == h
        assert wire.decode_vi64(bytes.fromhex(h), 0) == (v, len(h) // 2)


@given(properties(max_size=6))
def test_properties(props: tuple) -> None:
    assert wire.decode_kvps(wire.encode_kvps(props)) == props


@given(auth_tokens())
def test_auth_token(tok: wire.AuthToken) -> None:
    assert wire.AuthToken.decode(tok.encode()) == tok


@given(location_filters())
def test_location_filter(lf: wire.LocationFilter) -> None:
    assert wire.LocationFilter.decode(lf.encode()) == lf


@given(setup_options())
def test_setup_options(o: wire.SetupOptions) -> None:
    assert wire.SetupOptions.decode(o.encode()) == o


@given(parameters(ALL))
def test_parameters_all(p: wire.Parameters) -> None:
    r = wire.Reader(wire.encode_parameters(p))
    assert wire.decode_parameters(r, ALL) == p
    assert r.at_end


def _msg_strategy() -> st.SearchStrategy:
    P = parameters
    return st.one_of(
        st.builds(wire.Setup, setup_options()),
        st.builds(wire.GoAway, st.binary(max_size=20), vi64s),
        st.builds(wire.Subscribe, vi64s, namespaces, names, P(wire.SUBSCRIBE_PARAMS)),
        st.builds(wire.SubscribeOk, vi64s, P(wire.SUBSCRIBE_OK_PARAMS), properties()),
        st.builds(wire.RequestUpdate, vi64s, P(wire.REQUEST_UPDATE_PARAMS)),
        st.builds(wire.RequestOk, P(wire.REQUEST_OK_PARAMS), properties()),
        st.builds(wire.RequestError, vi64s.filter(lambda c: c != 0x34), vi64s, reasons),
        st.builds(
            wire.RequestError,
            st.just(0x34),
            vi64s,
            reasons,
            st.builds(wire.Redirect, st.binary(max_size=20), namespaces, names),
        ),
        st.builds(wire.Publish, vi64s, namespaces, names, vi64s, P(wire.PUBLISH_PARAMS),
                  properties()),
        st.builds(wire.PublishDone, vi64s, vi64s, reasons),
        st.builds(wire.PublishStateNotify, P(wire.PUBLISH_STATE_NOTIFY_PARAMS)),
        st.builds(wire.Fetch, vi64s, namespaces, names, P(wire.FETCH_PARAMS)),
        st.builds(
            wire.FetchOk,
            st.booleans(),
            st.builds(wire.Location, vi64s, vi64s),
            P(wire.FETCH_OK_PARAMS),
            properties(),
        ),
        st.builds(wire.TrackStatus, vi64s, namespaces, names, P(wire.TRACK_STATUS_PARAMS)),
        st.builds(wire.PublishNamespace, vi64s, namespaces, P(wire.PUBLISH_NAMESPACE_PARAMS)),
        st.builds(wire.SubscribeNamespace, vi64s, namespaces, P(wire.SUBSCRIBE_NAMESPACE_PARAMS)),
        st.builds(wire.SubscribeTracks, vi64s, namespaces, P(wire.SUBSCRIBE_TRACKS_PARAMS)),
        st.builds(wire.Namespace, namespaces),
        st.builds(wire.NamespaceDone, namespaces),
        st.builds(wire.PublishSkipped, namespaces, names),
    )


messages = _msg_strategy()


@settings(max_examples=400)
@given(messages)
def test_message_roundtrip(msg: object) -> None:
    raw = wire.encode_message(msg)  # type: ignore[arg-type]
    assert wire.ControlStreamParser().feed(raw) == [msg]
    r = wire.Reader(raw)
    t = r.vi64()
    assert r.u16() == r.remaining
    assert wire.decode_message(t, r.rest()) == msg


# ------------------------------------------------------------------- data streams


@st.composite
def subgroup_streams(draw: st.DrawFn) -> tuple[wire.SubgroupHeader, list[wire.ObjectRecord]]:
    """A header and a valid object sequence for it."""
    mode = draw(st.integers(0, 2))
    props_bit = draw(st.booleans())
    prio = draw(st.one_of(st.none(), u8s))
    first = draw(st.one_of(st.integers(0, 5), vi64s.filter(lambda v: v < MAXV - 1000)))
    sg = 0 if mode == 0 else (first if mode == 1 else draw(vi64s))
    hdr = wire.SubgroupHeader(
        draw(vi64s),
        draw(vi64s),
        sg,
        prio,
        props_bit,
        draw(st.booleans()),
        draw(st.booleans()),
        mode,
    )
    recs = []
    oid = first
    steps = draw(st.lists(st.integers(1, 200), max_size=6))
    for i, step in enumerate(steps):
        if i:
            oid += step
        # End of Group / End of Track only last: nothing may follow them (digest 8.8)
        status = draw(st.sampled_from([0, 0, 3, 4])) if i == len(steps) - 1 else 0
        payload = b"" if status else draw(st.binary(max_size=40))
        props = draw(properties(3)) if props_bit and not status else ()
        recs.append(wire.ObjectRecord(hdr.group_id, oid, sg, prio, status, props,
                                      memoryview(payload)))
    return hdr, recs


def encode_subgroup(hdr: wire.SubgroupHeader, recs: list[wire.ObjectRecord]) -> bytes:
    w = wire.SubgroupWriter(hdr)
    out = [w.header_bytes()]
    for r in recs:
        out.append(w.object_prefix(r.object_id, len(r.payload), r.status, r.properties))
        out.append(bytes(r.payload))
    return b"".join(out)


@given(subgroup_streams())
def test_subgroup_stream(s: tuple[wire.SubgroupHeader, list[wire.ObjectRecord]]) -> None:
    hdr, recs = s
    raw = encode_subgroup(hdr, recs)
    p = wire.DataStreamParser()
    items = p.feed(raw)
    p.finish()
    placeholder = wire.SubgroupHeader(
        hdr.track_alias,
        hdr.group_id,
        0,
        hdr.publisher_priority,
        hdr.has_properties,
        hdr.end_of_group,
        hdr.first_object,
        hdr.subgroup_id_mode,
    )
    # Mode 01: the subgroup id is only known once the first object has been parsed.
    unknown_sg = hdr.subgroup_id_mode == 1
    assert items[0] == (placeholder if unknown_sg and not recs else hdr)
    assert items[1:] == recs
    assert wire.SubgroupHeader.decode(hdr.encode()) == (placeholder if unknown_sg else hdr)


@st.composite
def fetch_streams(draw: st.DrawFn) -> tuple[bool, list[wire.ObjectRecord | wire.EndOfRange]]:
    """A valid fetch object / End of Range sequence in ascending or descending order."""
    desc = draw(st.booleans())
    g = draw(vi64s)
    o = draw(vi64s.filter(lambda v: v < MAXV - 10**6))
    items: list[wire.ObjectRecord | wire.EndOfRange] = []
    n = draw(st.integers(0, 8))
    for i in range(n):
        if i:
            if draw(st.booleans()):
                step = draw(st.integers(1, 3))
                ng = g - step if desc else g + step
                if 0 <= ng <= MAXV:
                    g = ng
                    o = draw(st.integers(0, 10))
                else:
                    o += draw(st.integers(1, 3))
            else:
                o += draw(st.integers(1, 3))  # ascending within a group (digest 7.3)
        if draw(st.integers(0, 4)) == 0:
            items.append(wire.EndOfRange(draw(st.sampled_from([0x8C, 0x10C, 0x20C])), g, o))
            continue
        dg = draw(st.integers(0, 5)) == 0
        sg = 0 if dg else draw(st.one_of(st.integers(0, 3), vi64s))
        items.append(
            wire.ObjectRecord(
                g,
                o,
                sg,
                draw(u8s),
                0,
                draw(properties(2)),
                memoryview(draw(st.binary(max_size=30))),
                dg,
            )
        )
    return desc, items


def encode_fetch(rid: int, desc: bool, items: list[wire.ObjectRecord | wire.EndOfRange]) -> bytes:
    w = wire.FetchWriter(rid, desc)
    out = [w.header_bytes()]
    for it in items:
        if isinstance(it, wire.EndOfRange):
            out.append(w.end_of_range(it.kind, it.group_id, it.object_id))
        else:
            out.append(
                w.object_prefix(
                    it.group_id,
                    it.subgroup_id,
                    it.object_id,
                    it.publisher_priority,
                    len(it.payload),  # type: ignore[arg-type]
                    it.properties,
                    it.datagram,
                )
            )
            out.append(bytes(it.payload))
    return b"".join(out)


@settings(max_examples=300)
@given(vi64s, fetch_streams())
def test_fetch_stream(rid: int, s: tuple[bool, list]) -> None:
    desc, items = s
    raw = encode_fetch(rid, desc, items)
    p = wire.DataStreamParser(lambda r: desc if r == rid else not desc)
    got = p.feed(raw)
    p.finish()
    assert got == [wire.FetchHeader(rid), *items]


@st.composite
def datagrams(draw: st.DrawFn) -> tuple[int, wire.ObjectRecord, bool]:
    """Valid (alias, record, end_of_group) datagram contents."""
    status = draw(st.sampled_from([0, 0, 0, 3, 4]))
    eog = False if status else draw(st.booleans())
    props = () if status else draw(properties(3))
    payload = b"" if status else draw(st.binary(max_size=30))
    rec = wire.ObjectRecord(
        draw(vi64s),
        draw(st.one_of(st.just(0), vi64s)),
        0,
        draw(st.one_of(st.none(), u8s)),
        status,
        props,
        memoryview(payload),
        True,
    )
    return draw(vi64s), rec, eog


@given(datagrams())
def test_datagram(d: tuple[int, wire.ObjectRecord, bool]) -> None:
    alias, rec, eog = d
    assert wire.decode_datagram(wire.encode_datagram(alias, rec, eog)) == (alias, rec, eog)
