"""Prefill in the test process, decode in another process, through a relay on 127.0.0.1:
the decode worker's logits and tokens are bit-identical to the producer continuing itself
(float32 and bfloat16); reusing only part of the prefix keeps the tokens, and the logits
within PARTIAL_ATOL."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the hf extra is not installed (pip install '.[hf]')")

from kvcs.integrations.hf import LayerwisePrefill, cache_kwargs
from kvcs.integrations.hf_testing import random_llama, random_llama_descriptor
from kvcs.testing import LocalNet
from kvcs.transport import DevCertificate

from .hf_worker import DTYPES, PROMPT_TOKENS, REUSED_PARTIAL, SCOPE, greedy, prompt_and_question

WORKER = Path(__file__).with_name("hf_worker.py")
PARTIAL_ATOL = {"float32": 1e-4, "bfloat16": 0.1}
"""Largest logit difference allowed when 256 prompt tokens are computed in the decode
worker's pass instead of the producer's (matmuls of other shapes may round differently;
measured 0 with one thread on both sides)."""


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch on ``n`` threads (the decode worker's count) inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


async def test_decode_in_another_process_is_bit_identical(cert: DevCertificate,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "decode.npz"
    ref: dict[str, np.ndarray] = {}
    prompt, question = prompt_and_question()
    async with LocalNet(cert) as net:
        relay = await net.relay()
        # the decoder starts first (its imports overlap the prefill) and polls discovery
        decoder = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), "--relay", f"moqt://127.0.0.1:{relay.port}/",
            "--cafile", str(cert.certfile), "--out", str(out))
        try:
            ep = await net.client(relay)
            with torch_threads(1):
                for name, dtype in DTYPES.items():
                    model = random_llama(0, dtype)
                    desc = random_llama_descriptor(model)
                    result = await LayerwisePrefill(model, ep, SCOPE, desc, prompt).run()
                    ref[f"{name}_tokens"], ref[f"{name}_logits"] = await asyncio.to_thread(
                        greedy, model, torch.cat([prompt, question], 1),
                        **cache_kwargs(model, result.cache))
            assert await asyncio.wait_for(decoder.wait(), 90) == 0
        finally:
            if decoder.returncode is None:
                decoder.kill()
                await decoder.wait()
    got = np.load(out)
    for dtype in DTYPES:
        assert got[f"{dtype}_full_reused"] == PROMPT_TOKENS
        assert got[f"{dtype}_full_rejected"] == 0
        assert np.array_equal(got[f"{dtype}_full_tokens"], ref[f"{dtype}_tokens"])
        assert np.array_equal(got[f"{dtype}_full_logits"].view(np.uint32),
                              ref[f"{dtype}_logits"].view(np.uint32)), dtype
        assert got[f"{dtype}_partial_reused"] == REUSED_PARTIAL
        assert np.array_equal(got[f"{dtype}_partial_tokens"], ref[f"{dtype}_tokens"])
        diff = np.abs(got[f"{dtype}_partial_logits"] - ref[f"{dtype}_logits"]).max()
        assert diff <= PARTIAL_ATOL[dtype], (dtype, diff)
