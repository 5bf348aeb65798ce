"""Scope files (kvcs/kv/scopefile.py) and ``kvcs keygen`` (kvcs/cli_keys.py), run through
``kvcs.cli.main`` as a user runs it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from kvcs.cli import main
from kvcs.kv.cose import Keyring, sign_manifest, verify_manifest
from kvcs.kv.ids import ScopeKey, scope_id
from kvcs.kv.scopefile import (
    ProducerRef,
    ScopeFile,
    ScopeFileError,
    load_scope_file,
    parse_scope_file,
    write_secret_file,
)
from kvcs.kv.secure import CipherSuite, ContentKey

NS = (b"kvcs-1", bytes(16), bytes(32), bytes(32), bytes(16))


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _keygen(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["keygen", *args])
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- scope files


def test_scope_file_round_trip_and_rotation(tmp_path: Path) -> None:
    scope = ScopeFile.new()
    assert scope.current_key_id == 1 and len(scope.content_keys) == 1
    assert scope.content_keys[0].base_key != scope.scope_key.key
    again = parse_scope_file(scope.to_json())
    assert again == scope
    rotated = again.rotated(CipherSuite.AES_256_GCM_SHA512_128)
    assert [k.key_id for k in rotated.content_keys] == [1, 2] and rotated.current_key_id == 2
    assert rotated.content_keys[0] == scope.content_keys[0]
    assert rotated.rotated().current_content_key().suite is CipherSuite.AES_256_GCM_SHA512_128
    doc = json.loads(rotated.to_json())
    assert [e.get("current", False) for e in doc["content_keys"]] == [False, True]
    # the publisher encrypts with key 2; a consumer that still holds only key 1 cannot, a
    # consumer with the rotated file decrypts old and new objects
    publisher = rotated.secure_objects()
    new = publisher.encrypt_object(NS, b"k.raw.s0", 0, 0, b"new", publisher_priority=0)
    old = scope.secure_objects().encrypt_object(NS, b"k.raw.s0", 0, 1, b"old",
                                                publisher_priority=0)
    consumer = parse_scope_file(rotated.to_json()).secure_objects()
    for obj, oid, want in [(new, 0, b"new"), (old, 1, b"old")]:
        assert consumer.decrypt_object(NS, b"k.raw.s0", 0, oid, obj.payload,
                                       publisher_priority=0, properties=obj.properties) == want


def test_plain_scope_key_files_still_load(tmp_path: Path) -> None:
    raw, hexed = tmp_path / "raw.key", tmp_path / "hex.key"
    raw.write_bytes(bytes(range(32)))
    hexed.write_text(bytes(range(32)).hex() + "\n")
    for p in (raw, hexed):
        scope = load_scope_file(p)
        assert scope.scope_key.key == bytes(range(32)) and scope.content_keys == ()
        with pytest.raises(ValueError, match="no content keys"):
            scope.secure_objects()
    scope = load_scope_file(hexed).rotated()  # a content key can be added to a plain key
    assert scope.current_key_id == 1 and scope.scope_key.key == bytes(range(32))


def test_scope_key_from_file_reads_scope_files(tmp_path: Path) -> None:
    """Existing ``--scope-key`` users (ScopeKey.from_file) accept the new file."""
    scope = ScopeFile.new()
    path = tmp_path / "scope.json"
    path.write_bytes(scope.to_json())
    assert ScopeKey.from_file(path) == scope.scope_key


def _doc(**changes: object) -> bytes:
    doc = json.loads(ScopeFile.new().to_json())
    doc.update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("data", "message"), [
    (b"{not json", "not JSON"),
    (b" {}", "kvcs_scope is None, expected 1"),
    (_doc(kvcs_scope=2), "kvcs_scope is 2, expected 1"),
    (_doc(scope_key="00"), "scope_key: a hex scope key is exactly 64 hex characters"),
    (_doc(scope_key=5), "scope_key must be a string"),
    (_doc(content_keys={}), "content_keys must be an array"),
    (_doc(content_keys=[5]), "content_keys[0] must be an object"),
    (_doc(content_keys=[{"key_id": "1", "base_key": "00" * 32, "current": True}]),
     "content_keys[0].key_id must be an integer"),
    (_doc(content_keys=[{"key_id": 1, "base_key": "zz", "current": True}]),
     "content_keys[0].base_key is not hex"),
    (_doc(content_keys=[{"key_id": 1, "base_key": "00" * 8, "current": True}]),
     "content_keys[0]: a content base key is at least 16 bytes"),
    (_doc(content_keys=[{"key_id": 1, "suite": "AES_128_CTR_HMAC_SHA256_32",
                         "base_key": "00" * 32, "current": True}]),
     "unsupported cipher suite"),
    (_doc(content_keys=[{"key_id": 1, "base_key": "00" * 32, "current": "yes"}]),
     "current must be true or false"),
    (_doc(content_keys=[{"key_id": 1, "base_key": "00" * 32}]),
     "0 content keys are marked current"),
    (_doc(content_keys=[{"key_id": 1, "base_key": "00" * 32, "current": True},
                        {"key_id": 1, "base_key": "11" * 32}]),
     "two content keys share a Key ID"),
    (_doc(scope_key="00" * 32,
          content_keys=[{"key_id": 1, "base_key": "00" * 32, "current": True}]),
     "a content key equals the scope key S"),
    (_doc(producer={"private_key": "p.pem"}), "producer.kid must be a string"),
])
def test_scope_file_errors_are_one_line(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "scope.json"
    path.write_bytes(data)
    with pytest.raises(ScopeFileError) as info:
        load_scope_file(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_missing_and_bad_plain_files(tmp_path: Path) -> None:
    with pytest.raises(ScopeFileError, match=r"^scope file: a scope file is a JSON object$"):
        parse_scope_file(b"[]")
    with pytest.raises(ScopeFileError, match="No such file"):
        load_scope_file(tmp_path / "nope.json")
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"\xff" * 10)
    with pytest.raises(ScopeFileError, match="neither 32 raw octets"):
        load_scope_file(bad)


def test_write_secret_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_secret_file(path, b"one")
    assert path.read_bytes() == b"one" and _mode(path) == 0o600
    with pytest.raises(FileExistsError):
        write_secret_file(path, b"two")
    path.chmod(0o644)
    write_secret_file(path, b"two", overwrite=True)
    assert path.read_bytes() == b"two" and _mode(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret"]


# --------------------------------------------------------------------------- kvcs keygen


def test_keygen_creates_and_rotates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scope.json"
    rc, out, err = _keygen(capsys, str(path))
    assert rc == 0, err
    scope = load_scope_file(path)
    assert _mode(path) == 0o600
    assert f"scope id {scope_id(scope.scope_key).hex()}" in out
    assert "content key 1 (AES_128_GCM_SHA256_128, current)" in out
    assert scope.scope_key.key.hex() not in out and scope.content_keys[0].base_key.hex() not in out

    rc, out, err = _keygen(capsys, str(path), "--rotate", "--suite", "aes-256-gcm")
    assert rc == 0, err
    rotated = load_scope_file(path)
    assert rotated.scope_key == scope.scope_key and rotated.current_key_id == 2
    assert rotated.content_keys[0] == scope.content_keys[0]
    assert rotated.content_keys[1].suite is CipherSuite.AES_256_GCM_SHA512_128
    assert "added content key 2 (AES_256_GCM_SHA512_128), now current; Key IDs 1, 2" in out
    assert _mode(path) == 0o600
    # the producer signing key made beside the new scope file (issue 27), kept by --rotate
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "scope.json", "scope.producer.keyring.json", "scope.producer.pem"]
    assert rotated.producer == ProducerRef("producer", "scope.producer.pem",
                                           "scope.producer.keyring.json")

    rc, _, _ = _keygen(capsys, str(path), "--rotate")
    assert rc == 0
    assert load_scope_file(path).current_content_key() == ContentKey(
        3, CipherSuite.AES_256_GCM_SHA512_128, load_scope_file(path).content_keys[2].base_key)


def test_keygen_never_overwrites_without_force(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scope.json"
    assert _keygen(capsys, str(path))[0] == 0
    before = path.read_bytes()
    rc, out, err = _keygen(capsys, str(path))
    assert rc == 2 and out == ""
    assert err == (f"kvcs keygen: error: {path} exists; --rotate adds a content key, --force "
                   "replaces it with a new scope\n")
    assert path.read_bytes() == before
    rc, _, err = _keygen(capsys, str(path), "--force")
    assert rc == 0, err
    assert load_scope_file(path).scope_key != parse_scope_file(before).scope_key


def test_keygen_from_existing_scope_key(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    legacy = tmp_path / "scope.key"
    legacy.write_bytes(bytes(range(32)))
    path = tmp_path / "scope.json"
    rc, out, err = _keygen(capsys, str(path), "--scope-key", str(legacy))
    assert rc == 0, err
    assert load_scope_file(path).scope_key.key == bytes(range(32))
    assert scope_id(bytes(range(32))).hex() in out
    rc, _, err = _keygen(capsys, str(legacy), "--rotate")
    assert rc == 2 and "is a plain scope key file" in err
    assert legacy.read_bytes() == bytes(range(32))


@pytest.mark.parametrize(("args", "message"), [
    (["--rotate"], "does not exist; create it first (without --rotate)"),
    (["--suite", "des"], "--suite: unsupported cipher suite 'des'"),
    (["--scope-key", "/nonexistent/scope.key"], "--scope-key /nonexistent/scope.key: No such"),
    (["--signing-key", "/nonexistent/dir/p.pem"], "/nonexistent/dir is not a directory"),
])
def test_keygen_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            args: list[str], message: str) -> None:
    path = tmp_path / "scope.json"
    rc, out, err = _keygen(capsys, str(path), *args)
    assert rc == 2 and out == ""
    assert err.startswith("kvcs keygen: error: ") and message in err
    assert err.count("\n") == 1
    assert not path.exists()


def test_keygen_rejects_rotate_with_force(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scope.json"
    assert _keygen(capsys, str(path))[0] == 0
    rc, _, err = _keygen(capsys, str(path), "--rotate", "--force")
    assert rc == 2 and "--rotate keeps the scope" in err


def test_keygen_makes_a_producer_key_by_default(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "scope.json"
    rc, out, err = _keygen(capsys, str(path))
    assert rc == 0, err
    pem, keyring_path = tmp_path / "scope.producer.pem", tmp_path / "scope.producer.keyring.json"
    assert f"wrote {pem} (EdDSA signing key 'producer') and {keyring_path}" in out
    scope = load_scope_file(path)
    key, keyring = scope.producer_key(), scope.keyring()
    assert key is not None and keyring is not None and _mode(pem) == 0o600
    assert verify_manifest(sign_manifest(b"{}", key), keyring) == b"{}"
    bare = tmp_path / "bare.json"
    rc, out, err = _keygen(capsys, str(bare), "--no-signing-key")
    assert rc == 0, err
    assert load_scope_file(bare).producer is None and "signing key" not in out
    assert not (tmp_path / "bare.producer.pem").exists()


def test_keygen_signing_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keys").mkdir()
    path = tmp_path / "scope.json"
    pem = tmp_path / "keys" / "producer.pem"
    rc, out, err = _keygen(capsys, str(path), "--signing-key", str(pem), "--kid", "prod-1",
                           "--alg", "ES256")
    assert rc == 0, err
    keyring_path = tmp_path / "keys" / "producer.keyring.json"
    assert _mode(pem) == 0o600 and _mode(keyring_path) == 0o600
    assert f"wrote {pem} (ES256 signing key 'prod-1') and {keyring_path}" in out
    scope = load_scope_file(path)
    assert scope.producer == ProducerRef("prod-1", "keys/producer.pem",
                                         "keys/producer.keyring.json")
    key = scope.producer_key()
    keyring = scope.keyring()
    assert key is not None and keyring is not None and key.alg == "ES256"
    assert keyring.alg_for(b"prod-1") == "ES256"
    body = b'{"kvcs":1}'
    assert verify_manifest(sign_manifest(body, key), keyring) == body
    assert verify_manifest(sign_manifest(body, key), Keyring.load(keyring_path)) == body

    # the key files are never replaced without --force; the scope file is untouched
    before = path.read_bytes()
    rc, _, err = _keygen(capsys, str(path), "--signing-key", str(pem))
    assert rc == 2 and f"{pem} exists; use --force to replace it" in err
    assert path.read_bytes() == before

    # a signing key can be added to an existing scope file (its keys unchanged)
    other = tmp_path / "other.pem"
    rc, out, err = _keygen(capsys, str(path), "--signing-key", str(other), "--kid", "p2")
    assert rc == 0, err
    assert "replaces signing key 'prod-1'" in out
    updated = load_scope_file(path)
    assert updated.content_keys == scope.content_keys and updated.scope_key == scope.scope_key
    assert updated.producer == ProducerRef("p2", "other.pem", "other.keyring.json")


def test_scope_file_names_a_missing_producer_key(tmp_path: Path) -> None:
    scope = ScopeFile.new().with_producer(ProducerRef("p", "gone.pem", "gone.json"))
    path = tmp_path / "scope.json"
    path.write_bytes(scope.to_json())
    loaded = load_scope_file(path)
    with pytest.raises(ScopeFileError, match=r"producer key .*gone\.pem: No such file"):
        loaded.producer_key()
    with pytest.raises(ScopeFileError, match=r"producer keyring .*gone\.json: No such file"):
        loaded.keyring()
    assert ScopeFile.new().producer_key() is None and ScopeFile.new().keyring() is None
