"""The decode worker process of tests/integrations/test_hf_processes.py.

For each dtype it restores the published prefix of PROMPT + QUESTION from the relay (all
of it, then only the first REUSED_PARTIAL tokens) and generates NEW_TOKENS greedily; it
writes tokens, logits and counts to ``--out``. It starts before the prefill and polls
discovery until the publication appears (a live one is restored while it is produced).
It uses one torch thread, like the test's prefill: float32 results are bit-identical only
with equal thread counts on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import torch

from kvcs.endpoint import Endpoint
from kvcs.integrations.hf import CacheRestore, cache_kwargs
from kvcs.integrations.hf_testing import random_llama, random_llama_descriptor
from kvcs.kv.ids import ScopeKey
from kvcs.kvnet.consumer import KvConsumer
from kvcs.transport import QuicSettings

SCOPE = ScopeKey.from_bytes(bytes(range(32)))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PROMPT_TOKENS = 512  # 32 blocks of 16
QUESTION_TOKENS = 20
NEW_TOKENS = 8
REUSED_PARTIAL = 256  # prefix reuse: 16 blocks restored, the rest computed


def prompt_and_question() -> tuple[torch.Tensor, torch.Tensor]:
    """The shared prompt [1, 512] and the decode worker's question [1, 20]."""
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, 512, (1, PROMPT_TOKENS), generator=g),
            torch.randint(0, 512, (1, QUESTION_TOKENS), generator=g))


def greedy(model: torch.nn.Module, ids: torch.Tensor, **kwargs: object
           ) -> tuple[np.ndarray, np.ndarray]:
    """NEW_TOKENS greedy tokens and their logits [steps, vocab] as float32 numpy."""
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,  # type: ignore[operator]
                         output_logits=True, return_dict_in_generate=True, **kwargs)
    logits = torch.cat(out.logits).float().numpy()
    return out.sequences[0, ids.shape[1]:].numpy(), logits


async def decode(args: argparse.Namespace) -> None:
    """Restore and generate for every dtype; write the results."""
    ep = await Endpoint.connect(args.relay, cafile=args.cafile, settings=QuicSettings.loopback())
    prompt, question = prompt_and_question()
    full = torch.cat([prompt, question], 1)
    results: dict[str, np.ndarray] = {}
    for name, dtype in DTYPES.items():
        model = random_llama(0, dtype)
        desc = random_llama_descriptor(model)
        for label, limit in (("full", None), ("partial", REUSED_PARTIAL)):
            consumer = KvConsumer(ep, SCOPE, desc, full[0].numpy(), discovery_timeout=0.2)
            restore = CacheRestore(model, consumer, full, max_tokens=limit)
            deadline = time.monotonic() + 60
            while not (reused := await restore.find()):
                assert time.monotonic() < deadline, "nothing published for the prompt"
                await asyncio.sleep(0.05)
            assert restore.cache is not None
            gen = asyncio.create_task(asyncio.to_thread(
                greedy, model, full, **cache_kwargs(model, restore.cache)))
            await restore.fill()
            tokens, logits = await gen
            results[f"{name}_{label}_tokens"] = tokens
            results[f"{name}_{label}_logits"] = logits
            results[f"{name}_{label}_reused"] = np.array(reused)
            results[f"{name}_{label}_rejected"] = np.array(consumer.stats.rejected)
    np.savez(args.out, **results)  # type: ignore[arg-type]
    ep.close()
    await ep.wait_closed()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--relay", required=True)
    p.add_argument("--cafile", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    asyncio.run(decode(args))


if __name__ == "__main__":
    main()
