"""The synthetic model shared by the example workers: a Compatibility Descriptor, a
deterministic prompt, and deterministic K/V tensors per layer (so the decode worker can
check that what it received equals what the prefill worker published)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kvcs import CompatDescriptor, ScopeKey

DEMO_SCOPE_KEY = bytes(range(32))
"""The demo's scope key. Real deployments distribute a random 32-byte key out of band."""


def descriptor(layers: int = 32, kv_heads: int = 8, head_dim: int = 128,
               block_tokens: int = 16) -> CompatDescriptor:
    """Descriptor of the synthetic model (bfloat16 KV, 32 KiB per K or V block object)."""
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": "kvcs-demo-synthetic", "revision": "0", "tokenizer": "demo-0",
        "layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": "bfloat16",
        "block_tokens": block_tokens, "layout": "tnd", "rope": "post",
    })


def prompt(n_tokens: int, seed: int = 7) -> np.ndarray:
    """A deterministic prompt of token IDs."""
    return np.random.default_rng(seed).integers(0, 32000, n_tokens, dtype=np.int64)


def layer_kv(desc: CompatDescriptor, layer: int, n_tokens: int,
             seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """K and V of one layer: [n_tokens, kv_heads, head_dim] in bfloat16."""
    rng = np.random.default_rng((seed, layer))
    shape = (n_tokens, desc.kv_heads, desc.head_dim)
    k = rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.bfloat16)
    return k, v


def scope() -> ScopeKey:
    """The demo scope key."""
    return ScopeKey.from_bytes(DEMO_SCOPE_KEY)
