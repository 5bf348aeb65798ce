"""Example prefill worker: computes a (synthetic) KV cache layer by layer and publishes it
into a relay as it goes, like a real prefill engine would after each layer's forward pass.

    python examples/prefill_worker.py --relay moqt://127.0.0.1:4443/ --pin <SHA-256>
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo_model

from kvcs import Endpoint, KvPublisher, PublisherOptions, QuicSettings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults run the demo model)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--relay", required=True, help="moqt://host:port/ or https://host:port/")
    p.add_argument("--pin", help="relay certificate SHA-256 fingerprint")
    p.add_argument("--cafile", help="trust this certificate")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--tokens", type=int, default=1024, help="prompt length")
    p.add_argument("--pace-ms", type=float, default=40.0,
                   help="compute time per layer (the prefill's forward pass)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--linger", type=float, default=None,
                   help="seconds to keep serving after the last layer (default: until stdin "
                        "closes or the process is stopped)")
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> int:
    """Publish the demo cache; returns the exit status."""
    desc = demo_model.descriptor(layers=args.layers)
    tokens = demo_model.prompt(args.tokens, args.seed)
    ep = await Endpoint.connect(args.relay, pin_sha256=args.pin, cafile=args.cafile,
                                settings=QuicSettings.loopback())
    pub = KvPublisher(ep, demo_model.scope(), desc, tokens, PublisherOptions(retention_s=600))
    await pub.start()
    print(f"prefill: publication {pub.publication_id.hex()[:12]} "
          f"({pub.blocks()} blocks x {desc.layers} layers)", flush=True)
    t0 = time.perf_counter()
    for layer in range(desc.layers):
        k, v = demo_model.layer_kv(desc, layer, len(tokens), args.seed)
        await asyncio.sleep(args.pace_ms / 1000)  # the forward pass of this layer
        await pub.put_layer(layer, k, v)
        print(f"prefill: layer {layer} published at {time.perf_counter() - t0:.3f} s",
              flush=True)
    await pub.finish()
    print(f"prefill: complete in {time.perf_counter() - t0:.3f} s", flush=True)
    if args.linger is not None:
        await asyncio.sleep(args.linger)
    else:  # serve until the orchestrator closes our stdin
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    ep.close()
    await ep.wait_closed()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(asyncio.run(main(parse_args())))
