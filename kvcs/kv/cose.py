"""COSE_Sign1 signing and verification of manifests (the "manifest.cose" track).

Follows ``cose-manifest.md``: EdDSA (Ed25519) is signed through pycose, ES256 is signed by
hand through OpenSSL (``cryptography``), never through pycose (python-ecdsa timing side
channel). Output is tagged (CBOR tag 18) with ``alg`` and ``kid`` in the protected header and
the manifest JSON attached. Verification accepts tagged and untagged messages, reads the kid
only from the protected header, pins the algorithm per kid and maps every failure to
SignatureError. Decoding works with cbor2 5 and 6 (the "thaw" step).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cbor2
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from .errors import SignatureError

__all__ = [
    "ALGORITHMS",
    "Keyring",
    "ProducerKey",
    "sign_manifest",
    "verify_manifest",
]

#: Supported algorithm names -> COSE algorithm identifiers.
ALGORITHMS: dict[str, int] = {"EdDSA": -8, "ES256": -7}
_COSE_SIGN1_TAG = 18

PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey


def _alg_for(key: Any, *, public: bool) -> str:
    """The COSE algorithm of a producer key (a public one if ``public``, else private)."""
    ed, ecc = ((ed25519.Ed25519PublicKey, ec.EllipticCurvePublicKey) if public
               else (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey))
    if isinstance(key, ed):
        return "EdDSA"
    if isinstance(key, ecc) and isinstance(key.curve, ec.SECP256R1):
        return "ES256"
    which = "public keys" if public else "keys"
    raise ValueError(f"producer {which} are Ed25519 (EdDSA) or P-256 (ES256)")


def _check_kid(kid: Any) -> bytes:
    if isinstance(kid, str):
        kid = kid.encode("utf-8")
    if not isinstance(kid, bytes) or not kid:
        raise ValueError("a kid is a non-empty byte string")
    return kid


@dataclass(frozen=True)
class ProducerKey:
    """A producer's private signing key with its key identifier.

    ``alg`` is ``"EdDSA"`` (Ed25519, the default) or ``"ES256"`` (P-256), derived from the key.
    """

    private_key: PrivateKey = field(repr=False)
    kid: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "kid", _check_kid(self.kid))
        _alg_for(self.private_key, public=False)

    @property
    def alg(self) -> str:
        """COSE algorithm name."""
        return _alg_for(self.private_key, public=False)

    @classmethod
    def generate(cls, kid: bytes | str, alg: str = "EdDSA") -> ProducerKey:
        """Generate a new key for ``alg`` (EdDSA or ES256)."""
        if alg == "EdDSA":
            return cls(ed25519.Ed25519PrivateKey.generate(), _check_kid(kid))
        if alg == "ES256":
            return cls(ec.generate_private_key(ec.SECP256R1()), _check_kid(kid))
        raise ValueError(f"unsupported algorithm {alg!r} (EdDSA or ES256)")

    @classmethod
    def from_pem(cls, pem: bytes | str, kid: bytes | str) -> ProducerKey:
        """Load an unencrypted PKCS#8 PEM private key."""
        data = pem.encode("ascii") if isinstance(pem, str) else pem
        key = serialization.load_pem_private_key(data, password=None)
        return cls(key, _check_kid(kid))  # type: ignore[arg-type]

    @classmethod
    def load(cls, path: str | os.PathLike[str], kid: bytes | str) -> ProducerKey:
        """Load a PEM private key file."""
        return cls.from_pem(Path(path).read_bytes(), kid)

    def private_pem(self) -> bytes:
        """Unencrypted PKCS#8 PEM of the private key."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the private key as PEM with mode 0600."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.private_pem())

    def public_key(self) -> PublicKey:
        """The public key."""
        return self.private_key.public_key()

    def public_pem(self) -> bytes:
        """SubjectPublicKeyInfo PEM of the public key."""
        return self.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


def _sign_eddsa(body: bytes, key: ProducerKey) -> bytes:
    priv = key.private_key
    assert isinstance(priv, ed25519.Ed25519PrivateKey)
    d = priv.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    x = priv.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    # pycose is imported where it is used: it is ~11 ms of `import kvcs` (cryptography's
    # COSE layer), paid by signing and verifying only.
    from pycose.algorithms import EdDSA
    from pycose.headers import KID, Algorithm
    from pycose.keys import OKPKey
    from pycose.keys.curves import Ed25519
    from pycose.keys.keyparam import KpAlg
    from pycose.messages import Sign1Message

    cose_key = OKPKey(crv=Ed25519, d=d, x=x, optional_params={KpAlg: EdDSA})
    msg = Sign1Message(phdr={Algorithm: EdDSA, KID: key.kid}, payload=body)
    msg.key = cose_key
    return bytes(msg.encode())


def _sign_es256(body: bytes, key: ProducerKey) -> bytes:
    priv = key.private_key
    assert isinstance(priv, ec.EllipticCurvePrivateKey)
    protected = cbor2.dumps({1: ALGORITHMS["ES256"], 4: key.kid})
    to_sign = cbor2.dumps(["Signature1", protected, b"", body])
    r, s = decode_dss_signature(priv.sign(to_sign, ec.ECDSA(hashes.SHA256())))
    sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    return cbor2.dumps(cbor2.CBORTag(_COSE_SIGN1_TAG, [protected, {}, body, sig]))


def sign_manifest(json_bytes: bytes, key: ProducerKey) -> bytes:
    """Return a tagged COSE_Sign1 with the manifest JSON attached, signed by ``key``.

    ES256 signatures are randomized: store the result, never re-sign a published version.
    """
    body = bytes(json_bytes)
    if key.alg == "EdDSA":
        return _sign_eddsa(body, key)
    return _sign_es256(body, key)


@dataclass(frozen=True)
class _TrustedKey:
    alg: str
    public_key: PublicKey
    cose_key: Any


def _cose_public(public_key: PublicKey, alg: str) -> Any:
    from pycose.algorithms import EdDSA, Es256
    from pycose.keys import EC2Key, OKPKey
    from pycose.keys.curves import P256, Ed25519
    from pycose.keys.keyparam import KpAlg

    if alg == "EdDSA":
        assert isinstance(public_key, ed25519.Ed25519PublicKey)
        x = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return OKPKey(crv=Ed25519, x=x, optional_params={KpAlg: EdDSA})
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    nums = public_key.public_numbers()
    return EC2Key(
        crv=P256,
        x=nums.x.to_bytes(32, "big"),
        y=nums.y.to_bytes(32, "big"),
        optional_params={KpAlg: Es256},
    )


def _load_public(data: bytes | str | PublicKey) -> PublicKey:
    if isinstance(data, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey):
        return data
    raw = data.encode("ascii") if isinstance(data, str) else data
    try:
        key = serialization.load_pem_public_key(raw)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"not a PEM public key: {exc}") from None
    _alg_for(key, public=True)
    return key  # type: ignore[return-value]


class Keyring:
    """Trusted producer public keys: kid -> (public key, pinned algorithm)."""

    def __init__(self) -> None:
        self._keys: dict[bytes, _TrustedKey] = {}

    def add(
        self, kid: bytes | str, public_key: bytes | str | PublicKey, alg: str | None = None
    ) -> None:
        """Trust ``public_key`` (object or PEM) for ``kid``; ``alg`` must match the key type."""
        kid_b = _check_kid(kid)
        pub = _load_public(public_key)
        key_alg = _alg_for(pub, public=True)
        if alg is not None and alg != key_alg:
            raise ValueError(f"key for kid {kid_b!r} is {key_alg}, not {alg}")
        self._keys[kid_b] = _TrustedKey(key_alg, pub, _cose_public(pub, key_alg))

    def add_producer(self, key: ProducerKey) -> None:
        """Trust the public half of a producer key."""
        self.add(key.kid, key.public_key(), key.alg)

    def alg_for(self, kid: bytes) -> str | None:
        """Pinned algorithm of ``kid``, or None if unknown."""
        entry = self._keys.get(kid)
        return entry.alg if entry else None

    def _get(self, kid: bytes) -> _TrustedKey | None:
        return self._keys.get(kid)

    def __contains__(self, kid: object) -> bool:
        return kid in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._keys)

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> Keyring:
        """Build from JSON ``{"keys": [{"kid": str | "kid_hex": hex, "alg": ..., "pem": ...}]}``."""
        obj = json.loads(data) if isinstance(data, bytes | str) else data
        ring = cls()
        entries = obj.get("keys") if isinstance(obj, Mapping) else None
        if not isinstance(entries, list):
            raise ValueError("keyring JSON must be an object with a 'keys' array")
        for e in entries:
            if not isinstance(e, Mapping) or not isinstance(e.get("pem"), str):
                raise ValueError("keyring entry needs 'pem' and 'kid' or 'kid_hex'")
            if isinstance(e.get("kid_hex"), str):
                kid: bytes | str = bytes.fromhex(e["kid_hex"])
            elif isinstance(e.get("kid"), str):
                kid = e["kid"]
            else:
                raise ValueError("keyring entry needs 'kid' (text) or 'kid_hex'")
            ring.add(kid, e["pem"], e.get("alg"))
        return ring

    @classmethod
    def load(cls, path: str | os.PathLike[str], kid: bytes | str | None = None) -> Keyring:
        """Load a directory of ``<kid>.pem`` files, a JSON keyring, or one PEM file.

        A single PEM file uses ``kid`` if given, else the file stem. Algorithms are pinned from
        the key types (and the ``alg`` members of a JSON keyring).
        """
        p = Path(path)
        ring = cls()
        if p.is_dir():
            for f in sorted(p.glob("*.pem")):
                ring.add(f.stem, f.read_bytes())
            return ring
        data = p.read_bytes()
        if p.suffix == ".json" or data.lstrip().startswith(b"{"):
            return cls.from_json(data)
        ring.add(kid if kid is not None else p.stem, data)
        return ring


def _thaw(arr: Any) -> list[Any]:
    """cbor2 6 decodes tag content as tuple/frozendict; pycose 1.1.0 needs list and dict."""
    return [arr[0], dict(arr[1]), arr[2], arr[3]]


def verify_manifest(blob: bytes | bytearray | memoryview, keyring: Keyring) -> bytes:
    """Verify a COSE_Sign1 manifest and return the signed JSON bytes (parse them afterwards).

    Raises SignatureError on every failure: malformed CBOR, wrong tag or structure, detached
    payload, kid missing from the protected header, unknown kid, algorithm different from the
    kid's pinned algorithm, or an invalid signature.
    """
    try:
        top = cbor2.loads(bytes(blob))
    except Exception as exc:
        raise SignatureError(f"manifest.cose is not valid CBOR: {type(exc).__name__}") from None
    if isinstance(top, cbor2.CBORTag):
        if top.tag != _COSE_SIGN1_TAG:
            raise SignatureError(f"CBOR tag {top.tag} is not COSE_Sign1 (18)")
        arr = top.value
    else:
        arr = top
    if not isinstance(arr, list | tuple) or len(arr) != 4:
        raise SignatureError("COSE_Sign1 is not a four-element array")
    protected, unprotected, payload, signature = arr
    if not isinstance(protected, bytes) or not isinstance(unprotected, Mapping):
        raise SignatureError("COSE_Sign1 headers are malformed")
    if payload is None:
        raise SignatureError("detached payloads are not used for manifests")
    if not isinstance(payload, bytes) or not isinstance(signature, bytes):
        raise SignatureError("COSE_Sign1 payload or signature is not a byte string")
    try:
        phdr = cbor2.loads(protected) if protected else {}
    except Exception:
        raise SignatureError("protected header is not valid CBOR") from None
    if not isinstance(phdr, Mapping):
        raise SignatureError("protected header is not a map")
    if 2 in phdr:
        raise SignatureError("critical header parameters are not supported")
    kid = phdr.get(4)
    if kid is None:
        where = "unprotected header only" if 4 in unprotected else "no header"
        raise SignatureError(f"kid is not in the protected header ({where})")
    if not isinstance(kid, bytes):
        raise SignatureError("kid is not a byte string")
    entry = keyring._get(kid)
    if entry is None:
        raise SignatureError(f"unknown kid {kid!r}")
    alg = phdr.get(1)
    if alg != ALGORITHMS[entry.alg]:
        raise SignatureError(
            f"algorithm {alg!r} does not match the algorithm pinned for kid {kid!r} ({entry.alg})"
        )
    from pycose.messages import Sign1Message

    try:
        msg = Sign1Message.from_cose_obj(_thaw(list(arr)), True)
        msg.key = entry.cose_key
        ok = msg.verify_signature()
    except Exception as exc:
        raise SignatureError(f"unusable COSE_Sign1: {type(exc).__name__}: {exc}") from None
    if not ok:
        raise SignatureError("bad signature")
    return payload
