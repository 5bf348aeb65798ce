"""Prefill worker of the real-model demo: computes the KV cache of a shared system prompt
with SmolLM2-135M-Instruct and publishes each layer into the relay while the forward pass
runs, then keeps serving until stdin closes.

    python examples/hf_prefill_worker.py --relay moqt://127.0.0.1:4443/ --pin <SHA-256> \
        --system-prompt-file examples/hf_system_prompt.txt
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hf_model

from kvcs import Endpoint, PublisherOptions, QuicSettings, ScopeKey
from kvcs.integrations.hf import LayerwisePrefill


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--relay", required=True, help="moqt://host:port/ or https://host:port/")
    p.add_argument("--pin", help="relay certificate SHA-256 fingerprint")
    p.add_argument("--cafile", help="trust this certificate")
    p.add_argument("--system-prompt-file", required=True, type=Path)
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> int:
    """Publish the system prompt's cache, then serve until stdin closes."""
    model, tokenizer, desc = hf_model.load()
    ids = hf_model.chat_ids(tokenizer, args.system_prompt_file.read_text())
    # the session pings the relay while it waits (QuicSettings.keep_alive_s): a prefill
    # longer than the idle timeout, or a wait for decode workers, keeps the publication
    ep = await Endpoint.connect(args.relay, pin_sha256=args.pin, cafile=args.cafile,
                                settings=QuicSettings.loopback())
    prefill = LayerwisePrefill(model, ep, ScopeKey.from_bytes(hf_model.SCOPE_KEY), desc, ids,
                               options=PublisherOptions(retention_s=600))
    await prefill.start()
    result = await prefill.run()
    blocks = prefill.publisher.blocks()
    size = (2 * desc.layers * blocks * desc.block_tokens * desc.kv_heads * desc.head_dim
            * desc.dtype.itemsize)
    first = result.layer_published[(0, 0)] - result.forward_started
    print(f"published the system prompt: {len(ids)} tokens, {blocks} blocks x {desc.layers} "
          f"layers ({size / 2**20:.1f} MiB); forward pass {result.forward_s:.2f} s, layer 0 "
          f"published after {first:.2f} s", flush=True)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    ep.close()
    await ep.wait_closed()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(asyncio.run(main(parse_args())))
