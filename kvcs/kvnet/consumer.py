"""The KVCS consumer: find a publication of a prompt's prefix, verify it, stream its layers.

Its parts: discovery (:mod:`kvcs.kvnet.discovery`), the endpoints it uses
(:mod:`kvcs.kvnet.endpoint_pool`), one retrieval of a layer range
(:mod:`kvcs.kvnet.retrieval`) from MOQT (:mod:`kvcs.kvnet.moqt_source`), recovery
(:mod:`kvcs.kvnet.recovery`) from the other sources, KVSP HTTP among them
(:mod:`kvcs.kvnet.http_source`). This module holds the facade and the manifest checks.

Embed it in a decode worker::

    consumer = KvConsumer(endpoint, scope, descriptor, tokens)
    pub = await consumer.discover()                  # longest reusable prefix, or None
    async for layer in consumer.prefix_layers(pub):  # layer 0 first, while later ones arrive
        attend(layer.index, layer.k, layer.v)        # numpy [blocks*B, kv_heads, head_dim]

Procedures (kvcs-draft "Consumer Procedures"):

* discovery (:mod:`kvcs.kvnet.discovery`), one round trip whatever the prompt's length:
  one SUBSCRIBE_NAMESPACE on ("kvcs-1", ScopeID, CompatID) that lists the scope's
  publications of this CompatID, matched against the prompt's Block Keys locally; and/or
  (``index=``, ``discovery=``) a KVSP Index lookup of the prompt's Block Keys, whose
  ``moqt://`` replica records name publications (also those of a longer prefix than the
  prompt). Neither reveals a prefix to relays. Probing prefix by prefix
  (``discovery="prefix"``) only when asked for. :meth:`KvConsumer.longest_prefix` is the
  lookup alone (no manifest read), for a serving engine's scheduler;
* manifest (:mod:`kvcs.kvnet.manifest_track`): SUBSCRIBE to ``manifest.cose`` (Next Object
  + fill Relative Start 1), to ``manifest`` only when the publisher says ``manifest.cose``
  does not exist and authenticity is not required; CompatID of ``compat`` must equal the
  namespace's; a segment is used only when its ``block_keys_sha256`` covers the consumer's
  own Block Keys (:meth:`KvConsumer.covered_blocks`). While a segment is live the
  subscription stays open: newer versions bring completion and ``object_digests``;
* a live segment: SUBSCRIBE with Next Object + FILL_PARAMETERS from the first wanted layer
  on each needed data track (exactly once); a completed one: FETCH of layers a..b (Absolute
  Start, Group End; ascending) plus OBJECTID_FILTER 0..n-1 when the peer allows range
  filters (else the excess objects are discarded); relays that refuse multi-group FETCH get
  one FETCH per layer. The layers are asked for a few at a time (``fetch_window``,
  :data:`FETCH_WINDOW`): two FETCHes per track open, the next sent once the objects waiting
  for verification are below half the window, so a relay sending at full speed does not
  fill the consumer's memory (its QUIC transport gives no back-pressure). A live segment's
  fill then reaches only as many layers as one such FETCH, and the layers after them up to
  the SUBSCRIBE_OK's Largest Object are FETCHed the same way while the subscription runs
  (a consumer joining a mostly finished segment);
* relay profiles (``relay_profile``, :mod:`kvcs.kvnet.relay_profile`): what the relay
  supports decides how a data track is retrieved (``"kvcs"``: a full draft-22 relay, with
  automatic fallbacks where a request is refused; ``"moq-dev"``: the limits of moq-dev/moq,
  whose live and completed tracks are both followed from the current group);
* codecs: ``codec`` is a preference order; codecs this build does not implement are
  skipped and another listed encoding is selected (:func:`~kvcs.kv.assembly.select_tracks`);
* every object is verified (header, Location, SHA-256, token count, codec, and the
  ``object_digests`` whenever the manifest lists them; signed ones confirm layers when
  authenticity is required) and placed by a sans-IO
  :class:`~kvcs.kv.assembly.LayerAssembler`; a bad object is discarded and treated as
  missing;
* protection (``secure=``, the scope's content keys): the manifest and every object must
  decrypt as MOQT Secure Objects before any KVCS check, and the manifest must declare the
  protection; a plaintext or tampered object is missing, never a fallback. An object whose
  Key ID is not held waits ``key_wait_s`` for :meth:`KvConsumer.add_content_key`, then is
  missing;
* a layer is yielded as soon as all its needed blocks of K and V are verified, in layer
  order. Missing blocks are retried (other endpoints = other relays, other publications
  when both manifests say ``deterministic``), then fetched over KVSP HTTP, then reported
  through :class:`RecomputeRequired`. Objects of different publications are never mixed
  unless both manifests say ``deterministic``;
* bounded waits ("SHOULD bound recovery by recompute time"): the transfer gives up after
  ``recompute_budget_s`` without progress (an object or container verified and placed, a
  newer manifest version), measured from the start of the retrieval and restarted by each
  progress as of its ARRIVAL (not when it was verified: objects may wait for their batch's
  SHA-256 and for the event loop); recovery then has ``recompute_budget_s`` from when the
  transfer's ran out, so the answer comes at most two budgets after the last byte that
  made progress (:attr:`ConsumerStats.last_progress_at`). Reading a
  manifest, a namespace subscription and an index lookup are bounded by the same budget.
  What was verified is kept: :attr:`RecomputeRequired.partial`;
* interrupted transfers: when a subscription or fetch loses its source (the session ends,
  the relay or the publisher goes away: PUBLISH_DONE GOING_AWAY, a reset fetch stream, a
  DOES_NOT_EXIST once objects of the publication have arrived: its publisher's session
  ended and a ``ReconnectingTarget`` publishes it again),
  the transfer goes on after a short backoff, within the same no-progress budget: on the
  same endpoint, on another open one, or, when none is open, on the same relay reconnected
  through ``connect`` (a relay that restarted); a live segment is subscribed again from its
  start, the missing blocks of a completed one are fetched (what is verified is kept);
* HTTP fallback (``http=KvspClient(...)``, KVSP profile section 8): blocks still missing
  after the MOQT sources are fetched as KVSP containers from HTTP holders, and from the
  ``https://`` holders their lookup answers name, verified (layer digests, CompatID, Block
  Key, token start, and the listed ``object_digests``) and placed, within the same budget;
  with no MOQT path at all (no endpoint, nothing discovered),
  :meth:`KvConsumer.http_layers` retrieves the layers over HTTP alone, named by the Block
  Keys of the consumer's own prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..endpoint import Endpoint, MoqtRequestError
from ..kv.assembly import KvLayer, LayerArrays, LayerAssembler, check_layer_arrays
from ..kv.cose import Keyring, verify_manifest
from ..kv.errors import KvcsError, ManifestError, SignatureError
from ..kv.ids import CompatDescriptor, ScopeKey, block_keys, scope_id
from ..kv.manifest import Manifest, Segment, check_namespace, check_protection, segment_covers
from ..kv.secure import ContentKey, SecureObjects
from .consumer_types import ConsumerStats, Publication, RecomputeRequired
from .discovery import Discovery
from .endpoint_pool import EndpointPool
from .http_source import HttpSource
from .manifest_track import ManifestTrack
from .relay_profile import RELAY_PROFILES, RelayProfile
from .retrieval import Retrieval

if TYPE_CHECKING:
    from .kvsp_http import KvspClient

__all__ = [
    "DISCOVERY_MODES",
    "FETCH_WINDOW",
    "RELAY_PROFILES",
    "ConsumerStats",
    "KvConsumer",
    "KvLayer",
    "Publication",
    "RecomputeRequired",
]

log = logging.getLogger(__name__)

FETCH_WINDOW = 64 << 20
"""``KvConsumer(fetch_window=...)``, bytes: about the most a segment's received objects
hold in the consumer before they are verified and placed. A completed segment's data
tracks (and what a live one had published before the consumer joined) are
FETCHed a few layers at a time, two FETCHes per track open at once, the next one sent when
at most half this many bytes wait for verification (:attr:`Retrieval.fetch_step
<kvcs.kvnet.retrieval.Retrieval.fetch_step>`). QUIC gives no back-pressure here: the
consumer's QUIC library returns a stream's flow-control credit as the session reads the
bytes, not as they are verified, so one FETCH of every layer from a relay that holds them
all left up to 110 MiB of a 128 MiB cache queued (bench/bench_e2e.py, completed pull).
None: one FETCH of all wanted layers per track, unbounded. A layer of every track larger
than a quarter of the window is fetched alone (the bound is then half the window plus two
such layers). 64 MiB, not 16: at 16 (one 4 MiB layer per FETCH) the completed pull read
193 against 246 MiB/s unbounded (medians, alternating pairs on a loaded 2-core VM), at 64
200-229 MiB/s with the peak at most 1.17x the layers held (unbounded: up to 1.77x)."""

#: ``KvConsumer(discovery=...)``: one namespace listing (the default without an index), the
#: KVSP Index only, both at once with the index's publications first (the default with an
#: index), or prefix probing (one request per prefix length: only when asked for).
DISCOVERY_MODES = ("namespace", "index", "index-first", "prefix")


class KvConsumer:
    """Finds and retrieves KV caches for one prompt. See the module docstring.

    ``codec``: a codec name or a preference order (e.g. ``["q8", "raw"]``). ``index``: a
    KVSP Index (:class:`~kvcs.kvnet.kvsp_http.KvspClient`) for ``discovery`` ``"index"``
    or ``"index-first"`` (the default when ``index`` is given), and for more holders in
    HTTP recovery. ``discovery`` (:data:`DISCOVERY_MODES`) defaults to ``"namespace"``
    without an index. ``discovery_timeout``: how long a peer that does not confirm a
    namespace listing (or a prefix probe) is waited for. ``connect``: opens an endpoint to
    a relay the index names that none of ``endpoints`` is connected to, and reopens the
    relay of an endpoint whose session ended when an interrupted retrieval has no other
    open endpoint to go on with (the consumer owns and :meth:`aclose` closes those).
    ``fetch_window`` (bytes, :data:`FETCH_WINDOW`): about the most received objects of a
    segment held waiting for verification (None: no bound).
    """

    def __init__(
        self,
        endpoints: Endpoint | Sequence[Endpoint],
        scope: ScopeKey,
        descriptor: CompatDescriptor | dict,
        tokens: Sequence[int] | np.ndarray,
        *,
        keyring: Keyring | None = None,
        require_signed: bool | None = None,
        codec: str | Sequence[str] = "raw",
        hex_namespace: bool = False,
        recompute_budget_s: float = 10.0,
        discovery_timeout: float = 0.1,
        on_progress: Callable[[str, int, int], None] | None = None,
        relay_profile: RelayProfile | str = "kvcs",
        http: KvspClient | None = None,
        index: KvspClient | None = None,
        discovery: str | None = None,
        connect: Callable[[str], Awaitable[Endpoint]] | None = None,
        secure: SecureObjects | None = None,
        key_wait_s: float = 2.0,
        fetch_window: int | None = FETCH_WINDOW,
    ) -> None:
        given = [endpoints] if isinstance(endpoints, Endpoint) else list(endpoints)
        if not given and http is None and index is None:
            raise ValueError("at least one endpoint (or an HTTP client) is needed")
        self.http = http
        """KVSP HTTP holders (:class:`~kvcs.kvnet.kvsp_http.KvspClient`) used when MOQT
        sources fail (recovery) or when there is no MOQT path (:meth:`http_layers`)."""
        self.index = index
        """The KVSP Index asked for publications (and holders)."""
        self.discovery = discovery or ("index-first" if index is not None else "namespace")
        if self.discovery not in DISCOVERY_MODES:
            raise ValueError(f"discovery must be one of {DISCOVERY_MODES}, got {discovery!r}")
        if self.discovery in ("index", "index-first") and index is None:
            raise ValueError(f"discovery={self.discovery!r} needs index=KvspClient(...)")
        self.connect = connect
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
        self.codecs: tuple[str, ...] = (codec, "raw") if isinstance(codec, str) else tuple(codec)
        """The codec preference order."""
        if not self.codecs or not all(isinstance(c, str) for c in self.codecs):
            raise ValueError("codec must be a codec name or a sequence of names")
        self.hex_namespace = hex_namespace
        self.recompute_budget_s = recompute_budget_s
        self.discovery_timeout = discovery_timeout
        self.on_progress = on_progress
        self.relay_profile = RelayProfile.resolve(relay_profile)
        """How data tracks are retrieved through the relay (:mod:`kvcs.kvnet.relay_profile`)."""
        self.compat_id = self.descriptor.compat_id
        # the element type resolved now, not on the first object: its first use imports
        # ml_dtypes (0.45 s on a quiet 2-core machine, 1.8-4 s measured loaded), which
        # stalled the event loop in the middle of a transfer (issue #27)
        self.descriptor.dtype  # noqa: B018
        self.scope_id = scope_id(scope)
        self.keys = block_keys(scope, self.compat_id, np.asarray(tokens, dtype=np.int64),
                               self.descriptor.block_tokens)
        self.secure = secure
        """The scope's content keys: only protected publications are accepted, and only
        objects that decrypt (None: only unprotected publications)."""
        self.key_wait_s = key_wait_s
        """Seconds an object with an unknown Key ID waits for its key before it is missing."""
        if fetch_window is not None and fetch_window <= 0:
            raise ValueError("fetch_window must be a positive number of bytes (or None)")
        self.fetch_window = fetch_window
        """About the most bytes of received objects of completed segments held waiting for
        verification (:data:`FETCH_WINDOW`); None: no bound."""
        self.pool = EndpointPool(given, connect, recompute_budget_s)
        """The endpoints in use (given, opened for index-named relays, reopened)."""
        self._retrievals: set[Retrieval] = set()
        self.stats = ConsumerStats()
        self.finder = Discovery(self.keys, self.scope_id, self.compat_id,
                                hex_namespace=hex_namespace, budget=recompute_budget_s,
                                answer_wait=discovery_timeout, pool=self.pool, index=index,
                                stats=self.stats)
        """Discovery of this prompt's publications (:mod:`kvcs.kvnet.discovery`)."""
        self.http_source = HttpSource(http, index, self.scope_id, self.compat_id,
                                      self.descriptor)
        """KVSP HTTP as a source of blocks (recovery, :meth:`http_layers`)."""
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
            run.wake()

    @property
    def endpoints(self) -> list[Endpoint]:
        """The endpoints in use, the primary one first (one whose session ended and was
        reopened through ``connect`` is replaced by its successor)."""
        return self.pool.endpoints

    @property
    def endpoint(self) -> Endpoint:
        """The primary endpoint."""
        if not self.endpoints:
            raise ValueError("this consumer has no MOQT endpoint (HTTP only)")
        return self.endpoints[0]

    def source(self, pub: Publication) -> Endpoint:
        """The endpoint a publication's retrieval starts on (the successor of the one it
        was found on, if that one was reopened)."""
        return self.pool.current(pub.endpoint or self.endpoint)

    async def aclose(self) -> None:
        """Close the endpoints this consumer opened (``connect``) for index-named relays."""
        await self.pool.aclose()

    async def __aenter__(self) -> KvConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ discovery

    async def discover(self, max_blocks: int | None = None,
                       endpoint: Endpoint | None = None) -> Publication | None:
        """Find a usable publication for the longest reusable prefix (None if nothing
        matches): the candidates of :meth:`lookup`, the longest first, each until one's
        manifest passes its checks (CompatID, Block Keys, signature); the others are
        discarded (:attr:`discarded`). With ``discovery="prefix"`` the probes go on with
        shorter prefixes while none is usable."""
        t0, sent = time.perf_counter(), self.stats.discovery_requests
        if self.discovery == "prefix" and (endpoint is not None or self.endpoints):
            found = await self.finder.probe(max_blocks, endpoint, usable=self._first_usable)
            pub = found[0] if found else None
        else:
            pub = await self._first_usable(await self.lookup(max_blocks, endpoint))
        log.info("discovery: %s in %.1f ms (%d request(s))",
                 f"{pub.prefix_blocks} block(s)" if pub else "nothing", 1000 *
                 (time.perf_counter() - t0), self.stats.discovery_requests - sent)
        return pub

    async def lookup(self, max_blocks: int | None = None,
                     endpoint: Endpoint | None = None) -> list[Publication]:
        """The publications that cover a prefix of this prompt, the longest first, from
        one lookup (``discovery``; ``endpoint``: ask that endpoint only): one KVSP Index
        lookup, or one namespace listing (one SUBSCRIBE_NAMESPACE, one round trip whatever
        the prompt's length), both with ``"index-first"`` (at once: the index's first);
        with ``"prefix"``, probes of successively shorter prefixes until one has any.
        Reads no manifest and keeps nothing; within ``recompute_budget_s`` (what has not
        answered by then counts as nothing found)."""
        try:
            async with asyncio.timeout(self.recompute_budget_s):
                return await self.finder.lookup(self.discovery, max_blocks, endpoint,
                                                fence=self.relay_profile.namespace_sync)
        except TimeoutError:
            log.warning("discovery unanswered within %.1f s (recompute budget)",
                        self.recompute_budget_s)
            return []

    async def longest_prefix(self, budget_s: float | None = None) -> Publication | None:
        """The longest published block-aligned prefix of this prompt (None: a miss), for
        a serving engine's scheduler: ``prefix_blocks * descriptor.block_tokens`` tokens
        need not be computed. One lookup (:meth:`lookup`), bounded by ``budget_s``
        (default ``recompute_budget_s``); side-effect free: no manifest is read (the
        retrieval checks it) and nothing is kept."""
        budget = self.recompute_budget_s if budget_s is None else budget_s
        try:
            async with asyncio.timeout(budget):
                found = await self.finder.lookup(self.discovery, None, None,
                                                 fence=self.relay_profile.namespace_sync)
        except TimeoutError:
            return None
        return found[0] if found else None

    async def _first_usable(self, pubs: Sequence[Publication]) -> Publication | None:
        for pub in pubs:
            try:
                await self.manifest(pub)
            except (KvcsError, MoqtRequestError, ConnectionError) as exc:
                self.discarded.append((pub, str(exc)))
                log.warning("discarding publication %s: %s",
                            pub.namespace.publication_id.hex(), exc)
                continue
            return pub
        return None

    async def discover_all(self, max_blocks: int | None = None,
                           endpoint: Endpoint | None = None) -> list[Publication]:
        """All publications of the longest prefix that has any (others first-found first;
        :meth:`lookup`), none of them checked."""
        pubs = await self.lookup(max_blocks, endpoint)
        return [p for p in pubs if p.prefix_blocks == pubs[0].prefix_blocks] if pubs else []

    # ------------------------------------------------------------------ manifest

    async def manifest(self, pub: Publication, endpoint: Endpoint | None = None) -> Manifest:
        """Read and check the current manifest of a publication (ManifestError,
        SignatureError, MoqtRequestError), within ``recompute_budget_s``."""
        track, m = await self.open_manifest(pub, endpoint)
        await track.close()
        return m

    async def open_manifest(self, pub: Publication, endpoint: Endpoint | None = None,
                            ) -> tuple[ManifestTrack, Manifest]:
        """Subscribe to the manifest track and check its current version; the track stays
        open for newer versions (the caller closes it)."""
        ep = await self.pool.open(endpoint or self.source(pub))
        track: ManifestTrack | None = None
        deadline = asyncio.get_running_loop().time() + self.recompute_budget_s
        try:
            # open() keeps to the deadline itself (a transient refusal still standing then
            # is reported as such, not as a timeout); the first version must come by then
            track = await ManifestTrack.open(
                ep, pub.fields, require_signed=self.require_signed, retry_until=deadline,
                secure=self.secure)
            async with asyncio.timeout_at(deadline):
                blob = await track.next_version()
            if blob is None:
                raise ManifestError("the manifest track ended without a version")
            m = self.check_manifest(pub, blob, track.signed, track.protected)
        except TimeoutError:
            if track is not None:
                await track.close()
            raise ManifestError(f"no manifest version within {self.recompute_budget_s} s "
                                "(recompute budget)") from None
        except BaseException:
            if track is not None:
                await track.close()
            raise
        return track, m

    def check_manifest(self, pub: Publication, blob: bytes, signed: bool,
                       protected: bool) -> Manifest:
        """Check one manifest version (``protected``: it decrypted with the content keys)."""
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
        if not self.covered_blocks(pub, seg0):
            raise ManifestError("block_keys_sha256 of segment 0 does not match this prompt")
        self.manifests[pub.fields] = m
        self.stats.manifest_versions += 1
        return m

    def covered_blocks(self, pub: Publication, segment: Segment) -> int:
        """How many blocks of ``segment`` (from its first) are known to be this prompt's.

        All of them when its ``block_keys_sha256`` equals the hash of the prompt's Block
        Keys at the segment's blocks; none when it differs, or when the prompt ends inside
        the segment (its keys cannot be checked), except for a publication the KVSP Index
        named for the prompt's blocks (:attr:`Publication.index_blocks`, not with
        ``require_signed``)."""
        if segment_covers(segment, self.keys):
            return segment.blocks
        end = segment.first_block + segment.blocks
        if (not self.require_signed and len(self.keys) < end
                and pub.index_blocks > segment.first_block):
            return min(segment.blocks, pub.index_blocks - segment.first_block)
        return 0

    # ------------------------------------------------------------------ layers

    def layers(
        self,
        pub: Publication,
        layers: range | None = None,
        blocks: int | None = None,
        segment: int = 0,
        *,
        manifest: Manifest | None = None,
        alternates: Sequence[Publication] = (),
        into: Sequence[LayerArrays] | None = None,
    ) -> AsyncIterator[KvLayer]:
        """Yield verified layers of one ``segment`` in order (K and V of its blocks).

        ``layers`` defaults to all; ``blocks`` (first n blocks) defaults to what the
        segment covers of this prompt; ManifestError when it covers none of it
        (:meth:`covered_blocks`). Raises :class:`RecomputeRequired` (block indexes within
        the segment) when blocks stay missing. :meth:`prefix_layers` joins every segment.

        ``into``: the caller's (K, V) arrays of each layer, by layer index, to assemble
        the layers into instead of new arrays (a decode worker's reused cache buffers:
        no allocation and first touch of 2 x blocks x block_tokens rows per layer); each
        needs at least blocks x block_tokens tokens, and the yielded layer's ``k`` and
        ``v`` are views of their first ones. ValueError if they do not fit: before any
        request, but for their number of tokens, known once the manifest is read.
        """
        def plan(m: Manifest) -> list[tuple[Segment, int]]:
            seg = m.segment(segment)
            if seg is None:
                raise ManifestError(f"manifest has no segment {segment}")
            n = self.covered_blocks(pub, seg)
            if n == 0:
                raise ManifestError(f"segment {segment} does not cover this prompt (its "
                                    "block_keys_sha256 differs from this prompt's Block Keys, "
                                    "or the prompt ends inside it)")
            return [(seg, n if blocks is None else min(n, blocks))]

        return self._read(pub, manifest, plan, layers, alternates, into, absolute=False)

    def prefix_layers(
        self,
        pub: Publication,
        layers: range | None = None,
        blocks: int | None = None,
        *,
        manifest: Manifest | None = None,
        alternates: Sequence[Publication] = (),
        into: Sequence[LayerArrays] | None = None,
    ) -> AsyncIterator[KvLayer]:
        """Yield verified layers of the whole prefix of this prompt that the publication
        covers: every segment whose Block Keys are the prompt's, from segment 0 on, joined
        in token order (one layer = K and V of all their blocks).

        ``blocks`` limits it to the first n blocks. The segments are retrieved together;
        layer l is yielded once every segment has it. Raises :class:`RecomputeRequired`
        (block indexes within the prefix) when blocks stay missing. ``into``: as for
        :meth:`layers`, with the tokens of every segment (:meth:`prefix_plan`): each
        segment is assembled into its rows, so the layers are not joined by a copy.
        """
        def plan(m: Manifest) -> list[tuple[Segment, int]]:
            found = self.prefix_plan(pub, m, blocks)
            if not found and (blocks is None or blocks > 0):
                raise ManifestError("the publication covers no block of this prompt")
            return found

        return self._read(pub, manifest, plan, layers, alternates, into, absolute=True)

    def prefix_plan(self, pub: Publication, manifest: Manifest,
                    blocks: int | None = None) -> list[tuple[Segment, int]]:
        """(segment, blocks of it) covering the longest prefix of this prompt, in token
        order: segments that start where the previous one ended and cover the prompt
        (:meth:`covered_blocks`), up to ``blocks`` blocks in all."""
        plan: list[tuple[Segment, int]] = []
        end = 0
        limit = len(self.keys) if blocks is None else blocks
        by_start = {s.first_block: s for s in manifest.segments}
        while end < limit and (seg := by_start.get(end)) is not None:
            n = min(self.covered_blocks(pub, seg), limit - end)
            if n == 0:
                break
            plan.append((seg, n))
            end += n
            if n < seg.blocks:
                break
        return plan

    async def _manifest_for(self, pub: Publication, manifest: Manifest | None,
                            ) -> tuple[ManifestTrack | None, Manifest]:
        if manifest is not None:
            return None, manifest
        return await self.open_manifest(pub)

    async def _read(self, pub: Publication, manifest: Manifest | None,
                    plan: Callable[[Manifest], list[tuple[Segment, int]]],
                    layers: range | None, alternates: Sequence[Publication],
                    into: Sequence[LayerArrays] | None, *, absolute: bool,
                    ) -> AsyncGenerator[KvLayer, None]:
        """:meth:`layers` and :meth:`prefix_layers`: check ``into``, read the manifest,
        retrieve ``plan(manifest)`` and close the manifest track however it ends."""
        self._check_into(into, layers)
        track, m = await self._manifest_for(pub, manifest)
        try:
            async with contextlib.aclosing(self._retrieve(
                    pub, m, plan(m), layers, alternates, track, absolute=absolute,
                    into=into)) as retrieved:
                async for layer in retrieved:
                    yield layer
        finally:
            if track is not None:
                await track.close()

    async def _retrieve(self, pub: Publication, m: Manifest, plan: list[tuple[Segment, int]],
                        layers: range | None, alternates: Sequence[Publication],
                        track: ManifestTrack | None, *, absolute: bool,
                        into: Sequence[LayerArrays] | None = None,
                        ) -> AsyncGenerator[KvLayer, None]:
        if not plan or plan[0][1] <= 0:
            return
        wanted = self._layer_range(layers)
        arrays = None if into is None else self._layer_arrays(
            into, wanted, sum(n for _, n in plan) * self.descriptor.block_tokens)
        run = Retrieval(self, pub, m, plan, wanted, absolute, arrays)
        self.stats.started_at = time.perf_counter()
        self._retrievals.add(run)
        try:
            # aclosing: a caller that stops reading (break, aclose) ends the transfer at
            # once (subscriptions cancelled, feeders stopped), not when it is collected
            async with contextlib.aclosing(run.run(alternates, track)) as layers_run:
                async for layer in layers_run:
                    if self.stats.first_layer_at is None:
                        self.stats.first_layer_at = time.perf_counter()
                    if self.on_progress is not None:
                        self.on_progress("layer", layer.index, run.layers.stop)
                    yield layer
        finally:
            self._retrievals.discard(run)
        self.stats.finished_at = time.perf_counter()

    def _layer_range(self, layers: range | None) -> range:
        return layers if layers is not None else range(self.descriptor.layers)

    def _check_into(self, into: Sequence[LayerArrays] | None, layers: range | None) -> None:
        """ValueError, before any request, unless ``into`` (if given) has arrays of the
        descriptor's dtype and head shapes for every wanted layer."""
        if into is not None:
            self._layer_arrays(into, self._layer_range(layers), None)

    def _layer_arrays(self, into: Sequence[LayerArrays], layers: range,
                      rows: int | None) -> dict[int, LayerArrays]:
        """The first ``rows`` tokens of the caller's arrays of every wanted layer, checked
        before any layer object is requested (ValueError)."""
        if len(into) < layers.stop:
            raise ValueError(f"into: {len(into)} layers given, layer {layers.stop - 1} "
                             "is wanted")
        return {layer: check_layer_arrays(self.descriptor, rows, into[layer],
                                          f"into[{layer}]") for layer in layers}

    # ------------------------------------------------------------------ HTTP (KVSP)

    async def http_layers(self, layers: range | None = None,
                          blocks: int | None = None) -> AsyncIterator[KvLayer]:
        """Yield verified layers retrieved over KVSP HTTP only (no MOQT path).

        Needs ``http`` (or ``index``, whose lookups name holders). The blocks are named by
        this prompt's own Block Keys (no manifest); ``blocks`` limits them to the first n
        (default: every complete block of the prompt). Each container is verified (layer
        digests, CompatID, Block Key, token start) before use; a bad one counts as rejected
        and its block as missing. All containers are fetched (``http.concurrency`` at a
        time) within ``recompute_budget_s``, then the layers are yielded in order. Blocks no
        holder delivered raise :class:`RecomputeRequired` naming them for every layer.

        Without a manifest there is no producer signature, so a consumer with
        ``require_signed=True`` refuses (SignatureError): use :meth:`layers`, whose
        recovery checks HTTP blocks against the signed ``object_digests``.
        """
        if self.http is None and self.index is None:
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
        await self.http_source.fetch(assembler, range(n),
                                     time.monotonic() + self.recompute_budget_s)
        missing = assembler.missing()
        if missing:
            raise RecomputeRequired(missing, 0, "blocks not available over HTTP",
                                    assembler.partial())
        for layer in assembler.pop_ready():
            if self.stats.first_layer_at is None:
                self.stats.first_layer_at = time.perf_counter()
            if self.on_progress is not None:
                self.on_progress("layer", layer.index, assembler.layers.stop)
            yield layer
        self.stats.finished_at = time.perf_counter()
