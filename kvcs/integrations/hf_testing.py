"""Seeded random transformers models for tests and benchmarks of kvcs.integrations.hf.

They run offline (no hub). An initializer range of 0.08 (transformers' default is 0.02)
makes greedy output depend on the context, so a wrong cache changes the tokens.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ..kv.ids import CompatDescriptor
from .hf import descriptor_for

__all__ = ["BENCH_MODEL", "TEST_MODEL", "random_llama", "random_llama_descriptor"]

TEST_MODEL = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128,
              "vocab": 512}
"""Small enough that a 512-token forward pass takes a few tens of ms on one core."""

BENCH_MODEL = {"layers": 16, "hidden": 512, "heads": 8, "kv_heads": 2, "intermediate": 1408,
               "vocab": 4096}
"""Bigger for the 2048-token benchmark: 16 layers of 8 heads of 64, 2 KV heads (GQA)."""


def random_llama(seed: int = 0, dtype: torch.dtype = torch.float32, *, layers: int = 4,
                 hidden: int = 64, heads: int = 4, kv_heads: int = 2, intermediate: int = 128,
                 vocab: int = 512, max_positions: int = 4096) -> LlamaForCausalLM:
    """A LlamaForCausalLM with seeded random weights, in eval mode and ``dtype``."""
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                         initializer_range=0.08)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(gen_state)
    # nn.Module.to converts in place; transformers' wrapper of .to is mistyped for mypy
    torch.nn.Module.to(model, dtype=dtype)
    model.eval()
    return model


def random_llama_descriptor(model: LlamaForCausalLM, seed: int = 0,
                            block_tokens: int = 16) -> CompatDescriptor:
    """The descriptor of :func:`random_llama` (its seed is the revision)."""
    c = model.config
    return descriptor_for(model, model_id=f"kvcs-test/random-llama-{c.num_hidden_layers}x"
                          f"{c.hidden_size}", revision=f"seed-{seed}", block_tokens=block_tokens)
