"""The small float16 model and the scope that the container store and KVSP HTTP tests
use."""

from __future__ import annotations

from kvcs.kv.ids import CompatDescriptor, ScopeKey, scope_id

SCOPE = ScopeKey.from_bytes(bytes(range(32)))
SID = scope_id(SCOPE)


def tiny_descriptor(model: str, layers: int) -> CompatDescriptor:
    """A ``layers``-layer float16 model of 2 KV heads of 8, in 4-token blocks."""
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": model, "revision": "0", "tokenizer": "t0", "layers": layers,
        "kv_heads": 2, "head_dim": 8, "dtype": "float16", "block_tokens": 4,
        "layout": "tnd", "rope": "post",
    })
