"""Component kinds: track-name tokens, payload field values, and the codecs of each."""

from __future__ import annotations

import numpy as np
import pytest

from kvcs.kv.codecs import decode_component, encode_component, encode_kv, encode_section
from kvcs.kv.component import Component
from kvcs.kv.errors import HeaderError
from kvcs.kv.payload import build_payload, build_payload_bytes, data_digest, parse_header
from kvcs.kv.tracks import TrackName


def test_tokens_and_fields() -> None:
    assert [(c.value, c.field) for c in Component] == [("k", 1), ("v", 2), ("kv", 3)]
    assert Component.K == "k" and str(Component.KV) == "kv" and f"{Component.V}" == "v"
    for c in Component:
        assert Component.from_token(c.value) is c and Component.from_field(c.field) is c
    assert (Component.K.carries_k, Component.K.carries_v) == (True, False)
    assert (Component.V.carries_k, Component.V.carries_v) == (False, True)
    assert (Component.KV.carries_k, Component.KV.carries_v) == (True, True)
    for bad in ("K", "q", ""):
        with pytest.raises(ValueError, match="not one of k, v, kv"):
            Component.from_token(bad)
    for bad_field in (0, 4, True):
        with pytest.raises(ValueError, match="not 1"):
            Component.from_field(bad_field)


def test_track_names_and_payloads_carry_the_enum() -> None:
    tn = TrackName.parse("kv.zstd.s2")
    assert tn.component is Component.KV and tn.component_value == 3
    assert TrackName.data(Component.V, "raw", 0) == TrackName.parse("v.raw.s0")
    for spelled in (Component.K, "k", 1):
        header, _ = build_payload(spelled, 0, 0, 0, 4, "raw", b"x")
        assert parse_header(header + b"x").component == 1
    with pytest.raises(ValueError, match="k/v/kv"):
        build_payload("x", 0, 0, 0, 4, "raw", b"")


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_encode_and_decode_each_component(codec: str) -> None:
    rng = np.random.default_rng(0)
    k = rng.standard_normal((4, 2, 8)).astype(np.float16)
    v = rng.standard_normal((4, 2, 6)).astype(np.float16)
    assert bytes(encode_component(Component.K, codec, k, v)) == bytes(encode_section(codec, k))
    assert bytes(encode_component(Component.V, codec, k, v)) == bytes(encode_section(codec, v))
    assert encode_component(Component.KV, codec, k, v) == encode_kv(codec, k, v)
    for kind, want in ((Component.K, (k, None)), (Component.V, (None, v)),
                       (Component.KV, (k, v))):
        data = encode_component(kind, codec, k, v)
        got = decode_component(kind, codec, data, np.float16, k.shape, v.shape)
        for a, b in zip(got, want, strict=True):
            assert (a is None and b is None) or np.array_equal(a, b)
    with pytest.raises(TypeError, match="Component"):
        decode_component("k", codec, b"", np.float16, k.shape, v.shape)  # type: ignore[arg-type]


def test_data_digest_reads_the_header_field() -> None:
    payload = build_payload_bytes(Component.V, 2, 5, 20, 4, "raw", bytes(range(64)))
    assert data_digest(payload) == parse_header(payload).digest
    assert data_digest(memoryview(payload)[:68]) == parse_header(payload).digest
    with pytest.raises(HeaderError, match="68-octet"):
        data_digest(payload[:67])
