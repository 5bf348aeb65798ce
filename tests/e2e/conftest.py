"""Fixtures for end-to-end KVCS tests: a small model, its prompt and cache, local relays."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kvcs.kv.ids import CompatDescriptor, ScopeKey
from kvcs.testing import LocalNet

LAYERS = 6
BLOCK = 4
BLOCKS = 16


def descriptor(model: str, layers: int, block: int) -> CompatDescriptor:
    """A tiny bfloat16 model's descriptor: 2 KV heads of 64."""
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": model, "revision": "0", "tokenizer": "t0", "layers": layers,
        "kv_heads": 2, "head_dim": 64, "dtype": "bfloat16", "block_tokens": block,
        "layout": "tnd", "rope": "post",
    })


DESC = descriptor("e2e-tiny", LAYERS, BLOCK)
SCOPE = ScopeKey.from_bytes(bytes(range(32)))
PROMPT = np.arange(1000, 1000 + BLOCK * BLOCKS, dtype=np.int64)


def cache(seed: int, tokens: int = BLOCK * BLOCKS) -> list[tuple[np.ndarray, np.ndarray]]:
    """Deterministic per-layer (K, V), [tokens, 2, 64] bfloat16."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(LAYERS):
        k = rng.standard_normal((tokens, 2, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
        v = rng.standard_normal((tokens, 2, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
        out.append((k, v))
    return out


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-exact equality of two bfloat16 arrays."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.fixture(scope="session")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("e2e-certs"))


@pytest.fixture(params=["inline", "worker"])
def hashing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """SHA-256 of the tiny test objects inline (as the tests' sizes make it) or, forced,
    in the worker thread (as a real model's layers are hashed)."""
    if request.param == "worker":
        monkeypatch.setattr("kvcs.kvnet.offload.INLINE_BYTES", 0)
    return str(request.param)


@pytest.fixture
async def net(cert_dir: Path) -> AsyncIterator[LocalNet]:
    async with LocalNet(cert_dir) as n:
        yield n
