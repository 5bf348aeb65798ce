"""Discovery of a prompt's longest published prefix through a relay on loopback (issue
#26: a miss used to cost one 0.1 s probe per 16-token block, 26-27 s for 4096 tokens).

Run ``make bench BENCH=discovery``. A kvcs relay process holds one publication of a
4096-token prompt (256 blocks); this process asks it about that prompt (a hit: the lookup
and the manifest read) and about another 4096-token prompt (a miss: the lookup). Reports
the median of several lookups of each (targets <= 50 ms), and how many discovery
requests each sent.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from bench._relays import relay_process
from kvcs.endpoint import Endpoint
from kvcs.kv.ids import CompatDescriptor
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher
from kvcs.transport import QuicSettings, ensure_dev_certificate

TOKENS = 4096
LAYERS = 2
SCOPE = bytes(range(32))
RUNS = 9
SETTINGS = QuicSettings.loopback()


def _desc() -> CompatDescriptor:
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": "bench-discovery", "revision": "0", "tokenizer": "t",
        "layers": LAYERS, "kv_heads": 1, "head_dim": 8, "dtype": "float16",
        "block_tokens": 16, "layout": "tnd", "rope": "post"})


async def _measure(url: str, cafile: str) -> dict[str, Any]:
    desc = _desc()
    published = np.arange(TOKENS, dtype=np.int64) + 7
    other = np.arange(TOKENS, dtype=np.int64) + 900_000
    pub_ep = await Endpoint.connect(url, cafile=cafile, settings=SETTINGS)
    con_ep = await Endpoint.connect(url, cafile=cafile, settings=SETTINGS)
    try:
        pub = KvPublisher(pub_ep, SCOPE, desc, published)
        await pub.start()
        shape = (TOKENS, 1, 8)
        for layer in range(LAYERS):
            k = np.full(shape, layer, np.float16)
            await pub.put_layer(layer, k, -k)
        await pub.finish()
        times: dict[str, list[float]] = {"hit": [], "miss": []}
        requests: dict[str, int] = {}
        for run in range(RUNS + 1):  # the first round warms up
            for kind, tokens in (("hit", published), ("miss", other)):
                consumer = KvConsumer(con_ep, SCOPE, desc, tokens, recompute_budget_s=5.0)
                t0 = time.perf_counter()
                found = await consumer.discover()
                took = time.perf_counter() - t0
                assert (found is not None) == (kind == "hit"), kind
                if run:
                    times[kind].append(took * 1000)
                requests[kind] = consumer.stats.discovery_requests
    finally:
        for ep in (pub_ep, con_ep):
            ep.close()
            await ep.wait_closed()
    return {
        "miss_latency_ms": round(statistics.median(times["miss"]), 2),
        "hit_discovery_ms": round(statistics.median(times["hit"]), 2),
        "miss_latency_range_ms": [round(min(times["miss"]), 2), round(max(times["miss"]), 2)],
        "hit_discovery_range_ms": [round(min(times["hit"]), 2), round(max(times["hit"]), 2)],
        "discovery_prompt_tokens": TOKENS,
        "miss_discovery_requests": requests["miss"],
        "hit_discovery_requests": requests["hit"],
    }


def main() -> dict[str, Any]:
    """Print and return the discovery figures."""
    with tempfile.TemporaryDirectory() as tmp:
        cert = ensure_dev_certificate(tmp)
        with relay_process("kvcs", tmp) as relay:
            res = asyncio.run(_measure(relay.url, str(cert.certfile)))
    print(f"discovery of a {TOKENS}-token prompt through a kvcs relay on loopback (median "
          f"of {RUNS}): miss {res['miss_latency_ms']:.1f} ms "
          f"[{res['miss_latency_range_ms'][0]:.1f}-{res['miss_latency_range_ms'][1]:.1f}], "
          f"{res['miss_discovery_requests']} request(s); hit {res['hit_discovery_ms']:.1f} ms "
          f"[{res['hit_discovery_range_ms'][0]:.1f}-{res['hit_discovery_range_ms'][1]:.1f}] "
          f"(lookup + manifest read), {res['hit_discovery_requests']} request(s); targets "
          "<= 50 ms")
    return res


if __name__ == "__main__":
    main()
