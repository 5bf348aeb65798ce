"""What the vLLM connector (:mod:`kvcs.integrations.vllm`) needs besides vLLM's interface:
its settings, the Compatibility Descriptor of a vLLM model, the scope of a ``cache_salt``,
the background event loop that runs kvcs's asyncio API for vLLM's synchronous scheduler
and worker, the relay sessions, the one-lookup discovery and the paged-cache layout.

Nothing here imports vLLM at module level: the connector passes its config objects in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import ml_dtypes
import numpy as np
import torch

from ..endpoint import Endpoint
from ..kv.cose import Keyring, ProducerKey
from ..kv.ids import CompatDescriptor, ScopeKey, block_keys, scope_id
from ..kv.prefault import empty as new_array
from ..kv.scopefile import ScopeFile, ScopeFileError, load_scope_file
from ..kv.secure import SecureObjects
from ..kvnet.discovery import NamespaceIndex, scope_prefix
from ..moqt.wire import AuthToken
from ..transport import QuicSettings

log = logging.getLogger("kvcs.integrations.vllm")

T = TypeVar("T")

EXTRA_KEYS = ("relay", "cafile", "pin", "scope_key", "protect", "recompute_budget_s",
              "token", "events", "retention_s")
"""The ``kv_connector_extra_config`` keys the connector reads (docs/vllm.md)."""

_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


class ConnectorConfigError(ValueError):
    """A ``kv_connector_extra_config`` value or a model the connector cannot serve (one-line
    message naming the key or the reason)."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """The connector's settings, from ``kv_connector_extra_config``."""

    relays: tuple[str, ...]
    cafile: str | None
    pin: str | None
    scope: ScopeFile
    protect: bool
    recompute_budget_s: float
    token: str | None
    events: str | None
    retention_s: float | None

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Settings:
        """Parse and check the extra config (ConnectorConfigError, one line)."""
        unknown = sorted(set(extra) - set(EXTRA_KEYS))
        if unknown:
            raise ConnectorConfigError(f"kvcs: unknown kv_connector_extra_config key(s) "
                                       f"{', '.join(unknown)} (known: {', '.join(EXTRA_KEYS)})")
        relay = extra.get("relay")
        relays = (relay,) if isinstance(relay, str) else tuple(relay or ())
        if not relays or not all(isinstance(r, str) for r in relays):
            raise ConnectorConfigError("kvcs: 'relay' must be a moqt://host:port/ URL or a list")
        for url in relays:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("moqt", "https") or not parts.hostname or not parts.port:
                raise ConnectorConfigError(f"kvcs: relay {url!r} is not moqt://host:port/")
        cafile, pin = extra.get("cafile"), extra.get("pin")
        if cafile is not None and not Path(cafile).is_file():
            raise ConnectorConfigError(f"kvcs: cafile {cafile}: no such file")
        path = extra.get("scope_key")
        if path is None:
            raise ConnectorConfigError("kvcs: 'scope_key' is required (a `kvcs keygen` scope "
                                       "file or a scope.key)")
        try:
            scope = load_scope_file(path)
        except ScopeFileError as exc:
            raise ConnectorConfigError(f"kvcs: scope_key: {exc}") from None
        protect = extra.get("protect")
        protect = bool(scope.content_keys) if protect is None else bool(protect)
        if protect and not scope.content_keys:
            raise ConnectorConfigError(f"kvcs: protect needs content keys; {path} has none "
                                       "(make one with `kvcs keygen`)")
        try:
            budget = float(extra.get("recompute_budget_s", 5.0))
            retention = extra.get("retention_s", 3600.0)
            retention = None if retention is None else float(retention)
        except (TypeError, ValueError):
            raise ConnectorConfigError("kvcs: recompute_budget_s and retention_s are "
                                       "numbers of seconds") from None
        if budget <= 0:
            raise ConnectorConfigError("kvcs: recompute_budget_s must be positive")
        return cls(relays, cafile, pin, scope, protect, budget, extra.get("token"),
                   extra.get("events"), retention)

    def secure(self) -> SecureObjects | None:
        """The scope's Secure Objects (None: unprotected)."""
        return self.scope.secure_objects() if self.protect else None

    def producer_key(self) -> ProducerKey | None:
        return self.scope.producer_key()

    def keyring(self) -> Keyring | None:
        return self.scope.keyring()


def scope_for_salt(scope: ScopeKey, salt: str | None) -> ScopeKey:
    """The scope key of a ``cache_salt``: the scope file's own key without one, else a key
    derived from it and the salt (HMAC-SHA256), so every salt names its own ScopeID and a
    request never discovers another salt's publications."""
    if not salt:
        return scope
    return ScopeKey(hmac.new(scope.key, b"kvcs vllm cache_salt\0" + salt.encode(),
                             hashlib.sha256).digest())


# --------------------------------------------------------------------------- descriptor


def _weights_revision(directory: Path) -> str | None:
    from ..kv.model_id import WEIGHT_SUFFIXES, weights_revision

    if not directory.is_dir() or not any(f.suffix in WEIGHT_SUFFIXES
                                         for f in directory.iterdir()):
        return None
    return weights_revision(directory)


_REVISIONS: dict[str, str] = {}


def descriptor_from_vllm(vllm_config: Any) -> CompatDescriptor:
    """The Compatibility Descriptor of a vLLM engine's KV cache: architecture, weights
    revision (the configured ``revision``, else the SHA-256 of the weight files, never
    their path), dtype, KV heads, head dim, layers and block size. ConnectorConfigError for
    what the connector does not carry (tensor or pipeline parallelism, hybrid, sliding
    window or MLA models, quantized caches)."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    if pc.tensor_parallel_size != 1 or pc.pipeline_parallel_size != 1:
        raise ConnectorConfigError(
            "kvcs: tensor/pipeline parallel shards are not supported yet (tensor_parallel_size "
            f"{pc.tensor_parallel_size}, pipeline_parallel_size {pc.pipeline_parallel_size})")
    if getattr(mc, "use_mla", False):
        raise ConnectorConfigError("kvcs: MLA models (latent KV caches) are not supported")
    if getattr(mc, "is_hybrid", False) or mc.get_sliding_window() is not None:
        raise ConnectorConfigError("kvcs: hybrid and sliding-window models are not supported "
                                   "(only full-attention layers)")
    if str(cc.cache_dtype) != "auto":
        raise ConnectorConfigError(f"kvcs: kv cache dtype {cc.cache_dtype} is not supported "
                                   "(use 'auto')")
    dtype = _DTYPES.get(mc.dtype)
    if dtype is None:
        raise ConnectorConfigError(f"kvcs: model dtype {mc.dtype} is not supported")
    revision = mc.revision
    if not revision:
        key = str(mc.model)
        if key not in _REVISIONS:
            found = _weights_revision(Path(key))
            if found is None:
                raise ConnectorConfigError(
                    f"kvcs: cannot tell the weights revision of {key}: give LLM(revision=...)")
            _REVISIONS[key] = found
        revision = _REVISIONS[key]
    hf = mc.hf_text_config
    arch = (getattr(mc.hf_config, "architectures", None) or [mc.hf_config.model_type])[0]
    rope = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None)
    extra: dict[str, Any] = {"runtime": "vllm", "model_type": str(hf.model_type)}
    if rope:
        extra["rope_parameters"] = {str(k): repr(v) if isinstance(v, float) else v
                                    for k, v in dict(rope).items() if v is not None}
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": str(arch), "revision": str(revision),
        "tokenizer": str(mc.tokenizer_revision or revision),
        "layers": int(mc.get_total_num_hidden_layers()),
        "kv_heads": int(mc.get_total_num_kv_heads()),
        "head_dim": int(mc.get_head_size()),
        "dtype": dtype, "block_tokens": int(cc.block_size), "layout": "tnd",
        "rope": "post", "extra": extra,
    })


# --------------------------------------------------------------------------- event loop


class BackgroundLoop:
    """An asyncio loop in a daemon thread: vLLM's scheduler and worker are synchronous,
    kvcs's network API is asyncio."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kvcs-vllm",
                                       daemon=True)
        self.thread.start()

    def pin(self, cpus: Sequence[int]) -> None:
        """Run the loop's thread on ``cpus`` only (vLLM's CPU backend binds its OpenMP
        threads to the other cores and reserves these; the thread inherits the forward
        pass's core otherwise, and every byte received would then wait for the forward
        pass, or hold it up)."""
        def pin_this_thread() -> None:
            try:
                os.sched_setaffinity(0, cpus)
            except (OSError, AttributeError, ValueError) as exc:
                log.info("kvcs: cannot pin the transfer thread to CPUs %s: %s", cpus, exc)

        self.loop.call_soon_threadsafe(pin_this_thread)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait at most ``timeout`` s (TimeoutError)."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError from None


_LOOP: BackgroundLoop | None = None
_LOOP_LOCK = threading.Lock()


def background_loop() -> BackgroundLoop:
    """The process's one background loop (the scheduler and worker connectors of one
    process share it, and its relay sessions)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = BackgroundLoop()
        return _LOOP


# --------------------------------------------------------------------------- relays


class Relays:
    """Sessions to the configured relays (on the background loop): the first reachable
    one publishes; consumers use every reachable one (failover)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._endpoints: dict[str, Endpoint] = {}
        self._lock: asyncio.Lock | None = None
        self._reconnecting: asyncio.Future[list[Endpoint]] | None = None
        self.indexes: dict[tuple[int, tuple[bytes, ...]], NamespaceIndex] = {}
        """(session, namespace prefix) -> its live index (:func:`scope_index`)."""
        self._last_attempt = 0.0

    async def _connect(self, url: str) -> Endpoint | None:
        s = self.settings
        tokens = (AuthToken(3, token_type=0, value=s.token.encode()),) if s.token else ()
        try:
            # the default settings size datagrams per peer: a relay on loopback gets the
            # library's largest, as with QuicSettings.loopback() (its other values are the
            # defaults), any other the internet's
            return await Endpoint.connect(url, settings=QuicSettings(), cafile=s.cafile,
                                          pin_sha256=s.pin, auth_tokens=tokens,
                                          timeout=s.recompute_budget_s)
        except (ConnectionError, OSError, ValueError, TimeoutError) as exc:
            log.warning("kvcs: cannot connect to relay %s: %s", url, exc)
            return None

    async def endpoints(self) -> list[Endpoint]:
        """Open sessions to every configured relay that answers, in configured order."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            missing = [u for u in self.settings.relays
                       if u not in self._endpoints or self._endpoints[u].is_closed]
            if missing:
                opened = await asyncio.gather(*(self._connect(u) for u in missing))
                for url, ep in zip(missing, opened, strict=True):
                    if ep is not None:
                        self._endpoints[url] = ep
                    else:
                        self._endpoints.pop(url, None)
            return [self._endpoints[u] for u in self.settings.relays if u in self._endpoints]

    def ready(self) -> list[Endpoint]:
        """The sessions open now, without waiting (on the loop): a lookup never waits for a
        connection. Reconnects the missing ones in the background (at most once a second)."""
        eps = [ep for u in self.settings.relays
               if (ep := self._endpoints.get(u)) is not None and not ep.is_closed]
        now = time.monotonic()
        if len(eps) < len(self.settings.relays) and now - self._last_attempt > 1.0 and (
                self._reconnecting is None or self._reconnecting.done()):
            self._last_attempt = now
            self._reconnecting = asyncio.ensure_future(self.endpoints())
        return eps

    async def primary(self) -> Endpoint:
        eps = await self.endpoints()
        if not eps:
            raise ConnectionError(f"no relay reachable ({', '.join(self.settings.relays)})")
        return eps[0]


_RELAYS: dict[tuple[Any, ...], Relays] = {}


def relays_for(settings: Settings) -> Relays:
    """One :class:`Relays` per process and settings (the scheduler's and the worker's
    connector share the sessions)."""
    with _LOOP_LOCK:
        key = (settings.relays, settings.cafile, settings.pin, settings.token,
               settings.recompute_budget_s)
        return _RELAYS.setdefault(key, Relays(settings))


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class Match:
    """The longest publication of a prompt's prefix found by one lookup."""

    fields: tuple[bytes, ...]
    blocks: int
    """Blocks of the prompt it covers (segment 0 of the publication)."""
    relay: int
    """Index of the relay session it was found on."""


async def scope_index(relays: Relays, scope: ScopeKey, compat_id: bytes,
                      timeout: float) -> tuple[NamespaceIndex | None, int]:
    """The standing index (:class:`~kvcs.kvnet.discovery.NamespaceIndex`) of (scope,
    CompatID) on the first open relay session, opened if needed; with the round trips it
    took (0 or 1). None: no relay session is open."""
    eps = relays.ready()
    if not eps:
        return None, 0
    sid = scope_id(scope)
    key = (id(eps[0]), scope_prefix(sid, compat_id))
    index = relays.indexes.get(key)
    if index is not None and index.alive:
        return index, 0
    index = NamespaceIndex(eps[0], sid, compat_id)
    await index.open(timeout)
    relays.indexes[key] = index
    return index, 1


def prompt_keys(scope: ScopeKey, desc: CompatDescriptor, tokens: Sequence[int]) -> list[bytes]:
    return block_keys(scope, desc.compat_id, np.asarray(tokens, dtype=np.int64),
                      desc.block_tokens)


# --------------------------------------------------------------------------- paged cache


class PagedLayout:
    """The CPU backend's paged cache of one layer, ``[blocks, kv_heads, block_size,
    2 * head_dim]``, whose memory per (block, head) is K's block_size rows then V's (the
    backend views it as ``[blocks, heads, 2 * block_size, head_dim]``)."""

    def __init__(self, desc: CompatDescriptor) -> None:
        self.desc = desc

    def check(self, name: str, kv: torch.Tensor) -> None:
        d = self.desc
        want = (d.kv_heads, d.block_tokens, 2 * d.head_dim)
        if kv.dim() != 4 or tuple(kv.shape[1:]) != want or kv.device.type != "cpu":
            raise ConnectorConfigError(
                f"kvcs: layer {name}: paged cache {tuple(kv.shape)} on {kv.device} is not the "
                f"CPU backend's [blocks, {want[0]}, {want[1]}, {want[2]}] (only vLLM's CPU "
                "attention backend is supported)")

    def _blocks(self, kv: torch.Tensor) -> np.ndarray:
        """The layer's cache as numpy ``[blocks, kv_heads, 2 * block_size, head_dim]``
        sharing its memory (torch's view raises if the memory does not allow one)."""
        d = self.desc
        view = kv.view(kv.shape[0], d.kv_heads, 2 * d.block_tokens, d.head_dim)
        if view.dtype == torch.bfloat16:
            return view.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return view.numpy()

    # The copies are numpy's, not torch's: torch runs an indexed copy of this size on its
    # OpenMP threads, i.e. on the forward pass's whole team, and on 2 shared cores one
    # layer's gather or scatter then waited for a descheduled team member: 30 layers of 15
    # blocks took 0.12-0.5 s CPU (1.3 s wall at load 12) against 3-16 ms with numpy (one
    # thread, measured on the development machine).

    def gather(self, kv: torch.Tensor, block_ids: Sequence[int]) -> tuple[np.ndarray,
                                                                          np.ndarray]:
        """K and V of ``block_ids`` as numpy [blocks * block_size, kv_heads, head_dim] (one
        gather of the blocks, then one copy per component into token order)."""
        d = self.desc
        B = d.block_tokens
        picked = self._blocks(kv)[np.asarray(block_ids, dtype=np.intp)]
        return tuple(np.ascontiguousarray(part.transpose(0, 2, 1, 3)).reshape(
            -1, d.kv_heads, d.head_dim) for part in (picked[:, :, :B], picked[:, :, B:])
        )  # type: ignore[return-value]

    def scatter(self, kv: torch.Tensor, block_ids: Sequence[int], k: np.ndarray,
                v: np.ndarray) -> None:
        """Write K and V ([blocks * block_size, heads, dim]) into ``block_ids`` (one indexed
        copy per component)."""
        d = self.desc
        B = d.block_tokens
        blocks = self._blocks(kv)
        idx = np.asarray(block_ids, dtype=np.intp)
        for rows, array in ((slice(0, B), k), (slice(B, 2 * B), v)):
            blocks[idx, :, rows] = array.reshape(len(idx), B, d.kv_heads,
                                                 d.head_dim).transpose(0, 2, 1, 3)


class StagingPool:
    """Reused (K, V) arrays of every layer that a load's retrieval assembles into (the
    ``into`` of :meth:`~kvcs.kvnet.consumer.KvConsumer.prefix_layers`) before they are
    written into the paged cache. New arrays for every load cost an allocation and the
    first touch of each page, about 7% of a decode worker's transfer thread (py-spy,
    1920-token loads, 2-core machine). Thread-safe; keeps at most :attr:`keep` idle sets
    (the largest: 2 x 42 MiB for 1920 tokens of SmolLM2-135M)."""

    def __init__(self, desc: CompatDescriptor, keep: int = 2) -> None:
        self.desc = desc
        self.keep = keep
        self._idle: list[list[tuple[np.ndarray, np.ndarray]]] = []
        self._lock = threading.Lock()

    @staticmethod
    def rows(arrays: list[tuple[np.ndarray, np.ndarray]]) -> int:
        return int(arrays[0][0].shape[0])

    def take(self, rows: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Arrays of every layer with at least ``rows`` tokens (an idle set, else new)."""
        with self._lock:
            fitting = [i for i, a in enumerate(self._idle) if self.rows(a) >= rows]
            if fitting:  # the smallest that fits (the list is kept largest first)
                return self._idle.pop(fitting[-1])
        d = self.desc  # written whole by the first load: faulted in at once
        return [(new_array((rows, *d.k_shape()[1:]), d.dtype),
                 new_array((rows, *d.v_shape()[1:]), d.dtype)) for _ in range(d.layers)]

    def give(self, arrays: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Hand a set back once nothing reads or writes it any more."""
        with self._lock:
            self._idle.append(arrays)
            self._idle.sort(key=self.rows, reverse=True)
            del self._idle[self.keep:]


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# --------------------------------------------------------------------------- events


class EventLog:
    """JSON lines of what the connector did per request (``events`` key): lookups, loads
    and publications, for tests and operators."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def write(self, kind: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": kind, "t": time.time(), **fields}, default=str)
        with self._lock, open(self.path, "a") as fh:
            fh.write(line + "\n")
