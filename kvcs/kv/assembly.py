"""Sans-IO assembly of verified KV layers (KVCS "Verification and Recovery").

A :class:`LayerAssembler` is told what one retrieval wants: the Compatibility Descriptor,
a range of layers, the first ``blocks`` blocks of a segment (from ``first_block``), the
selected tracks (their codecs come from the names), the consumer's Block Keys and whether
authenticity is required. It is then given bytes:

* objects (component, group = layer, object = block, payload) from any MOQT source, in any
  order, duplicates included: :meth:`LayerAssembler.accept`;
* KVSP containers (one block, every layer) from HTTP holders:
  :meth:`LayerAssembler.accept_container`;
* newer manifest versions, whose ``object_digests`` every object of a listed layer must
  match (signed ones also confirm layers): :meth:`LayerAssembler.use_manifest`.

It verifies each object (with content keys, first that it decrypts as a MOQT Secure Object;
then the 68-octet header, Location, SHA-256, component, codec, token count and token start,
and the digest the manifest lists for it) and each container (layer digests, CompatID,
Block Key, token start, and the listed digests of the objects it stands for; in a protected
retrieval a container's block waits for that listing), decodes the verified data straight
into preallocated layer arrays (one pass: receive buffer -> layer), hands out complete
layers in order (:meth:`LayerAssembler.pop_ready`) and says exactly which blocks are still
missing (:meth:`LayerAssembler.missing`) and what of the unfinished layers was verified
(:meth:`LayerAssembler.partial`). A failed check discards the object, counts it as rejected
and leaves its block missing: nothing raises and no unverified byte reaches a yielded layer.
An object whose Key ID is not held is kept for ``key_wait_s``
(:meth:`LayerAssembler.release_held` retries it once the key is added to the
:class:`~kvcs.kv.secure.SecureObjects`), then treated as missing.

No I/O: :class:`kvcs.kvnet.consumer.KvConsumer` subscribes, fetches, retries and feeds it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from ..moqt.wire import ObjectRecord, Properties
from .codecs import (
    CODECS,
    BlockDecoder,
    BlockRunDecoder,
    Buffer,
    Codec,
    block_decoder,
    block_run_decoder,
    codec_record,
    decode_component_into,
    encode_component,
)
from .component import Component
from .container import decode_container, read_container
from .errors import ContainerError, ManifestError, VerificationError
from .ids import CompatDescriptor
from .manifest import Manifest, Segment
from .payload import HEADER_SIZE, HEADER_STRUCT, MAGIC, VERSION, verify_payload
from .prefault import empty as new_array
from .secure import SecureObjects, UnknownKeyIdError, effective_priority, open_object
from .secure_wire import IN_BAND_MAGIC
from .tracks import TrackName

__all__ = [
    "AssemblyStats",
    "KvLayer",
    "LayerArrays",
    "LayerAssembler",
    "Outcome",
    "check_layer_arrays",
    "codec_implemented",
    "select_tracks",
]

log = logging.getLogger(__name__)

_K, _V = Component.K, Component.V  # module constants: an Enum attribute costs a lookup



LayerArrays = tuple[np.ndarray, np.ndarray]
"""The (K, V) arrays of one layer, [tokens, kv_heads, head_dim] (V: ``v_head_dim``)."""


def check_layer_arrays(descriptor: CompatDescriptor, rows: int | None, arrays: LayerArrays,
                       what: str = "arrays") -> LayerArrays:
    """The first ``rows`` tokens of caller-provided layer arrays to assemble a layer into
    (views); ValueError unless they are writeable numpy arrays of the descriptor's dtype
    and head shapes with at least ``rows`` tokens (``None``: any number, a check made
    before the manifest tells how many)."""
    try:
        k, v = arrays
    except (TypeError, ValueError):
        raise ValueError(f"{what}: a (K, V) pair of arrays is needed") from None
    for name, arr, shape in (("K", k, descriptor.k_shape()), ("V", v, descriptor.v_shape())):
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"{what}: {name} is a {type(arr).__name__}, not a numpy array")
        if arr.ndim != 3 or arr.shape[1:] != shape[1:] or arr.shape[0] < (rows or 0):
            tokens = "tokens" if rows is None else f">= {rows}"
            raise ValueError(f"{what}: {name} has shape {arr.shape}, expected "
                             f"[{tokens}, {shape[1]}, {shape[2]}]")
        if arr.dtype != descriptor.dtype:
            raise ValueError(f"{what}: {name} dtype {arr.dtype}, the descriptor says "
                             f"{descriptor.dtype_name}")
        if not arr.flags.writeable:
            raise ValueError(f"{what}: {name} is read-only")
    return k[:rows], v[:rows]


@dataclass
class KvLayer:
    """One verified layer: K and V as [blocks*B, kv_heads, head_dim] arrays."""

    index: int
    k: np.ndarray
    v: np.ndarray
    blocks: int


@dataclass
class AssemblyStats:
    """Counters of what an assembler was given (several assemblers may share one)."""

    objects: int = 0
    """Objects verified and placed."""
    bytes: int = 0
    """Octets of the objects and containers placed."""
    rejected: int = 0
    """Objects and containers that failed verification (or a signed digest)."""
    duplicates: int = 0
    """Objects whose block was already placed (e.g. a retry overlapping what arrived)."""
    excess: int = 0
    """Objects of blocks beyond the ones wanted (a FETCH without an object filter)."""
    http_blocks: int = 0
    """Blocks (containers, all needed layers each) placed from KVSP HTTP holders."""
    held: int = 0
    """Protected objects held because their Key ID was not (yet) known."""


class Outcome(Enum):
    """What :meth:`LayerAssembler.accept` did with an object."""

    PLACED = "placed"
    """Verified and placed; its layer still misses blocks."""
    LAYER_COMPLETE = "layer complete"
    """Verified and placed, and its layer now has every wanted block of every track."""
    DUPLICATE = "duplicate"
    """Its block is already placed: dropped."""
    EXCESS = "excess"
    """A block beyond the wanted ones: dropped."""
    IGNORED = "ignored"
    """A layer outside the range, or already handed out: dropped."""
    REJECTED = "rejected"
    """Failed verification: dropped, its block stays missing."""
    HELD = "held"
    """Protected with a Key ID not held yet: kept a bounded time (its block is missing)."""


def codec_implemented(codec: str) -> bool:
    """True if this build can decode ``codec`` (a registered name; ``zstd`` needs the
    ``zstandard`` package)."""
    return codec in CODECS and codec_record(codec).available()


def select_tracks(segment: Segment, codecs: str | Sequence[str]) -> dict[Component, TrackName]:
    """The tracks of ``segment`` to retrieve, by codec preference: for each codec in order,
    the ``k`` and ``v`` pair, else the joint ``kv`` track. A single name means that codec,
    then ``raw``. Codecs this build does not implement (:func:`codec_implemented`) are
    skipped, so another listed encoding is selected (KVSP profile section 5);
    ManifestError if none of the preferred codecs is offered."""
    s = segment.segment
    prefs = (codecs, "raw") if isinstance(codecs, str) else tuple(codecs)
    for codec in dict.fromkeys(prefs):
        if not codec_implemented(codec):
            continue
        for kinds in ((Component.K, Component.V), (Component.KV,)):
            tracks = {kind: TrackName.data(kind, codec, s) for kind in kinds}
            if all(t.format() in segment.tracks for t in tracks.values()):
                return tracks
    raise ManifestError(f"segment {s} offers no usable tracks for codecs {list(prefs)}: "
                        f"{segment.tracks}")


@dataclass
class _LayerBuffer:
    """One layer being assembled: K and V rows for every wanted block, which blocks of each
    are placed, and the Data Digest each placed object had (checked against the manifest's
    listing)."""

    k: np.ndarray
    v: np.ndarray
    have_k: bytearray
    have_v: bytearray
    """1 where the block's K (V) rows are placed: bytearrays, whose item reads cost a
    fifth of a numpy array's on the per-object path."""
    placed: int = 0
    """Placed (block, K or V) pairs; the layer is complete at 2 x blocks."""
    digests: dict[tuple[Component, int], bytes] = field(default_factory=dict)
    from_containers: set[int] = field(default_factory=set)
    """Blocks placed from KVSP containers (a protected retrieval confirms them only by the
    manifest's listing)."""
    decoders: dict[Component, BlockDecoder] = field(default_factory=dict)
    """Each k or v track's :func:`~kvcs.kv.codecs.block_decoder` into this layer's K or V."""
    run_decoders: dict[Component, BlockRunDecoder] = field(default_factory=dict)
    """Each k or v track's :func:`~kvcs.kv.codecs.block_run_decoder` into it."""

    @classmethod
    def empty(cls, desc: CompatDescriptor, blocks: int,
              arrays: LayerArrays | None = None) -> _LayerBuffer:
        """A layer with nothing placed, in ``arrays`` (checked) or new arrays."""
        rows = blocks * desc.block_tokens
        if arrays is None:
            # every row is written: the pages faulted in at once
            k = new_array((rows, *desc.k_shape()[1:]), desc.dtype)
            v = new_array((rows, *desc.v_shape()[1:]), desc.dtype)
        else:
            k, v = check_layer_arrays(desc, rows, arrays)
        return cls(k, v, bytearray(blocks), bytearray(blocks))

    def complete(self) -> bool:
        return self.placed == 2 * len(self.have_k)

    def has(self, kind: Component, block: int) -> bool:
        if kind is _K:
            return bool(self.have_k[block])
        if kind is _V:
            return bool(self.have_v[block])
        return bool(self.have_k[block] and self.have_v[block])

    def place(self, block: int, k: np.ndarray, v: np.ndarray) -> None:
        """Copy verified rows of one block (K and V) into the layer."""
        rows = k.shape[0]
        self.k[block * rows:(block + 1) * rows] = k
        self.v[block * rows:(block + 1) * rows] = v
        self.mark(Component.KV, block)

    def mark(self, kind: Component, block: int) -> None:
        """Count the rows of ``kind`` of one block as placed (they were written)."""
        if kind is not _V and not self.have_k[block]:
            self.have_k[block] = 1
            self.placed += 1
        if kind is not _K and not self.have_v[block]:
            self.have_v[block] = 1
            self.placed += 1

    def drop(self, kind: Component, block: int) -> bool:
        """Forget a placed object (its signed digest differs); True if it was placed."""
        self.digests.pop((kind, block), None)
        dropped = False
        if kind.carries_k and self.have_k[block]:
            self.have_k[block] = 0
            self.placed -= 1
            dropped = True
        if kind.carries_v and self.have_v[block]:
            self.have_v[block] = 0
            self.placed -= 1
            dropped = True
        return dropped

    def missing(self) -> list[int]:
        have_k, have_v = self.have_k, self.have_v
        return [b for b in range(len(have_k)) if not (have_k[b] and have_v[b])]


_FIELDS = {kind: kind.field for kind in Component}

Placer = Callable[[memoryview, _LayerBuffer, int], None]
"""Decodes one verified object's Data into its block's rows of a layer."""


def _placer(kind: Component, codec: Codec, block_tokens: int) -> Placer:
    """The :data:`Placer` of the ``kind`` track: :func:`decode_component_into` with the
    checks of the output arrays and the codec's lookups made once per layer
    (:func:`~kvcs.kv.codecs.block_decoder`), ~10 Python calls per object fewer (the
    codec's checks of the Data stay)."""
    rows = block_tokens
    if kind is Component.KV:
        def place_kv(data: memoryview, buf: _LayerBuffer, block: int) -> None:
            at = slice(block * rows, (block + 1) * rows)
            decode_component_into(kind, codec, data, buf.k[at], buf.v[at])
        return place_kv
    carried = "k" if kind is Component.K else "v"

    def place(data: memoryview, buf: _LayerBuffer, block: int) -> None:
        decoder = buf.decoders.get(kind)
        if decoder is None:
            decoder = buf.decoders[kind] = block_decoder(codec, getattr(buf, carried), rows)
        decoder(data, block)
    return place


RunPlacer = Callable[[Sequence[Buffer], _LayerBuffer, int], int]
"""Decodes verified Data of consecutive blocks from ``first`` into a layer; returns -1 or
the index of the first section refused (:data:`~kvcs.kv.codecs.BlockRunDecoder`)."""


def _run_placer(kind: Component, codec: Codec, block_tokens: int) -> RunPlacer:
    """The :data:`RunPlacer` of the k or v track: one
    :func:`~kvcs.kv.codecs.block_run_decoder` per layer (a run of q8 blocks is one call of
    the compiled kernel)."""
    carried = "k" if kind is Component.K else "v"

    def place_run(sections: Sequence[Buffer], buf: _LayerBuffer, first: int) -> int:
        decoder = buf.run_decoders.get(kind)
        if decoder is None:
            decoder = buf.run_decoders[kind] = block_run_decoder(
                codec, getattr(buf, carried), block_tokens)
        return decoder(sections, first)
    return place_run


_Verified = tuple[int, int, memoryview, bytes, int]
"""An object of a run verified and waiting for its Data to be placed: (its index in the
run, block, Data, Data Digest, payload length)."""


@dataclass
class _Held:
    """A protected object waiting for the content key of its Key ID."""

    payload: Buffer
    publisher_priority: int
    properties: Properties
    namespace: tuple[bytes, ...]
    key_id: int
    deadline: float


class LayerAssembler:
    """Verifies objects and containers of one retrieval and assembles its layers.

    ``layers``: the contiguous layer range wanted; ``blocks``: how many blocks (the first
    ones of the segment, from ``first_block``, the segment's first absolute block index).
    ``tracks``: the selected track of each component (:func:`select_tracks`); none for a
    retrieval of containers only. ``block_keys``: the consumer's Block Keys from block 0,
    which name and verify containers. ``require_signed``: a layer is handed out only once
    every object of it matches the signed ``object_digests`` (:meth:`use_manifest`).
    ``secure``: the scope's content keys; every object must then decrypt (a protected
    publication, ``namespace`` its Track Namespace fields as on the wire), and containers
    are accepted only where the manifest, authenticated by the same keys, lists their
    digests. An object with an unknown Key ID is held ``key_wait_s`` seconds (``clock``)
    for its key. ``stats`` is updated in place (shared with the caller's counters).
    ``arrays``: where each layer is assembled, called with the layer index when its
    first object or container arrives: (K, V) arrays with at least ``blocks`` x
    block_tokens tokens (:func:`check_layer_arrays`; the first ones are written and handed
    out), e.g. a decode worker's reused cache buffers, whose memory is then not allocated
    and faulted in again for every layer; default: new arrays.
    """

    def __init__(
        self,
        descriptor: CompatDescriptor,
        layers: range,
        blocks: int,
        *,
        tracks: Mapping[Component, TrackName] | None = None,
        first_block: int = 0,
        block_keys: Sequence[bytes] = (),
        require_signed: bool = False,
        secure: SecureObjects | None = None,
        namespace: Sequence[bytes] = (),
        key_wait_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        stats: AssemblyStats | None = None,
        arrays: Callable[[int], LayerArrays] | None = None,
    ) -> None:
        if (layers.step != 1 or layers.start < 0 or layers.stop > descriptor.layers
                or not len(layers)):
            raise ValueError(f"layers must be a contiguous range within 0..{descriptor.layers}")
        if blocks < 1:
            raise ValueError(f"blocks = {blocks}: at least one block is needed")
        if require_signed and not tracks:
            raise ValueError("require_signed needs the tracks whose digests are signed")
        self.descriptor = descriptor
        self.layers = layers
        self.blocks = blocks
        self.first_block = first_block
        self.tracks: dict[Component, TrackName] = dict(tracks or {})
        self.block_keys = block_keys
        self.require_signed = require_signed
        self.secure = secure
        self.namespace = tuple(namespace)
        self.key_wait_s = key_wait_s
        self.stats = stats if stats is not None else AssemblyStats()
        self._clock = clock
        self._codecs = {kind: codec_record(t.codec or "") for kind, t in self.tracks.items()}
        self._placers = {kind: _placer(kind, codec, descriptor.block_tokens)
                         for kind, codec in self._codecs.items()}
        self._run_placers: dict[Component, RunPlacer] = {
            kind: _run_placer(kind, codec, descriptor.block_tokens)
            for kind, codec in self._codecs.items() if kind is not Component.KV}
        self._names = {kind: t.format().encode() for kind, t in self.tracks.items()}
        self._held: dict[tuple[Component, int, int], _Held] = {}
        self._given_up: set[int] = set()  # Key IDs whose objects waited in vain
        self._block_tokens = descriptor.block_tokens
        self._buffers: dict[int, _LayerBuffer] = {}
        self._arrays = arrays
        self._signed: dict[Component, list[list[str]]] = {}
        self._next = layers.start

    # ------------------------------------------------------------------ state

    @property
    def next_layer(self) -> int:
        """The next layer :meth:`pop_ready` hands out (``layers.stop`` when done)."""
        return self._next

    @property
    def yielded(self) -> int:
        """How many layers have been handed out."""
        return self._next - self.layers.start

    @property
    def done(self) -> bool:
        """Every wanted layer has been handed out."""
        return self._next >= self.layers.stop

    def missing(self) -> dict[int, list[int]]:
        """The blocks still missing, per layer not yet handed out (layer -> sorted block
        indexes within the segment). Placed objects whose digest differs from the one the
        manifest lists are dropped first (and counted as rejected); with authenticity
        required, a layer the manifest does not list yet misses every block (none of it
        can be confirmed)."""
        out: dict[int, list[int]] = {}
        for layer in range(self._next, self.layers.stop):
            buf = self._buffers.get(layer)
            if buf is None or (self.require_signed and not self._listed_layer(layer)):
                out[layer] = list(range(self.blocks))
                continue
            listed = self._listed_layer(layer)
            if listed:
                self._drop_mismatches(layer, buf)
            miss = buf.missing()
            if not listed and self._containers_wait(buf):
                miss = sorted({*miss, *buf.from_containers})
            if miss:
                out[layer] = miss
        return out

    def partial(self) -> dict[int, KvLayer]:
        """The verified blocks of the layers not handed out (those with any), for a caller
        that recomputes only what :meth:`missing` names: the rows of missing blocks are
        zero. With authenticity required, only layers the manifest lists count."""
        missing = self.missing()
        out: dict[int, KvLayer] = {}
        for layer in range(self._next, self.layers.stop):
            buf = self._buffers.get(layer)
            gaps = missing.get(layer, [])
            if buf is None or len(gaps) == self.blocks:
                continue
            rows = self._block_tokens
            for b in gaps:
                buf.k[b * rows:(b + 1) * rows] = 0
                buf.v[b * rows:(b + 1) * rows] = 0
            out[layer] = KvLayer(layer, buf.k, buf.v, self.blocks)
        return out

    def pop_ready(self) -> list[KvLayer]:
        """The layers complete (and confirmed) next in order; each is handed out once."""
        out: list[KvLayer] = []
        while self._next < self.layers.stop:
            buf = self._buffers.get(self._next)
            if buf is None or not buf.complete() or not self._confirmed(self._next, buf):
                break
            del self._buffers[self._next]
            out.append(KvLayer(self._next, buf.k, buf.v, self.blocks))
            self._next += 1
        return out

    # ------------------------------------------------------------------ objects

    def accept(self, kind: Component, layer: int, block: int, payload: Buffer, *,
               publisher_priority: int = 128, properties: Properties = (),
               namespace: Sequence[bytes] | None = None,
               data_sha256: bytes | None = None) -> Outcome:
        """Verify one object of the ``kind`` track at (``layer``, ``block``) and place it.

        ``publisher_priority`` (effective, :func:`~kvcs.kv.secure.effective_priority`) and
        ``properties`` as received matter for protected objects (the AAD); ``namespace``
        is that of another publication whose objects recover this one's (deterministic).
        ``data_sha256``: the SHA-256 of the payload's octets after the 68-octet header,
        computed beforehand (e.g. a batch in a worker thread); only for an unprotected
        retrieval (a protected object is hashed once decrypted). None: hashed here."""
        if layer < self._next or layer >= self.layers.stop:
            return Outcome.IGNORED
        if block >= self.blocks:
            self.stats.excess += 1
            return Outcome.EXCESS
        buf = self._buffers.get(layer) or self._buffer(layer)
        if buf.has(kind, block):
            self.stats.duplicates += 1
            return Outcome.DUPLICATE
        ns = self.namespace if namespace is None else tuple(namespace)
        try:
            digest = self._verify_and_place(buf, kind, layer, block, payload,
                                            publisher_priority, properties, ns,
                                            None if self.secure is not None else data_sha256)
        except UnknownKeyIdError as exc:
            return self._hold(kind, layer, block, _Held(
                payload, publisher_priority, properties, ns, exc.key_id,
                self._clock() + self.key_wait_s))
        except (VerificationError, ValueError) as exc:
            self._reject(kind, layer, block, exc)
            return Outcome.REJECTED
        buf.digests[(kind, block)] = digest  # checked when the manifest lists the layer
        stats = self.stats
        stats.objects += 1
        stats.bytes += len(payload)
        return Outcome.LAYER_COMPLETE if buf.complete() else Outcome.PLACED

    def accept_run(self, kind: Component, objects: Sequence[ObjectRecord], *,
                   data_sha256: Sequence[bytes | None] | None = None,
                   track_properties: Properties = (),
                   namespace: Sequence[bytes] | None = None) -> list[Outcome]:
        """Verify and place objects of the ``kind`` track that arrived together (a read's
        run of one subscription or fetch), in order: the outcomes, checks, counters and
        layers of :meth:`accept` called for each object (``group_id`` = layer,
        ``object_id`` = block, Publisher Priority :func:`~kvcs.kv.secure.effective_priority`
        of its own and ``track_properties``), in fewer calls. In an unprotected retrieval
        an object of the k or v track that carries no properties (every one a plain
        publication sends) is verified here: its header read once and every check of
        :meth:`accept` made in one expression, the failing ones again by :meth:`accept`'s
        code for the error to log; the Data of consecutive blocks of a layer is then decoded
        in one call (for q8 one call of the compiled kernel per run instead of per object;
        a section refused there is rejected with the error its own decode gives, and the
        run goes on after it). Any other object goes through :meth:`accept`.
        ``data_sha256``: per object, as :meth:`accept`'s."""
        n = len(objects)
        if data_sha256 is None:
            data_sha256 = [None] * n
        outcomes = [Outcome.IGNORED] * n
        place_run = self._run_placers.get(kind) if self.secure is None else None
        if place_run is None:  # protected, a joint kv track, or a track not selected
            for i, obj in enumerate(objects):
                outcomes[i] = self._accept_one(kind, obj, data_sha256[i], track_properties,
                                               namespace)
            return outcomes
        stats, buffers, blocks, stop = self.stats, self._buffers, self.blocks, self.layers.stop
        component, tokens, codec = _FIELDS[kind], self._block_tokens, self._codecs[kind].value
        first_token = self.first_block * tokens
        signed = self._signed.get(kind) or ()
        unpack, sha256 = HEADER_STRUCT.unpack_from, hashlib.sha256
        run: list[_Verified] = []  # verified, consecutive blocks of run_buf from run_first
        run_buf: _LayerBuffer | None = None
        run_layer = run_first = run_next = -1
        for i, obj in enumerate(objects):
            layer, block, payload = obj.group_id, obj.object_id, obj.payload
            if layer < self._next or layer >= stop:
                continue  # IGNORED
            if block >= blocks:
                stats.excess += 1
                outcomes[i] = Outcome.EXCESS
                continue
            if run and (layer != run_layer or block != run_next):
                # only a block not waiting in the run may be looked up (a duplicate of one
                # that is must see it placed, or rejected, first)
                self._place_run(kind, run_layer, run_buf, run_first, run, outcomes)
                run = []
            mv = payload if type(payload) is memoryview else memoryview(payload)
            size = len(mv)
            if obj.properties or size < HEADER_SIZE or mv.format != "B" or mv.ndim != 1:
                if run:
                    self._place_run(kind, run_layer, run_buf, run_first, run, outcomes)
                    run = []
                outcomes[i] = self._accept_one(kind, obj, data_sha256[i], track_properties,
                                               namespace)
                continue
            buf = buffers.get(layer) or self._buffer(layer)
            if (buf.have_k if kind is _K else buf.have_v)[block]:
                stats.duplicates += 1
                outcomes[i] = Outcome.DUPLICATE
                continue
            (magic, version, comp, _flags, h_layer, h_block, start, count, h_codec, _reserved,
             length, digest) = unpack(mv)
            data = mv[HEADER_SIZE:]
            sha = data_sha256[i]
            if sha is None:
                sha = sha256(data).digest()
            listed = bytes.fromhex(signed[layer][block]) if layer < len(signed) else None
            if not (magic == MAGIC and version == VERSION and comp == component
                    and h_layer == layer and h_block == block and HEADER_SIZE + length == size
                    and sha == digest and (listed is None or listed == digest)
                    and count == tokens and h_codec == codec
                    and start == first_token + block * tokens):
                # not a plain object of this track and Location (an in-band protected one
                # among them), or one failing a check: accept's code says which
                if run:  # keep the order of what is placed and rejected
                    self._place_run(kind, run_layer, run_buf, run_first, run, outcomes)
                    run = []
                outcomes[i] = self._accept_one(kind, obj, data_sha256[i], track_properties,
                                               namespace)
                continue
            if not run:
                run_buf, run_layer, run_first = buf, layer, block
            run.append((i, block, data, digest, size))
            run_next = block + 1
        if run:
            self._place_run(kind, run_layer, run_buf, run_first, run, outcomes)
        return outcomes

    def _accept_one(self, kind: Component, obj: ObjectRecord, data_sha256: bytes | None,
                    track_properties: Properties, namespace: Sequence[bytes] | None) -> Outcome:
        return self.accept(
            kind, obj.group_id, obj.object_id, obj.payload,
            publisher_priority=effective_priority(obj.publisher_priority, track_properties),
            properties=obj.properties, namespace=namespace, data_sha256=data_sha256)

    def _place_run(self, kind: Component, layer: int, buf: _LayerBuffer | None, first: int,
                   run: list[_Verified], outcomes: list[Outcome]) -> None:
        """Decode the verified Data of consecutive blocks from ``first`` (of the k or v
        track) into ``buf`` and mark them placed, in order: :meth:`accept`'s placement; a
        section the decoder refuses is rejected with the error its own decode gives
        (nothing of it written) and the rest goes on."""
        assert buf is not None
        place_run, stats = self._run_placers[kind], self.stats
        have = buf.have_k if kind is _K else buf.have_v
        digests, full = buf.digests, 2 * len(buf.have_k)
        while run:
            bad = place_run([v[2] for v in run], buf, first)
            done = run if bad < 0 else run[:bad]
            if bad >= 0:
                i, block, data, _digest, _size = run[bad]
                try:
                    self._placers[kind](data, buf, block)  # raises the section's own error
                except (VerificationError, ValueError) as exc:
                    self._reject(kind, layer, block, exc)
                    outcomes[i] = Outcome.REJECTED
                else:  # pragma: no cover - the block decoder took it after all: placed
                    done = run[:bad + 1]
            for i, block, _data, digest, size in done:
                have[block] = 1  # not placed before: checked when the run was made
                buf.placed += 1
                digests[(kind, block)] = digest  # checked when the manifest lists the layer
                stats.objects += 1
                stats.bytes += size
                outcomes[i] = Outcome.LAYER_COMPLETE if buf.placed == full else Outcome.PLACED
            if bad < 0:
                return
            run = run[bad + 1:]
            first = run[0][1] if run else first

    def _reject(self, kind: Component, layer: int, block: int, reason: object) -> None:
        self.stats.rejected += 1
        track = self.tracks.get(kind, kind.value)
        log.warning("discarding object %d/%d of %s: %s", layer, block, track, reason)

    def _verify_and_place(self, buf: _LayerBuffer, kind: Component, layer: int, block: int,
                          payload: Buffer, priority: int, properties: Properties,
                          namespace: tuple[bytes, ...], data_sha256: bytes | None) -> bytes:
        codec = self._codecs.get(kind)
        if codec is None:
            raise VerificationError(f"no {kind.value} track is selected")
        if self.secure is None and not properties and payload[:4] != IN_BAND_MAGIC:
            plain = payload  # what open_object returns for an object that carries no Key ID
        else:
            plain = open_object(self.secure, namespace, self._names[kind], layer, block,
                                payload, publisher_priority=priority, properties=properties)
        hdr = verify_payload(plain, group=layer, object_id=block,
                             expected_digest=self._listed(kind, layer, block),
                             data_sha256=data_sha256)
        if hdr.component != _FIELDS[kind]:
            raise VerificationError(f"component {hdr.component} on the {kind.value} track")
        tokens = self._block_tokens
        if hdr.token_count != tokens or hdr.codec != codec.value:
            raise VerificationError("token count or codec differs from the manifest")
        expected = (self.first_block + block) * tokens
        if hdr.token_start != expected:
            raise VerificationError(f"token start {hdr.token_start}, expected {expected}")
        # straight into the layer: a section that fails to decode leaves its rows unmarked
        self._placers[kind](hdr.data, buf, block)
        buf.mark(kind, block)
        return hdr.digest

    # ------------------------------------------------------------------ unknown Key IDs

    def _hold(self, kind: Component, layer: int, block: int, held: _Held) -> Outcome:
        if held.key_id in self._given_up:
            self._reject(kind, layer, block, f"no content key for Key ID {held.key_id}")
            return Outcome.REJECTED
        if self._held.setdefault((kind, layer, block), held) is held:
            self.stats.held += 1
            log.info("holding object %d/%d of %s: no content key for Key ID %d yet", layer,
                     block, self.tracks.get(kind, kind.value), held.key_id)
        return Outcome.HELD

    @property
    def held_until(self) -> float | None:
        """When the first held object expires (``clock`` time), None if none is held."""
        return min((h.deadline for h in self._held.values()), default=None)

    def release_held(self) -> bool:
        """Retry the held objects whose key is now held, and drop (count as rejected,
        leave missing) those held ``key_wait_s``; True if a layer may have completed."""
        if not self._held:
            return False
        now = self._clock()
        completed = False
        for (kind, layer, block), h in list(self._held.items()):
            if self.secure is not None and h.key_id in self.secure:
                del self._held[(kind, layer, block)]
                outcome = self.accept(kind, layer, block, h.payload,
                                      publisher_priority=h.publisher_priority,
                                      properties=h.properties, namespace=h.namespace)
                completed |= outcome is Outcome.LAYER_COMPLETE
            elif now >= h.deadline:
                del self._held[(kind, layer, block)]
                self._given_up.add(h.key_id)
                self._reject(kind, layer, block,
                             f"no content key for Key ID {h.key_id} within {self.key_wait_s} s")
        return completed

    # ------------------------------------------------------------------ containers

    def _containers_wait(self, buf: _LayerBuffer) -> bool:
        """``buf``, of a layer the manifest does not list yet, holds blocks from containers
        that must wait for the listing: in a protected retrieval the content keys do not
        cover the holder, only the manifest they authenticate does."""
        return self.secure is not None and bool(buf.from_containers)

    def container_blocks(self, missing: Mapping[int, Iterable[int]] | None = None) -> list[int]:
        """The blocks (within the segment) of ``missing`` (default: :meth:`missing`) that a
        container can supply: those the consumer has a Block Key for."""
        wanted = self.missing() if missing is None else missing
        have_key = len(self.block_keys) - self.first_block
        return sorted({b for blocks in wanted.values() for b in blocks if b < have_key})

    def block_key(self, block: int) -> bytes:
        """The Block Key naming block ``block`` (within the segment)."""
        return self.block_keys[self.first_block + block]

    def accept_container(self, block: int, data: Buffer) -> bool:
        """Verify a KVSP container of block ``block`` (within the segment) and place it in
        every layer not yet handed out that misses it; False if it was discarded."""
        if not 0 <= block < self.blocks:
            raise ValueError(f"block {block} is outside 0..{self.blocks - 1}")
        index = self.first_block + block
        d = self.descriptor
        try:
            c = read_container(data, descriptor=d, expected_block_key=self.block_key(block))
            start = index * d.block_tokens
            if c.token_start != start:
                raise ContainerError(f"token start {c.token_start}, expected {start}")
            ks, vs = decode_container(c, d)
        except (VerificationError, ValueError) as exc:  # ContainerError, or zstd missing
            self.stats.rejected += 1
            log.warning("discarding KVSP container of block %d: %s", index, exc)
            return False
        self.stats.http_blocks += 1
        self.stats.bytes += len(data)
        for layer in range(self._next, self.layers.stop):
            buf = self._buffer(layer)
            if buf.has(Component.KV, block):
                continue
            buf.place(block, ks[layer], vs[layer])
            for kind in self.tracks:  # checked like objects' when the manifest lists them
                buf.digests[(kind, block)] = self._object_digest(
                    kind, ks[layer], vs[layer], c.layers[layer].digest)
            buf.from_containers.add(block)
        return True

    def _object_digest(self, kind: Component, k: np.ndarray, v: np.ndarray,
                       layer_digest: bytes) -> bytes:
        """The Data Digest of the ``kind`` object that these raw K and V rows of one block
        and layer make on its track: SHA-256 of the raw section, the layer digest for
        ``kv.raw``; for another codec, of the rows encoded again (``q8`` is deterministic;
        a ``zstd`` digest matches when this zstandard writes the publisher's frame)."""
        codec = self._codecs[kind]
        if codec.verbatim and kind is Component.KV:
            return layer_digest
        return hashlib.sha256(encode_component(kind, codec, k, v)).digest()

    # ------------------------------------------------------------------ signed digests

    def use_manifest(self, manifest: Manifest) -> None:
        """Take the ``object_digests`` of a (newer) manifest version of the publication:
        every object and container of a listed layer must have its listed digest (checked
        at receipt, and for what was placed before the listing when the layer is handed
        out); with authenticity required (the manifest's signature was verified) they also
        confirm layers, and an unlisted layer waits; in a protected retrieval (the manifest
        decrypted with the content keys) they confirm the blocks placed from containers."""
        for kind, track in self.tracks.items():
            seg = manifest.segment(track.segment or 0)
            groups = None
            # a listed group has one digest per block of the segment: enough for ours?
            if seg is not None and seg.object_digests is not None and seg.blocks >= self.blocks:
                groups = seg.object_digests.get(track.format())
            self._signed[kind] = groups or []

    def _listed(self, kind: Component, layer: int, block: int) -> bytes | None:
        groups = self._signed.get(kind, ())
        return bytes.fromhex(groups[layer][block]) if layer < len(groups) else None

    def _listed_layer(self, layer: int) -> bool:
        """The manifest lists the signed digests of ``layer`` for every selected track."""
        return all(layer < len(self._signed.get(kind, ())) for kind in self.tracks)

    def _drop_mismatches(self, layer: int, buf: _LayerBuffer) -> None:
        """Drop (and count as rejected) the placed objects of a listed layer whose digest is
        not the listed one, so that recovery fetches them again."""
        for kind in self.tracks:
            listed = self._signed[kind][layer]
            for b in range(self.blocks):
                got = buf.digests.get((kind, b))
                if got is not None and got.hex() != listed[b] and buf.drop(kind, b):
                    self.stats.rejected += 1

    def _confirmed(self, layer: int, buf: _LayerBuffer) -> bool:
        """True if the complete layer may be handed out: every object of it has the digest
        the manifest lists, or the manifest does not list the layer yet and nothing in it
        needs the listing (authenticity required: every object; protected: the blocks
        from containers); otherwise the layer waits for a newer manifest version."""
        if not self._listed_layer(layer):
            return not (self.require_signed or self._containers_wait(buf))
        self._drop_mismatches(layer, buf)
        return buf.complete()

    def _buffer(self, layer: int) -> _LayerBuffer:
        buf = self._buffers.get(layer)
        if buf is None:
            arrays = None if self._arrays is None else self._arrays(layer)
            buf = self._buffers[layer] = _LayerBuffer.empty(self.descriptor, self.blocks,
                                                            arrays)
        return buf
