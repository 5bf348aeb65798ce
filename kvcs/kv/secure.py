"""MOQT Secure Objects: end-to-end protection of object payloads against relays.

Implements the -01 line of draft-ietf-moq-secure-objects (``secure-objects.md``), which is
SFrame's crypto (RFC 9605) with nothing extra on the wire: the Key ID travels in an
immutable Object property, the counter is (Group ID, Object ID), and both ends build the
AAD from fields a relay can read but must not change. Pure: no asyncio, no sockets.

Layers, bottom up (each usable and tested on its own):

* cipher suites (:class:`CipherSuite`) and their AEADs (:func:`aead_for`);
* key schedule (:func:`derive_key_and_salt`), nonce (:func:`object_nonce`),
  AAD (:func:`secure_object_aad`), plaintext framing (:func:`frame_plaintext`,
  :func:`parse_plaintext`), the Key ID property (:func:`build_immutable_properties`,
  :func:`immutable_properties_of`, :func:`read_key_id`);
* :class:`SecureObjects`: the content keys of a scope, with per-track derived keys
  cached and per-key usage counted; :meth:`SecureObjects.encrypt_object` and
  :meth:`SecureObjects.decrypt_object` are what publishers and consumers call;
* the consumer's policy for any received object (:func:`open_object`): with content keys
  only objects that decrypt are accepted, without them a protected object is refused.

Two carriages of the Key ID: the draft's (an Immutable Properties object property, the
Publisher Priority authenticated as received) and, for relays that drop object properties
or rewrite priorities (moq-dev/moq does both), the same bytes in front of the ciphertext
(:meth:`ProtectedObject.in_band_payload`, after the magic :data:`IN_BAND_MAGIC`). Both
authenticate the same AAD; a receiver tells them apart by the presence of Immutable
Properties, and either from plaintext by its Key ID (:func:`carried_key_id`).

Where the Key ID travels and how the integers inside the protected bytes are written is
a setting (:class:`~kvcs.kv.secure_wire.SecureWire`, in :mod:`kvcs.kv.secure_wire` with
the framing functions): kvcs's default (property 0x78, MOQT draft-22 integers) or the
draft's vectors (property 0x02, QUIC varints).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import NamedTuple, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from ..moqt.wire import DEFAULT_PUBLISHER_PRIORITY, IMMUTABLE_PROPERTIES, Properties
from .codecs import Buffer
from .errors import KvcsError, VerificationError
from .secure_wire import (
    DRAFT_WIRE,
    ENCRYPTED_PROPERTIES_LIST,
    IN_BAND_MAGIC,
    KEY_ID_PROPERTY,
    KVCS_WIRE,
    MAX_KEY_ID,
    SecureObjectError,
    SecureWire,
    build_immutable_properties,
    carried_key_id,
    frame_plaintext,
    immutable_properties_of,
    parse_plaintext,
    read_key_id,
    serialize_full_track_name,
    split_in_band,
)

__all__ = [
    "DEFAULT_SUITE",
    "DRAFT_WIRE",
    "ENCRYPTED_PROPERTIES_LIST",
    "ENCRYPTION_BLOCK_LIMIT",
    "IN_BAND_MAGIC",
    "KEY_ID_PROPERTY",
    "KVCS_WIRE",
    "MAX_KEY_ID",
    "MAX_OBJECT_ID",
    "CipherSuite",
    "ContentKey",
    "CtrHmacAead",
    "KeyUsage",
    "KeyUsageLimitError",
    "ObjectAead",
    "ProtectedObject",
    "SecureObjectError",
    "SecureObjects",
    "SecureWire",
    "UnknownKeyIdError",
    "aead_for",
    "build_immutable_properties",
    "carried_key_id",
    "derivation_labels",
    "derive_key_and_salt",
    "effective_priority",
    "frame_plaintext",
    "immutable_properties_of",
    "moq_secret",
    "object_nonce",
    "open_object",
    "parse_plaintext",
    "read_key_id",
    "secure_object_aad",
    "serialize_full_track_name",
    "split_in_band",
]

MAX_OBJECT_ID = (1 << 32) - 1
"""Largest Object ID the nonce can hold; larger ones are never encrypted or decrypted."""
MAX_GROUP_ID = (1 << 64) - 1

ENCRYPTION_BLOCK_LIMIT = 1 << 36
"""AES blocks one content key may protect, counted as ceil(plaintext/16) + 1 per object.

draft-irtf-cfrg-aead-limits bounds the confidentiality advantage for AES-GCM (and AES-CTR)
by (blocks + objects + 1)^2 / 2^129; keeping it below 2^-57 allows 2^36 blocks, 1 TiB. It
is counted per Key ID (summed over every track the key covers), which is stricter than
the per-derived-key bound and survives the eviction of cached track keys.
"""

MIN_BASE_KEY_SIZE = 16
_BASE_KEY_SIZE = 32  # generated keys: 256 bits, enough for every suite's HKDF-Extract
_NONCE_SIZE = 12
_KEY_LABEL = b"MOQ 1.0 Secure Objects Secret key "  # the prefixes differ on purpose (draft)
_SALT_LABEL = b"MOQ 1.0 Secret salt "
_AAD_HEAD = struct.Struct(">QIB")
_CTR_HMAC_LENGTHS = struct.Struct(">QQQ")


class UnknownKeyIdError(VerificationError):
    """The object names a Key ID this side holds no key for (it was never decrypted).

    A consumer may hold such an object a bounded time and retry after
    :meth:`SecureObjects.add_key`, then treat it as missing.
    """

    def __init__(self, key_id: int) -> None:
        super().__init__(f"no content key for Key ID {key_id}")
        self.key_id = key_id


class KeyUsageLimitError(KvcsError):
    """A content key reached its usage limit: rotate to a new Key ID
    (``kvcs keygen --rotate``)."""


# --------------------------------------------------------------------------- suites


class _SuiteParams(NamedTuple):
    hash_name: str
    key_size: int  # Nk (for CTR+HMAC: Nka + Nh)
    tag_size: int  # Nt
    ctr_hmac: bool


_PARAMS: dict[int, _SuiteParams] = {
    0x0001: _SuiteParams("sha256", 48, 10, True),
    0x0002: _SuiteParams("sha256", 48, 8, True),
    0x0004: _SuiteParams("sha256", 16, 16, False),
    0x0005: _SuiteParams("sha512", 32, 16, False),
}
_ALIASES = {
    "aes-128-ctr-hmac-80": 0x0001,
    "aes-128-ctr-hmac-64": 0x0002,
    "aes-128-gcm": 0x0004,
    "aes-256-gcm": 0x0005,
}


class CipherSuite(IntEnum):
    """Supported entries of the "MoQ Secure Objects Cipher Suites" registry.

    0x0004 is mandatory and the default; 0x0001 is the SHOULD. 0x0003 (32-bit tag, not
    recommended) is not supported.
    """

    AES_128_CTR_HMAC_SHA256_80 = 0x0001
    AES_128_CTR_HMAC_SHA256_64 = 0x0002
    AES_128_GCM_SHA256_128 = 0x0004
    AES_256_GCM_SHA512_128 = 0x0005

    @property
    def hash_name(self) -> str:
        """hashlib name of the suite's hash (HKDF, HMAC)."""
        return _PARAMS[self].hash_name

    @property
    def key_size(self) -> int:
        """Nk: bytes of the derived ``moq_key``."""
        return _PARAMS[self].key_size

    @property
    def tag_size(self) -> int:
        """Nt: bytes the AEAD adds to the plaintext."""
        return _PARAMS[self].tag_size

    @property
    def forgery_limit(self) -> int | None:
        """Failed authentications tolerated per Key ID before it is retired (CTR+HMAC).

        A forgery succeeds with probability 2^-(8*Nt) per attempt; staying below 2^-57
        allows 2^(8*Nt - 57) attempts: 2^23 for 0x0001, 128 for 0x0002. None for GCM,
        whose 128-bit tag makes the bound unreachable.
        """
        p = _PARAMS[self]
        return 1 << (8 * p.tag_size - 57) if p.ctr_hmac else None

    @classmethod
    def parse(cls, value: str | int) -> CipherSuite:
        """A suite from its registry name, short alias (``aes-128-gcm``), or number."""
        if isinstance(value, str):
            text = value.strip()
            code = _ALIASES.get(text.lower())
            if code is None and text.upper() in cls.__members__:
                code = cls.__members__[text.upper()].value
            if code is None:
                try:
                    code = int(text, 0)
                except ValueError:
                    code = -1
        else:
            code = value
        if code not in _PARAMS:
            names = ", ".join(_ALIASES)
            raise ValueError(f"unsupported cipher suite {value!r} (one of {names})")
        return cls(code)


DEFAULT_SUITE = CipherSuite.AES_128_GCM_SHA256_128


class ObjectAead(Protocol):
    """An AEAD with the key bound: ``seal`` returns ``ct || tag``; ``open`` returns the
    plaintext or raises :class:`SecureObjectError`."""

    def seal(self, nonce: bytes, aad: bytes, plaintext: Buffer) -> bytes: ...

    def open(self, nonce: bytes, aad: bytes, ciphertext: Buffer) -> bytes: ...


class _GcmAead:
    __slots__ = ("_aead",)

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, nonce: bytes, aad: bytes, plaintext: Buffer) -> bytes:
        return self._aead.encrypt(nonce, plaintext, aad)

    def open(self, nonce: bytes, aad: bytes, ciphertext: Buffer) -> bytes:
        try:
            return self._aead.decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise SecureObjectError("authentication failed") from None


class CtrHmacAead:
    """The AES-CTR + HMAC-SHA256 AEAD of RFC 9605 section 4.5.1.

    ``key`` is 48 bytes: the AES-128 key, then the HMAC key. The tag is the first
    ``tag_size`` bytes of HMAC(auth_key, u64(len(aad)) || u64(len(ct)) || u64(Nt) ||
    nonce || aad || ct). The draft's published CTR vectors use another tag input; kvcs
    follows the RFC (see tests/kv/test_secure_objects.py).
    """

    __slots__ = ("_auth", "_enc_key", "_tag_size")

    def __init__(self, key: bytes, tag_size: int) -> None:
        if len(key) != 48:
            raise ValueError("an AES-128-CTR-HMAC-SHA256 key is 48 bytes")
        self._enc_key = algorithms.AES(key[:16])
        self._auth = hmac.new(key[16:], digestmod=hashlib.sha256)
        self._tag_size = tag_size

    def _ctr(self, nonce: bytes, data: Buffer) -> bytes:
        ctx = Cipher(self._enc_key, modes.CTR(nonce + bytes(4))).encryptor()
        out = ctx.update(data)
        ctx.finalize()  # CTR has no final block: returns b""
        return out

    def _tag(self, nonce: bytes, aad: bytes, ct: Buffer) -> bytes:
        mac = self._auth.copy()
        mac.update(_CTR_HMAC_LENGTHS.pack(len(aad), memoryview(ct).nbytes, self._tag_size))
        mac.update(nonce)
        mac.update(aad)
        mac.update(ct)
        return mac.digest()[: self._tag_size]

    def seal(self, nonce: bytes, aad: bytes, plaintext: Buffer) -> bytes:
        ct = self._ctr(nonce, plaintext)
        return ct + self._tag(nonce, aad, ct)

    def open(self, nonce: bytes, aad: bytes, ciphertext: Buffer) -> bytes:
        mv = memoryview(ciphertext)
        split = mv.nbytes - self._tag_size
        if split < 0:
            raise SecureObjectError("authentication failed")
        ct = mv[:split]
        # the tag is checked in constant time before anything is decrypted
        if not hmac.compare_digest(self._tag(nonce, aad, ct), mv[split:]):
            raise SecureObjectError("authentication failed")
        return self._ctr(nonce, ct)


def aead_for(suite: CipherSuite, key: bytes) -> ObjectAead:
    """The AEAD of ``suite`` keyed with ``key`` (a derived ``moq_key``)."""
    if len(key) != suite.key_size:
        raise ValueError(f"{suite.name} needs a {suite.key_size}-byte key, got {len(key)}")
    if _PARAMS[suite].ctr_hmac:
        return CtrHmacAead(key, suite.tag_size)
    return _GcmAead(key)


# --------------------------------------------------------------------------- key schedule


def moq_secret(base_key: bytes, suite: CipherSuite) -> bytes:
    """HKDF-Extract with an empty salt over the track base key (the suite's hash)."""
    return hmac.digest(b"", base_key, suite.hash_name)


def derivation_labels(
    full_track_name: bytes, suite: CipherSuite, key_id: int
) -> tuple[bytes, bytes]:
    """The HKDF-Expand ``info`` of the key and of the salt (suite u16be, Key ID u64be)."""
    suffix = full_track_name + suite.to_bytes(2, "big") + key_id.to_bytes(8, "big")
    return _KEY_LABEL + suffix, _SALT_LABEL + suffix


def derive_key_and_salt(
    base_key: bytes, suite: CipherSuite, key_id: int, full_track_name: bytes
) -> tuple[bytes, bytes]:
    """``(moq_key, moq_salt)`` of one track under one Key ID: every track gets its own."""
    secret = moq_secret(base_key, suite)
    key_label, salt_label = derivation_labels(full_track_name, suite, key_id)
    algorithm = hashes.SHA512() if suite.hash_name == "sha512" else hashes.SHA256()
    key = HKDFExpand(algorithm, suite.key_size, key_label).derive(secret)
    salt = HKDFExpand(algorithm, _NONCE_SIZE, salt_label).derive(secret)
    return key, salt


def _check_location(group_id: int, object_id: int) -> None:
    if not 0 <= group_id <= MAX_GROUP_ID:
        raise ValueError(f"Group ID {group_id} is outside 0..2^64-1")
    if not 0 <= object_id <= MAX_OBJECT_ID:
        raise ValueError(f"Object ID {object_id} is outside 0..2^32-1 (Secure Objects limit)")


def object_nonce(salt: bytes, group_id: int, object_id: int) -> bytes:
    """``salt XOR (u64be(Group ID) || u32be(Object ID))``; ValueError when out of range."""
    _check_location(group_id, object_id)
    return _xor_counter(salt, group_id, object_id)


def _xor_counter(salt: bytes, group_id: int, object_id: int) -> bytes:
    ctr = (group_id << 32) | object_id
    return (int.from_bytes(salt, "big") ^ ctr).to_bytes(_NONCE_SIZE, "big")


def secure_object_aad(
    group_id: int, object_id: int, publisher_priority: int, immutable_properties: Buffer
) -> bytes:
    """SECURE_OBJECT_AAD of the -01 line: u64 Group ID, u32 Object ID, u8 Publisher
    Priority, then the Immutable Properties value exactly as sent or received."""
    _check_location(group_id, object_id)
    if not 0 <= publisher_priority <= 255:
        raise ValueError(f"Publisher Priority {publisher_priority} is outside 0..255")
    return _AAD_HEAD.pack(group_id, object_id, publisher_priority) + bytes(immutable_properties)


def effective_priority(received: int | None, track_properties: Properties = ()) -> int:
    """The Publisher Priority an object was sent with, as the AAD needs it: the one received
    (subgroup header, datagram or FETCH object), else the track's
    DEFAULT_PUBLISHER_PRIORITY (from SUBSCRIBE_OK / FETCH_OK), else 128."""
    if received is not None:
        return received
    for t, v in track_properties:
        if t == DEFAULT_PUBLISHER_PRIORITY and isinstance(v, int):
            return v
    return 128


# --------------------------------------------------------------------------- objects


@dataclass(frozen=True)
class ContentKey:
    """One ``(Key ID, track_base_key)`` of a scope with its cipher suite. Never the KVSP
    scope key S (which keys the identifiers). Its repr never shows the key."""

    key_id: int
    suite: CipherSuite
    base_key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.key_id, bool) or not isinstance(self.key_id, int):
            raise ValueError("a Key ID is an integer")
        if not 0 <= self.key_id <= MAX_KEY_ID:
            raise ValueError(f"Key ID {self.key_id} is outside 0..2^64-1")
        object.__setattr__(self, "suite", CipherSuite.parse(self.suite))
        if not isinstance(self.base_key, bytes) or len(self.base_key) < MIN_BASE_KEY_SIZE:
            raise ValueError(f"a content base key is at least {MIN_BASE_KEY_SIZE} bytes")

    @classmethod
    def generate(cls, key_id: int, suite: CipherSuite = DEFAULT_SUITE) -> ContentKey:
        """A new random 32-byte base key."""
        return cls(key_id, suite, secrets.token_bytes(_BASE_KEY_SIZE))


@dataclass
class KeyUsage:
    """What one content key has done: objects and AES blocks protected, and failed
    authentications (the per-track failure rate the draft suggests watching)."""

    encryptions: int = 0
    encrypted_blocks: int = 0
    auth_failures: int = 0


@dataclass(frozen=True, slots=True)
class ProtectedObject:
    """An encrypted object: send ``payload`` with ``properties`` and exactly
    ``publisher_priority`` (authenticated), or send :meth:`in_band_payload` alone."""

    key_id: int
    immutable_properties: bytes
    payload: bytes
    publisher_priority: int
    wire: SecureWire = KVCS_WIRE

    @property
    def properties(self) -> Properties:
        """Object properties to send: the Immutable Properties carrying the Key ID."""
        return ((IMMUTABLE_PROPERTIES, self.immutable_properties),)

    def in_band_payload(self) -> bytes:
        """The in-band carriage, for relays that drop object properties or rewrite
        priorities: ``"SOB1" || vi64(len(immutable)) || immutable || u8(priority) ||
        payload``, sent without properties at any priority. The AAD is unchanged; it costs
        one copy of the payload and 8 bytes more for a one-byte Key ID."""
        imm = self.immutable_properties
        return b"".join((IN_BAND_MAGIC, self.wire.encode_int(len(imm)), imm,
                         bytes((self.publisher_priority,)), self.payload))


class _TrackCipher(NamedTuple):
    aead: ObjectAead
    salt: bytes
    key_id_only: bytes  # Immutable Properties when the publisher adds none of its own


class SecureObjects:
    """The content keys of a scope: encrypts and decrypts objects of any of its tracks.

    ``current_key_id`` (default: the highest Key ID) encrypts; every held key decrypts, so
    rotation is adding a key and making it current. Derived per-track keys are cached (LRU,
    ``cache_size`` tracks); usage is counted per Key ID (:data:`ENCRYPTION_BLOCK_LIMIT`).
    ``wire``: where the Key ID travels and how the protected bytes' integers are written
    (default :data:`KVCS_WIRE`; :data:`DRAFT_WIRE` for the draft's vectors).
    """

    def __init__(
        self,
        keys: Iterable[ContentKey] = (),
        current_key_id: int | None = None,
        *,
        block_limit: int = ENCRYPTION_BLOCK_LIMIT,
        cache_size: int = 1024,
        wire: SecureWire = KVCS_WIRE,
    ) -> None:
        self.wire = wire
        self._keys: dict[int, ContentKey] = {}
        self._usage: dict[int, KeyUsage] = {}
        # Immutable Properties holding only a held key's Key ID -> that Key ID: the common
        # case skips the KVP parser (about 1 us of the 8 us a 32 KiB object takes)
        self._key_id_only: dict[bytes, int] = {}
        self._tracks: OrderedDict[tuple[int, tuple[bytes, ...], bytes], _TrackCipher] = (
            OrderedDict()
        )
        self._block_limit = block_limit
        self._cache_size = cache_size
        self._current: int | None = None
        for key in keys:
            self.add_key(key)
        if current_key_id is not None:
            self.set_current(current_key_id)
        elif self._keys:
            self._current = max(self._keys)

    def add_key(self, key: ContentKey, *, current: bool = False) -> None:
        """Hold ``key`` (e.g. one that arrived after objects naming it); a Key ID names
        one key for good, so a different key under a held Key ID is refused."""
        held = self._keys.get(key.key_id)
        if held is not None and held != key:
            raise ValueError(f"Key ID {key.key_id} is already held with a different key")
        self._keys[key.key_id] = key
        self._usage.setdefault(key.key_id, KeyUsage())
        self._key_id_only[build_immutable_properties(key.key_id, (), self.wire)] = key.key_id
        if current:
            self._current = key.key_id

    def set_current(self, key_id: int) -> None:
        """Encrypt with ``key_id`` from now on."""
        if key_id not in self._keys:
            raise ValueError(f"no content key with Key ID {key_id}")
        self._current = key_id

    @property
    def current_key_id(self) -> int | None:
        """The Key ID new objects are encrypted with."""
        return self._current

    @property
    def key_ids(self) -> tuple[int, ...]:
        """Every held Key ID, ascending."""
        return tuple(sorted(self._keys))

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def usage(self, key_id: int) -> KeyUsage:
        """A snapshot of what ``key_id`` has done."""
        return replace(self._usage[key_id])

    def protected_size(self, size: int, *, in_band: bool = False) -> int:
        """Bytes on the wire of a ``size``-byte payload protected with the current key
        (the ``in_band`` carriage adds the Key ID header); ValueError without a key."""
        kid = self._current
        if kid is None:
            raise ValueError("no content key to encrypt with")
        w = self.wire
        out = len(w.encode_int(size)) + size + self._keys[kid].suite.tag_size
        if in_band:
            imm = len(build_immutable_properties(kid, (), w))
            out += len(IN_BAND_MAGIC) + len(w.encode_int(imm)) + imm + 1
        return out

    def _track(self, key_id: int, namespace: Sequence[bytes], track_name: bytes) -> _TrackCipher:
        cache_key = (key_id, tuple(namespace), track_name)
        entry = self._tracks.get(cache_key)
        if entry is not None:
            self._tracks.move_to_end(cache_key)
            return entry
        ck = self._keys[key_id]
        full_name = serialize_full_track_name(cache_key[1], track_name, self.wire)
        key, salt = derive_key_and_salt(ck.base_key, ck.suite, key_id, full_name)
        entry = _TrackCipher(aead_for(ck.suite, key), salt,
                             build_immutable_properties(key_id, (), self.wire))
        self._tracks[cache_key] = entry
        if len(self._tracks) > self._cache_size:
            self._tracks.popitem(last=False)
        return entry

    def encrypt_object(
        self,
        namespace: Sequence[bytes],
        track_name: bytes,
        group_id: int,
        object_id: int,
        payload: Buffer | Sequence[Buffer],
        *,
        publisher_priority: int,
        properties: Properties = (),
        key_id: int | None = None,
    ) -> ProtectedObject:
        """Encrypt one object of track ``namespace``/``track_name`` with the current key
        (or ``key_id``). ``payload`` may be a sequence of pieces. ``properties`` are extra
        immutable properties to authenticate. The object must then be sent with exactly
        this ``publisher_priority`` (always explicitly: the AAD covers it).

        Never encrypt two different payloads at one (track, Group ID, Object ID): the
        nonce is derived from them. ValueError on out-of-range input,
        :class:`KeyUsageLimitError` once the key's limit is reached.
        """
        kid = self._current if key_id is None else key_id
        if kid is None or kid not in self._keys:
            raise ValueError("no content key to encrypt with" if kid is None
                             else f"no content key with Key ID {kid}")
        track = self._track(kid, namespace, track_name)
        immutable = build_immutable_properties(kid, properties, self.wire) if properties else (
            track.key_id_only)
        aad = secure_object_aad(group_id, object_id, publisher_priority, immutable)
        nonce = _xor_counter(track.salt, group_id, object_id)  # range checked with the AAD
        plaintext = frame_plaintext(payload, self.wire)
        usage = self._usage[kid]
        blocks = (len(plaintext) + 15) // 16 + 1
        if usage.encrypted_blocks + blocks > self._block_limit:
            raise KeyUsageLimitError(
                f"Key ID {kid} reached its limit of {self._block_limit} AES blocks; "
                "rotate to a new Key ID")
        ciphertext = track.aead.seal(nonce, aad, plaintext)
        usage.encryptions += 1
        usage.encrypted_blocks += blocks
        return ProtectedObject(kid, immutable, ciphertext, publisher_priority, self.wire)

    def decrypt_object(
        self,
        namespace: Sequence[bytes],
        track_name: bytes,
        group_id: int,
        object_id: int,
        payload: Buffer,
        *,
        publisher_priority: int,
        properties: Properties,
    ) -> memoryview:
        """Authenticate and decrypt one received object; return its original payload (a
        view of the decrypted bytes).

        ``publisher_priority`` is the effective priority as received
        (:func:`effective_priority`); ``properties`` are the object's properties as
        received. An object without Immutable Properties is read as the in-band carriage
        (:func:`split_in_band`), whose own priority byte is the authenticated one. Raises
        :class:`UnknownKeyIdError` when no key is held for its Key ID, and
        :class:`SecureObjectError` for everything else that is wrong.
        """
        if any(t == IMMUTABLE_PROPERTIES for t, _ in properties):
            immutable = immutable_properties_of(properties)
        else:
            in_band, publisher_priority, payload = split_in_band(payload, self.wire)
            immutable = bytes(in_band)
        try:  # an object that can never be decrypted is not worth waiting for a key
            aad = secure_object_aad(group_id, object_id, publisher_priority, immutable)
        except ValueError as exc:
            raise SecureObjectError(str(exc)) from None
        kid = self._key_id_only.get(immutable)
        if kid is None:
            kid = read_key_id(immutable, self.wire)
        ck = self._keys.get(kid)
        if ck is None:
            raise UnknownKeyIdError(kid)
        usage = self._usage[kid]
        limit = ck.suite.forgery_limit
        if limit is not None and usage.auth_failures >= limit:
            raise SecureObjectError(
                f"Key ID {kid} is retired: {usage.auth_failures} failed authentications")
        track = self._track(kid, namespace, track_name)
        nonce = _xor_counter(track.salt, group_id, object_id)  # range checked with the AAD
        try:
            plaintext = track.aead.open(nonce, aad, payload)
        except SecureObjectError:
            usage.auth_failures += 1
            raise
        return parse_plaintext(plaintext, self.wire)


def open_object(
    secure: SecureObjects | None,
    namespace: Sequence[bytes],
    track_name: bytes,
    group_id: int,
    object_id: int,
    payload: Buffer,
    *,
    publisher_priority: int,
    properties: Properties,
    wire: SecureWire = KVCS_WIRE,
) -> Buffer:
    """A consumer's view of one received object's payload: what it may go on to check.

    With content keys (``secure``) the object must decrypt: a plaintext or tampered object
    raises :class:`SecureObjectError` (an unknown Key ID :class:`UnknownKeyIdError`), so a
    relay cannot downgrade a protected publication to plaintext. Without keys the payload
    is returned as received, unless the object carries a Key ID: then
    :class:`SecureObjectError` says that content keys are needed.
    """
    if secure is not None:
        return secure.decrypt_object(namespace, track_name, group_id, object_id, payload,
                                     publisher_priority=publisher_priority,
                                     properties=properties)
    kid = carried_key_id(properties, payload, wire)
    if kid is not None:
        raise SecureObjectError(f"object is protected (Key ID {kid}) and no content keys "
                                "are held")
    return payload
