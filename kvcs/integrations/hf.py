"""Hugging Face transformers: publish a model's KV cache during prefill, restore it in decode.

Install with ``pip install 'kvcs[hf]'`` (``torch==2.13.0``, ``transformers>=5,<6``). Only
decoder-only models whose cache is a plain :class:`~transformers.DynamicCache` of full
attention layers are supported (Llama, Qwen2, SmolLM2 ...; no sliding windows).

Prefill worker: the forward pass runs in a worker thread; as each layer stores its K/V in
the cache, the integration copies that layer's rows and hands them to the
:class:`~kvcs.kvnet.publisher.KvPublisher` on the event loop, which publishes them while
the next layers are still being computed::

    desc = descriptor_for(model, model_id="org/model", revision="abc123")
    prefill = LayerwisePrefill(model, endpoint, scope, desc, input_ids)
    await prefill.start()                 # consumers can discover the publication now
    result = await prefill.run()          # result.cache, result.logits, timestamps

Decode worker: find the longest published prefix of the prompt, then fill a cache whose
layers a forward pass (in a worker thread) may use as soon as each one has arrived::

    restore = CacheRestore(model, KvConsumer(endpoint, scope, desc, input_ids), input_ids)
    if await restore.find():             # restore.reused_tokens of the prompt are published
        gen = asyncio.to_thread(model.generate, ids,
                                **cache_kwargs(model, restore.cache), ...)
        await restore.fill()             # layer i lands while layer i-1 is computed
        out = await gen

At least one prompt token is always left uncached (``generate`` gives wrong tokens when the
cache already covers the whole prompt). Objects are verified by the consumer before they
reach the cache; if the restore fails (:class:`~kvcs.kvnet.consumer.RecomputeRequired`),
a forward pass waiting on a missing layer raises :class:`RestoreFailed` and nothing
unverified was used: recompute the prompt.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ..errors import KvcsError
from ..kv.ids import CompatDescriptor, ScopeKey
from ..kv.manifest import Manifest, Segment, segment_covers
from ..kv.model_id import identity_of_directory, weights_revision
from ..kvnet.consumer import KvConsumer, KvLayer, Publication
from ..kvnet.publisher import KvPublisher, PublisherOptions, PublishTarget

__all__ = [
    "CacheRestore",
    "LayerwisePrefill",
    "PrefillResult",
    "RestoreFailed",
    "StreamedCache",
    "cache_argument",
    "cache_kwargs",
    "check_model",
    "descriptor_for",
    "descriptor_for_directory",
    "output_cache",
    "restore_cache",
    "weights_revision",
]

_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


class RestoreFailed(KvcsError, RuntimeError):
    """A forward pass needed a layer that the restore could not deliver (the cause is
    chained: usually :class:`~kvcs.kvnet.consumer.RecomputeRequired`)."""


# --------------------------------------------------------------------------- descriptor


def _geometry(model: PreTrainedModel) -> dict[str, Any]:
    """Layers, KV heads, head dim, dtype and RoPE placement of a model's KV cache."""
    cfg = model.config.get_text_config(decoder=True)
    heads = int(cfg.num_attention_heads)
    dtype = _DTYPE_NAMES.get(model.dtype)
    if dtype is None:
        raise ValueError(f"model dtype {model.dtype} has no KVSP element type "
                         f"(supported: {', '.join(_DTYPE_NAMES.values())})")
    probe = DynamicCache(config=model.config)
    if not probe.layers or any(type(x) is not DynamicLayer for x in probe.layers):
        kinds = sorted({type(x).__name__ for x in probe.layers}) or ["none"]
        raise ValueError(f"{cfg.model_type}: only full-attention DynamicCache layers are "
                         f"supported, this model's cache has {', '.join(kinds)}")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_theta", None)
    return {
        "layers": int(cfg.num_hidden_layers),
        "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        "dtype": dtype,
        # transformers applies rotary embeddings to K before it stores K in the cache
        "rope": "post" if rope else "none",
    }


def _json_safe(value: Any) -> Any:
    """A config value in descriptor form: floats become strings (descriptors forbid floats)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float):
        return repr(value)
    return value


def descriptor_for(model: PreTrainedModel, *, model_id: str, revision: str,
                   tokenizer: str | None = None, block_tokens: int = 16,
                   config_id: str | None = None) -> CompatDescriptor:
    """The KVSP Compatibility Descriptor of a model's KV cache.

    ``model_id`` and ``revision`` name the weights (a hub id and commit, or a file and its
    hash): two workers share caches only when they agree on both. ``tokenizer`` defaults to
    ``model_id``. ``extra`` records what else changes the numbers: the model type, its
    RoPE parameters, the attention implementation and ``config_id`` (the config's hash,
    :func:`kvcs.kv.model_id.config_identity`) when given. Raises ValueError for a model whose
    cache this integration cannot carry (sliding windows, unsupported dtype).
    """
    cfg = model.config.get_text_config(decoder=True)
    extra = {
        "runtime": "transformers",
        "model_type": str(cfg.model_type),
        "attention": str(getattr(model.config, "_attn_implementation", None) or "default"),
    }
    rope = getattr(cfg, "rope_parameters", None)
    if rope:
        extra["rope_parameters"] = _json_safe(dict(rope))
    if config_id is not None:
        extra["config"] = config_id
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": model_id, "revision": revision,
        "tokenizer": tokenizer or model_id, "block_tokens": block_tokens, "layout": "tnd",
        **_geometry(model), "extra": extra,
    })


def descriptor_for_directory(directory: str | Path, *, model_id: str | None = None,
                             revision: str | None = None, tokenizer: str | None = None,
                             block_tokens: int = 16) -> CompatDescriptor:
    """The descriptor of a local transformers model directory (``config.json`` and
    weights), without loading the weights: the model is built on the meta device from its
    config and dtype. ``model``, ``revision`` and ``tokenizer`` come from the model, never
    from the path (:func:`kvcs.kv.model_id.identity_of_directory`: hub ID or architecture,
    SHA-256 of the weights, SHA-256 of the tokenizer files), so the same model gives the
    same Compatibility ID from a relative and an absolute path, on any machine."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(directory)
    ident = identity_of_directory(path, model_id=model_id, revision=revision,
                                  tokenizer=tokenizer)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    return descriptor_for(model, model_id=ident.model, revision=ident.revision,
                          tokenizer=ident.tokenizer, block_tokens=block_tokens,
                          config_id=ident.config)


def check_model(model: PreTrainedModel, descriptor: CompatDescriptor) -> None:
    """Raise ValueError unless the model's cache has the descriptor's shape and dtype."""
    geo = _geometry(model)
    want = {k: descriptor.members[k] for k in geo}
    if geo != want:
        diff = ", ".join(f"{k} {geo[k]} (descriptor: {want[k]})" for k in geo
                         if geo[k] != want[k])
        raise ValueError(f"the model does not match the descriptor: {diff}")
    if descriptor.v_head_dim != descriptor.head_dim:
        raise ValueError("descriptors with a v_head_dim are not supported")


# --------------------------------------------------------------------------- arguments


def cache_argument(model: PreTrainedModel) -> str:
    """The keyword under which ``model.forward``/``generate`` take a cache: ``cache``
    (transformers >= 5.x) or the older ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: PreTrainedModel, cache: DynamicCache) -> dict[str, Any]:
    """``{name: cache}`` for ``model(...)`` or ``model.generate(...)``."""
    return {cache_argument(model): cache}


def output_cache(outputs: Any) -> DynamicCache:
    """The cache of a forward pass's outputs (``outputs.cache`` or ``past_key_values``)."""
    for name in ("cache", "past_key_values"):
        value = outputs.get(name) if hasattr(outputs, "get") else getattr(outputs, name, None)
        if value is not None:
            return value  # type: ignore[no-any-return]
    raise ValueError("the outputs carry no cache (was use_cache=False?)")


# --------------------------------------------------------------------------- tensors


def _to_tnd(states: torch.Tensor, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a cache tensor [1, heads, tokens, dim] as numpy [tokens,
    heads, dim] (a copy; bfloat16 bit-exact through int16)."""
    t = states[0, :, start:stop, :].transpose(0, 1).contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _tnd_view(states: torch.Tensor) -> np.ndarray:
    """A CPU cache tensor [1, heads, tokens, dim] as a writeable numpy [tokens, heads, dim]
    view (strided; bfloat16 through int16): what the consumer assembles a layer into."""
    t = states[0]
    if t.dtype == torch.bfloat16:
        array = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        array = t.numpy()
    return array.transpose(1, 0, 2)


def _from_tnd(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """numpy [tokens, heads, dim] -> cache tensor [1, heads, tokens, dim] (shares memory
    on CPU; the cache copies it)."""
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        t = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(array)
    return t.transpose(0, 1).unsqueeze(0).to(device)


def _token_list(input_ids: Any) -> list[int]:
    """A prompt given as a list, a 1-D array or a [1, tokens] tensor, as a list of ints."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(f"batch size {input_ids.shape[0]}: only one prompt at a time")
            input_ids = input_ids[0]
        return [int(x) for x in input_ids.tolist()]
    return [int(x) for x in np.asarray(input_ids).reshape(-1)]


def _device(model: PreTrainedModel) -> torch.device:
    return next(model.parameters()).device


# --------------------------------------------------------------------------- prefill


class _PublishingCache(DynamicCache):
    """A DynamicCache that reports each layer's update (in the forward pass's thread)."""

    def __init__(self, model: PreTrainedModel,
                 on_layer: Callable[[int, torch.Tensor, torch.Tensor], None]) -> None:
        super().__init__(config=model.config)
        self.on_layer: Callable[[int, torch.Tensor, torch.Tensor], None] | None = on_layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        if self.on_layer is not None:
            self.on_layer(layer_idx, keys, values)
        return keys, values


@dataclass(frozen=True)
class _Pass:
    """One forward pass of a (chunked) prefill: tokens ``start:stop``, published as
    ``segment`` covering blocks ``first_block:end_block`` (None: no complete new block)."""

    start: int
    stop: int
    segment: int | None
    first_block: int
    end_block: int


@dataclass
class PrefillResult:
    """What :meth:`LayerwisePrefill.run` computed and when (``time.perf_counter`` values,
    comparable across processes on Linux)."""

    cache: DynamicCache
    """The model's cache after the prefill, ready for ``generate`` (it mutates it)."""
    logits: torch.Tensor
    """Logits of the last prompt position, [1, vocab]."""
    forward_started: float
    forward_finished: float
    layer_produced: dict[tuple[int, int], float] = field(default_factory=dict)
    """(segment, layer) -> when the forward pass stored that layer's K/V."""
    layer_published: dict[tuple[int, int], float] = field(default_factory=dict)
    """(segment, layer) -> when ``put_layer`` had handed its objects to the transport."""
    segments: int = 0

    @property
    def forward_s(self) -> float:
        """Duration of the forward pass(es)."""
        return self.forward_finished - self.forward_started


class LayerwisePrefill:
    """Runs a model's prefill off the event loop and publishes each layer's K/V as the
    forward pass produces it.

    ``chunk_tokens`` (a multiple of the descriptor's ``block_tokens``) splits the prompt
    into passes of that many tokens; each pass is published as its own segment (the KVCS
    rule for chunked prefill), the first one anchoring the publication. A last pass that
    completes no new block is computed but not published. The publisher
    (``self.publisher``) is created here; the forward passes never wait for the network.
    """

    def __init__(self, model: PreTrainedModel, target: PublishTarget, scope: ScopeKey,
                 descriptor: CompatDescriptor, input_ids: Any, *,
                 chunk_tokens: int | None = None,
                 options: PublisherOptions | None = None) -> None:
        check_model(model, descriptor)
        self.model = model
        self.descriptor = descriptor
        self.tokens = _token_list(input_ids)
        B = descriptor.block_tokens
        n = len(self.tokens)
        if not n:
            raise ValueError("the prompt is empty")
        if chunk_tokens is not None and (chunk_tokens <= 0 or chunk_tokens % B):
            raise ValueError(f"chunk_tokens must be a positive multiple of block_tokens ({B})")
        step = chunk_tokens or n
        self.passes: list[_Pass] = []
        segment = 0
        for start in range(0, n, step):
            stop = min(start + step, n)
            first, end = start // B, stop // B
            self.passes.append(_Pass(start, stop, segment if end > first else None, first, end))
            segment += end > first
        self.publisher = KvPublisher(target, scope, descriptor,
                                     self.tokens[:self.passes[0].stop], options)

    async def start(self) -> None:
        """Announce the publication (consumers can discover it and subscribe from now)."""
        await self.publisher.start()

    async def run(self) -> PrefillResult:
        """Compute the prefill, publishing every layer of every pass; returns once the
        forward passes are done and every layer is published (the publication is then
        finished: its manifest marks it complete). Raises the publisher's error, if any,
        after the forward passes."""
        await self.start()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, int, np.ndarray, np.ndarray] | None] = asyncio.Queue()
        produced: dict[tuple[int, int], float] = {}
        published: dict[tuple[int, int], float] = {}
        current: list[_Pass] = []
        B = self.descriptor.block_tokens

        def on_layer(layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
            p = current[-1]
            if p.segment is None:
                return
            rows = (p.first_block * B, p.end_block * B)
            item = (p.segment, layer, _to_tnd(keys, *rows), _to_tnd(values, *rows))
            produced[(p.segment, layer)] = time.perf_counter()
            loop.call_soon_threadsafe(queue.put_nowait, item)

        async def publish_all() -> None:
            while (item := await queue.get()) is not None:
                segment, layer, k, v = item
                await self.publisher.put_layer(layer, k, v, segment=segment)
                published[(segment, layer)] = time.perf_counter()

        cache = _PublishingCache(self.model, on_layer)
        arg = cache_argument(self.model)
        keep = ({"logits_to_keep": 1}
                if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {})
        device = _device(self.model)

        def forward(p: _Pass) -> tuple[torch.Tensor, float, float]:
            # timed in this thread: the event loop may resume the caller later
            t0 = time.perf_counter()
            ids = torch.tensor([self.tokens[p.start:p.stop]], dtype=torch.long, device=device)
            with torch.no_grad():  # grad mode is per thread
                out = self.model(input_ids=ids, use_cache=True, **{arg: cache}, **keep)
            return out.logits[:, -1, :], t0, time.perf_counter()

        publishing = asyncio.create_task(publish_all())
        started = finished = 0.0
        logits: torch.Tensor | None = None
        try:
            for i, p in enumerate(self.passes):
                if p.segment is not None and p.segment > 0:
                    self.publisher.add_segment(self.tokens[self.passes[i - 1].stop:p.stop])
                current.append(p)
                logits, t0, finished = await asyncio.to_thread(forward, p)
                started = started or t0
                if publishing.done():  # the publisher failed: stop computing for it
                    break
            queue.put_nowait(None)
            await publishing
        finally:
            cache.on_layer = None
            if not publishing.done():
                publishing.cancel()
        await self.publisher.finish()
        assert logits is not None
        return PrefillResult(cache, logits, started, finished, produced, published,
                             sum(p.segment is not None for p in self.passes))


# --------------------------------------------------------------------------- restore


class StreamedCache(DynamicCache):
    """A DynamicCache whose layers arrive while a forward pass already uses it.

    :meth:`place` (event loop) stores a verified layer; the forward pass (in another
    thread) waits in each layer's cache access until that layer is there. Once every layer
    is placed it behaves as a plain DynamicCache. A forward pass on the thread that must
    place the layers would wait forever: it raises RuntimeError instead.
    """

    def __init__(self, model: PreTrainedModel, timeout: float = 120.0) -> None:
        super().__init__(config=model.config)
        self.timeout = timeout
        self._arrived = [threading.Event() for _ in self.layers]
        self._placed = [False] * len(self.layers)
        self._error: BaseException | None = None
        self._placing_thread = threading.get_ident()

    @property
    def complete(self) -> bool:
        """Every layer is placed."""
        return all(self._placed)

    @property
    def placed_layers(self) -> list[int]:
        """Indexes of the layers placed so far."""
        return [i for i, placed in enumerate(self._placed) if placed]

    def place(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store layer ``layer``'s K and V ([1, heads, tokens, dim], kept as they are: no
        copy) and release waiters."""
        if self._placed[layer]:
            raise ValueError(f"layer {layer} is already placed")
        target = self.layers[layer]
        assert isinstance(target, DynamicLayer)  # checked by check_model
        target.lazy_initialization(k, v)
        target.keys, target.values = k, v  # what update() would hold, without its copy
        self._placed[layer] = True
        self._arrived[layer].set()

    def fail(self, error: BaseException) -> None:
        """Layers not placed yet will never be: wake every waiter with RestoreFailed."""
        self._error = error
        for event in self._arrived:
            event.set()

    def _wait(self, layer: int) -> None:
        if not 0 <= layer < len(self._placed) or self._placed[layer]:
            return
        if self._error is None and threading.get_ident() == self._placing_thread:
            raise RuntimeError("this thread places the layers: run the forward pass in a "
                               "worker thread (asyncio.to_thread) or await fill() first")
        if not self._arrived[layer].wait(self.timeout):
            raise RestoreFailed(f"layer {layer} did not arrive within {self.timeout} s")
        if not self._placed[layer]:
            raise RestoreFailed(f"layer {layer} could not be restored") from self._error

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self._wait(layer_idx)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        self._wait(layer_idx)
        return super().get_seq_length(layer_idx)

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        self._wait(layer_idx)
        return super().get_mask_sizes(query_length, layer_idx)


@dataclass
class RestoreTimes:
    """When the phases of a restore ended (``time.perf_counter``)."""

    started: float = 0.0
    found: float | None = None
    first_layer: float | None = None
    filled: float | None = None


class CacheRestore:
    """Restores the longest published prefix of a prompt into a :class:`StreamedCache`.

    :meth:`find` discovers the publication and picks the segments that cover the prompt
    (segment 0 and every following segment whose Block Keys match; at least one prompt
    token is left to compute, and at most ``max_tokens`` are restored); :meth:`fill`
    retrieves their layers (all segments at once, each layer verified by the consumer) and
    places layer i as soon as every segment's layer i is there, so a forward pass in
    another thread can start on layer 0 while later layers arrive. On CPU the consumer
    assembles every segment straight into the cache's tensors (``KvConsumer.layers(...,
    into=...)``): no layer is copied or joined on its way into the cache.
    """

    def __init__(self, model: PreTrainedModel, consumer: KvConsumer, input_ids: Any,
                 *, max_tokens: int | None = None, timeout: float = 120.0) -> None:
        check_model(model, consumer.descriptor)
        self.model = model
        self.consumer = consumer
        self.tokens = _token_list(input_ids)
        B = consumer.descriptor.block_tokens
        if len(consumer.keys) != len(self.tokens) // B:
            raise ValueError("the consumer was made for a different prompt")
        self.timeout = timeout
        self.max_tokens = len(self.tokens) - 1 if max_tokens is None else max_tokens
        self.publication: Publication | None = None
        self.manifest: Manifest | None = None
        self.segments: list[tuple[Segment, int]] = []
        """(segment, blocks used) in order."""
        self.reused_tokens = 0
        self.cache: StreamedCache | None = None
        self.times = RestoreTimes()
        self._parts: dict[int, dict[int, KvLayer]] = {}
        self._tensors: list[tuple[torch.Tensor, torch.Tensor]] = []
        """On CPU, the cache tensors the consumer assembles each layer into."""

    async def find(self, publication: Publication | None = None) -> int:
        """Find the publication (or use ``publication``) and prepare :attr:`cache`;
        returns the number of prompt tokens it will restore (0: nothing usable)."""
        self.times.started = time.perf_counter()
        c = self.consumer
        B = c.descriptor.block_tokens
        pub = publication or await c.discover()
        if pub is None:
            return 0
        m = c.manifests.get(pub.fields) or await c.manifest(pub)
        usable: list[Segment] = []
        covered = 0
        for seg in sorted(m.segments, key=lambda s: s.segment):
            if seg.segment != len(usable) or seg.first_block != covered:
                break
            if seg.segment > 0 and not segment_covers(seg, c.keys):
                break  # this prompt diverges inside the segment (or ends before its end)
            usable.append(seg)
            covered += seg.blocks
        reused = min(covered * B, len(self.tokens) - 1, self.max_tokens)
        needed = math.ceil(reused / B)
        self.segments = [(s, min(s.blocks, needed - s.first_block))
                         for s in usable if needed > s.first_block]
        if reused <= 0 or not self.segments:
            return 0
        self.publication, self.manifest, self.reused_tokens = pub, m, reused
        self.cache = StreamedCache(self.model, self.timeout)
        self.times.found = time.perf_counter()
        return reused

    async def fill(self) -> StreamedCache:
        """Retrieve and place every layer; returns the complete cache. Raises
        :class:`~kvcs.kvnet.consumer.RecomputeRequired` (and fails the cache, so that a
        waiting forward pass raises :class:`RestoreFailed`) when layers stay missing."""
        cache, pub = self.cache, self.publication
        if cache is None or pub is None:
            raise RuntimeError("fill() needs a successful find()")
        device = _device(self.model)
        d = self.consumer.descriptor
        B = d.block_tokens
        if device.type == "cpu":
            # the layers are assembled straight into the cache's tensors (no copy of each
            # layer into the cache, nor a join of the segments)
            rows = sum(n for _, n in self.segments) * B
            dtype = next(t for t, name in _DTYPE_NAMES.items() if name == d.dtype_name)
            self._tensors = [
                (torch.empty((1, d.kv_heads, rows, d.head_dim), dtype=dtype),
                 torch.empty((1, d.kv_heads, rows, d.v_head_dim), dtype=dtype))
                for _ in range(d.layers)]
        arrays = [(_tnd_view(k), _tnd_view(v)) for k, v in self._tensors]

        async def pull(seg: Segment, blocks: int) -> None:
            row = seg.first_block * B
            into = [(k[row:], v[row:]) for k, v in arrays] if arrays else None
            async for layer in self.consumer.layers(pub, blocks=blocks, segment=seg.segment,
                                                    manifest=self.manifest, into=into):
                parts = self._parts.setdefault(layer.index, {})
                parts[seg.segment] = layer
                if len(parts) == len(self.segments):
                    self._place(cache, self._parts.pop(layer.index), device)

        tasks = [asyncio.create_task(pull(s, n)) for s, n in self.segments]
        try:
            await asyncio.gather(*tasks)
        except BaseException as exc:
            for t in tasks:
                t.cancel()
            cache.fail(exc)
            raise
        if not cache.complete:  # every layer yielded, so this is a bug, not bad input
            raise RuntimeError("restore finished with layers missing")
        self.times.filled = time.perf_counter()
        return cache

    def _place(self, cache: StreamedCache, parts: dict[int, KvLayer],
               device: torch.device) -> None:
        ordered = [parts[s.segment] for s, _ in self.segments]
        index = ordered[0].index
        n = self.reused_tokens
        if self._tensors:  # assembled in place
            k_t, v_t = self._tensors[index]
            cache.place(index, k_t[:, :, :n], v_t[:, :, :n])
        else:
            k = np.concatenate([x.k for x in ordered]) if len(ordered) > 1 else ordered[0].k
            v = np.concatenate([x.v for x in ordered]) if len(ordered) > 1 else ordered[0].v
            cache.place(index, _from_tnd(k[:n], device), _from_tnd(v[:n], device))
        if self.times.first_layer is None:
            self.times.first_layer = time.perf_counter()

    @property
    def restore_s(self) -> float | None:
        """From :meth:`find` to the last layer placed."""
        if self.times.filled is None:
            return None
        return self.times.filled - self.times.started


async def restore_cache(model: PreTrainedModel, consumer: KvConsumer,
                        input_ids: Sequence[int] | Any) -> CacheRestore | None:
    """Find and fully restore the published prefix of ``input_ids``; None if nothing is
    published for it. Raises RecomputeRequired when it cannot be retrieved and verified."""
    restore = CacheRestore(model, consumer, input_ids)
    if not await restore.find():
        return None
    await restore.fill()
    return restore
