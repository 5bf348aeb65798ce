"""The KVCS consumer: find a publication of a prompt's prefix, verify it, stream its layers.

Embed it in a decode worker::

    consumer = KvConsumer(endpoint, scope, descriptor, tokens)
    pub = await consumer.discover()                  # longest reusable prefix, or None
    async for layer in consumer.layers(pub):         # layer 0 first, while later ones arrive
        attend(layer.index, layer.k, layer.v)        # numpy [blocks*B, kv_heads, head_dim]

Procedures (kvcs-draft "Consumer Procedures"):

* discovery: SUBSCRIBE_NAMESPACE on ("kvcs-1", ScopeID, CompatID, AnchorKey) for the
  longest prefix, then successively shorter ones;
* manifest: ``manifest.cose`` first, ``manifest`` only when authenticity is not required;
  CompatID of ``compat`` must equal the namespace's, ``block_keys_sha256`` must cover the
  consumer's own Block Keys;
* a live cache: SUBSCRIBE with Next Object + FILL_PARAMETERS from {0,0} on each needed data
  track (exactly once); a completed one: FETCH of layers a..b (Absolute Start, Group End;
  ascending) plus OBJECTID_FILTER 0..n-1 when the peer allows range filters (else the
  excess objects are discarded); relays that refuse multi-group FETCH get one FETCH per
  layer;
* relay profiles (``relay_profile``, :mod:`kvcs.kvnet.relay_profile`): what the relay
  supports decides how a data track is retrieved (``"kvcs"``: a full draft-22 relay, with
  automatic fallbacks where a request is refused; ``"moq-dev"``: the limits of moq-dev/moq,
  whose live and completed tracks are both followed from the current group);
* every object is verified (header, Location, SHA-256, and the signed ``object_digests``
  when authenticity is required) and placed by a sans-IO
  :class:`~kvcs.kv.assembly.LayerAssembler`; a bad object is discarded and treated as
  missing;
* protection (``secure=``, the scope's content keys): the manifest and every object must
  decrypt as MOQT Secure Objects before any KVCS check, and the manifest must declare the
  protection; a plaintext or tampered object is missing, never a fallback. An object whose
  Key ID is not held waits ``key_wait_s`` for :meth:`KvConsumer.add_content_key`, then is
  missing;
* a layer is yielded as soon as all its needed blocks of K and V are verified, in layer
  order; missing blocks are retried (other endpoints = other relays, other publications
  when both are deterministic) within a recompute-time budget, then reported through
  :class:`RecomputeRequired`. Objects of different publications are never mixed unless
  both manifests say ``deterministic``;
* HTTP fallback (``http=KvspClient(...)``, KVSP profile section 8): blocks still missing
  after the MOQT sources are fetched as KVSP containers from HTTP holders, verified
  (layer digests, CompatID, Block Key, token start, and the signed ``object_digests`` when
  authenticity is required) and placed, within the same budget; with no MOQT path at all
  (no endpoint, nothing discovered), :meth:`KvConsumer.http_layers` retrieves the layers
  over HTTP alone, named by the Block Keys of the consumer's own prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..endpoint import Endpoint, MoqtRequestError, ReceivedObject
from ..kv.assembly import AssemblyStats, KvLayer, LayerAssembler, Outcome, select_tracks
from ..kv.codecs import codec_value
from ..kv.component import Component
from ..kv.container import max_container_size
from ..kv.cose import Keyring, verify_manifest
from ..kv.errors import KvcsError, ManifestError, SignatureError
from ..kv.ids import CompatDescriptor, KvcsNamespace, ScopeKey, block_keys, scope_id
from ..kv.manifest import Manifest, Segment, check_namespace, check_protection, segment_covers
from ..kv.secure import ContentKey, SecureObjects, effective_priority, open_object
from ..kv.tracks import TrackName
from ..moqt.errors import RequestErrorCode
from ..moqt.wire import (
    Location,
    LocationFilter,
    ObjectStatus,
    Parameters,
    Properties,
    RangeFilter,
)
from .relay_profile import RELAY_PROFILES, RelayProfile, TrackRetrieval

if TYPE_CHECKING:
    from .kvsp_http import KvspClient

__all__ = [
    "RELAY_PROFILES",
    "ConsumerStats",
    "KvConsumer",
    "KvLayer",
    "Publication",
    "RecomputeRequired",
]

log = logging.getLogger(__name__)

OBJECTID_FILTER = 0x26


class RecomputeRequired(KvcsError):
    """Some blocks could not be obtained and verified within the budget.

    ``missing`` maps layer -> sorted block indexes (within the segment) to recompute;
    ``yielded`` is how many layers were delivered before this was raised.
    """

    def __init__(self, missing: dict[int, list[int]], yielded: int, reason: str) -> None:
        layers = sorted(missing)
        super().__init__(f"{reason}: {len(layers)} layer(s) incomplete, first {layers[:1]}")
        self.missing = missing
        self.yielded = yielded
        self.reason = reason


@dataclass(frozen=True)
class Publication:
    """A publication found by discovery: its namespace and how many blocks its anchor
    covers (the reusable prefix)."""

    namespace: KvcsNamespace
    fields: tuple[bytes, ...]
    prefix_blocks: int


@dataclass
class ConsumerStats(AssemblyStats):
    """What the consumer saw (for logs, tests and benchmarks): the assembly counters
    (objects, bytes, rejected, duplicates, excess, http_blocks) and its own."""

    retries: int = 0
    first_layer_at: float | None = None
    started_at: float = 0.0
    finished_at: float | None = None


class KvConsumer:
    """Finds and retrieves KV caches for one prompt. See the module docstring."""

    def __init__(
        self,
        endpoints: Endpoint | Sequence[Endpoint],
        scope: ScopeKey,
        descriptor: CompatDescriptor | dict,
        tokens: Sequence[int] | np.ndarray,
        *,
        keyring: Keyring | None = None,
        require_signed: bool | None = None,
        codec: str = "raw",
        hex_namespace: bool = False,
        recompute_budget_s: float = 10.0,
        discovery_timeout: float = 0.1,
        on_progress: Callable[[str, int, int], None] | None = None,
        relay_profile: RelayProfile | str = "kvcs",
        http: KvspClient | None = None,
        secure: SecureObjects | None = None,
        key_wait_s: float = 2.0,
    ) -> None:
        self.endpoints = [endpoints] if isinstance(endpoints, Endpoint) else list(endpoints)
        if not self.endpoints and http is None:
            raise ValueError("at least one endpoint (or an HTTP client) is needed")
        self.http = http
        """KVSP HTTP holders (:class:`~kvcs.kvnet.kvsp_http.KvspClient`) used when MOQT
        sources fail (recovery) or when there is no MOQT path (:meth:`http_layers`)."""
        self.descriptor = (descriptor if isinstance(descriptor, CompatDescriptor)
                           else CompatDescriptor.from_dict(descriptor))
        self.scope = scope
        self.keyring = keyring
        self.require_signed = keyring is not None if require_signed is None else require_signed
        """Producer authenticity: only manifest.cose verified with ``keyring``, and every
        object checked against its signed digest. Default: required when a keyring is
        given (a consumer with producer keys never falls back to unsigned manifests)."""
        if self.require_signed and keyring is None:
            raise ValueError("require_signed needs a keyring of producer keys")
        self.codec = codec
        codec_value(codec)
        self.hex_namespace = hex_namespace
        self.recompute_budget_s = recompute_budget_s
        self.discovery_timeout = discovery_timeout
        self.on_progress = on_progress
        self.relay_profile = RelayProfile.resolve(relay_profile)
        """How data tracks are retrieved through the relay (:mod:`kvcs.kvnet.relay_profile`)."""
        self.compat_id = self.descriptor.compat_id
        self.scope_id = scope_id(scope)
        self.keys = block_keys(scope, self.compat_id, np.asarray(tokens, dtype=np.int64),
                               self.descriptor.block_tokens)
        self.secure = secure
        """The scope's content keys: only protected publications are accepted, and only
        objects that decrypt (None: only unprotected publications)."""
        self.key_wait_s = key_wait_s
        """Seconds an object with an unknown Key ID waits for its key before it is missing."""
        self._retrievals: set[_Retrieval] = set()
        self.stats = ConsumerStats()
        self.manifests: dict[tuple[bytes, ...], Manifest] = {}
        self.discarded: list[tuple[Publication, str]] = []
        """Publications found but rejected, with the reason."""

    def add_content_key(self, key: ContentKey) -> None:
        """Hold one more content key (e.g. after the publisher rotated to a Key ID this
        consumer did not have): objects waiting for it are decrypted now. Only for a
        consumer of protected publications (``secure=``)."""
        if self.secure is None:
            raise ValueError("add_content_key needs a consumer of protected publications "
                             "(KvConsumer(secure=...))")
        self.secure.add_key(key)
        for run in self._retrievals:
            run.ready.set()

    @property
    def endpoint(self) -> Endpoint:
        """The primary endpoint."""
        if not self.endpoints:
            raise ValueError("this consumer has no MOQT endpoint (HTTP only)")
        return self.endpoints[0]

    # ------------------------------------------------------------------ discovery

    def _prefix(self, n: int) -> tuple[bytes, ...]:
        fields = (self.scope_id, self.compat_id, self.keys[n - 1])
        if self.hex_namespace:
            return (b"kvcs-1", *(f.hex().encode() for f in fields))
        return (b"kvcs-1", *fields)

    async def discover(self, max_blocks: int | None = None,
                       endpoint: Endpoint | None = None) -> Publication | None:
        """Find a usable publication for the longest reusable prefix (None if nothing
        matches). Publications whose manifest fails its checks (CompatID, block keys,
        signature) are discarded and the next one is tried. None without any endpoint."""
        if endpoint is None and not self.endpoints:
            return None
        ep = endpoint or self.endpoint
        n = min(len(self.keys), max_blocks or len(self.keys))
        while n >= 1:
            for pub in await self._publications_at(ep, n):
                try:
                    await self.manifest(pub, ep)
                except (KvcsError, MoqtRequestError) as exc:
                    self.discarded.append((pub, str(exc)))
                    log.warning("discarding publication %s: %s",
                                pub.namespace.publication_id.hex(), exc)
                    continue
                return pub
            n -= 1
        return None

    async def discover_all(self, max_blocks: int | None = None,
                           endpoint: Endpoint | None = None) -> list[Publication]:
        """All publications of the longest prefix that has any (others first-found first)."""
        if endpoint is None and not self.endpoints:
            return []
        ep = endpoint or self.endpoint
        n = min(len(self.keys), max_blocks or len(self.keys))
        while n >= 1:
            pubs = await self._publications_at(ep, n)
            if pubs:
                return pubs
            n -= 1
        return []

    async def _publications_at(self, ep: Endpoint, n: int) -> list[Publication]:
        prefix = self._prefix(n)
        try:
            watch = await ep.subscribe_namespace(prefix)
        except MoqtRequestError as exc:
            if exc.code == RequestErrorCode.UNAUTHORIZED:
                raise
            return []
        out: list[Publication] = []
        try:
            # NAMESPACE messages follow the REQUEST_OK on the same stream: wait briefly
            wait = self.discovery_timeout
            while (change := await watch.next(wait)) is not None:
                added, ns = change
                wait = 0.01  # after the first answer, only collect what is already there
                if not added:
                    continue
                try:
                    kns = KvcsNamespace.from_fields(ns, hex_fields=self.hex_namespace)
                except ValueError:
                    continue
                out.append(Publication(kns, tuple(ns), n))
        finally:
            await watch.cancel()
        return out

    # ------------------------------------------------------------------ manifest

    async def manifest(self, pub: Publication, endpoint: Endpoint | None = None) -> Manifest:
        """Read and check the newest manifest of a publication (raises ManifestError or
        SignatureError)."""
        ep = endpoint or self.endpoint
        blob, protected, signed = await self._manifest_blob(ep, pub)
        return self._check_manifest(pub, blob, signed, protected)

    async def _manifest_blob(self, ep: Endpoint, pub: Publication) -> tuple[bytes, bool, bool]:
        names = [(TrackName.manifest(cose=True).to_bytes(), True)]
        if not self.require_signed:
            names.append((TrackName.manifest(cose=False).to_bytes(), False))
        last_exc: Exception | None = None
        for name, signed in names:
            try:
                largest = await self._largest(ep, pub, name)
            except MoqtRequestError as exc:
                last_exc = exc
                continue
            if largest is None:
                continue
            res = await ep.fetch(pub.fields, name, location_filter=LocationFilter.absolute_range(
                largest.group, 0, 0, 0))
            objs = [o async for o in res if o.status == ObjectStatus.NORMAL]
            if objs:
                props = res.ok.track_properties if res.ok is not None else ()
                return *self._open_manifest(pub, name, objs[-1], props), signed
        if self.require_signed:
            raise SignatureError("the publication has no signed manifest (manifest.cose)")
        raise ManifestError(f"no manifest found ({last_exc})")

    async def _largest(self, ep: Endpoint, pub: Publication, name: bytes) -> Location | None:
        """Largest Object of a track: TRACK_STATUS, or (relays without TRACK_STATUS, e.g.
        moq-dev/moq) the LARGEST_OBJECT of a SUBSCRIBE_OK that is cancelled at once."""
        if self.relay_profile.track_status:
            try:
                status = await ep.track_status(pub.fields, name)
                return status.params.largest_object
            except MoqtRequestError as exc:
                if exc.code != RequestErrorCode.NOT_SUPPORTED:
                    raise
                log.info("TRACK_STATUS refused (%s): using SUBSCRIBE_OK", exc)
        sub = await ep.subscribe(pub.fields, name, location_filter=LocationFilter.next_object())
        with contextlib.suppress(ConnectionError, KeyError, ValueError):
            await sub.cancel()
        return sub.largest

    def _open_manifest(self, pub: Publication, name: bytes, obj: ReceivedObject,
                       track_properties: Properties) -> tuple[bytes, bool]:
        """A manifest object's payload and whether it was protected: decrypted when this
        consumer holds content keys (it must then decrypt), else taken only in the clear
        (:func:`~kvcs.kv.secure.open_object`; SecureObjectError otherwise)."""
        payload = open_object(
            self.secure, pub.fields, name, obj.group_id, obj.object_id, obj.payload,
            publisher_priority=effective_priority(obj.publisher_priority, track_properties),
            properties=obj.properties)
        return bytes(payload), self.secure is not None

    def _check_manifest(self, pub: Publication, blob: bytes, signed: bool,
                        protected: bool) -> Manifest:
        if signed:
            if self.keyring is None:
                raise SignatureError("signed manifest but no keyring to verify it")
            blob = verify_manifest(blob, self.keyring)
        m = Manifest.parse(blob)
        check_namespace(m, pub.namespace.compat_id)
        check_protection(m, protected=protected)
        seg0 = m.segment(0)
        if seg0 is None:
            raise ManifestError("manifest has no segment 0")
        if not segment_covers(seg0, self.keys):
            raise ManifestError("block_keys_sha256 of segment 0 does not match this prompt")
        self.manifests[pub.fields] = m
        return m

    # ------------------------------------------------------------------ layers

    async def layers(
        self,
        pub: Publication,
        layers: range | None = None,
        blocks: int | None = None,
        segment: int = 0,
        *,
        manifest: Manifest | None = None,
        alternates: Sequence[Publication] = (),
    ) -> AsyncIterator[KvLayer]:
        """Yield verified layers of ``segment`` in order.

        ``layers`` defaults to all; ``blocks`` (first n blocks) defaults to what both the
        segment and this prompt cover. Live publications are subscribed (exactly once),
        completed ones fetched. Raises :class:`RecomputeRequired` when blocks stay missing.
        """
        m = manifest or await self.manifest(pub)
        seg = m.segment(segment)
        if seg is None:
            raise ManifestError(f"manifest has no segment {segment}")
        mine = max(0, len(self.keys) - seg.first_block)
        n = min(seg.blocks, mine if segment > 0 else seg.blocks)
        if blocks is not None:
            n = min(n, blocks)
        if n <= 0:
            return
        run = _Retrieval(self, pub, m, seg, self._layer_range(layers), n)
        self.stats.started_at = time.perf_counter()
        async for layer in run.run(alternates):
            if self.stats.first_layer_at is None:
                self.stats.first_layer_at = time.perf_counter()
            yield layer
        self.stats.finished_at = time.perf_counter()

    def _layer_range(self, layers: range | None) -> range:
        return layers if layers is not None else range(self.descriptor.layers)

    def _pop_ready(self, assembler: LayerAssembler) -> list[KvLayer]:
        """The assembler's next complete layers, reported to ``on_progress``."""
        out = assembler.pop_ready()
        if self.on_progress is not None:
            for layer in out:
                self.on_progress("layer", layer.index, assembler.layers.stop)
        return out

    # ------------------------------------------------------------------ HTTP (KVSP)

    async def http_layers(self, layers: range | None = None,
                          blocks: int | None = None) -> AsyncIterator[KvLayer]:
        """Yield verified layers retrieved over KVSP HTTP only (no MOQT path).

        Needs ``http``. The blocks are named by this prompt's own Block Keys (no manifest);
        ``blocks`` limits them to the first n (default: every complete block of the
        prompt). Each container is verified (layer digests, CompatID, Block Key, token
        start) before use; a bad one counts as rejected and its block as missing. All
        containers are fetched (``http.concurrency`` at a time) within
        ``recompute_budget_s``, then the layers are yielded in order. Blocks no holder
        delivered raise :class:`RecomputeRequired` naming them for every layer.

        Without a manifest there is no producer signature, so a consumer with
        ``require_signed=True`` refuses (SignatureError): use :meth:`layers`, whose
        recovery checks HTTP blocks against the signed ``object_digests``.
        """
        if self.http is None:
            raise ValueError("http_layers needs KvConsumer(http=KvspClient(...))")
        if self.require_signed:
            raise SignatureError("HTTP-only retrieval has no signed manifest to verify "
                                 "(require_signed)")
        n = len(self.keys) if blocks is None else min(blocks, len(self.keys))
        if n <= 0:
            return
        assembler = LayerAssembler(self.descriptor, self._layer_range(layers), n,
                                   block_keys=self.keys, stats=self.stats)
        self.stats.started_at = time.perf_counter()
        await self._http_fetch(assembler, range(n), time.monotonic() + self.recompute_budget_s)
        missing = assembler.missing()
        if missing:
            raise RecomputeRequired(missing, 0, "blocks not available over HTTP")
        for layer in self._pop_ready(assembler):
            if self.stats.first_layer_at is None:
                self.stats.first_layer_at = time.perf_counter()
            yield layer
        self.stats.finished_at = time.perf_counter()

    async def _http_fetch(self, assembler: LayerAssembler, blocks: Sequence[int],
                          deadline: float) -> None:
        """Fetch the containers of ``blocks`` (within the assembler's segment) from the
        KVSP holders, ``http.concurrency`` at a time until ``deadline``, and give each to
        the assembler, which verifies and places it."""
        assert self.http is not None
        http = self.http
        sem = asyncio.Semaphore(http.concurrency)
        limit = max_container_size(self.descriptor)
        failed: list[int] = []

        async def one(block: int) -> None:
            index = assembler.first_block + block
            async with sem:
                try:
                    data = await http.get_block(self.scope_id, self.compat_id,
                                                assembler.block_key(block), max_bytes=limit)
                except KvcsError as exc:  # the first failure loud, the others (alike) quiet
                    failed.append(index)
                    log.log(logging.WARNING if len(failed) == 1 else logging.INFO,
                            "KVSP retrieval of block %d failed: %s", index, exc)
                    return
            if data is None:
                log.info("no KVSP holder has block %d", index)
                return
            assembler.accept_container(block, data)

        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*(one(b) for b in blocks)), left)
        except TimeoutError:
            log.warning("KVSP retrieval stopped at the recompute budget")


class _Retrieval:
    """The I/O of one retrieval of a layer range of a segment: feeds every object of the
    selected tracks to a :class:`LayerAssembler` and yields what it assembles, then
    recovers what is missing (other endpoints, other publications, KVSP HTTP)."""

    def __init__(self, consumer: KvConsumer, pub: Publication, manifest: Manifest,
                 seg: Segment, layers: range, n: int) -> None:
        self.c = consumer
        self.pub = pub
        self.manifest = manifest
        self.seg = seg
        self.n = n
        self.assembler = LayerAssembler(
            consumer.descriptor, layers, n, tracks=select_tracks(seg, consumer.codec),
            first_block=seg.first_block, block_keys=consumer.keys,
            require_signed=consumer.require_signed, secure=consumer.secure,
            namespace=pub.fields, key_wait_s=consumer.key_wait_s, stats=consumer.stats)
        self.assembler.use_manifest(manifest)
        self.ready = asyncio.Event()
        """Set when a layer may have become ready, or a feeder ended."""
        self.feeding = 0
        """Feeders (one per selected track) still running."""

    def _take(self, kind: Component, obj: ReceivedObject, track_properties: Properties = (),
              pub: Publication | None = None) -> None:
        """Give one received object (of ``pub``, default this publication) to the
        assembler; wake the loop if a layer completed. ``track_properties`` (of the
        SUBSCRIBE_OK / FETCH_OK) give the priority an object inherits."""
        if obj.status != ObjectStatus.NORMAL:
            return
        outcome = self.assembler.accept(
            kind, obj.group_id, obj.object_id, obj.payload,
            publisher_priority=effective_priority(obj.publisher_priority, track_properties),
            properties=obj.properties,
            namespace=None if pub is None or pub is self.pub else pub.fields)
        if outcome is Outcome.LAYER_COMPLETE:
            self.ready.set()

    async def _woken(self) -> None:
        """Wait until a layer may be ready, a feeder ended, a content key was added or a
        held object's wait ends; then retry (or give up) the held objects."""
        until = self.assembler.held_until
        timeout = None if until is None else max(0.0, until - time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ready.wait(), timeout)
        self.ready.clear()
        self.assembler.release_held()

    # -- transfer --------------------------------------------------------------------

    async def run(self, alternates: Sequence[Publication]) -> AsyncIterator[KvLayer]:
        asm = self.assembler
        ep = self.c.endpoint
        retrieval = self.c.relay_profile.track_retrieval(self.seg.complete)
        tasks = [asyncio.create_task(self._feed(ep, kind, track.format(), retrieval))
                 for kind, track in asm.tracks.items()]
        self.feeding = len(tasks)
        if asm.require_signed and not self.seg.complete:
            tasks.append(asyncio.create_task(self._follow_manifest(ep)))
        self.c._retrievals.add(self)
        try:
            while self.feeding and not asm.done:
                await self._woken()
                for layer in self.c._pop_ready(asm):
                    yield layer
            while asm.held_until is not None and not asm.done:  # their key, a bounded wait
                await self._woken()
                for layer in self.c._pop_ready(asm):
                    yield layer
            for layer in self.c._pop_ready(asm):
                yield layer
            # recovery of whatever is still missing
            deadline = time.monotonic() + self.c.recompute_budget_s
            eps = self.c.endpoints[1:] + self.c.endpoints[:1]  # another relay first
            sources: list[tuple[Endpoint, Publication]] = [(e, self.pub) for e in eps]
            if self.manifest.deterministic:
                sources += [(e, p) for p in alternates for e in eps]
            for src_ep, src_pub in sources:
                missing = asm.missing()
                if not missing or time.monotonic() > deadline:
                    break
                if src_pub is not self.pub and not await self._deterministic(src_ep, src_pub):
                    continue
                self.c.stats.retries += 1
                log.info("recovering %d incomplete layer(s) from %s", len(missing),
                         src_pub.namespace.publication_id.hex()[:8])
                await self._recover(src_ep, src_pub, missing, deadline)
                for layer in self.c._pop_ready(asm):
                    yield layer
            missing = asm.missing()
            if missing and self.c.http is not None and time.monotonic() < deadline:
                await self._recover_http(missing, deadline)
                for layer in self.c._pop_ready(asm):
                    yield layer
                missing = asm.missing()
            if missing:
                raise RecomputeRequired(missing, asm.yielded,
                                        "objects missing or failed verification")
        finally:
            self.c._retrievals.discard(self)
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t

    async def _deterministic(self, ep: Endpoint, pub: Publication) -> bool:
        try:
            m = await self.c.manifest(pub, ep)
        except (KvcsError, MoqtRequestError) as exc:
            log.info("alternate publication unusable: %s", exc)
            return False
        return m.deterministic and self.manifest.deterministic

    def _fetch_params(self, ep: Endpoint, blocks: Sequence[int] | None = None,
                      ) -> tuple[RangeFilter, ...]:
        """OBJECTID_FILTER for the needed blocks, when the peer allows enough ranges."""
        wanted = sorted(set(blocks)) if blocks is not None else list(range(self.n))
        ranges: list[tuple[int, int | None]] = []
        for b in wanted:
            if ranges and ranges[-1][1] == b - 1:
                ranges[-1] = (ranges[-1][0], b)
            else:
                ranges.append((b, b))
        if ranges == [(0, self.seg.blocks - 1)]:
            return ()  # everything: no filter needed
        limit = ep.peer_max_filter_ranges
        if not limit:
            return ()
        if len(ranges) > limit:
            ranges = [(wanted[0], wanted[-1])]
        return (RangeFilter(OBJECTID_FILTER, 0, tuple(ranges)),)

    async def _feed(self, ep: Endpoint, kind: Component, name: str,
                    retrieval: TrackRetrieval) -> None:
        try:
            if retrieval is TrackRetrieval.FETCH:
                await self._fetch_layers(ep, self.pub, kind, name, self.assembler.layers)
            elif retrieval is TrackRetrieval.SUBSCRIBE_FROM_START:
                sub = await ep.subscribe(
                    self.pub.fields, name.encode(),
                    location_filter=LocationFilter.next_object(),
                    fill=Parameters(location_filter=LocationFilter.absolute_start(0, 0)),
                    priority=0)
                try:
                    async for obj in sub:
                        self._take(kind, obj, sub.track_properties)
                finally:
                    if not sub.finished:
                        await sub.cancel()
            else:
                await self._follow_current_group(ep, kind, name)
        except (MoqtRequestError, ConnectionError) as exc:
            log.warning("retrieval of %s failed: %s", name, exc)
        finally:
            self.feeding -= 1
            self.ready.set()

    async def _follow_current_group(self, ep: Endpoint, kind: Component, name: str) -> None:
        """A track behind a relay that fills only inside the current group: SUBSCRIBE
        Next Object + a fill of the current group (Relative Start 1), and one FETCH per
        layer before the current one, while the subscription runs. Overlaps are harmless
        (duplicates are dropped); nothing is missed: the fill and the live part cover
        {Largest.Group, 0} onwards, the FETCHes everything before."""
        sub = await ep.subscribe(
            self.pub.fields, name.encode(),
            location_filter=LocationFilter.next_object(),
            fill=Parameters(location_filter=LocationFilter.relative_start(1)),
            priority=0)

        async def relay_live() -> None:
            async for obj in sub:
                self._take(kind, obj, sub.track_properties)

        live = asyncio.create_task(relay_live())
        try:
            largest = sub.largest
            if largest is not None:
                past = [g for g in self.assembler.layers if g < largest.group]
                await self._fetch_layers(ep, self.pub, kind, name, past)
            await live
        finally:
            live.cancel()
            with contextlib.suppress(BaseException):
                await live
            if not sub.finished:
                with contextlib.suppress(ConnectionError, KeyError, ValueError):
                    await sub.cancel()

    async def _fetch_layers(self, ep: Endpoint, pub: Publication, kind: Component, name: str,
                            layers: Sequence[int], blocks: Sequence[int] | None = None) -> None:
        rf = self._fetch_params(ep, blocks)
        for a, b in self.c.relay_profile.fetch_spans(layers):
            try:
                await self._fetch(ep, pub, kind, name, a, b, rf)
            except MoqtRequestError as exc:
                if b == a or exc.code not in (RequestErrorCode.NOT_SUPPORTED,
                                              RequestErrorCode.INVALID_RANGE,
                                              RequestErrorCode.INTERNAL_ERROR):
                    raise
                # relays that refuse multi-group FETCH: one FETCH per layer
                for g in range(a, b + 1):
                    await self._fetch(ep, pub, kind, name, g, g, rf)

    async def _fetch(self, ep: Endpoint, pub: Publication, kind: Component, name: str,
                     first: int, last: int, rf: tuple[RangeFilter, ...]) -> None:
        """FETCH layers ``first..last`` of a track and give every object to the assembler."""
        res = await ep.fetch(pub.fields, name.encode(), range_filters=rf,
                             location_filter=LocationFilter.absolute_group_end(
                                 first, 0, last - first))
        props = res.ok.track_properties if res.ok is not None else ()
        async for obj in res:
            self._take(kind, obj, props, pub)

    async def _recover(self, ep: Endpoint, pub: Publication, missing: dict[int, list[int]],
                       deadline: float) -> None:
        layers = sorted(missing)
        blocks = sorted({b for bs in missing.values() for b in bs})
        for kind, track in self.assembler.tracks.items():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            name = track.format()
            try:
                await asyncio.wait_for(
                    self._fetch_layers(ep, pub, kind, name, layers, blocks), left)
            except (MoqtRequestError, ConnectionError, TimeoutError) as exc:
                log.info("recovery fetch of %s failed: %s", name, exc)

    async def _recover_http(self, missing: dict[int, list[int]], deadline: float) -> None:
        """Fetch the containers of the missing blocks from the KVSP HTTP holders; the
        assembler places them in the layers that miss them (KVCS "Verification and
        Recovery")."""
        asm = self.assembler
        if not asm.containers_usable:
            log.info("HTTP recovery skipped: signed digests of %s tracks",
                     "/".join(sorted({t.codec or "" for t in asm.tracks.values()})))
            return
        blocks = asm.container_blocks(missing)
        if not blocks:
            return
        self.c.stats.retries += 1
        log.info("recovering %d block(s) of %d layer(s) over KVSP HTTP", len(blocks),
                 len(missing))
        await self.c._http_fetch(asm, blocks, deadline)

    async def _follow_manifest(self, ep: Endpoint) -> None:
        """Follow newer manifest versions (their object_digests confirm layers)."""
        name = TrackName.manifest(cose=True).to_bytes()
        try:
            sub = await ep.subscribe(self.pub.fields, name,
                                     location_filter=LocationFilter.next_object(),
                                     fill=Parameters(location_filter=LocationFilter.relative_start(1)))
            async for obj in sub:
                if obj.status != ObjectStatus.NORMAL:
                    continue
                try:
                    blob, protected = self.c._open_manifest(self.pub, name, obj,
                                                            sub.track_properties)
                    m = self.c._check_manifest(self.pub, blob, True, protected)
                except (KvcsError, ValueError) as exc:
                    log.warning("discarding manifest version: %s", exc)
                    continue
                self.manifest = m
                self.assembler.use_manifest(m)
                self.ready.set()  # newly listed layers may now be confirmed
        except (MoqtRequestError, ConnectionError) as exc:
            log.info("manifest follow ended: %s", exc)
