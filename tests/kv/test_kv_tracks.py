"""Tests of the track-name grammar."""

from __future__ import annotations

import pytest

from kvcs.kv.tracks import TrackName


@pytest.mark.parametrize(
    ("text", "comp", "codec", "seg"),
    [
        ("k.raw.s0", "k", "raw", 0),
        ("v.q8.s12", "v", "q8", 12),
        ("kv.zstd.s1", "kv", "zstd", 1),
        ("k.a-b-9.s100", "k", "a-b-9", 100),
        ("k." + "a" * 32 + ".s3", "k", "a" * 32, 3),
    ],
)
def test_parse_data(text, comp, codec, seg):
    tn = TrackName.parse(text)
    assert (tn.kind, tn.component, tn.codec, tn.segment) == ("data", comp, codec, seg)
    assert tn.format() == text
    assert TrackName.parse(text.encode()) == tn
    assert TrackName.data(comp, codec, seg) == tn
    assert tn.to_bytes() == text.encode()


def test_manifest_names():
    assert TrackName.parse("manifest").is_manifest
    assert TrackName.parse(b"manifest.cose") == TrackName.manifest(cose=True)
    assert TrackName.manifest().format() == "manifest"
    with pytest.raises(ValueError):
        TrackName.manifest().component_value  # noqa: B018


def test_component_values():
    assert [TrackName.parse(f"{c}.raw.s0").component_value for c in ("k", "v", "kv")] == [1, 2, 3]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("k.raw.s01", "leading zero"),
        ("k.raw.s", "not a decimal"),
        ("k.raw.0", "must start with 's'"),
        ("q.raw.s0", "component"),
        ("K.raw.s0", "component"),
        ("k.RAW.s0", "codec"),
        ("k..s0", "codec"),
        ("k." + "a" * 33 + ".s0", "codec"),
        ("k.ra_w.s0", "codec"),
        ("k.raw", "expected"),
        ("manifest.json", "component"),
        ("k.raw.s0.x", "expected"),
        ("", "expected"),
        ("k.raw.s-1", "decimal"),
        ("k.raw.s\u0661", "decimal"),
    ],
)
def test_parse_rejects(text, reason):
    with pytest.raises(ValueError, match=reason):
        TrackName.parse(text)


def test_parse_rejects_non_ascii_bytes_and_types():
    with pytest.raises(ValueError, match="ASCII"):
        TrackName.parse(b"k.raw.s\xff")
    with pytest.raises(ValueError):
        TrackName.parse(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TrackName.data("x", "raw", 0)
    with pytest.raises(ValueError):
        TrackName.data("k", "RAW", 0)
    with pytest.raises(ValueError):
        TrackName.data("k", "raw", -1)
