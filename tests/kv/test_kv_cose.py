"""Tests of COSE_Sign1 manifest signing and verification."""

from __future__ import annotations

import json

import cbor2
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from kvcs.kv.cose import Keyring, ProducerKey, sign_manifest, verify_manifest
from kvcs.kv.errors import SignatureError

# cose-manifest.md section 3 regression vector
SEED = bytes(range(32))
PUB = "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8"
ATTACHED = bytes.fromhex(
    "d2844ca20127044770726f642d6564a04a7b226b766373223a317d5840"
    "42446815b56224906dafc4f06f53b82da7ba0fce0a6fb9466afb2815bb0c4e94"
    "93b163ca66578cec9e789b7b6037c87d83cf8fbc1fd6756d01ae26299c737106"
)
BODY = b'{"kvcs":1,"segments":[]}'


def seed_key() -> ProducerKey:
    return ProducerKey(ed25519.Ed25519PrivateKey.from_private_bytes(SEED), b"prod-ed")


@pytest.fixture(scope="module")
def keys():
    ed = seed_key()
    ec = ProducerKey.generate(b"prod-ec", "ES256")
    ring = Keyring()
    ring.add_producer(ed)
    ring.add_producer(ec)
    return ed, ec, ring


def test_eddsa_regression_vector(keys):
    ed, _, ring = keys
    from cryptography.hazmat.primitives import serialization

    raw = ed.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert raw.hex() == PUB
    assert sign_manifest(b'{"kvcs":1}', ed) == ATTACHED
    assert verify_manifest(ATTACHED, ring) == b'{"kvcs":1}'


def test_sign_verify_both_algorithms(keys):
    ed, ec, ring = keys
    for key, alg_byte in ((ed, 0x27), (ec, 0x26)):
        blob = sign_manifest(BODY, key)
        assert blob[0] == 0xD2  # tag 18
        top = cbor2.loads(blob)
        assert top.tag == 18
        assert cbor2.loads(top.value[0]) == {1: -8 if key is ed else -7, 4: key.kid}
        assert top.value[0][2] == alg_byte and top.value[1] == {}
        assert verify_manifest(blob, ring) == BODY
        untagged = cbor2.dumps(top.value)
        assert verify_manifest(untagged, ring) == BODY


def test_es256_interop_with_pycose_signer(keys):
    """An ES256 message made by pycose (python-ecdsa) verifies (consumers may meet them)."""
    from cryptography.hazmat.primitives.asymmetric import ec as ecmod
    from pycose.algorithms import Es256
    from pycose.headers import KID, Algorithm
    from pycose.keys import EC2Key
    from pycose.keys.curves import P256
    from pycose.messages import Sign1Message

    _, ec, ring = keys
    nums = ec.private_key.private_numbers()
    assert isinstance(ec.private_key, ecmod.EllipticCurvePrivateKey)
    ck = EC2Key(crv=P256, d=nums.private_value.to_bytes(32, "big"))
    msg = Sign1Message(phdr={Algorithm: Es256, KID: b"prod-ec"}, payload=BODY)
    msg.key = ck
    assert verify_manifest(msg.encode(), ring) == BODY


def flip(blob: bytes, index: int) -> bytes:
    b = bytearray(blob)
    b[index] ^= 1
    return bytes(b)


def rebuild(blob: bytes, *, protected=None, unprotected=None, payload=..., sig=None, tag=18):
    arr = list(cbor2.loads(blob).value)
    if protected is not None:
        arr[0] = cbor2.dumps(protected)
    if unprotected is not None:
        arr[1] = unprotected
    if payload is not ...:
        arr[2] = payload
    if sig is not None:
        arr[3] = sig
    return cbor2.dumps(cbor2.CBORTag(tag, arr) if tag is not None else arr)


def test_rejections(keys):
    ed, ec, ring = keys
    good = sign_manifest(BODY, ed)
    good_ec = sign_manifest(BODY, ec)
    other = ProducerKey.generate(b"prod-ed")
    cases = {
        "bad signature": flip(good, len(good) - 1),
        "payload modified": good.replace(b'"kvcs":1', b'"kvcs":2'),
        "signed by another key with the same kid": sign_manifest(BODY, other),
        "unknown kid": sign_manifest(BODY, ProducerKey.generate(b"nobody")),
        "kid only unprotected": rebuild(good, protected={1: -8}, unprotected={4: b"prod-ed"}),
        "no kid": rebuild(good, protected={1: -8}),
        "alg mismatch (ES256 header on EdDSA kid)": rebuild(good, protected={1: -7, 4: b"prod-ed"}),
        "alg mismatch (EdDSA header on ES256 kid)": rebuild(
            good_ec, protected={1: -8, 4: b"prod-ec"}
        ),
        "alg missing": rebuild(good, protected={4: b"prod-ed"}),
        "crit": rebuild(good, protected={1: -8, 4: b"prod-ed", 2: [99]}),
        "detached": rebuild(good, payload=None),
        "wrong tag": rebuild(good, tag=17),
        "malformed cbor": good[:-5],
        "not cbor": b"\xff\xff",
        "empty": b"",
        "not an array": cbor2.dumps(cbor2.CBORTag(18, {"a": 1})),
        "short array": cbor2.dumps([b"", {}, b""]),
        "protected not bytes": rebuild(good, protected=None, unprotected=None)[:0]
        + cbor2.dumps(cbor2.CBORTag(18, [{1: -8}, {}, BODY, b"x" * 64])),
        "protected not a map": cbor2.dumps(cbor2.CBORTag(18, [cbor2.dumps([1]), {}, BODY, b""])),
        "kid not bytes": rebuild(good, protected={1: -8, 4: "prod-ed"}),
        "signature wrong length": rebuild(good, sig=b"\x00" * 10),
        "signature not bytes": rebuild(good, sig=None)[:0]
        + cbor2.dumps(cbor2.CBORTag(18, [cbor2.loads(good).value[0], {}, BODY, 5])),
    }
    for name, blob in cases.items():
        with pytest.raises(SignatureError):
            verify_manifest(blob, ring)
            pytest.fail(name)


def test_thaw_handles_tuple_and_frozen_like_input(keys, monkeypatch):
    """Simulate cbor2 6 (tag content decoded as tuple / read-only mapping)."""
    import types

    import kvcs.kv.cose as cose

    ed, _, ring = keys
    blob = sign_manifest(BODY, ed)
    real_loads = cbor2.loads

    def loads6(data):
        v = real_loads(data)
        if isinstance(v, cbor2.CBORTag):
            arr = v.value
            return cbor2.CBORTag(v.tag, (arr[0], types.MappingProxyType(arr[1]), arr[2], arr[3]))
        return v

    monkeypatch.setattr(cose.cbor2, "loads", loads6)
    assert verify_manifest(blob, ring) == BODY


def test_keyring_loading(tmp_path, keys):
    ed, ec, _ = keys
    d = tmp_path / "ring"
    d.mkdir()
    (d / "prod-ed.pem").write_bytes(ed.public_pem())
    (d / "prod-ec.pem").write_bytes(ec.public_pem())
    ring = Keyring.load(d)
    assert set(ring) == {b"prod-ed", b"prod-ec"} and len(ring) == 2
    assert ring.alg_for(b"prod-ec") == "ES256" and ring.alg_for(b"prod-ed") == "EdDSA"
    assert verify_manifest(sign_manifest(BODY, ec), ring) == BODY

    j = tmp_path / "ring.json"
    j.write_text(json.dumps({"keys": [
        {"kid": "prod-ed", "alg": "EdDSA", "pem": ed.public_pem().decode()},
        {"kid_hex": b"prod-ec".hex(), "alg": "ES256", "pem": ec.public_pem().decode()},
    ]}))  # fmt: skip
    ring2 = Keyring.load(j)
    assert verify_manifest(sign_manifest(BODY, ed), ring2) == BODY
    assert b"prod-ec" in ring2

    p = tmp_path / "one.pem"
    p.write_bytes(ed.public_pem())
    assert set(Keyring.load(p)) == {b"one"}
    assert set(Keyring.load(p, kid=b"prod-ed")) == {b"prod-ed"}

    with pytest.raises(ValueError, match="not ES256"):
        Keyring().add(b"x", ed.public_pem(), "ES256")
    with pytest.raises(ValueError):
        Keyring.from_json({"keys": [{"pem": ed.public_pem().decode()}]})
    with pytest.raises(ValueError):
        Keyring().add(b"x", b"not a pem")


def test_producer_key_pem_roundtrip(tmp_path, keys):
    ed, ec, ring = keys
    for key in (ed, ec):
        path = tmp_path / f"{key.alg}.pem"
        key.save(path)
        assert (path.stat().st_mode & 0o777) == 0o600
        loaded = ProducerKey.load(path, key.kid)
        assert loaded.alg == key.alg
        assert verify_manifest(sign_manifest(BODY, loaded), ring) == BODY
    with pytest.raises(ValueError):
        ProducerKey.generate(b"x", "RS256")
    with pytest.raises(ValueError):
        ProducerKey.generate(b"", "EdDSA")
    assert "private_key" not in repr(ed)
