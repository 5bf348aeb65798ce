"""The wire choices of MOQT Secure Objects: where the Key ID travels and how the integers
inside the protected bytes are written (:class:`SecureWire`), and the framing functions
that follow them. Pure: no asyncio, no sockets.

Two deviations of kvcs from the Secure Objects draft's vectors, each a documented decision
(docs/secure-objects.md, docs/conformance.md):

* **Key ID property type.** The draft assigns 0x02; MOQT draft-22 registers 0x02 as
  OBJECT_DELIVERY_TIMEOUT, so kvcs uses 0x78 by default (:data:`KEY_ID_PROPERTY`).
* **Integers inside the protected bytes** (the plaintext's payload length, the Serialized
  Full Track Name of the key schedule, the in-band header's length). The draft says
  "varint" and its vectors use QUIC varints (RFC 9000 section 16); kvcs writes the
  variable-length integer of the MOQT version in use (draft-22's vi64) by default.

:data:`DRAFT_WIRE` (0x02 and QUIC varints) reads and writes exactly what an implementation
built from the draft's vectors does; :data:`KVCS_WIRE` is the default. Both ends of a
scope must use the same (``"wire": "draft"`` in the scope file,
``SecureObjects(wire=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..moqt.errors import ProtocolError
from ..moqt.wire import (
    IMMUTABLE_PROPERTIES,
    NeedMore,
    Properties,
    decode_kvps,
    decode_vi64,
    encode_kvps,
    encode_vi64,
)
from .codecs import Buffer
from .errors import VerificationError

__all__ = [
    "DRAFT_KEY_ID_PROPERTY",
    "DRAFT_WIRE",
    "ENCRYPTED_PROPERTIES_LIST",
    "IN_BAND_MAGIC",
    "KEY_ID_PROPERTY",
    "KVCS_WIRE",
    "MAX_KEY_ID",
    "SecureObjectError",
    "SecureWire",
    "build_immutable_properties",
    "carried_key_id",
    "decode_quic_varint",
    "encode_quic_varint",
    "frame_plaintext",
    "immutable_properties_of",
    "parse_plaintext",
    "read_key_id",
    "serialize_full_track_name",
    "split_in_band",
]

KEY_ID_PROPERTY = 0x78
"""Object property type that carries the Secure Object Key ID by default (inside Immutable
Properties).

The draft assigns 0x02, but MOQT draft-22 registers 0x02 as OBJECT_DELIVERY_TIMEOUT (scope
Track and Object) and makes processors look for properties in Immutable Properties too. A
conforming relay would read Key ID 1 on the first object of a subgroup as a 1 ms delivery
timeout and reset the stream or drop the objects: protected tracks would fail on exactly
the third-party relays protection exists for. kvcs therefore uses 0x78, the first type of
the range draft-22 reserves for applications and never allocates. It is even, so its value
is one varint, as the draft defines the Key ID. The cost: an implementation of the draft
does not find the Key ID unless both ends use :data:`DRAFT_WIRE`.
"""
DRAFT_KEY_ID_PROPERTY = 0x02
"""The draft's Key ID property type (clashes with draft-22's OBJECT_DELIVERY_TIMEOUT)."""

IN_BAND_MAGIC = b"SOB1"
"""First bytes of an in-band protected payload (:meth:`ProtectedObject.in_band_payload`).

No plaintext kvcs sends starts with them (KVCS payloads start with "KVO1", manifests with
"{" or a COSE_Sign1 CBOR head), so a consumer without keys can tell a protected object
from plaintext in both carriages and say that keys are needed."""

ENCRYPTED_PROPERTIES_LIST = 0x000A
"""16-bit type that starts the Encrypted Properties List inside a plaintext."""
_ENCRYPTED_LIST_TYPE = ENCRYPTED_PROPERTIES_LIST.to_bytes(2, "big")

MAX_KEY_ID = (1 << 64) - 1
"""Key IDs are written as u64 in the derivation labels."""


class SecureObjectError(VerificationError):
    """A protected object is unusable: authentication failed, its Key ID property is
    missing or malformed, its Location is out of range, or its plaintext framing is wrong.
    Discard it and treat it as missing."""


# --------------------------------------------------------------------------- QUIC varints


def encode_quic_varint(value: int) -> bytes:
    """RFC 9000 section 16: 1, 2, 4 or 8 bytes, the length in the top two bits."""
    if value < 0x40:
        return bytes((value,))
    if value < 0x4000:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 0x4000_0000:
        return (value | 0x8000_0000).to_bytes(4, "big")
    if value < 0x4000_0000_0000_0000:
        return (value | 0xC000_0000_0000_0000).to_bytes(8, "big")
    raise ValueError(f"{value} does not fit a QUIC varint")


def decode_quic_varint(buf: Buffer, pos: int = 0) -> tuple[int, int]:
    """``(value, next position)``; :class:`~kvcs.moqt.wire.NeedMore` when truncated."""
    mv = memoryview(buf)
    if pos >= mv.nbytes:
        raise NeedMore(1)
    size = 1 << (mv[pos] >> 6)
    if pos + size > mv.nbytes:
        raise NeedMore(pos + size - mv.nbytes)
    return int.from_bytes(mv[pos : pos + size], "big") & ((1 << (8 * size - 2)) - 1), pos + size


# --------------------------------------------------------------------------- the setting


@dataclass(frozen=True, slots=True)
class SecureWire:
    """Where the Key ID travels (``key_id_property``) and how the integers inside the
    protected bytes are written (``quic_varints``: RFC 9000 varints, else MOQT vi64)."""

    key_id_property: int = KEY_ID_PROPERTY
    quic_varints: bool = False

    @property
    def name(self) -> str:
        """``kvcs`` or ``draft`` (the scope file's ``"wire"``), else a description."""
        if self == KVCS_WIRE:
            return "kvcs"
        if self == DRAFT_WIRE:
            return "draft"
        return f"key id 0x{self.key_id_property:x}, {'quic' if self.quic_varints else 'vi64'}"

    @classmethod
    def named(cls, name: str) -> SecureWire:
        """:data:`KVCS_WIRE` for ``kvcs``, :data:`DRAFT_WIRE` for ``draft``."""
        try:
            return {"kvcs": KVCS_WIRE, "draft": DRAFT_WIRE}[name]
        except KeyError:
            raise ValueError(f"unknown Secure Objects wire {name!r} (kvcs or draft)") from None

    def encode_int(self, value: int) -> bytes:
        """An integer inside the protected bytes."""
        return encode_quic_varint(value) if self.quic_varints else encode_vi64(value)

    def decode_int(self, buf: Buffer, pos: int) -> tuple[int, int]:
        """``(value, next position)``; NeedMore when truncated."""
        return decode_quic_varint(buf, pos) if self.quic_varints else decode_vi64(buf, pos)


KVCS_WIRE = SecureWire()
"""The default: Key ID in property 0x78, MOQT draft-22 integers."""
DRAFT_WIRE = SecureWire(DRAFT_KEY_ID_PROPERTY, quic_varints=True)
"""The Secure Objects draft's vectors: Key ID in property 0x02, QUIC varints."""


# --------------------------------------------------------------------------- framing


def serialize_full_track_name(namespace: Sequence[bytes], track_name: bytes,
                              wire: SecureWire = KVCS_WIRE) -> bytes:
    """Wire form of a full track name for the key schedule: the namespace tuple (field
    count, then each field length-prefixed), then the length-prefixed track name."""
    enc = wire.encode_int
    parts = [enc(len(namespace))]
    for f in namespace:
        parts += (enc(len(f)), f)
    parts += (enc(len(track_name)), track_name)
    return b"".join(parts)


def frame_plaintext(payload: Buffer | Sequence[Buffer], wire: SecureWire = KVCS_WIRE) -> bytes:
    """``varint(len(payload)) || payload``; a sequence of pieces (e.g. the header and data
    from :func:`~kvcs.kv.payload.build_payload`) is joined in the same single copy.
    kvcs sends no Encrypted Properties List and no padding."""
    if isinstance(payload, bytes | bytearray):
        return b"".join((wire.encode_int(len(payload)), payload))
    pieces = (payload,) if isinstance(payload, memoryview) else payload
    size = sum(memoryview(p).nbytes for p in pieces)
    return b"".join((wire.encode_int(size), *pieces))


def parse_plaintext(plaintext: Buffer, wire: SecureWire = KVCS_WIRE) -> memoryview:
    """The original payload (a view, no copy) of a decrypted plaintext.

    A trailing Encrypted Properties List is accepted and ignored: its 16-bit type must be
    0x000A and its length must cover exactly the remaining bytes. Any other framing raises
    :class:`SecureObjectError`.
    """
    mv = memoryview(plaintext)
    total = mv.nbytes
    try:
        size, start = wire.decode_int(mv, 0)
    except NeedMore:
        raise SecureObjectError("plaintext too short for its length field") from None
    end = start + size
    if end > total:
        raise SecureObjectError(f"payload length {size} exceeds the plaintext")
    if end < total:
        if mv[end : end + 2] != _ENCRYPTED_LIST_TYPE:
            raise SecureObjectError("bytes after the payload are not an Encrypted Properties List")
        try:
            length, body = wire.decode_int(mv, end + 2)
        except NeedMore:
            raise SecureObjectError("Encrypted Properties List is truncated") from None
        if body + length != total:
            raise SecureObjectError("Encrypted Properties List length does not match")
    return mv[start:end]


# --------------------------------------------------------------------------- Key ID property


def build_immutable_properties(key_id: int, properties: Properties = (),
                               wire: SecureWire = KVCS_WIRE) -> bytes:
    """The Immutable Properties value of a protected object: the Key ID property plus the
    publisher's own immutable ``properties`` (MOQT Key-Value-Pairs)."""
    if not 0 <= key_id <= MAX_KEY_ID:
        raise ValueError(f"Key ID {key_id} is outside 0..2^64-1")
    for t, _ in properties:
        if t in (wire.key_id_property, IMMUTABLE_PROPERTIES):
            raise ValueError(f"property 0x{t:x} cannot be given inside Immutable Properties")
    return encode_kvps(((wire.key_id_property, key_id), *properties))


def immutable_properties_of(properties: Properties) -> bytes:
    """The exact bytes of an object's Immutable Properties (0x0B) value: what the AAD
    authenticates. Raises :class:`SecureObjectError` if absent or given twice."""
    values = [v for t, v in properties if t == IMMUTABLE_PROPERTIES]
    if not values:
        raise SecureObjectError("object has no Immutable Properties (no Key ID)")
    if len(values) > 1 or not isinstance(values[0], bytes):
        raise SecureObjectError("object has more than one Immutable Properties")
    return values[0]


def read_key_id(immutable_properties: Buffer, wire: SecureWire = KVCS_WIRE) -> int:
    """The Key ID in an Immutable Properties value; :class:`SecureObjectError` if it does
    not parse or does not hold exactly one Key ID property."""
    try:
        props = decode_kvps(immutable_properties)
    except ProtocolError as exc:
        raise SecureObjectError(f"Immutable Properties do not parse: {exc.reason}") from None
    ids = [v for t, v in props if t == wire.key_id_property]
    if len(ids) != 1 or not isinstance(ids[0], int):
        what = "no" if not ids else "more than one"
        raise SecureObjectError(f"Immutable Properties hold {what} Key ID property")
    return ids[0]


def carried_key_id(properties: Properties, payload: Buffer = b"",
                   wire: SecureWire = KVCS_WIRE) -> int | None:
    """The Key ID a received object carries, in its Immutable Properties or in-band
    (``payload`` starts with :data:`IN_BAND_MAGIC`); None for a plaintext object. A
    malformed Key ID raises :class:`SecureObjectError`."""
    if any(t == IMMUTABLE_PROPERTIES for t, _ in properties):
        return read_key_id(immutable_properties_of(properties), wire)
    if memoryview(payload)[:4] == IN_BAND_MAGIC:
        return read_key_id(split_in_band(payload, wire)[0], wire)
    return None


def split_in_band(payload: Buffer,
                  wire: SecureWire = KVCS_WIRE) -> tuple[memoryview, int, memoryview]:
    """``(immutable properties, publisher priority, ciphertext)`` of an in-band payload
    ``"SOB1" || varint(len(immutable)) || immutable || u8(priority) || ciphertext`` (views,
    no copy); :class:`SecureObjectError` if it does not parse."""
    mv = memoryview(payload).cast("B")
    if mv[:4] != IN_BAND_MAGIC:
        raise SecureObjectError("no Key ID: neither Immutable Properties nor an in-band "
                                "Secure Object")
    try:
        size, start = wire.decode_int(mv, 4)
    except NeedMore:
        raise SecureObjectError("in-band Key ID header is truncated") from None
    end = start + size
    if end + 1 > mv.nbytes:
        raise SecureObjectError("in-band Key ID header is truncated")
    return mv[start:end], mv[end], mv[end + 1 :]
