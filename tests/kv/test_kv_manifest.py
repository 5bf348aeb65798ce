"""Tests of manifest serialization, validation and consumer checks."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from kvcs.kv.errors import ManifestError
from kvcs.kv.ids import KvcsNamespace, compat_id
from kvcs.kv.manifest import Manifest, Segment, check_namespace, expected_digest, segment_covers
from kvcs.kv.vectors import FIXED_DESCRIPTOR

KEYS = [hashlib.sha256(bytes([i])).digest() for i in range(6)]
D = [[hashlib.sha256(bytes([lyr, b])).hexdigest() for b in range(2)] for lyr in range(2)]


def make() -> Manifest:
    seg0 = Segment(0, 0, 4, hashlib.sha256(b"".join(KEYS[:4])).hexdigest(),
                   ["k.raw.s0", "v.raw.s0"], True)  # fmt: skip
    seg1 = Segment(1, 4, 2, hashlib.sha256(b"".join(KEYS[4:6])).hexdigest(),
                   ["kv.zstd.s1"], False, {"kv.zstd.s1": D})  # fmt: skip
    return Manifest.for_descriptor(FIXED_DESCRIPTOR, segments=[seg0, seg1])


def test_roundtrip_deterministic():
    m = make()
    b = m.to_json_bytes()
    assert b == json.dumps(json.loads(b), sort_keys=True, separators=(",", ":")).encode()
    assert b"object_digests" in b and b.count(b"object_digests") == 1
    m2 = Manifest.parse(b)
    assert m2 == m and m2.to_json_bytes() == b
    assert m2.descriptor.compat_id == compat_id(FIXED_DESCRIPTOR)


def test_check_namespace():
    m = make()
    cid = compat_id(FIXED_DESCRIPTOR)
    check_namespace(m, cid)
    check_namespace(m, KvcsNamespace(bytes(16), cid, bytes(32), bytes(16)))
    with pytest.raises(ManifestError, match="Compatibility ID"):
        check_namespace(m, bytes(32))
    other = Manifest.for_descriptor({**FIXED_DESCRIPTOR, "revision": "1"})
    with pytest.raises(ManifestError):
        check_namespace(other, cid)


def test_segment_covers():
    m = make()
    assert segment_covers(m.segments[0], KEYS)
    assert segment_covers(m.segments[1], KEYS)
    assert not segment_covers(m.segments[1], KEYS[:5])
    assert not segment_covers(m.segments[0], [KEYS[1], KEYS[0], *KEYS[2:]])


def test_expected_digest():
    m = make()
    assert expected_digest(m, "kv.zstd.s1", 1, 0) == bytes.fromhex(D[1][0])
    assert expected_digest(m, "kv.zstd.s1", 2, 0) is None
    assert expected_digest(m, "kv.zstd.s1", 0, 2) is None
    assert expected_digest(m, "k.raw.s0", 0, 0) is None
    assert expected_digest(m, "k.raw.s7", 0, 0) is None
    assert expected_digest(m, "manifest", 0, 0) is None


def bad(mutator):
    obj = json.loads(make().to_json_bytes())
    mutator(obj)
    return json.dumps(obj).encode()


def _del(path):
    def f(o):
        *head, last = path
        for p in head:
            o = o[p]
        del o[last]

    return f


def _set(path, value):
    def f(o):
        *head, last = path
        for p in head:
            o = o[p]
        o[last] = copy.deepcopy(value)

    return f


S1 = ("segments", 1)
OD = (*S1, "object_digests", "kv.zstd.s1")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"{", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "not a JSON object"),
        (bad(_del(("kvcs",))), "missing member 'kvcs'"),
        (bad(_del(("compat",))), "missing member 'compat'"),
        (bad(_del(("layers",))), "missing member 'layers'"),
        (bad(_del(("block_tokens",))), "missing"),
        (bad(_del(("deterministic",))), "missing"),
        (bad(_del(("segments",))), "missing"),
        (bad(_set(("kvcs",), 2)), "not supported"),
        (bad(_set(("kvcs",), True)), "type int"),
        (bad(_set(("layers",), "2")), "type int"),
        (bad(_set(("layers",), 3)), "compat.layers"),
        (bad(_set(("block_tokens",), 8)), "compat.block_tokens"),
        (bad(_set(("deterministic",), 1)), "type bool"),
        (bad(_set(("segments",), {})), "type list"),
        (bad(_set(("compat", "layers"), 2.0)), "floats"),
        (bad(_del(("compat", "dtype"))), "compat"),
        (bad(_set(("segments", 0), [])), "not an object"),
        (bad(_del((*S1, "first_block"))), "missing member 'first_block'"),
        (bad(_del((*S1, "block_keys_sha256"))), "missing member 'block_keys_sha256'"),
        (bad(_set((*S1, "blocks"), -1)), "below"),
        (bad(_set((*S1, "segment"), 0)), "segment 0"),
        (bad(_set((*S1, "block_keys_sha256"), "ab")), "64 hex"),
        (bad(_set((*S1, "block_keys_sha256"), "g" * 64)), "64 hex"),
        (bad(_set((*S1, "tracks"), ["kv.zstd.s01"])), "leading zero"),
        (bad(_set((*S1, "tracks"), ["manifest"])), "manifest track"),
        (bad(_set((*S1, "tracks"), [3])), "non-string"),
        (bad(_set((*S1, "tracks"), ["kv.zstd.s1", "kv.zstd.s1"])), "twice"),
        (bad(_set((*S1, "complete"), "yes")), "type bool"),
        (bad(_set((*S1, "object_digests"), [])), "type dict"),
        (bad(_set((*S1, "object_digests", "k.raw.s1"), D)), "not listed"),
        (bad(_set(OD, [*D, D[0]])), "more than 2 layers"),
        (bad(_set(OD, [D[0][:1]])), "array of 2 digests"),
        (bad(_set(OD, [[D[0][0], "00"]])), "64 hex"),
        (bad(_set(OD, {"0": D[0]})), "array of groups"),
    ],
)
def test_parse_rejections(data, match):
    with pytest.raises(ManifestError, match=match):
        Manifest.parse(data)


def test_partial_object_digests_accepted():
    m = Manifest.parse(bad(_set(OD, D[:1])))
    assert m.segments[1].object_digests == {"kv.zstd.s1": D[:1]}


def test_object_digests_read_in_lower_case():
    """Digests listed in upper or mixed case read as the lower-case ones (those of a
    publisher, returned as they are)."""
    mixed = [[D[0][0].upper(), D[0][1]], [D[1][0][:32] + D[1][0][32:].upper(), D[1][1]]]
    assert Manifest.parse(bad(_set(OD, mixed))).segments[1].object_digests == {"kv.zstd.s1": D}
    assert Manifest.parse(bad(_set(OD, D))).segments[1].object_digests == {"kv.zstd.s1": D}
    with pytest.raises(ManifestError, match=r"\[1\]\[0\] must be 64 hex"):
        Manifest.parse(bad(_set(OD, [D[0], [D[1][0][:63] + "g", D[1][1]]])))
    with pytest.raises(ManifestError, match=r"\[0\]\[1\] must be 64 hex"):
        Manifest.parse(bad(_set(OD, [[D[0][0], 7], D[1]])))
    with pytest.raises(ManifestError, match=r"\[0\]\[0\] must be 64 hex"):  # 63 + 65
        Manifest.parse(bad(_set(OD, [[D[0][0][:63], D[0][1] + "a"], D[1]])))


def test_duplicate_segment_numbers_rejected():
    def dup(o):
        o["segments"][1]["segment"] = 0
        o["segments"][1]["tracks"] = ["kv.zstd.s0"]
        del o["segments"][1]["object_digests"]

    with pytest.raises(ManifestError, match="twice"):
        Manifest.parse(bad(dup))


def test_protection_member():
    """A protected publication's manifest says so; check_protection binds the member to
    how the manifest arrived."""
    from kvcs.kv.manifest import Protection, check_protection

    m = make()
    assert "protection" not in m.to_dict()
    m.protection = Protection()
    b = m.to_json_bytes()
    assert b'"protection":{"key_id_property":120,"scheme":"moq-secure-objects"}' in b
    m2 = Manifest.parse(b)
    assert m2 == m and m2.protection == Protection()
    check_protection(m2, protected=True)
    with pytest.raises(ManifestError, match="arrived unencrypted"):
        check_protection(m2, protected=False)
    with pytest.raises(ManifestError, match="does not declare protection"):
        check_protection(make(), protected=True)
    check_protection(make(), protected=False)
    for bad, why in (({"scheme": "sframe", "key_id_property": 120}, "not supported"),
                     ({"scheme": "moq-secure-objects", "key_id_property": 4}, "0x4"),
                     ({"scheme": "moq-secure-objects"}, "key_id_property"),
                     ("yes", "not an object")):
        doc = json.loads(b)
        doc["protection"] = bad
        with pytest.raises(ManifestError, match=why):
            Manifest.parse(json.dumps(doc))
    # the draft's Key ID property, on the draft's wire (kvcs.kv.secure_wire.DRAFT_WIRE)
    doc = json.loads(b)
    doc["protection"]["key_id_property"] = 2
    assert Manifest.parse(json.dumps(doc)).protection == Protection(key_id_property=2)
