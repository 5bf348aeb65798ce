"""The KVCS manifest (JSON object of the "manifest" / "manifest.cose" tracks).

``Manifest.parse`` validates everything a consumer relies on and raises ManifestError;
``check_namespace`` binds a manifest to the Compatibility ID of its namespace;
``check_protection`` binds the ``protection`` member (a kvcs extension: the publication's
objects and manifest are MOQT Secure Objects) to how the manifest arrived.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import DescriptorError, ManifestError
from .ids import CompatDescriptor, KvcsNamespace
from .secure_wire import DRAFT_KEY_ID_PROPERTY, KEY_ID_PROPERTY
from .tracks import TrackName

__all__ = [
    "SECURE_OBJECTS",
    "Manifest",
    "Protection",
    "Segment",
    "check_namespace",
    "check_protection",
    "expected_digest",
    "segment_covers",
]

_HEX = frozenset("0123456789abcdef")
_HEX_RUN = re.compile("[0-9a-fA-F]*")

SECURE_OBJECTS = "moq-secure-objects"
"""The ``protection.scheme`` of publications protected with MOQT Secure Objects."""


@dataclass(frozen=True)
class Protection:
    """The ``protection`` member: every data track and the manifest track of the
    publication are protected end to end, so consumers accept only objects that decrypt.

    ``{"scheme": "moq-secure-objects", "key_id_property": 120}``: the scheme and the object
    property type that carries the Key ID (:data:`kvcs.kv.secure.KEY_ID_PROPERTY`, or 2 on
    the draft's wire: :data:`kvcs.kv.secure_wire.DRAFT_WIRE`). Key IDs
    and cipher suites are per object (rotation), so they are not listed.
    """

    scheme: str = SECURE_OBJECTS
    key_id_property: int = KEY_ID_PROPERTY

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"scheme": self.scheme, "key_id_property": self.key_id_property}

    @classmethod
    def from_dict(cls, obj: Any) -> Protection:
        """Validate a decoded ``protection`` member; ManifestError names what is wrong."""
        where = "manifest.protection"
        if not isinstance(obj, dict):
            raise ManifestError(f"{where} is not an object")
        scheme = _get(obj, "scheme", str, where)
        if scheme != SECURE_OBJECTS:
            raise ManifestError(f"{where}.scheme {scheme!r} is not supported "
                                f"(expected {SECURE_OBJECTS!r})")
        prop = _get_int(obj, "key_id_property", where)
        if prop not in (KEY_ID_PROPERTY, DRAFT_KEY_ID_PROPERTY):
            raise ManifestError(f"{where}.key_id_property {prop:#x} is not supported "
                                f"(kvcs reads {KEY_ID_PROPERTY:#x}, or "
                                f"{DRAFT_KEY_ID_PROPERTY:#x} on the draft's wire)")
        return cls(scheme, prop)


@dataclass
class Segment:
    """One segment entry of a manifest.

    ``object_digests`` maps a data track name to one list per completed Group (layer), each
    holding the hex Data Digests of the Group's Objects in Object order.
    """

    segment: int
    first_block: int
    blocks: int
    block_keys_sha256: str
    tracks: list[str]
    complete: bool
    object_digests: dict[str, list[list[str]]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``object_digests`` omitted when None)."""
        d: dict[str, Any] = {
            "segment": self.segment,
            "first_block": self.first_block,
            "blocks": self.blocks,
            "block_keys_sha256": self.block_keys_sha256,
            "tracks": list(self.tracks),
            "complete": self.complete,
        }
        if self.object_digests is not None:
            d["object_digests"] = {
                t: [list(g) for g in gs] for t, gs in self.object_digests.items()
            }
        return d


@dataclass
class Manifest:
    """A KVCS manifest version."""

    compat: dict[str, Any]
    layers: int
    block_tokens: int
    deterministic: bool = False
    segments: list[Segment] = field(default_factory=list)
    kvcs: int = 1
    protection: Protection | None = None
    """Set when the publication is protected end to end (omitted from the JSON when None)."""

    @classmethod
    def for_descriptor(
        cls,
        desc: CompatDescriptor | Mapping[str, Any],
        *,
        deterministic: bool = False,
        segments: Sequence[Segment] = (),
        protection: Protection | None = None,
    ) -> Manifest:
        """A manifest whose ``layers`` and ``block_tokens`` come from the descriptor."""
        d = desc if isinstance(desc, CompatDescriptor) else CompatDescriptor.from_dict(desc)
        return cls(d.to_dict(), d.layers, d.block_tokens, deterministic, list(segments),
                   protection=protection)

    @property
    def descriptor(self) -> CompatDescriptor:
        """The ``compat`` member as a validated CompatDescriptor."""
        return CompatDescriptor.from_dict(self.compat)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        d: dict[str, Any] = {
            "kvcs": self.kvcs,
            "compat": self.compat,
            "layers": self.layers,
            "block_tokens": self.block_tokens,
            "deterministic": self.deterministic,
            "segments": [s.to_dict() for s in self.segments],
        }
        if self.protection is not None:
            d["protection"] = self.protection.to_dict()
        return d

    def to_json_bytes(self) -> bytes:
        """Deterministic JSON (sorted keys, no whitespace, UTF-8)."""
        return json.dumps(
            self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")

    def segment(self, number: int) -> Segment | None:
        """The entry of segment ``number``, or None."""
        for s in self.segments:
            if s.segment == number:
                return s
        return None

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview | str) -> Manifest:
        """Parse and fully validate manifest JSON; raises ManifestError."""
        try:
            obj = json.loads(bytes(data) if not isinstance(data, str) else data)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ManifestError(f"manifest is not valid JSON: {exc}") from None
        return cls.from_dict(obj)

    @classmethod
    def from_dict(cls, obj: Any) -> Manifest:
        """Validate a decoded manifest object; raises ManifestError."""
        if not isinstance(obj, dict):
            raise ManifestError("manifest is not a JSON object")
        kvcs = _get_int(obj, "kvcs", "manifest")
        if kvcs != 1:
            raise ManifestError(f"manifest.kvcs = {kvcs} is not supported (expected 1)")
        compat = _get(obj, "compat", dict, "manifest")
        try:
            desc = CompatDescriptor.from_dict(compat)
        except DescriptorError as exc:
            raise ManifestError(f"manifest.compat: {exc}") from None
        layers = _get_int(obj, "layers", "manifest")
        block_tokens = _get_int(obj, "block_tokens", "manifest")
        if layers != desc.layers:
            raise ManifestError(f"manifest.layers = {layers} but compat.layers = {desc.layers}")
        if block_tokens != desc.block_tokens:
            raise ManifestError(
                f"manifest.block_tokens = {block_tokens} but compat.block_tokens = "
                f"{desc.block_tokens}"
            )
        deterministic = _get(obj, "deterministic", bool, "manifest")
        raw_segments = _get(obj, "segments", list, "manifest")
        segments = [_parse_segment(s, i, layers) for i, s in enumerate(raw_segments)]
        numbers = [s.segment for s in segments]
        if len(set(numbers)) != len(numbers):
            raise ManifestError("manifest lists a segment number twice")
        protection = Protection.from_dict(obj["protection"]) if "protection" in obj else None
        return cls(desc.to_dict(), layers, block_tokens, deterministic, segments, kvcs,
                   protection)


def _get(obj: Mapping[str, Any], name: str, typ: type, where: str) -> Any:
    if name not in obj:
        raise ManifestError(f"{where} is missing member {name!r}")
    v = obj[name]
    if not isinstance(v, typ) or (typ is not bool and isinstance(v, bool)):
        raise ManifestError(f"{where}.{name} must be of type {typ.__name__}")
    return v


def _get_int(obj: Mapping[str, Any], name: str, where: str, minimum: int = 0) -> int:
    v = _get(obj, name, int, where)
    if v < minimum:
        raise ManifestError(f"{where}.{name} = {v} is below {minimum}")
    return int(v)


def _hex32(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or not _HEX.issuperset(value.lower()):
        raise ManifestError(f"{where} must be 64 hex characters (a SHA-256 digest)")
    return value.lower()


def _hex32_list(values: list[Any], where: str) -> list[str]:
    """:func:`_hex32` of every entry, checked in one pass over the joined strings (a live
    consumer parses every listed digest of every manifest version: 1.6 us each with a
    check per entry, 0.13 ms per MiB of K/V retrieved), with no Python per entry when they
    are lower case already (as publishers write them): ``join`` refuses a non-string,
    ``map(len, ...)`` measures each."""
    try:
        joined = "".join(values)
    except TypeError:
        joined = None
    if joined is not None and _HEX_RUN.fullmatch(joined) and set(map(len, values)) <= {64}:
        lower = joined.lower()
        if lower == joined:
            return list(values)
        return [lower[i:i + 64] for i in range(0, len(lower), 64)]
    for i, v in enumerate(values):  # name the first bad entry
        _hex32(v, f"{where}[{i}]")
    raise AssertionError("unreachable: some entry failed the check above")


def _parse_segment(obj: Any, index: int, layers: int) -> Segment:
    where = f"manifest.segments[{index}]"
    if not isinstance(obj, dict):
        raise ManifestError(f"{where} is not an object")
    number = _get_int(obj, "segment", where)
    first_block = _get_int(obj, "first_block", where)
    blocks = _get_int(obj, "blocks", where)
    if first_block + blocks > 0xFFFFFFFF:
        raise ManifestError(f"{where}: block range exceeds 2^32")
    if "block_keys_sha256" not in obj:
        raise ManifestError(f"{where} is missing member 'block_keys_sha256'")
    bks = _hex32(obj["block_keys_sha256"], f"{where}.block_keys_sha256")
    tracks = _get(obj, "tracks", list, where)
    for t in tracks:
        if not isinstance(t, str):
            raise ManifestError(f"{where}.tracks has a non-string entry")
        try:
            tn = TrackName.parse(t)
        except ValueError as exc:
            raise ManifestError(f"{where}.tracks: {exc}") from None
        if tn.is_manifest:
            raise ManifestError(f"{where}.tracks lists the manifest track {t!r}")
        if tn.segment != number:
            raise ManifestError(f"{where}.tracks: {t!r} is not a track of segment {number}")
    if len(set(tracks)) != len(tracks):
        raise ManifestError(f"{where}.tracks lists a track twice")
    complete = _get(obj, "complete", bool, where)
    digests: dict[str, list[list[str]]] | None = None
    if "object_digests" in obj:
        raw = _get(obj, "object_digests", dict, where)
        digests = {}
        for track, groups in raw.items():
            dw = f"{where}.object_digests[{track!r}]"
            if track not in tracks:
                raise ManifestError(f"{dw}: track is not listed in tracks")
            if not isinstance(groups, list):
                raise ManifestError(f"{dw} must be an array of groups")
            if len(groups) > layers:
                raise ManifestError(f"{dw} has {len(groups)} groups, more than {layers} layers")
            out: list[list[str]] = []
            for g, group in enumerate(groups):
                if not isinstance(group, list) or len(group) != blocks:
                    raise ManifestError(f"{dw}[{g}] must be an array of {blocks} digests")
                out.append(_hex32_list(group, f"{dw}[{g}]"))
            digests[track] = out
    return Segment(number, first_block, blocks, bks, list(tracks), complete, digests)


def check_namespace(manifest: Manifest, namespace_compat_id: bytes | KvcsNamespace) -> None:
    """Raise ManifestError unless CompatID(manifest.compat) equals the namespace's CompatID."""
    cid = (
        namespace_compat_id.compat_id
        if isinstance(namespace_compat_id, KvcsNamespace)
        else bytes(namespace_compat_id)
    )
    try:
        mine = CompatDescriptor.from_dict(manifest.compat).compat_id
    except DescriptorError as exc:
        raise ManifestError(f"manifest.compat: {exc}") from None
    if mine != cid:
        raise ManifestError("manifest compat does not match the namespace Compatibility ID")


def check_protection(manifest: Manifest, *, protected: bool) -> None:
    """Raise ManifestError unless the ``protection`` member agrees with how the manifest
    arrived (``protected``: it was a Secure Object that decrypted): a protected manifest
    must declare protection, and a declared protection must not arrive in the clear (a
    relay that strips it cannot make consumers take the publication as plaintext)."""
    if protected and manifest.protection is None:
        raise ManifestError("the manifest arrived encrypted but does not declare protection")
    if not protected and manifest.protection is not None:
        raise ManifestError("the manifest declares protection but arrived unencrypted")


def segment_covers(segment: Segment, my_block_keys: Sequence[bytes]) -> bool:
    """True if the segment covers the consumer's tokens.

    ``my_block_keys`` are the consumer's Block Keys from block 0; the keys of blocks
    ``first_block .. first_block + blocks - 1`` are hashed and compared with
    ``block_keys_sha256``. False if the consumer has fewer keys than the segment needs.
    """
    end = segment.first_block + segment.blocks
    if len(my_block_keys) < end:
        return False
    h = hashlib.sha256()
    for k in my_block_keys[segment.first_block : end]:
        h.update(k)
    return h.hexdigest() == segment.block_keys_sha256.lower()


def expected_digest(
    manifest: Manifest, track: str | TrackName, layer: int, block: int
) -> bytes | None:
    """Listed Data Digest of Object ``block`` (index within the segment) of Group ``layer``.

    None when the manifest lists no digest for it (no ``object_digests``, track not listed,
    layer not completed yet, or block out of range).
    """
    tn = track if isinstance(track, TrackName) else TrackName.parse(track)
    if tn.segment is None:
        return None
    seg = manifest.segment(tn.segment)
    if seg is None or seg.object_digests is None:
        return None
    groups = seg.object_digests.get(tn.format())
    if groups is None or not 0 <= layer < len(groups):
        return None
    group = groups[layer]
    if not 0 <= block < len(group):
        return None
    return bytes.fromhex(group[block])
