"""The same streams fed whole, byte by byte and in random splits give equal results."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcs.moqt.wire import (
    ControlStreamParser,
    DataStreamParser,
    EndOfRange,
    ObjectRecord,
    SubgroupHeader,
    encode_message,
)

from .test_wire_roundtrip import encode_fetch, encode_subgroup, fetch_streams, messages
from .vectors import VECTORS


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    cuts = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for c in [*cuts, len(data)]:
        out.append(data[prev:c])
        prev = c
    return out


def _feed_control(chunks: list[bytes]) -> list:
    p = ControlStreamParser()
    out = []
    for c in chunks:
        out += p.feed(c)
    assert p.buffered == 0
    return out


def _feed_data(chunks: list[bytes], desc: bool = False) -> list:
    p = DataStreamParser(lambda rid: desc)
    out = []
    for c in chunks:
        out += p.feed(c)
    p.finish()
    return out


CONTROL_STREAM = b"".join(
    bytes.fromhex(v["hex"])
    for v in VECTORS
    if v["kind"] == "control" and "unknown" not in v["name"]
)


def test_control_stream_chunkings() -> None:
    whole = _feed_control([CONTROL_STREAM])
    assert len(whole) == sum(
        1 for v in VECTORS if v["kind"] == "control" and "unknown" not in v["name"]
    )
    assert _feed_control([bytes([b]) for b in CONTROL_STREAM]) == whole
    rnd = random.Random(7)
    for _ in range(50):
        cuts = [rnd.randrange(len(CONTROL_STREAM)) for _ in range(rnd.randrange(1, 30))]
        assert _feed_control(_splits(CONTROL_STREAM, cuts)) == whole


def test_control_buffered_reports_partial_message() -> None:
    p = ControlStreamParser()
    raw = CONTROL_STREAM[:45]
    msgs = p.feed(raw)
    consumed = sum(len(encode_message(m)) for m in msgs)
    assert p.buffered == 45 - consumed > 0


@settings(max_examples=60)
@given(st.lists(messages, min_size=1, max_size=5), st.lists(st.integers(0, 10**6), max_size=12))
def test_control_random_messages(msgs: list, cuts: list[int]) -> None:
    raw = b"".join(encode_message(m) for m in msgs)
    assert _feed_control([raw]) == msgs
    assert _feed_control(_splits(raw, cuts)) == msgs


def _big_subgroup() -> tuple[bytes, list]:
    hdr = SubgroupHeader(7, 3, 0, None, has_properties=True)
    recs = []
    rnd = random.Random(1)
    sizes = [0, 1, 100, 40000, 5, 70000, 16000, 15999, 16001, 3]
    for i, n in enumerate(sizes):
        payload = bytes(rnd.getrandbits(8) for _ in range(min(n, 64))) * (n // 64 + 1)
        payload = payload[:n]
        props = ((0x78, i), (0x79, b"x" * i)) if i % 2 else ()
        recs.append(ObjectRecord(3, i * 2, 0, None, 0, props, memoryview(payload)))
    recs.append(ObjectRecord(3, 40, 0, None, 3, (), memoryview(b"")))
    return encode_subgroup(hdr, recs), [hdr, *recs]


def test_subgroup_stream_chunkings() -> None:
    raw, expected = _big_subgroup()
    assert _feed_data([raw]) == expected
    assert _feed_data([raw[i : i + 1] for i in range(len(raw))]) == expected
    rnd = random.Random(3)
    for _ in range(40):
        cuts = [rnd.randrange(len(raw)) for _ in range(rnd.randrange(1, 60))]
        assert _feed_data(_splits(raw, cuts)) == expected
    assert _feed_data([raw[i : i + 16000] for i in range(0, len(raw), 16000)]) == expected


@settings(max_examples=150)
@given(fetch_streams(), st.lists(st.integers(0, 10**6), max_size=15))
def test_fetch_stream_chunkings(s: tuple[bool, list], cuts: list[int]) -> None:
    desc, items = s
    raw = encode_fetch(9, desc, items)
    whole = _feed_data([raw], desc)
    assert whole[1:] == items
    assert _feed_data(_splits(raw, cuts), desc) == whole
    assert _feed_data([raw[i : i + 1] for i in range(len(raw))], desc) == whole


def test_payload_zero_copy_and_single_copy() -> None:
    hdr = SubgroupHeader(1, 0)
    raw, _ = _big_subgroup()
    del raw
    payload_a = b"a" * 1000
    payload_b = b"b" * 50000
    from kvcs.moqt.wire import SubgroupWriter

    w = SubgroupWriter(hdr)
    chunk1 = w.header_bytes() + w.object_prefix(0, len(payload_a)) + payload_a
    pre_b = w.object_prefix(1, len(payload_b))
    chunk1 += pre_b + payload_b[:100]
    p = DataStreamParser()
    items = p.feed(chunk1)
    assert len(items) == 2
    rec_a = items[1]
    assert isinstance(rec_a, ObjectRecord)
    assert rec_a.payload.obj is chunk1  # a view of the fed chunk: no copy
    assert p.in_progress
    got = p.feed(payload_b[100:30000])
    assert got == []
    got = p.feed(payload_b[30000:])
    assert len(got) == 1 and bytes(got[0].payload) == payload_b
    buf = got[0].payload.obj
    assert isinstance(buf, bytearray) and len(buf) == len(payload_b)
    p.finish()


def test_mode1_subgroup_id_filled_after_first_object() -> None:
    from kvcs.moqt.wire import SubgroupWriter

    hdr = SubgroupHeader(1, 2, 5, 9, subgroup_id_mode=1)
    w = SubgroupWriter(hdr)
    p = DataStreamParser()
    (h,) = p.feed(w.header_bytes())
    assert isinstance(h, SubgroupHeader) and h.subgroup_id_mode == 1
    (rec,) = p.feed(w.object_prefix(5, 2) + b"hi")
    assert rec.subgroup_id == 5 and h.subgroup_id == 5 and rec.object_id == 5
    (rec,) = p.feed(w.object_prefix(6, 0, status=4))
    assert rec.subgroup_id == 5 and rec.status == 4
    p.finish()


def test_end_of_range_only_stream_chunked() -> None:
    from kvcs.moqt.wire import FetchWriter

    w = FetchWriter(3)
    raw = w.header_bytes() + w.end_of_range(0x10C, 2**64 - 1, 2**64 - 1)
    assert _feed_data([raw[i : i + 1] for i in range(len(raw))])[1] == EndOfRange(
        0x10C, 2**64 - 1, 2**64 - 1
    )
