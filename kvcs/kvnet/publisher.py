"""The KVCS publisher: stream a KV cache layer by layer as it is computed.

Embed it in a prefill worker::

    pub = KvPublisher(endpoint, scope, descriptor, tokens)
    await pub.start()                       # PUBLISH_NAMESPACE + manifest version 0
    for layer in range(L):
        k, v = run_layer(layer)             # numpy [tokens, kv_heads, head_dim]
        await pub.put_layer(layer, k, v)    # block objects, End of Group, back-pressure
    await pub.finish()                      # End of Track, final manifest

Mapping (kvcs-draft "Object Model Mapping"): Track Namespace ("kvcs-1", ScopeID, CompatID,
AnchorKey, PublicationID); tracks ``k.<codec>.sN`` / ``v.<codec>.sN`` (and optionally a
joint ``kv.<codec>.sN``); Group = layer; Object = block index within the segment;
Subgroup 0 in ascending Object order; End of Group after each layer, End of Track after
the last; Publisher Priority floor(128*g/L) (manifest: 0); no delivery timeouts;
MAX_CACHE_DURATION from the retention setting. A manifest version (Object 0 of a new
Group of ``manifest`` or, with a producer key, ``manifest.cose``) is published at start,
at least every ``manifest_every`` completed layers, and whenever a segment is added or
completes; it carries ``object_digests`` for every completed layer.

Appended tokens (or chunked prefill: one segment per pass) become segments ``.s1``,
``.s2`` ... with their own tracks. An error stops the publication; publish again with a
new :class:`KvPublisher` (new Publication ID).

With ``PublisherOptions(secure=...)`` (the scope's content keys) every object of every data
track and every manifest version is a MOQT Secure Object (:mod:`kvcs.kv.secure`), sent
with its Key ID in Immutable Properties and its authenticated Publisher Priority, and the
manifest says so (``protection``): relays forward and cache ciphertext. A layer's blocks
are encoded in one call per component (:func:`~kvcs.kv.codecs.encode_component_sections`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..kv.codecs import Buffer, codec_record, codec_value, encode_component_sections
from ..kv.component import Component
from ..kv.cose import ProducerKey, sign_manifest
from ..kv.errors import KvcsError
from ..kv.ids import (
    CompatDescriptor,
    KvcsNamespace,
    ScopeKey,
    block_keys,
    block_keys_sha256,
    new_publication_id,
    scope_id,
)
from ..kv.manifest import Manifest, Protection, Segment
from ..kv.payload import HEADER_SIZE, build_headers
from ..kv.secure import ContentKey, SecureObjects
from ..kv.tracks import TrackName
from ..moqt.track import CachedObject, Track
from ..moqt.wire import ObjectStatus, Parameters, Properties
from ..moqt.wire.properties import DEFAULT_PUBLISHER_PRIORITY, MAX_CACHE_DURATION
from ..publishing import HandOverTarget, PublishTarget, object_record
from .offload import sha256_digests

log = logging.getLogger(__name__)


class PublicationError(KvcsError):
    """The publication cannot continue (bad input, size limits, wrong order)."""


@dataclass
class PublisherOptions:
    """Publisher settings.

    ``codec``: codec of the ``k``/``v`` tracks (``raw`` keeps the KVSP layer digest
    property). ``joint_codec``: also offer a ``kv.<codec>`` track (e.g. ``q8``, ``zstd``).
    ``retention_s``: MAX_CACHE_DURATION of every track (None: unlimited).
    ``producer_key``: sign manifests (``manifest.cose``). ``hex_namespace``: the opt-in
    UTF-8-safe namespace encoding for relays that accept only UTF-8 fields (both ends must
    select it). ``max_group_bytes`` / ``max_group_objects``: refuse layers whose Group would
    exceed these (deployed relays cap groups: moq-dev/moq at 32 MiB and 8192 objects); with
    the ``raw`` codec the size is checked when the segment is created, otherwise before the
    first object of a layer is published. ``data_end_of_track``: end each data track with
    End of Track after its last layer (the KVCS mapping). Set it to False behind relays that
    forget a track once its upstream subscription ends, which makes earlier groups of a
    completed track unfetchable (moq-dev/moq); the manifest's ``complete`` still marks the
    end. ``hand_over_s``: :meth:`KvPublisher.finish` also waits, at most this many seconds,
    until the relay holds every track of the publication complete (the target must be a
    :class:`HandOverTarget`, an Endpoint connected to a kvcs relay), so the publisher may
    leave right after: the relay keeps the publication until MAX_CACHE_DURATION
    (docs/relay.md, "Publish and go"). None: finish() does not wait for the relay.
    ``hand_over_from_start``: with ``hand_over_s``, start the hand-over when the
    publication starts (:meth:`KvPublisher.start`), so that the relay pulls each object as
    it is published instead of every object once :meth:`KvPublisher.finish` is called
    (finish() then waits only for what the relay has not pulled yet: a vLLM producer's
    2048-token publication was confirmed 3-100 ms after its last layer was published,
    against 120-470 ms at load 5-20). Tracks of segments added later are handed over by
    finish().
    ``flush_s``: :meth:`KvPublisher.finish` waits at most this many seconds for the
    transport to send what is queued (then logs what is left and returns).

    ``secure``: protect every data track and the manifest end to end with these content
    keys (MOQT Secure Objects; the current key encrypts, :meth:`KvPublisher.use_content_key`
    rotates), e.g. ``load_scope_file("scope.json").secure_objects()``. ``secure_in_band``:
    carry the Key ID and the authenticated priority at the start of the payload instead of
    in object properties, for relays that drop object properties or rewrite priorities
    (moq-dev/moq); consumers read both forms.
    """

    codec: str = "raw"
    joint_codec: str | None = None
    retention_s: float | None = 3600.0
    producer_key: ProducerKey | None = None
    deterministic: bool = False
    manifest_every: int = 8
    hex_namespace: bool = False
    max_group_bytes: int | None = None
    max_group_objects: int | None = None
    drain_limit: int = 8 << 20
    publication_id: bytes | None = None
    data_end_of_track: bool = True
    hand_over_s: float | None = None
    hand_over_from_start: bool = False
    secure: SecureObjects | None = None
    secure_in_band: bool = False
    flush_s: float = 60.0

    def __post_init__(self) -> None:
        # a negative retention cannot be encoded: it failed in three tasks at once, and
        # the publisher then waited the whole hand-over timeout (300 s measured)
        if self.retention_s is not None and self.retention_s <= 0:
            raise PublicationError(f"retention_s must be positive (seconds) or None, got "
                                   f"{self.retention_s:g}")
        if self.hand_over_s is not None and self.hand_over_s <= 0:
            raise PublicationError(f"hand_over_s must be positive or None, got "
                                   f"{self.hand_over_s:g}")


@dataclass
class _SegmentState:
    number: int
    first_block: int
    blocks: int
    keys: list[bytes]
    tracks: dict[str, Track] = field(default_factory=dict)  # track name -> track
    digests: dict[str, list[list[str]]] = field(default_factory=dict)
    layers_done: int = 0
    next_layer: int = 0
    complete: bool = False
    since_manifest: int = 0


class KvPublisher:
    """Publishes one KV cache (one Publication) on a :class:`PublishTarget`."""

    def __init__(
        self,
        endpoint: PublishTarget,
        scope: ScopeKey,
        descriptor: CompatDescriptor | dict,
        tokens: Sequence[int] | np.ndarray,
        options: PublisherOptions | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.options = options or PublisherOptions()
        self.descriptor = (descriptor if isinstance(descriptor, CompatDescriptor)
                           else CompatDescriptor.from_dict(descriptor))
        self.scope = scope
        d = self.descriptor
        self.compat_id = d.compat_id
        self._tokens = np.asarray(tokens, dtype=np.int64)
        self._all_keys = block_keys(scope, self.compat_id, self._tokens, d.block_tokens)
        if not self._all_keys:
            raise PublicationError(
                f"{len(self._tokens)} tokens make no complete block of {d.block_tokens}")
        codec_value(self.options.codec)
        if self.options.joint_codec is not None:
            codec_value(self.options.joint_codec)
        if self.options.secure is not None and self.options.secure.current_key_id is None:
            raise PublicationError("secure: the content keys have no current key to "
                                   "encrypt with")
        self.publication_id = self.options.publication_id or new_publication_id()
        self.namespace = KvcsNamespace(scope_id(scope), self.compat_id, self._all_keys[-1],
                                       self.publication_id)
        self.fields = self.namespace.to_fields(hex_fields=self.options.hex_namespace)
        self._segments: list[_SegmentState] = []
        self._manifest_track: Track | None = None
        self._manifest_version = 0
        self._started = False
        self._failed: str | None = None
        self._lock = asyncio.Lock()
        self._hand_over: asyncio.Future[None] | None = None
        """The hand-over started with the publication (``hand_over_from_start``)."""
        self._handed_tracks: set[bytes] = set()
        """Names of the tracks it covers."""
        self._add_segment_state(len(self._all_keys))

    # ------------------------------------------------------------------ properties

    @property
    def manifest_track_name(self) -> bytes:
        """``manifest.cose`` with a producer key, else ``manifest``."""
        return TrackName.manifest(cose=self.options.producer_key is not None).to_bytes()

    @property
    def segments(self) -> int:
        """Number of segments so far."""
        return len(self._segments)

    def blocks(self, segment: int = 0) -> int:
        """Complete blocks of a segment."""
        return self._segments[segment].blocks

    @property
    def protected(self) -> bool:
        """True if the publication's objects are Secure Objects (``options.secure``)."""
        return self.options.secure is not None

    def use_content_key(self, key: ContentKey) -> None:
        """Key rotation: encrypt every object from now on with ``key`` (a new Key ID of
        the scope). Consumers that hold both keys decrypt both; one that lacks the new key
        holds its objects a bounded time, then treats them as missing."""
        if self.options.secure is None:
            raise PublicationError("use_content_key on an unprotected publication")
        self.options.secure.add_key(key, current=True)

    def _protect(self, track_name: bytes, group: int, object_id: int,
                 payload: Sequence[Buffer], priority: int) -> tuple[bytes, Properties]:
        """The payload and object properties to send for one object (its ``payload``
        pieces are joined once): as given, or encrypted under the current content key."""
        secure = self.options.secure
        if secure is None:
            return b"".join(payload), ()
        obj = secure.encrypt_object(self.fields, track_name, group, object_id, payload,
                                    publisher_priority=priority)
        if self.options.secure_in_band:
            return obj.in_band_payload(), ()
        return obj.payload, obj.properties

    # ------------------------------------------------------------------ lifecycle

    def _track_properties(self, priority: int) -> tuple[tuple[int, int | bytes], ...]:
        props: list[tuple[int, int | bytes]] = []
        if self.options.retention_s is not None:
            props.append((MAX_CACHE_DURATION, int(self.options.retention_s * 1000)))
        props.append((DEFAULT_PUBLISHER_PRIORITY, priority))
        return tuple(props)

    def _data_tracks(self, segment: int) -> list[tuple[Component, str, str]]:
        """(component, codec, track name) of each data track of a segment."""
        o = self.options
        kinds = [(Component.K, o.codec), (Component.V, o.codec)]
        if o.joint_codec is not None:
            kinds.append((Component.KV, o.joint_codec))
        return [(kind, codec, TrackName.data(kind, codec, segment).format())
                for kind, codec in kinds]

    def _add_segment_state(self, total_blocks: int) -> _SegmentState:
        first = sum(s.blocks for s in self._segments)
        n = total_blocks - first
        seg = _SegmentState(len(self._segments), first, n, self._all_keys[first:total_blocks])
        self._check_group_limits(seg)
        for _, _, name in self._data_tracks(seg.number):
            seg.tracks[name] = self.endpoint.create_track(self.fields, name.encode(),
                                                         self._track_properties(0))
            seg.digests[name] = []
        self._segments.append(seg)
        return seg

    def _check_group_limits(self, seg: _SegmentState) -> None:
        """Refuse a segment whose Groups cannot fit the relay's caps (exact for ``raw``)."""
        o = self.options
        d = self.descriptor
        objects = seg.blocks + 2  # blocks, End of Group, End of Track
        if o.max_group_objects is not None and objects > o.max_group_objects:
            raise PublicationError(
                f"segment {seg.number}: {seg.blocks} blocks make groups of {objects} objects, "
                f"over the relay's limit of {o.max_group_objects}: use smaller segments")
        if o.max_group_bytes is None:
            return
        # sizes known before encoding (a codec that fixes the octets per element: raw): the
        # larger of the K and V objects, and the joint object
        sizes = []
        for codec, dims in ((o.codec, max(d.head_dim, d.v_head_dim)),
                            (o.joint_codec, d.head_dim + d.v_head_dim)):
            element = codec_record(codec).element_size(d.dtype) if codec is not None else None
            if element is not None:
                sizes.append(HEADER_SIZE + d.block_tokens * d.kv_heads * element * dims)
        for size in sizes:
            if o.secure is not None:
                size = o.secure.protected_size(size, in_band=o.secure_in_band)
            total = size * seg.blocks
            if total > o.max_group_bytes:
                raise PublicationError(
                    f"segment {seg.number}: {seg.blocks} blocks make groups of {total} bytes, "
                    f"over the relay's limit of {o.max_group_bytes} bytes: use smaller "
                    "segments (fewer blocks per segment)")

    async def start(self) -> None:
        """Announce the namespace (PUBLISH_NAMESPACE) and publish manifest version 0."""
        if self._started:
            return
        self._manifest_track = self.endpoint.create_track(
            self.fields, self.manifest_track_name, self._track_properties(0))
        self._publish_manifest()
        await self.endpoint.announce(self.fields)
        self._started = True
        o = self.options
        if o.hand_over_s is not None and o.hand_over_from_start and isinstance(
                self.endpoint, HandOverTarget):
            self._handed_tracks = {t.name for t in self._tracks()}
            self._hand_over = asyncio.ensure_future(
                self.endpoint.hand_over(self.fields, None, live=True))
            # its error is reported by finish(); one that never comes is not an error
            self._hand_over.add_done_callback(
                lambda f: None if f.cancelled() else f.exception())
        log.info("publishing %s (%d blocks, %d layers)", self.publication_id.hex(),
                 self._segments[0].blocks, self.descriptor.layers)

    def add_segment(self, tokens: Sequence[int] | np.ndarray) -> int:
        """Append tokens (the full context grows to include them); returns the new
        segment number. Only complete blocks are published; the new segment covers the
        blocks the earlier segments did not."""
        self._check_ok()
        new = np.asarray(tokens, dtype=np.int64)
        self._tokens = np.concatenate([self._tokens, new])
        keys = block_keys(self.scope, self.compat_id, self._tokens,
                          self.descriptor.block_tokens)
        if len(keys) <= len(self._all_keys):
            raise PublicationError("the appended tokens complete no new block")
        self._all_keys = keys
        seg = self._add_segment_state(len(keys))
        self._publish_manifest()
        return seg.number

    # ------------------------------------------------------------------ layers

    def _check_ok(self) -> None:
        if self._failed is not None:
            raise PublicationError(f"publication stopped: {self._failed}")

    def _fail(self, reason: str) -> PublicationError:
        self._failed = reason
        self.abandon()
        return PublicationError(reason)

    def abandon(self) -> None:
        """Stop the hand-over started with the publication (one that will not finish: the
        relay's subscriptions to its tracks end)."""
        if self._hand_over is not None:
            self._hand_over.cancel()

    def _tracks(self) -> list[Track]:
        """Every track of the publication (manifest first)."""
        tracks = [] if self._manifest_track is None else [self._manifest_track]
        return tracks + [t for s in self._segments for t in s.tracks.values()]

    async def put_layer(self, layer: int, k: np.ndarray, v: np.ndarray, segment: int = 0) -> None:
        """Publish layer ``layer`` of a segment: K and V as [tokens, kv_heads, head_dim].

        ``tokens`` must be at least the segment's blocks x block_tokens (extra trailing
        tokens, a partial block, are ignored). Layers of a segment go in order 0..L-1.
        Each component's blocks are encoded in one call and hashed in a worker thread
        (:mod:`kvcs.kvnet.offload`) while the event loop sends what was published before;
        a track's objects are published (encrypted if protected) once its digests are in.
        Concurrent calls are serialized. Waits for the send queue to drain below
        ``options.drain_limit`` (back-pressure).
        """
        self._check_ok()
        if not self._started:
            await self.start()
        if not 0 <= segment < len(self._segments):
            raise PublicationError(f"no segment {segment}")
        seg = self._segments[segment]
        d = self.descriptor
        B = d.block_tokens
        need = seg.blocks * B
        for name, arr, shape in (("K", k, d.k_shape()), ("V", v, d.v_shape())):
            if arr.ndim != 3 or arr.shape[1:] != shape[1:] or arr.shape[0] < need:
                raise PublicationError(
                    f"layer {layer} {name} has shape {arr.shape}, expected "
                    f"[>= {need}, {shape[1]}, {shape[2]}]")
            if arr.dtype != d.dtype:
                raise PublicationError(f"layer {layer} {name} dtype {arr.dtype}, "
                                       f"descriptor says {d.dtype_name}")
        async with self._lock:  # another put_layer waits: layers go in order
            if layer != seg.next_layer:
                raise PublicationError(f"segment {segment}: expected layer "
                                       f"{seg.next_layer}, got {layer}")
            await self._publish_layer(seg, layer, k, v)
        await self.endpoint.drain(self.options.drain_limit)

    async def _publish_layer(self, seg: _SegmentState, layer: int, k: np.ndarray,
                             v: np.ndarray) -> None:
        d = self.descriptor
        o = self.options
        B = d.block_tokens
        L = d.layers
        prio = math.floor(128 * layer / L)
        tracks = self._data_tracks(seg.number)
        token0 = seg.first_block * B
        ep = self.endpoint
        rows = seg.blocks * B
        k, v = k[:rows], v[:rows]
        # every track's sections first (raw: views; q8: one compiled pass), and their
        # digests hashed in a worker thread, one track after the other, while the event
        # loop sends the previous layer (and the tracks published before)
        encoded = [(kind, codec, name, encode_component_sections(kind, codec, k, v, B))
                   for kind, codec, name in tracks]
        hashing = [asyncio.ensure_future(sha256_digests(sections))
                   for _, _, _, sections in encoded]

        async def objects(i: int) -> tuple[list[bytes], list[Properties] | None, list[str]]:
            """The payload of each block of track ``i``, their properties (None: none, a
            plaintext publication) and hex Data Digests."""
            kind, codec, name, sections = encoded[i]
            digests = await hashing[i]
            headers = build_headers(kind, layer, token0, B, codec, sections, digests)
            hexes = [digest.hex() for digest in digests]
            if o.secure is None:  # header + Data joined, as the track keeps them
                join = b"".join
                return [join(pair) for pair in zip(headers, sections, strict=True)], None, hexes
            protect, track_name = self._protect, name.encode()
            made = [protect(track_name, layer, b, pair, prio)
                    for b, pair in enumerate(zip(headers, sections, strict=True))]
            return [payload for payload, _ in made], [props for _, props in made], hexes

        normal = ObjectStatus.NORMAL

        def publish(name: str, payloads: list[bytes], props: list[Properties] | None,
                    hexes: list[str]) -> None:
            # the layer's objects and end markers as one run: one forwarding call chain
            # per layer and track instead of one per object
            track = seg.tracks[name]
            run = [CachedObject(layer, b, 0, prio, normal, tuple(p), payload)
                   for b, (payload, p) in enumerate(zip(
                       payloads, [()] * len(payloads) if props is None else props, strict=True))]
            run.append(CachedObject(layer, seg.blocks, 0, prio, ObjectStatus.END_OF_GROUP,
                                    (), b""))
            if layer == L - 1 and o.data_end_of_track:
                run.append(CachedObject(layer, seg.blocks + 1, 0, prio,
                                        ObjectStatus.END_OF_TRACK, (), b""))
            ep.publish_run(track, run)
            seg.digests[name].append(hexes)

        try:
            if o.max_group_bytes is None or all(codec_record(c).verbatim for _, c, _ in tracks):
                # Group sizes are known (checked exactly when the segment was added):
                # publish each track as soon as its digests are there
                for i, (_, _, name, _) in enumerate(encoded):
                    publish(name, *await objects(i))
            else:
                # compressed groups under a byte cap: make every Group of the layer first,
                # so that a layer over the cap publishes nothing
                groups = [(name, await objects(i)) for i, (_, _, name, _) in enumerate(encoded)]
                for name, made in groups:
                    total = sum(len(payload) for payload in made[0])
                    if total > o.max_group_bytes:
                        raise self._fail(
                            f"layer {layer} of {name} exceeds the {o.max_group_bytes}-byte "
                            "group limit of the relay: use a smaller segment")
                for name, made in groups:
                    publish(name, *made)
        finally:
            for task in hashing:  # an error (or cancellation) leaves no hashing behind
                task.cancel()
        seg.next_layer = layer + 1
        seg.layers_done += 1
        seg.since_manifest += 1
        if seg.layers_done == L:
            seg.complete = True
            self._publish_manifest()
        elif seg.since_manifest >= max(1, o.manifest_every):
            self._publish_manifest()

    # ------------------------------------------------------------------ manifest

    def manifest(self) -> Manifest:
        """The current manifest (as it would be published now)."""
        segs = [
            Segment(
                segment=s.number,
                first_block=s.first_block,
                blocks=s.blocks,
                block_keys_sha256=block_keys_sha256(s.keys).hex(),
                tracks=list(s.tracks),
                complete=s.complete,
                object_digests={n: [list(g) for g in gs] for n, gs in s.digests.items()},
            )
            for s in self._segments
        ]
        return Manifest.for_descriptor(self.descriptor, deterministic=self.options.deterministic,
                                       segments=segs,
                                       protection=self._protection())

    def _protection(self) -> Protection | None:
        secure = self.options.secure
        return None if secure is None else Protection(key_id_property=secure.wire.key_id_property)

    def _publish_manifest(self) -> None:
        track = self._manifest_track
        if track is None:
            return  # published by start()
        for s in self._segments:
            s.since_manifest = 0
        body = self.manifest().to_json_bytes()
        key = self.options.producer_key
        signed = sign_manifest(body, key) if key is not None else body
        group = self._manifest_version
        self._manifest_version += 1
        # signed first, then encrypted: consumers decrypt, then verify the signature
        payload, props = self._protect(track.name, group, 0, (signed,), 0)
        self.endpoint.publish_run(track, (
            object_record(track, group, 0, payload, priority=0, properties=props),
            object_record(track, group, 1, b"", status=ObjectStatus.END_OF_GROUP, priority=0)))

    async def finish(self) -> None:
        """End the manifest track (the publication is complete) and flush; with
        ``options.hand_over_s``, also wait until the relay holds it complete."""
        self._check_ok()
        if any(not s.complete for s in self._segments):
            raise PublicationError("finish() before every segment has all its layers")
        track = self._manifest_track
        if track is not None and track.end_of_track is None:
            g = self._manifest_version - 1
            self.endpoint.publish_run(track, (object_record(
                track, g, 2, b"", status=ObjectStatus.END_OF_TRACK, priority=0),))
        await self._flush()
        timeout = self.options.hand_over_s
        if timeout is None:
            return
        if not isinstance(self.endpoint, HandOverTarget):
            raise PublicationError("hand_over_s needs an endpoint connected to a relay")
        try:
            if self._hand_over is not None:
                try:
                    await asyncio.wait_for(self._hand_over, timeout)
                except TimeoutError:
                    raise PublicationError(f"the relay did not take the publication over: "
                                           f"not confirmed within {timeout:g} s") from None
                if all(t.name in self._handed_tracks for t in self._tracks()):
                    return
            await self.endpoint.hand_over(self.fields, timeout)
        except ConnectionError as exc:
            raise PublicationError(f"the relay did not take the publication over: "
                                   f"{exc}") from exc

    async def _flush(self) -> None:
        """Wait until the transport sent what is queued, at most ``options.flush_s``: a
        wait for the network must end. QUIC's count of unsent bytes can stay above zero
        for good after streams were reset during a path outage (qh3 2.1: 261,688 bytes
        with no stream of the session left open, after a 2 s blackhole on the publisher's
        hop at load 40; ``make faults`` then waited until its 120 s timeout)."""
        try:
            await asyncio.wait_for(self.endpoint.drain(0), self.options.flush_s)
        except TimeoutError:
            log.warning("finish: the transport did not send everything queued within "
                        "%g s; going on", self.options.flush_s)

    def withdraw(self) -> None:
        """Withdraw the namespace (the relay keeps completed tracks in its cache)."""
        self.endpoint.withdraw(self.fields)

    @staticmethod
    def params() -> Parameters:
        """Parameters a publisher would send (none beyond auth, kept for symmetry)."""
        return Parameters()
