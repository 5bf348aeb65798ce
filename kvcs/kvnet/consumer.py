"""The KVCS consumer: find a publication of a prompt's prefix, verify it, stream its layers.

Embed it in a decode worker::

    consumer = KvConsumer(endpoint, scope, descriptor, tokens)
    pub = await consumer.discover()                  # longest reusable prefix, or None
    async for layer in consumer.prefix_layers(pub):  # layer 0 first, while later ones arrive
        attend(layer.index, layer.k, layer.v)        # numpy [blocks*B, kv_heads, head_dim]

Procedures (kvcs-draft "Consumer Procedures"):

* discovery: SUBSCRIBE_NAMESPACE on ("kvcs-1", ScopeID, CompatID, AnchorKey) for the
  longest prefix, then successively shorter ones; or (``index=``, ``discovery=``) a KVSP
  Index lookup of the prompt's Block Keys, whose ``moqt://`` replica records name
  publications (also those of a longer prefix than the prompt) without revealing prefixes
  to relays;
* manifest (:mod:`kvcs.kvnet.manifest_track`): SUBSCRIBE to ``manifest.cose`` (Next Object
  + fill Relative Start 1), to ``manifest`` only when the publisher says ``manifest.cose``
  does not exist and authenticity is not required; CompatID of ``compat`` must equal the
  namespace's; a segment is used only when its ``block_keys_sha256`` covers the consumer's
  own Block Keys (:meth:`KvConsumer.covered_blocks`). While a segment is live the
  subscription stays open: newer versions bring completion and ``object_digests``;
* a live segment: SUBSCRIBE with Next Object + FILL_PARAMETERS from {0,0} on each needed
  data track (exactly once); a completed one: FETCH of layers a..b (Absolute Start, Group
  End; ascending) plus OBJECTID_FILTER 0..n-1 when the peer allows range filters (else the
  excess objects are discarded); relays that refuse multi-group FETCH get one FETCH per
  layer;
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
  progress; recovery then has ``recompute_budget_s`` from its own start. Reading a
  manifest, a namespace subscription and an index lookup are bounded by the same budget.
  What was verified is kept: :attr:`RecomputeRequired.partial`;
* interrupted transfers: when a subscription or fetch loses its source (the session ends,
  the relay or the publisher goes away: PUBLISH_DONE GOING_AWAY, a reset fetch stream),
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
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..backoff import Backoff
from ..endpoint import Endpoint, FetchResult, MoqtRequestError, ReceivedObject, Subscription
from ..errors import SessionError
from ..kv.assembly import (
    AssemblyStats,
    KvLayer,
    LayerArrays,
    LayerAssembler,
    Outcome,
    check_layer_arrays,
    select_tracks,
)
from ..kv.component import Component
from ..kv.container import max_container_size
from ..kv.cose import Keyring, verify_manifest
from ..kv.errors import KvcsError, ManifestError, SignatureError
from ..kv.ids import CompatDescriptor, KvcsNamespace, ScopeKey, block_keys, scope_id
from ..kv.index import parse_publication_uri
from ..kv.manifest import Manifest, Segment, check_namespace, check_protection, segment_covers
from ..kv.payload import HEADER_SIZE
from ..kv.secure import ContentKey, SecureObjects, effective_priority
from ..moqt.errors import PublishDoneCode, RequestErrorCode, SessionUsageError
from ..moqt.wire import (
    PARAM_OBJECTID_FILTER,
    LocationFilter,
    ObjectStatus,
    Parameters,
    Properties,
    RangeFilter,
)
from .manifest_track import TRANSIENT, ManifestTrack
from .offload import sha256_digests
from .relay_profile import RELAY_PROFILES, RelayProfile, TrackRetrieval

if TYPE_CHECKING:
    from .kvsp_http import KvspClient

__all__ = [
    "DISCOVERY_MODES",
    "RELAY_PROFILES",
    "ConsumerStats",
    "KvConsumer",
    "KvLayer",
    "Publication",
    "RecomputeRequired",
]

log = logging.getLogger(__name__)

#: PUBLISH_DONE codes that end a subscription because its source went away, not because
#: the track ended or was refused: the transfer goes on elsewhere.
SOURCE_LOST = frozenset({PublishDoneCode.INTERNAL_ERROR, PublishDoneCode.GOING_AWAY,
                         PublishDoneCode.EXCESSIVE_LOAD, PublishDoneCode.TOO_FAR_BEHIND})
RESUME_BACKOFF = Backoff(initial=0.05, maximum=1.0)
"""Waits before each turn of an interrupted transfer: from 25-50 ms up to 0.5-1 s, so that
a publisher or relay that is back within a second is used at once, and one that stays
away is asked about once a second until the budget ends."""

#: ``KvConsumer(discovery=...)``: prefix probing only, the KVSP Index only, or the index
#: first and prefix probing when it names no usable publication.
DISCOVERY_MODES = ("prefix", "index", "index-first")


class RecomputeRequired(KvcsError):
    """Some blocks could not be obtained and verified within the budget.

    ``missing`` maps layer -> sorted block indexes to recompute (within the segment for
    :meth:`KvConsumer.layers`, within the covered prefix for
    :meth:`KvConsumer.prefix_layers`); ``yielded`` is how many layers were delivered before
    this was raised; ``partial`` holds, for the layers not delivered that have any, the
    verified blocks (a :class:`KvLayer` whose rows of missing blocks are zero), so that only
    the missing blocks need recomputing.
    """

    def __init__(self, missing: dict[int, list[int]], yielded: int, reason: str,
                 partial: dict[int, KvLayer] | None = None) -> None:
        layers = sorted(missing)
        super().__init__(f"{reason}: {len(layers)} layer(s) incomplete, first {layers[:1]}")
        self.missing = missing
        self.yielded = yielded
        self.reason = reason
        self.partial: dict[int, KvLayer] = partial or {}


@dataclass(frozen=True)
class Publication:
    """A publication found by discovery: its namespace and how many blocks of the prompt it
    covers (the reusable prefix).

    ``endpoint`` is where it was found (None: the consumer's primary endpoint); retrieval
    starts there. ``index_blocks`` is non-zero for a publication of a longer prefix than
    the prompt found through a KVSP Index: the consumer cannot compute its Block Keys, so
    that its first ``index_blocks`` blocks are the prompt's rests on the index's replica
    records (never accepted with ``require_signed``)."""

    namespace: KvcsNamespace
    fields: tuple[bytes, ...]
    prefix_blocks: int
    endpoint: Endpoint | None = field(default=None, compare=False)
    index_blocks: int = 0


@dataclass
class ConsumerStats(AssemblyStats):
    """What the consumer saw (for logs, tests and benchmarks): the assembly counters
    (objects, bytes, rejected, duplicates, excess, http_blocks, held) and its own."""

    retries: int = 0
    resumes: int = 0
    """Interrupted transfers that went on (a subscription or fetch lost its source)."""
    first_layer_at: float | None = None
    started_at: float = 0.0
    finished_at: float | None = None
    manifest_versions: int = 0
    """Manifest versions read (the first one and every newer one followed)."""


class KvConsumer:
    """Finds and retrieves KV caches for one prompt. See the module docstring.

    ``codec``: a codec name or a preference order (e.g. ``["q8", "raw"]``). ``index``: a
    KVSP Index (:class:`~kvcs.kvnet.kvsp_http.KvspClient`) for ``discovery`` ``"index"``
    or ``"index-first"`` (the default when ``index`` is given), and for more holders in
    HTTP recovery. ``connect``: opens an endpoint to a relay the index names that none of
    ``endpoints`` is connected to, and reopens the relay of an endpoint whose session ended
    when an interrupted retrieval has no other open endpoint to go on with (the consumer
    owns and :meth:`aclose` closes those).
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
    ) -> None:
        self.endpoints = [endpoints] if isinstance(endpoints, Endpoint) else list(endpoints)
        if not self.endpoints and http is None and index is None:
            raise ValueError("at least one endpoint (or an HTTP client) is needed")
        self.http = http
        """KVSP HTTP holders (:class:`~kvcs.kvnet.kvsp_http.KvspClient`) used when MOQT
        sources fail (recovery) or when there is no MOQT path (:meth:`http_layers`)."""
        self.index = index
        """The KVSP Index asked for publications (and holders)."""
        self.discovery = discovery or ("index-first" if index is not None else "prefix")
        if self.discovery not in DISCOVERY_MODES:
            raise ValueError(f"discovery must be one of {DISCOVERY_MODES}, got {discovery!r}")
        if self.discovery != "prefix" and index is None:
            raise ValueError(f"discovery={self.discovery!r} needs index=KvspClient(...)")
        self.connect = connect
        self._opened: dict[str, Endpoint] = {}
        self._reopened: dict[Endpoint, Endpoint] = {}  # an ended endpoint -> its successor
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
            run.progress.ready.set()

    @property
    def endpoint(self) -> Endpoint:
        """The primary endpoint."""
        if not self.endpoints:
            raise ValueError("this consumer has no MOQT endpoint (HTTP only)")
        return self.endpoints[0]

    def _source(self, pub: Publication) -> Endpoint:
        """The endpoint a publication's retrieval starts on (the successor of the one it
        was found on, if that one was reopened)."""
        return self._current(pub.endpoint or self.endpoint)

    def _current(self, ep: Endpoint) -> Endpoint:
        while ep in self._reopened:
            ep = self._reopened[ep]
        return ep

    async def _open(self, ep: Endpoint) -> Endpoint:
        """``ep`` (or its successor) while its session is up; else its relay reopened
        through ``connect``; ConnectionError when neither is possible."""
        ep = self._current(ep)
        if not ep.is_closed:
            return ep
        new = await self._reopen(ep, self.recompute_budget_s)
        if new is None:
            info = ep.conn.info
            where = info.authority if info is not None else "the relay"
            raise ConnectionError(f"the session to {where} has ended"
                                  + ("" if self.connect else " (no connect= to reopen it)"))
        return new

    async def _endpoint_to_resume(self, current: Endpoint, attempt: int,
                                  timeout: float) -> Endpoint | None:
        """Where an interrupted retrieval goes on: the open endpoints in turn, starting
        with ``current`` (``attempt`` counts the turns); when none is open, ``current``'s
        relay reconnected through ``connect`` (None: nothing reachable now)."""
        current = self._current(current)
        others = [e for e in self.endpoints if e is not current and not e.is_closed]
        candidates = others if current.is_closed else [current, *others]
        if candidates:
            return candidates[attempt % len(candidates)]
        return await self._reopen(current, timeout)

    async def _reopen(self, ep: Endpoint, timeout: float) -> Endpoint | None:
        """A new endpoint to the relay of ``ep``, whose session ended (``connect``; None
        without it or when the relay cannot be reached within ``timeout``)."""
        info = ep.conn.info
        if self.connect is None or info is None or timeout <= 0:
            return None
        scheme = "https" if ep.conn.is_webtransport else "moqt"
        url = f"{scheme}://{info.authority}{info.path or '/'}"
        try:
            new = await _within(self.connect(url), timeout)
        except (ConnectionError, OSError, ValueError, TimeoutError) as exc:
            log.info("cannot reconnect to %s: %s", url, exc or "timeout")
            return None
        log.info("reconnected to %s", url)
        self._reopened[ep] = new
        self.endpoints = [new if e is ep else e for e in self.endpoints]
        old = self._opened.get(url)
        if old is not None and old is not ep and not old.is_closed:
            old.close()
        self._opened[url] = new
        return new

    async def aclose(self) -> None:
        """Close the endpoints this consumer opened (``connect``) for index-named relays."""
        opened, self._opened = list(self._opened.values()), {}
        for ep in opened:
            ep.close()
        for ep in opened:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ep.wait_closed(), 2)

    async def __aenter__(self) -> KvConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ discovery

    def _prefix(self, n: int) -> tuple[bytes, ...]:
        fields = (self.scope_id, self.compat_id, self.keys[n - 1])
        if self.hex_namespace:
            return (b"kvcs-1", *(f.hex().encode() for f in fields))
        return (b"kvcs-1", *fields)

    async def discover(self, max_blocks: int | None = None,
                       endpoint: Endpoint | None = None) -> Publication | None:
        """Find a usable publication for the longest reusable prefix (None if nothing
        matches), through the KVSP Index and/or prefix probing (``discovery``; ``endpoint``
        probes that endpoint only). Publications whose manifest fails its checks (CompatID,
        Block Keys, signature) are discarded and the next one is tried."""
        if endpoint is None and self.discovery != "prefix":
            pub = await self._first_usable(await self._index_publications(max_blocks))
            if pub is not None or self.discovery == "index":
                return pub
        if endpoint is None and not self.endpoints:
            return None
        ep = await self._open(endpoint or self.endpoint)
        n = min(len(self.keys), max_blocks or len(self.keys))
        while n >= 1:
            pub = await self._first_usable(await self._publications_at(ep, n))
            if pub is not None:
                return pub
            n -= 1
        return None

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
        """All publications of the longest prefix that has any (others first-found first);
        with the KVSP Index, those it names covering the most blocks."""
        if endpoint is None and self.discovery != "prefix":
            pubs = await self._index_publications(max_blocks)
            best = [p for p in pubs if p.prefix_blocks == pubs[0].prefix_blocks] if pubs else []
            if best or self.discovery == "index":
                return best
        if endpoint is None and not self.endpoints:
            return []
        ep = await self._open(endpoint or self.endpoint)
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
            watch = await asyncio.wait_for(ep.subscribe_namespace(prefix),
                                           self.recompute_budget_s)
        except MoqtRequestError as exc:
            if exc.code == RequestErrorCode.UNAUTHORIZED:
                raise
            return []
        except TimeoutError:
            log.warning("SUBSCRIBE_NAMESPACE unanswered for %.1f s", self.recompute_budget_s)
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
                out.append(Publication(kns, tuple(ns), n, ep))
        finally:
            await watch.cancel()
        return out

    async def _index_publications(self, max_blocks: int | None) -> list[Publication]:
        """The publications the KVSP Index names for this prompt's Block Keys, those
        covering the most blocks first. A publication covers blocks 0..n-1 when the index
        names it for each of them; its namespace must be of this scope and CompatID."""
        assert self.index is not None
        keys = self.keys[:max_blocks] if max_blocks else self.keys
        if not keys:
            return []
        try:
            found = await asyncio.wait_for(
                self.index.lookup(self.scope_id, self.compat_id, keys), self.recompute_budget_s)
        except (KvcsError, TimeoutError) as exc:
            log.warning("KVSP Index lookup failed: %s", exc or "timeout")
            return []
        named: dict[tuple[str, tuple[bytes, ...]], set[int]] = {}
        for i, key in enumerate(keys):
            for uri in found.get(key, ()):
                if not uri.startswith("moqt://"):
                    continue
                try:
                    relay, fields = parse_publication_uri(uri)
                    kns = KvcsNamespace.from_fields(fields, hex_fields=self.hex_namespace)
                except ValueError as exc:
                    log.info("ignoring holder URI %s: %s", uri[:80], exc)
                    continue
                if kns.scope_id == self.scope_id and kns.compat_id == self.compat_id:
                    named.setdefault((relay, fields), set()).add(i)
        pubs: list[Publication] = []
        for (relay, fields), blocks in named.items():
            n = 0
            while n in blocks:
                n += 1
            if n == 0:
                continue
            ep = await self._endpoint_for(relay)
            if ep is None:
                continue
            kns = KvcsNamespace.from_fields(fields, hex_fields=self.hex_namespace)
            if kns.anchor_key in keys[:n]:  # segment 0 within the prompt: hash-checked
                pubs.append(Publication(kns, fields, keys.index(kns.anchor_key) + 1, ep))
            else:  # a longer prefix: coverage rests on the index
                pubs.append(Publication(kns, fields, n, ep, index_blocks=n))
        pubs.sort(key=lambda p: -p.prefix_blocks)
        return pubs

    async def _endpoint_for(self, relay_url: str) -> Endpoint | None:
        """An endpoint connected to ``relay_url``: one of ``endpoints`` with that authority,
        one opened before, or a new one from ``connect`` (None without it)."""
        target = urllib.parse.urlsplit(relay_url)
        for ep in (*self.endpoints, *self._opened.values()):
            info = ep.conn.info
            if info is not None and info.authority == target.netloc and \
                    not ep.conn.is_webtransport:
                return ep
        if self.connect is None:
            log.info("the index names relay %s; no endpoint is connected to it (connect=)",
                     relay_url)
            return None
        try:
            ep = await _within(self.connect(relay_url), self.recompute_budget_s)
        except (ConnectionError, OSError, ValueError, TimeoutError) as exc:
            log.warning("cannot connect to %s named by the index: %s", relay_url, exc)
            return None
        self._opened[relay_url] = ep
        return ep

    # ------------------------------------------------------------------ manifest

    async def manifest(self, pub: Publication, endpoint: Endpoint | None = None) -> Manifest:
        """Read and check the current manifest of a publication (ManifestError,
        SignatureError, MoqtRequestError), within ``recompute_budget_s``."""
        track, m = await self._open_manifest(pub, endpoint)
        await track.close()
        return m

    async def _open_manifest(self, pub: Publication, endpoint: Endpoint | None = None,
                             ) -> tuple[ManifestTrack, Manifest]:
        """Subscribe to the manifest track and check its current version; the track stays
        open for newer versions (the caller closes it)."""
        ep = await self._open(endpoint or self._source(pub))
        track: ManifestTrack | None = None
        try:
            async with asyncio.timeout(self.recompute_budget_s):
                track = await ManifestTrack.open(
                    ep, pub.fields, require_signed=self.require_signed,
                    retry_until=asyncio.get_running_loop().time() + self.recompute_budget_s,
                    secure=self.secure)
                blob = await track.next_version()
                if blob is None:
                    raise ManifestError("the manifest track ended without a version")
                m = self._check_manifest(pub, blob, track.signed, track.protected)
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

    def _check_manifest(self, pub: Publication, blob: bytes, signed: bool,
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

    async def layers(
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
        self._check_into(into, layers)
        track, m = await self._manifest_for(pub, manifest)
        try:
            seg = m.segment(segment)
            if seg is None:
                raise ManifestError(f"manifest has no segment {segment}")
            n = self.covered_blocks(pub, seg)
            if n == 0:
                raise ManifestError(f"segment {segment} does not cover this prompt (its "
                                    "block_keys_sha256 differs from this prompt's Block Keys, "
                                    "or the prompt ends inside it)")
            plan = [(seg, n if blocks is None else min(n, blocks))]
            async with contextlib.aclosing(self._retrieve(
                    pub, m, plan, layers, alternates, track, absolute=False,
                    into=into)) as retrieved:
                async for layer in retrieved:
                    yield layer
        finally:
            if track is not None:
                await track.close()

    async def prefix_layers(
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
        self._check_into(into, layers)
        track, m = await self._manifest_for(pub, manifest)
        try:
            plan = self.prefix_plan(pub, m, blocks)
            if not plan and (blocks is None or blocks > 0):
                raise ManifestError("the publication covers no block of this prompt")
            async with contextlib.aclosing(self._retrieve(
                    pub, m, plan, layers, alternates, track, absolute=True,
                    into=into)) as retrieved:
                async for layer in retrieved:
                    yield layer
        finally:
            if track is not None:
                await track.close()

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
        return await self._open_manifest(pub)

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
        run = _Retrieval(self, pub, m, plan, wanted, absolute, arrays)
        self.stats.started_at = time.perf_counter()
        # aclosing: a caller that stops reading (break, aclose) ends the transfer at once
        # (subscriptions cancelled, feeders stopped), not when the generator is collected
        async with contextlib.aclosing(run.run(alternates, track)) as layers_run:
            async for layer in layers_run:
                if self.stats.first_layer_at is None:
                    self.stats.first_layer_at = time.perf_counter()
                if self.on_progress is not None:
                    self.on_progress("layer", layer.index, run.layers.stop)
                yield layer
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
        await self._http_fetch(assembler, range(n), time.monotonic() + self.recompute_budget_s)
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

    async def _http_fetch(self, assembler: LayerAssembler, blocks: Sequence[int],
                          deadline: float) -> None:
        """Fetch the containers of ``blocks`` (within the assembler's segment) from the
        KVSP holders (``http``, ``http.concurrency`` at a time), then the ones still
        missing from the ``https://`` holders that the holders' and the index's lookup
        answers name, until ``deadline``; the assembler verifies and places each."""
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            await asyncio.wait_for(self._http_fetch_all(assembler, blocks), left)
        except TimeoutError:
            log.warning("KVSP retrieval stopped at the recompute budget")

    async def _http_fetch_all(self, assembler: LayerAssembler, blocks: Sequence[int]) -> None:
        http = self.http
        limit = max_container_size(self.descriptor)
        failed: list[int] = []
        missing: list[int] = []

        async def one(block: int, sem: asyncio.Semaphore) -> None:
            assert http is not None
            index = assembler.first_block + block
            async with sem:
                try:
                    data = await http.get_block(self.scope_id, self.compat_id,
                                                assembler.block_key(block), max_bytes=limit)
                except KvcsError as exc:  # the first failure loud, the others (alike) quiet
                    failed.append(index)
                    log.log(logging.WARNING if len(failed) == 1 else logging.INFO,
                            "KVSP retrieval of block %d failed: %s", index, exc)
                    data = None
            if data is None or not assembler.accept_container(block, data):
                missing.append(block)

        if http is not None:
            sem = asyncio.Semaphore(http.concurrency)
            await asyncio.gather(*(one(b, sem) for b in blocks))
        else:
            missing = list(blocks)
        if missing:
            await self._http_follow(assembler, sorted(missing), limit)

    async def _http_follow(self, assembler: LayerAssembler, blocks: list[int],
                           limit: int) -> None:
        """Ask the holders and the index which ``https://`` holders have ``blocks`` and
        fetch each from the first one that delivers a container that verifies."""
        clients = [c for c in (self.http, self.index) if c is not None]
        if self.index is self.http:
            clients = clients[:1]
        keys = {assembler.block_key(b): b for b in blocks}
        for client in clients:
            if not keys:
                return
            try:
                found = await client.lookup(self.scope_id, self.compat_id, list(keys))
            except KvcsError as exc:
                log.info("KVSP lookup failed: %s", exc)
                continue
            tried = tuple(u + "/" for u in (self.http.urls if self.http else ()))
            sem = asyncio.Semaphore(client.concurrency)

            async def follow(key: bytes, urls: list[str], client: KvspClient = client,
                             sem: asyncio.Semaphore = sem) -> None:
                for url in urls:
                    async with sem:
                        try:
                            data = await client.get_url(url, max_bytes=limit)
                        except KvcsError as exc:
                            log.info("KVSP holder %s failed: %s", url[:80], exc)
                            continue
                    if data is not None and assembler.accept_container(keys[key], data):
                        del keys[key]
                        return

            await asyncio.gather(*(
                follow(key, [u for u in found.get(key, ())
                             if u.startswith("https://") and not u.startswith(tried)])
                for key in list(keys)))


async def _within(connecting: Awaitable[Endpoint], timeout: float) -> Endpoint:
    """``connecting`` if it ends within ``timeout`` s, else TimeoutError at once: a
    connection attempt still cleaning up after its cancellation (a CONNECTION_CLOSE to
    send, up to 1 s measured) ends in the background, and an endpoint it opened after all
    is closed."""
    task = asyncio.ensure_future(connecting)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_close_late_endpoint)
    _abandoned.add(task)
    raise TimeoutError


_abandoned: set[asyncio.Future[Endpoint]] = set()
"""Connection attempts given up on, until they have ended (a reference keeps them alive)."""


def _close_late_endpoint(task: asyncio.Future[Endpoint]) -> None:
    _abandoned.discard(task)
    if not task.cancelled() and task.exception() is None:
        task.result().close()


class _Progress:
    """Wake-ups and the time of the last progress of one retrieval (all its segments)."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        """Set when a layer may have become ready, a feeder ended or a manifest arrived."""
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()

    def made(self) -> None:
        """Something was verified and placed: the no-progress clock restarts."""
        self.last = self.loop.time()


_Received = tuple["_SegmentRun", Component, ReceivedObject, Properties, "Publication | None"]
"""A received object on its way to a segment's assembler: (run, kind, object, the track
properties it inherits a priority from, the publication when another one's)."""


class _Intake:
    """The received objects of one retrieval on their way to the assemblers, in batches:
    the SHA-256 of each plaintext object's Data is computed for a whole batch at once (in
    the worker thread when the batch is large, :mod:`kvcs.kvnet.offload`), then each
    object is verified and placed on the event-loop thread, in arrival order. A batch is
    what arrived while the previous one was hashed (at least one loop turn's)."""

    def __init__(self) -> None:
        self._pending: list[_Received] = []
        self._task: asyncio.Task[None] | None = None

    def put(self, item: _Received) -> None:
        """Queue one object (others than normal ones are dropped: they carry no block)."""
        if item[2].status != ObjectStatus.NORMAL:
            return
        self._pending.append(item)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                # protected objects are hashed once decrypted, by the assembler
                plain = [i for i, (run, *_) in enumerate(batch) if run.assembler.secure is None]
                digests = await sha256_digests(
                    [batch[i][2].payload[HEADER_SIZE:] for i in plain])
                computed: list[bytes | None] = [None] * len(batch)
                for i, digest in zip(plain, digests, strict=True):
                    computed[i] = digest
                for (run, kind, obj, props, pub), known in zip(batch, computed, strict=True):
                    run.take(kind, obj, props, pub, known)
        finally:
            self._task = None

    async def flush(self) -> None:
        """Wait until every object queued so far is verified and placed."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def close(self) -> None:
        """Drop what is queued (the retrieval has ended)."""
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()


class _Retrieval:
    """The I/O of one retrieval of a layer range over one or more consecutive segments of
    a publication: one :class:`_SegmentRun` per segment, their layers joined in token
    order, the manifest followed while a segment is live, waits bounded by the budget,
    then recovery of what is missing (other endpoints, other publications, KVSP HTTP)."""

    def __init__(self, consumer: KvConsumer, pub: Publication, manifest: Manifest,
                 plan: list[tuple[Segment, int]], layers: range, absolute: bool,
                 into: dict[int, LayerArrays] | None = None) -> None:
        self.c = consumer
        self.pub = pub
        self.manifest = manifest
        self.layers = layers
        self.absolute = absolute
        """Block indexes in RecomputeRequired are within the prefix (else the segment)."""
        self.into = into
        """The caller's arrays of each layer (all segments' rows), or None: new ones."""
        self.progress = _Progress()
        self.intake = _Intake()
        self.source = consumer._source(pub)
        self.runs: list[_SegmentRun] = []
        row = 0
        for seg, n in plan:
            self.runs.append(_SegmentRun(self, seg, n, row))
            row += n * consumer.descriptor.block_tokens
        self.next = layers.start
        """The next layer to yield."""
        self.resumes = 0
        """Turns taken to go on with interrupted runs (successful or not)."""
        self._resume_delays = RESUME_BACKOFF.delays()
        self._tasks: list[asyncio.Task[None]] = []
        self._follower: asyncio.Task[None] | None = None
        self._own_tracks: list[ManifestTrack] = []

    @property
    def done(self) -> bool:
        return self.next >= self.layers.stop

    def _ready(self) -> list[KvLayer]:
        """The next layers every segment has, joined (one segment: as assembled)."""
        for run in self.runs:
            for layer in run.assembler.pop_ready():
                run.popped[layer.index] = layer
        out: list[KvLayer] = []
        while not self.done and all(self.next in r.popped for r in self.runs):
            parts = [r.popped.pop(self.next) for r in self.runs]
            if self.into is not None:  # assembled in place: nothing to join
                out.append(KvLayer(self.next, *self.into[self.next],
                                   sum(p.blocks for p in parts)))
            elif len(parts) == 1:
                out.append(parts[0])
            else:
                out.append(KvLayer(self.next, np.concatenate([p.k for p in parts]),
                                   np.concatenate([p.v for p in parts]),
                                   sum(p.blocks for p in parts)))
            self.next += 1
        return out

    def _release_held(self) -> None:
        """Place the held objects whose content key has arrived, give up those whose wait
        ended (:meth:`LayerAssembler.release_held`)."""
        for r in self.runs:
            if r.assembler.release_held():
                self.progress.made()

    def _held_until(self) -> float | None:
        """When the first held object of any segment gives up (``time.monotonic``)."""
        return min((t for r in self.runs if (t := r.assembler.held_until) is not None),
                   default=None)

    def _live(self) -> bool:
        """Some segment of the retrieval is still produced (as far as the newest manifest
        version read says)."""
        for r in self.runs:
            seg = self.manifest.segment(r.seg.segment)
            if seg is None or not seg.complete:
                return True
        return False

    def _follow(self, track: ManifestTrack) -> None:
        self._follower = asyncio.create_task(self._follow_manifest(track))
        self._tasks.append(self._follower)

    async def _open_manifest(self, ep: Endpoint, timeout: float) -> ManifestTrack | None:
        """Subscribe to the manifest on ``ep`` (closed at the end of the retrieval) and use
        its current version; None if it cannot be read within ``timeout`` seconds."""
        try:
            track, m = await asyncio.wait_for(self.c._open_manifest(self.pub, ep), timeout)
        except (KvcsError, MoqtRequestError, ConnectionError, ValueError, TimeoutError):
            return None
        self._own_tracks.append(track)
        self._use_manifest(m)
        return track

    def _use_manifest(self, m: Manifest) -> None:
        self.manifest = m
        for r in self.runs:
            r.assembler.use_manifest(m)

    async def _resume(self, left: float) -> None:
        """Go on with the interrupted segment runs (see the module docstring), after a
        backoff, spending at most ``left`` seconds."""
        loop = self.progress.loop
        deadline = loop.time() + left
        await asyncio.sleep(min(next(self._resume_delays), left))
        ep = await self.c._endpoint_to_resume(self.source, self.resumes,
                                              deadline - loop.time())
        self.resumes += 1
        if ep is None:
            return  # nothing reachable now: the next turn tries again, within the budget
        self.source = ep
        self.c.stats.resumes += 1
        for r in self.runs:
            if r.interrupted:
                self._tasks += r.resume(ep)
        if self._live() and (self._follower is None or self._follower.done()):
            track = await self._open_manifest(ep, deadline - loop.time())
            if track is not None:
                self._follow(track)

    async def run(self, alternates: Sequence[Publication],
                  track: ManifestTrack | None) -> AsyncGenerator[KvLayer, None]:
        c = self.c
        budget = c.recompute_budget_s
        c._retrievals.add(self)
        try:
            for r in self.runs:
                self._tasks += r.start(self.source)
            if self._live():
                if track is None:  # the caller gave a manifest: follow it ourselves
                    track = await self._open_manifest(self.source, budget)
                if track is not None:
                    self._follow(track)
            # transfer: wait while anything feeds or objects wait for their content key
            # (until add_content_key or their key_wait_s), at most ``budget`` without
            # progress; a run whose source was lost goes on elsewhere (_resume)
            while True:
                self._release_held()
                for layer in self._ready():
                    yield layer
                held_until = self._held_until()
                if self.done:
                    break
                left = self.progress.last + budget - self.progress.loop.time()
                if left <= 0:
                    log.warning("no progress for %.1f s (recompute budget): recovering", budget)
                    break
                if held_until is None and not any(r.feeding for r in self.runs):
                    if not any(r.interrupted for r in self.runs):
                        break
                    await self._resume(left)
                    continue
                if held_until is not None:
                    left = min(left, max(0.0, held_until - time.monotonic()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.progress.ready.wait(), left)
                self.progress.ready.clear()
            for layer in self._ready():
                yield layer
            if not self.done:
                async with contextlib.aclosing(
                        self._recover(alternates, time.monotonic() + budget)) as recovered:
                    async for layer in recovered:
                        yield layer
            if not self.done:
                raise self._recompute_required("objects missing or failed verification")
        finally:
            c._retrievals.discard(self)
            self.intake.close()
            for t in self._tasks:
                t.cancel()
            for t in self._tasks:
                with contextlib.suppress(BaseException):
                    await t
            for own in self._own_tracks:
                await own.close()

    async def _follow_manifest(self, track: ManifestTrack) -> None:
        """Newer manifest versions: their ``object_digests`` check and (signed) confirm
        layers, and a segment may have become complete."""
        try:
            while True:
                try:
                    blob = await track.next_version()  # decrypted when protected
                    if blob is None:
                        break
                    m = self.c._check_manifest(self.pub, blob, track.signed, track.protected)
                except SessionError:  # a KvcsError too: the session or request went (below)
                    raise
                except (KvcsError, ValueError) as exc:
                    log.warning("discarding manifest version: %s", exc)
                    continue
                self._use_manifest(m)
                self.progress.made()
                self.progress.ready.set()  # newly listed layers may now be confirmed
        except (MoqtRequestError, ConnectionError) as exc:
            log.info("manifest follow ended: %s", exc)

    async def _recover(self, alternates: Sequence[Publication],
                       deadline: float) -> AsyncGenerator[KvLayer, None]:
        """Retry the missing blocks from other sources until ``deadline``."""
        c = self.c
        eps = [e for e in c.endpoints if e is not self.source] + [self.source]
        sources: list[tuple[Endpoint, Publication]] = [(e, self.pub) for e in eps]
        if self.manifest.deterministic:
            sources += [(e, p) for p in alternates for e in eps]
        for src_ep, src_pub in sources:
            if self.done or time.monotonic() > deadline:
                break
            alt: Manifest | None = None
            if src_pub is not self.pub:
                alt = await self._deterministic(src_ep, src_pub, deadline)
                if alt is None:
                    continue
            c.stats.retries += 1
            for r in self.runs:
                missing = r.assembler.missing()
                if missing and (alt is None or r.same_segment(alt)):
                    log.info("recovering %d incomplete layer(s) of segment %d from %s",
                             len(missing), r.seg.segment,
                             src_pub.namespace.publication_id.hex()[:8])
                    await r.recover(src_ep, src_pub, missing, deadline)
            for layer in self._ready():
                yield layer
        if not self.done and (c.http is not None or c.index is not None) and \
                time.monotonic() < deadline:
            for r in self.runs:
                await r.recover_http(deadline)
            for layer in self._ready():
                yield layer

    async def _deterministic(self, ep: Endpoint, pub: Publication,
                             deadline: float) -> Manifest | None:
        """The manifest of an alternate publication whose objects may be combined with
        ours (both manifests say ``deterministic``), else None."""
        try:
            m = await asyncio.wait_for(self.c.manifest(pub, ep),
                                       max(0.0, deadline - time.monotonic()))
        except (KvcsError, MoqtRequestError, ConnectionError, TimeoutError) as exc:
            log.info("alternate publication unusable: %s", exc or "timeout")
            return None
        return m if m.deterministic and self.manifest.deterministic else None

    def _recompute_required(self, reason: str) -> RecomputeRequired:
        """What is still missing, per layer not yielded, with what was verified of it."""
        missing: dict[int, list[int]] = {}
        partial: dict[int, KvLayer] = {}
        per_run = [(r, r.assembler.missing(), r.assembler.partial()) for r in self.runs]
        for layer in range(self.next, self.layers.stop):
            blocks: list[int] = []
            parts: list[KvLayer | None] = []
            for r, miss, part in per_run:
                offset = r.seg.first_block if self.absolute else 0
                got = r.popped.get(layer) or part.get(layer)
                blocks += [offset + b for b in miss.get(layer, ())]
                parts.append(got)
            if blocks:
                missing[layer] = blocks
            if any(p is not None for p in parts):
                partial[layer] = self._join(layer, parts)
        return RecomputeRequired(missing, self.next - self.layers.start, reason, partial)

    def _join(self, layer: int, parts: list[KvLayer | None]) -> KvLayer:
        """One layer of every segment's part (zeros where a segment has nothing)."""
        d = self.c.descriptor
        if self.into is not None:  # the parts are rows of the caller's arrays
            k, v = self.into[layer]
            for r, p in zip(self.runs, parts, strict=True):
                if p is None:
                    k[r.row:r.row + r.n * d.block_tokens] = 0
                    v[r.row:r.row + r.n * d.block_tokens] = 0
            return KvLayer(layer, k, v, sum(r.n for r in self.runs))
        if len(parts) == 1 and parts[0] is not None:
            return parts[0]
        ks, vs = [], []
        for r, p in zip(self.runs, parts, strict=True):
            rows = r.n * d.block_tokens
            ks.append(p.k if p is not None else np.zeros((rows, *d.k_shape()[1:]), d.dtype))
            vs.append(p.v if p is not None else np.zeros((rows, *d.v_shape()[1:]), d.dtype))
        return KvLayer(layer, np.concatenate(ks), np.concatenate(vs),
                       sum(r.n for r in self.runs))


class _SegmentRun:
    """The transfer of one segment of a :class:`_Retrieval`: feeds every object of its
    selected tracks to a :class:`LayerAssembler` and recovers its missing blocks."""

    def __init__(self, retrieval: _Retrieval, seg: Segment, n: int, row: int) -> None:
        c = retrieval.c
        self.r = retrieval
        self.c = c
        self.seg = seg
        self.n = n
        self.row = row
        """Where the segment's tokens start in a layer of the retrieval."""
        self.assembler = LayerAssembler(
            c.descriptor, retrieval.layers, n, tracks=select_tracks(seg, c.codecs),
            first_block=seg.first_block, block_keys=c.keys,
            require_signed=c.require_signed, secure=c.secure, namespace=retrieval.pub.fields,
            key_wait_s=c.key_wait_s, stats=c.stats,
            arrays=None if retrieval.into is None else self._arrays)
        self.assembler.use_manifest(retrieval.manifest)
        self.feeding = 0
        """Feeders (one per selected track) still running."""
        self.interrupted = False
        """A feeder lost its source (session ended, relay or publisher gone): the run goes
        on elsewhere (:meth:`resume`)."""
        self.resumes = 0
        self.popped: dict[int, KvLayer] = {}
        """Layers assembled but not yet yielded (waiting for the other segments)."""

    @property
    def complete(self) -> bool:
        """The segment is complete (as far as the newest manifest version read says)."""
        seg = self.r.manifest.segment(self.seg.segment)
        return seg is not None and seg.complete

    def start(self, ep: Endpoint) -> list[asyncio.Task[None]]:
        """Start one feeder per selected track."""
        retrieval = self.c.relay_profile.track_retrieval(self.complete)
        tasks = [asyncio.create_task(self._feed(ep, kind, track.format(), retrieval))
                 for kind, track in self.assembler.tracks.items()]
        self.feeding += len(tasks)
        return tasks

    def _arrays(self, layer: int) -> LayerArrays:
        """This segment's rows of the caller's arrays of ``layer``."""
        assert self.r.into is not None
        k, v = self.r.into[layer]
        rows = slice(self.row, self.row + self.n * self.c.descriptor.block_tokens)
        return k[rows], v[rows]

    def resume(self, ep: Endpoint) -> list[asyncio.Task[None]]:
        """Go on on ``ep`` after the source was lost: the missing blocks of a completed
        segment are fetched; a live one is retrieved again (duplicates are dropped)."""
        self.interrupted = False
        self.resumes += 1
        missing = self.assembler.missing()
        if not missing:
            return []
        log.info("resuming segment %d (%d incomplete layer(s)) after losing its source",
                 self.seg.segment, len(missing))
        if not self.complete:
            return self.start(ep)
        layers = sorted(missing)
        blocks = sorted({b for bs in missing.values() for b in bs})
        tasks = [asyncio.create_task(self._feed(ep, kind, track.format(),
                                                TrackRetrieval.FETCH, layers, blocks))
                 for kind, track in self.assembler.tracks.items()]
        self.feeding += len(tasks)
        return tasks

    def _source_lost(self, sub: Subscription) -> None:
        """Note a subscription that ended without its track ending."""
        if sub.done is None or sub.done.status in SOURCE_LOST:
            self.interrupted = True

    def same_segment(self, m: Manifest) -> bool:
        """``m`` (an alternate publication's manifest) has this segment with the same blocks
        and our tracks, so its objects sit at the same Locations."""
        other = m.segment(self.seg.segment)
        return other is not None and other.first_block == self.seg.first_block and \
            other.block_keys_sha256 == self.seg.block_keys_sha256 and \
            all(t.format() in other.tracks for t in self.assembler.tracks.values())

    def take(self, kind: Component, obj: ReceivedObject, track_properties: Properties,
             pub: Publication | None, data_sha256: bytes | None) -> None:
        """Give one received object (of ``pub``, default this publication) to the
        assembler (:class:`_Intake` computed ``data_sha256``, the SHA-256 of its Data, if
        not None); note progress, wake the loop when a layer completed or the object waits
        for its content key. ``track_properties`` (of the SUBSCRIBE_OK / FETCH_OK) give the
        priority an object inherits (protected objects authenticate it)."""
        outcome = self.assembler.accept(
            kind, obj.group_id, obj.object_id, obj.payload,
            publisher_priority=effective_priority(obj.publisher_priority, track_properties),
            properties=obj.properties,
            namespace=None if pub is None or pub is self.r.pub else pub.fields,
            data_sha256=data_sha256)
        if outcome is Outcome.HELD:
            self.r.progress.ready.set()  # the loop's wait now ends at its key_wait_s
        elif outcome is Outcome.PLACED:
            self.r.progress.made()
        elif outcome is Outcome.LAYER_COMPLETE:
            self.r.progress.made()
            self.r.progress.ready.set()

    # -- transfer --------------------------------------------------------------------

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
        return (RangeFilter(PARAM_OBJECTID_FILTER, 0, tuple(ranges)),)

    async def _feed(self, ep: Endpoint, kind: Component, name: str,
                    retrieval: TrackRetrieval, layers: Sequence[int] | None = None,
                    blocks: Sequence[int] | None = None) -> None:
        pub = self.r.pub
        try:
            if retrieval is TrackRetrieval.FETCH:
                await self._fetch_layers(ep, pub, kind, name,
                                         self.assembler.layers if layers is None else layers,
                                         blocks)
            elif retrieval is TrackRetrieval.SUBSCRIBE_FROM_START:
                sub = await ep.subscribe(
                    pub.fields, name.encode(),
                    location_filter=LocationFilter.next_object(),
                    fill=Parameters(location_filter=LocationFilter.absolute_start(0, 0)),
                    priority=0)
                try:
                    await self._take_all(sub, kind, sub.track_properties)
                    self._source_lost(sub)
                finally:
                    if not sub.finished:
                        await sub.cancel()
            else:
                await self._follow_current_group(ep, kind, name)
        except (MoqtRequestError, ConnectionError, SessionUsageError) as exc:
            log.warning("retrieval of %s failed: %s", name, exc)
            if self.resumes or not isinstance(exc, MoqtRequestError) or exc.code in TRANSIENT:
                self.interrupted = True  # the source went away (or again, once resumed)
        finally:
            self.feeding -= 1
            self.r.progress.ready.set()

    async def _follow_current_group(self, ep: Endpoint, kind: Component, name: str) -> None:
        """A track behind a relay that fills only inside the current group: SUBSCRIBE
        Next Object + a fill of the current group (Relative Start 1), and one FETCH per
        layer before the current one, while the subscription runs. Overlaps are harmless
        (duplicates are dropped); nothing is missed: the fill and the live part cover
        {Largest.Group, 0} onwards, the FETCHes everything before."""
        pub = self.r.pub
        sub = await ep.subscribe(
            pub.fields, name.encode(),
            location_filter=LocationFilter.next_object(),
            fill=Parameters(location_filter=LocationFilter.relative_start(1)),
            priority=0)

        live = asyncio.create_task(self._take_all(sub, kind, sub.track_properties))
        try:
            largest = sub.largest
            if largest is not None:
                past = [g for g in self.assembler.layers if g < largest.group]
                await self._fetch_layers(ep, pub, kind, name, past)
            await live
            self._source_lost(sub)
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
        await self._take_all(res, kind, props, pub)

    async def _take_all(self, stream: Subscription | FetchResult, kind: Component,
                        track_properties: Properties, pub: Publication | None = None) -> None:
        """Give every object of a subscription or fetch to the retrieval's intake until
        it ends (each as it is parsed: a callback, no queue; those queued before through
        the iterator) and wait until they are all verified and placed."""
        put = self.r.intake.put
        stream.deliver_to(lambda obj: put((self, kind, obj, track_properties, pub)))
        async for obj in stream:
            put((self, kind, obj, track_properties, pub))
        await self.r.intake.flush()

    # -- recovery --------------------------------------------------------------------

    async def recover(self, ep: Endpoint, pub: Publication, missing: dict[int, list[int]],
                      deadline: float) -> None:
        """FETCH the missing blocks of each selected track from ``ep`` until ``deadline``."""
        if ep.is_closed:
            return
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
                log.info("recovery fetch of %s failed: %s", name, exc or "timeout")

    async def recover_http(self, deadline: float) -> None:
        """Fetch the containers of the missing blocks from the KVSP HTTP holders; the
        assembler places them in the layers that miss them (KVCS "Verification and
        Recovery")."""
        asm = self.assembler
        missing = asm.missing()
        blocks = asm.container_blocks(missing)
        if not blocks:
            return
        self.c.stats.retries += 1
        log.info("recovering %d block(s) of %d layer(s) of segment %d over KVSP HTTP",
                 len(blocks), len(missing), self.seg.segment)
        await self.c._http_fetch(asm, blocks, deadline)
