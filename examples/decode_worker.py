"""Example decode worker: finds the KV cache of its prompt through the relay, receives it
layer by layer (layer 0 can be used while later layers still arrive), verifies every
object and checks the tensors against the demo model.

    python examples/decode_worker.py --relay moqt://127.0.0.1:4443/ --pin <SHA-256>
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo_model

from kvcs import Endpoint, KvConsumer, QuicSettings, RecomputeRequired


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults match the prefill worker)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--relay", required=True)
    p.add_argument("--pin")
    p.add_argument("--cafile")
    p.add_argument("--name", default="decode")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--extra-tokens", type=int, default=40,
                   help="tokens this request adds after the shared prompt")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--discover-timeout", type=float, default=10.0)
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> int:
    """Retrieve and check the demo cache; returns the exit status."""
    name = args.name
    desc = demo_model.descriptor(layers=args.layers)
    shared = demo_model.prompt(args.tokens, args.seed)
    extra = np.arange(args.extra_tokens, dtype=np.int64) + 7
    tokens = np.concatenate([shared, extra])  # our prompt extends the published one
    ep = await Endpoint.connect(args.relay, pin_sha256=args.pin, cafile=args.cafile,
                                settings=QuicSettings.loopback())
    consumer = KvConsumer(ep, demo_model.scope(), desc, tokens)
    deadline = time.monotonic() + args.discover_timeout
    pub = await consumer.discover()
    while pub is None and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        pub = await consumer.discover()
    if pub is None:
        print(f"{name}: no publication found", flush=True)
        return 1
    manifest = await consumer.manifest(pub)
    live = not manifest.segments[0].complete
    print(f"{name}: found publication {pub.namespace.publication_id.hex()[:12]} covering "
          f"{pub.prefix_blocks}/{len(consumer.keys)} blocks "
          f"({'live, still being produced' if live else 'completed'})", flush=True)
    t0 = time.perf_counter()
    n_rows = pub.prefix_blocks * desc.block_tokens
    try:
        async for layer in consumer.layers(pub, manifest=manifest):
            k, v = demo_model.layer_kv(desc, layer.index, args.tokens, args.seed)
            ok = (np.array_equal(layer.k.view(np.uint16), k[:n_rows].view(np.uint16))
                  and np.array_equal(layer.v.view(np.uint16), v[:n_rows].view(np.uint16)))
            print(f"{name}: layer {layer.index} verified at {time.perf_counter() - t0:.3f} s "
                  f"({'equal to the published tensors' if ok else 'MISMATCH'})", flush=True)
            if not ok:
                return 2
    except RecomputeRequired as exc:
        print(f"{name}: must recompute {exc.missing}", flush=True)
        return 3
    st = consumer.stats
    total = time.perf_counter() - t0
    print(f"{name}: {desc.layers} layers, {st.bytes / 2**20:.1f} MiB verified in {total:.3f} s;"
          f" first layer after {st.first_layer_at - st.started_at:.3f} s; "
          f"{st.rejected} rejected, {st.retries} retries; the last "
          f"{len(tokens) - n_rows} tokens are computed locally", flush=True)
    ep.close()
    await ep.wait_closed()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(asyncio.run(main(parse_args())))
