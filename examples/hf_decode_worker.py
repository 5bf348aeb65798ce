"""Decode worker of the real-model demo: answers one question after the shared system
prompt. It restores the published cache of the prompt's prefix through the relay, then
generates; it also computes that prefix itself and checks that the text is identical.

    python examples/hf_decode_worker.py --relay moqt://127.0.0.1:4443/ --pin <SHA-256> \
        --system-prompt-file examples/hf_system_prompt.txt --question "..."

The last line of its output is ``RESULT {json}`` (question, text_reused, text_local,
identical, reused_tokens, prompt_tokens, restore_s, discover_s, prefill_s, speedup).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hf_model
import torch

from kvcs import Endpoint, KvConsumer, QuicSettings, RecomputeRequired, ScopeKey
from kvcs.integrations.hf import CacheRestore, cache_kwargs, output_cache


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--relay", required=True)
    p.add_argument("--pin")
    p.add_argument("--cafile")
    p.add_argument("--system-prompt-file", required=True, type=Path)
    p.add_argument("--question", required=True)
    p.add_argument("--max-new-tokens", type=int, default=48)
    return p.parse_args(argv)


def generate(model: Any, ids: list[int], cache: Any, max_new_tokens: int) -> list[int]:
    """Greedy continuation of ``ids`` whose prefix is in ``cache`` (which it extends)."""
    prompt = torch.tensor([ids])
    out = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False,
                         **cache_kwargs(model, cache))
    return [int(x) for x in out[0, len(ids):]]


def own_prefill(model: Any, ids: list[int]) -> Any:
    """The worker's own prefill of ``ids``: the cache it would use without kvcs."""
    with torch.no_grad():
        return output_cache(model(torch.tensor([ids]), use_cache=True, logits_to_keep=1))


async def main(args: argparse.Namespace) -> int:
    """Restore, generate, compare; prints the result line."""
    model, tokenizer, desc = hf_model.load()
    ids = hf_model.chat_ids(tokenizer, args.system_prompt_file.read_text(), args.question)
    ep = await Endpoint.connect(args.relay, pin_sha256=args.pin, cafile=args.cafile,
                                settings=QuicSettings.loopback())
    # a loopback relay answers a namespace probe within milliseconds; each prefix longer
    # than the published one costs one probe of this timeout
    consumer = KvConsumer(ep, ScopeKey.from_bytes(hf_model.SCOPE_KEY), desc, ids,
                          discovery_timeout=0.05)
    restore = CacheRestore(model, consumer, ids)
    t0 = time.perf_counter()
    reused = await restore.find()
    if not reused or restore.times.found is None:
        print("no published prefix found", flush=True)
        return 1
    try:
        cache = await restore.fill()
    except RecomputeRequired as exc:
        print(f"the published cache could not be retrieved: {exc}", flush=True)
        return 1
    restore_s = time.perf_counter() - t0
    discover_s = restore.times.found - t0
    reused_tokens = await asyncio.to_thread(generate, model, ids, cache, args.max_new_tokens)

    t0 = time.perf_counter()
    local = await asyncio.to_thread(own_prefill, model, ids[:reused])
    prefill_s = time.perf_counter() - t0
    local_tokens = await asyncio.to_thread(generate, model, ids, local, args.max_new_tokens)

    text_reused = tokenizer.decode(reused_tokens, skip_special_tokens=True)
    text_local = tokenizer.decode(local_tokens, skip_special_tokens=True)
    result = {
        "question": args.question, "text_reused": text_reused, "text_local": text_local,
        "identical": reused_tokens == local_tokens, "reused_tokens": reused,
        "prompt_tokens": len(ids), "restore_s": round(restore_s, 3),
        "discover_s": round(discover_s, 3), "prefill_s": round(prefill_s, 3),
        "speedup": round(prefill_s / restore_s, 1),
    }
    print(f"question: {args.question}", flush=True)
    print(f"answer:   {text_reused.strip()}", flush=True)
    print(f"reused {reused} of {len(ids)} prompt tokens: restored in {restore_s:.2f} s "
          f"(discovery {discover_s:.2f} s) vs {prefill_s:.2f} s for its own prefill of the "
          f"same prefix ({result['speedup']}x)", flush=True)
    print(f"identical to the text generated after its own prefill: {result['identical']}",
          flush=True)
    print("RESULT " + json.dumps(result), flush=True)
    ep.close()
    await ep.wait_closed()
    return 0 if result["identical"] else 2


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(asyncio.run(main(parse_args())))
