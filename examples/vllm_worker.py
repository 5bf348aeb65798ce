"""A vLLM worker for the demo, the tests and the bench: one ``LLM`` (vLLM's CPU build) with
or without a KV connector, serving prompts given as JSON lines on stdin.

    python examples/vllm_worker.py --model DIR --role producer --relay moqt://127.0.0.1:4443/ \
        --pin <sha256> --scope-key scope.json

``--role``: ``producer``/``consumer``/``both`` (KvcsConnector as kv_producer, kv_consumer,
kv_both), ``none`` (no connector), ``example-save``/``example-load`` (vLLM's own
ExampleConnector on local disk, for the bench). It prints ``READY`` once the engine is up,
then for each request line ``{"prompt_token_ids": [...], "max_tokens": 16, "cache_salt":
null, "stop_token_ids": []}`` one line ``RESULT {"tokens": [...], "num_cached_tokens": n,
"seconds": s}`` (``seconds``: the wall time of ``LLM.generate``; with ``max_tokens`` 1 that is the
time to first token). An empty line or EOF ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a saved transformers model directory")
    p.add_argument("--role", default="none", choices=["producer", "consumer", "both", "none",
                                                       "example-save", "example-load"])
    p.add_argument("--relay", action="append", default=[], help="moqt://host:port/ (repeat "
                   "for failover)")
    p.add_argument("--pin", help="relay certificate SHA-256 fingerprint")
    p.add_argument("--cafile", help="trust this certificate")
    p.add_argument("--scope-key", help="a `kvcs keygen` scope file")
    p.add_argument("--recompute-budget-s", type=float, default=5.0)
    p.add_argument("--events", help="append the connector's events (JSON lines) here")
    p.add_argument("--example-dir", help="ExampleConnector storage directory")
    p.add_argument("--prefix-caching", action="store_true",
                   help="keep vLLM's own prefix cache (off: every hit is the connector's)")
    p.add_argument("--max-model-len", type=int, default=4608)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--kv-cache-mib", type=int, default=512,
                   help="KV cache size (CPU memory; vLLM reserves 92%% of RAM by default)")
    return p.parse_args(argv)


def transfer_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """The kv_transfer_config of ``--role``."""
    if args.role == "none":
        return None
    if args.role.startswith("example"):
        return {"kv_connector": "ExampleConnector",
                "kv_role": "kv_both" if args.role == "example-save" else "kv_consumer",
                "kv_connector_extra_config": {"shared_storage_path": args.example_dir}}
    extra: dict[str, Any] = {"relay": args.relay, "scope_key": args.scope_key,
                             "recompute_budget_s": args.recompute_budget_s}
    for key in ("pin", "cafile", "events"):
        if getattr(args, key):
            extra[key] = getattr(args, key)
    role = {"producer": "kv_producer", "consumer": "kv_consumer", "both": "kv_both"}[args.role]
    return {"kv_connector": "KvcsConnector", "kv_connector_module_path": "kvcs.integrations.vllm",
            "kv_role": role, "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": extra}


def main(args: argparse.Namespace) -> int:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    config = transfer_config(args)
    llm = LLM(model=args.model, skip_tokenizer_init=True, enforce_eager=True, dtype=args.dtype,
              max_model_len=args.max_model_len, enable_prefix_caching=args.prefix_caching,
              kv_cache_memory_bytes=args.kv_cache_mib << 20,
              kv_transfer_config=KVTransferConfig(**config) if config else None)
    print("READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        req = json.loads(line)
        prompt: dict[str, Any] = {"prompt_token_ids": req["prompt_token_ids"]}
        if req.get("cache_salt"):
            prompt["cache_salt"] = req["cache_salt"]
        # without a tokenizer vLLM knows no EOS: the caller names its stop tokens, or none
        stop = [int(t) for t in req.get("stop_token_ids") or []]
        params = SamplingParams(max_tokens=int(req.get("max_tokens", 16)), temperature=0.0,
                                detokenize=False, ignore_eos=not stop, stop_token_ids=stop)
        t0 = time.perf_counter()
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        seconds = time.perf_counter() - t0
        print("RESULT " + json.dumps({"tokens": list(out.outputs[0].token_ids),
                                      "num_cached_tokens": out.num_cached_tokens or 0,
                                      "seconds": seconds}), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    raise SystemExit(main(parse_args()))
