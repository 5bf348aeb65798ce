"""The Secure Objects wire setting (issue 27): kvcs's default (Key ID in property 0x78,
MOQT draft-22 integers inside the protected bytes) and the draft's vectors (property 0x02,
QUIC varints), checked against the draft's vectors and RFC 9000's varint examples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvcs.kv.scopefile import ScopeFile, ScopeFileError, parse_scope_file
from kvcs.kv.secure import (
    DRAFT_WIRE,
    KVCS_WIRE,
    CipherSuite,
    ContentKey,
    SecureObjectError,
    SecureObjects,
    aead_for,
    derive_key_and_salt,
    frame_plaintext,
    object_nonce,
    open_object,
    parse_plaintext,
    serialize_full_track_name,
)
from kvcs.kv.secure_wire import SecureWire, decode_quic_varint, encode_quic_varint
from kvcs.moqt.wire import IMMUTABLE_PROPERTIES, decode_kvps

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "vectors" / "secure-objects-vectors.json").read_text())
h = bytes.fromhex
NS = (b"kvcs-1", bytes(range(16)))
KEY = ContentKey(7, CipherSuite.AES_128_GCM_SHA256_128, bytes(range(32)))


@pytest.mark.parametrize(("value", "wire"), [  # RFC 9000 appendix A.1
    (151288809941952652, "c2197c5eff14e88c"), (494878333, "9d7f3e7d"), (15293, "7bbd"),
    (37, "25"), (63, "3f"), (64, "4040")])
def test_quic_varints(value: int, wire: str) -> None:
    assert encode_quic_varint(value) == h(wire)
    assert decode_quic_varint(h("ff" + wire), 1) == (value, 1 + len(wire) // 2)


@pytest.mark.parametrize("entry", [e for e in VECTORS["encryption"]
                                   if e["cipher_suite"] in (4, 5)],
                         ids=lambda e: f"suite{e['cipher_suite']}")
def test_the_draft_wire_reads_and_writes_the_vectors(entry: dict[str, Any]) -> None:
    """Track name serialization, plaintext framing and decryption of the draft's vectors
    with DRAFT_WIRE (their AAD, whose properties use the vectors' private encoding, is
    taken as the opaque bytes it is)."""
    ns = [t.encode() for t in entry["namespace_tuples"]]
    name = serialize_full_track_name(ns, entry["track_name"].encode(), DRAFT_WIRE)
    assert name.hex() == entry["serialized_full_track_name"]
    suite = CipherSuite(entry["cipher_suite"])
    key, salt = derive_key_and_salt(h(entry["track_base_key"]), suite, entry["key_id"], name)
    assert (key.hex(), salt.hex()) == (entry["moq_key"], entry["moq_salt"])
    original = h(entry["original_payload"])
    assert frame_plaintext(original, DRAFT_WIRE) + h(entry["encrypted_properties_list"]) == h(
        entry["plaintext"])
    plaintext = aead_for(suite, key).open(object_nonce(salt, entry["group_id"],
                                                       entry["object_id"]),
                                          h(entry["aad"]), h(entry["ciphertext"]))
    assert bytes(parse_plaintext(plaintext, DRAFT_WIRE)) == original


def test_the_two_wires_differ_where_the_issue_says() -> None:
    big = bytes(20000)
    assert frame_plaintext(big, DRAFT_WIRE)[:4] == h("80004e20")  # QUIC varint
    assert frame_plaintext(big, KVCS_WIRE)[:3] == h("c04e20")  # MOQT draft-22 vi64
    assert bytes(parse_plaintext(frame_plaintext(big, DRAFT_WIRE), DRAFT_WIRE)) == big
    with pytest.raises(SecureObjectError):  # a kvcs reader cannot frame the draft's
        parse_plaintext(frame_plaintext(big, DRAFT_WIRE), KVCS_WIRE)
    ns = (b"n" * 100,)
    assert serialize_full_track_name(ns, b"t", DRAFT_WIRE)[:3] == h("014064")
    assert serialize_full_track_name(ns, b"t", KVCS_WIRE)[:2] == h("0164")


@pytest.mark.parametrize("wire", [KVCS_WIRE, DRAFT_WIRE], ids=["kvcs", "draft"])
def test_objects_round_trip_on_either_wire_and_not_across(wire: SecureWire) -> None:
    sender = SecureObjects([KEY], wire=wire)
    payload = bytes(range(256)) * 40
    obj = sender.encrypt_object(NS, b"k.raw.s0", 3, 5, payload, publisher_priority=7)
    assert decode_kvps(obj.immutable_properties) == ((wire.key_id_property, 7),)
    assert wire.key_id_property == (0x02 if wire is DRAFT_WIRE else 0x78)
    props = ((IMMUTABLE_PROPERTIES, obj.immutable_properties),)
    got = SecureObjects([KEY], wire=wire).decrypt_object(
        NS, b"k.raw.s0", 3, 5, obj.payload, publisher_priority=7, properties=props)
    assert bytes(got) == payload
    assert sender.protected_size(len(payload)) == len(obj.payload)
    other = DRAFT_WIRE if wire is KVCS_WIRE else KVCS_WIRE
    with pytest.raises(SecureObjectError):  # no Key ID under the other property type
        SecureObjects([KEY], wire=other).decrypt_object(
            NS, b"k.raw.s0", 3, 5, obj.payload, publisher_priority=7, properties=props)
    with pytest.raises(SecureObjectError, match="no content keys"):  # a keyless consumer
        open_object(None, NS, b"k.raw.s0", 3, 5, obj.payload, publisher_priority=7,
                    properties=props, wire=wire)
    in_band = sender.decrypt_object(NS, b"k.raw.s0", 3, 5, obj.in_band_payload(),
                                    publisher_priority=0, properties=())
    assert bytes(in_band) == payload


def test_the_scope_file_carries_the_setting() -> None:
    scope = ScopeFile.new(wire=DRAFT_WIRE)
    doc = json.loads(scope.to_json())
    assert doc["wire"] == "draft"
    loaded = parse_scope_file(scope.to_json())
    assert loaded.wire == DRAFT_WIRE and loaded.secure_objects().wire == DRAFT_WIRE
    assert "wire" not in json.loads(ScopeFile.new().to_json())  # the default is not written
    assert parse_scope_file(ScopeFile.new().to_json()).secure_objects().wire == KVCS_WIRE
    with pytest.raises(ScopeFileError, match="wire"):
        parse_scope_file(json.dumps({**doc, "wire": "quic"}).encode())
