"""``make bench BENCH=tree``: a tree of relays as one cache (issue #25).

Each relay is a ``kvcs relay`` process of its own (its metrics scraped over HTTP); the
publisher and the consumers run in this process and verify every object.

* ``tree_link_copies``: a root and three edges; a publication made at the root is taken
  by 8 consumers at once spread over the edges (3, 3, 2): payload bytes the root sent
  toward the edges / (edges with consumers x publication bytes). 1.0 = each link carried
  the cache once (target <= 1.05).
* ``tree_ttfl_ratio``: a live publication at the root; one consumer at the root (one hop
  from the publisher) and one at an edge (two hops), both subscribed before the first
  layer is produced: time to the first verified layer, two hops / one hop (median of 3,
  target <= 1.5).
* ``store_restart_s``: a relay with ``--store`` holding a 128 MiB publication (handed
  over, the publisher gone) is stopped, then started again on the same directory with no
  upstream: seconds from launching the process to a consumer's first verified layer
  (``store_restart_listening_s``: the part after the relay printed that it listens).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from kvcs.endpoint import Endpoint
from kvcs.kv.ids import CompatDescriptor, ScopeKey
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import KvPublisher, PublisherOptions
from kvcs.testing import stop_process
from kvcs.transport import QuicSettings, ensure_dev_certificate

SCOPE = ScopeKey.from_bytes(bytes(range(32)))
LAYERS = 32
SETTINGS = QuicSettings.loopback()


def _desc() -> CompatDescriptor:
    return CompatDescriptor.from_dict({
        "kvsp": 1, "model": "bench-tree", "revision": "0", "tokenizer": "t", "layers": LAYERS,
        "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "block_tokens": 16,
        "layout": "tnd", "rope": "post"})


def _layer(i: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    k = rng.standard_normal((tokens, 8, 128), dtype=np.float32).astype(ml_dtypes.bfloat16)
    return k, (-k.astype(np.float32)).astype(ml_dtypes.bfloat16)


def _prompt(tokens: int, salt: int) -> np.ndarray:
    return np.arange(tokens, dtype=np.int64) + 1000 * salt + 7


@dataclass
class RelayProc:
    proc: subprocess.Popen[str]
    url: str
    metrics: str
    started: float
    listening: float

    def scrape(self, name: str) -> float:
        """The value of an unlabelled metric."""
        with urllib.request.urlopen(self.metrics, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return 0.0


@contextlib.contextmanager
def _relay(cert_dir: str, *args: str) -> Iterator[RelayProc]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcs", "relay", "--anonymous", "--listen", "127.0.0.1:0",
         "--quic-preset", "loopback", "--cert-dir", cert_dir, "--metrics", "127.0.0.1:0",
         "--log-level", "warning", *args],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert proc.stdout is not None
        url = metrics = ""
        listening = 0.0
        while not metrics:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"relay did not start (exit code {proc.wait(10)})")
            if "listening on" in line:
                listening = time.perf_counter()
                url = "moqt://" + line.split("listening on ")[1].split()[0] + "/"
            elif line.startswith("metrics on"):
                metrics = line.split()[-1]
        yield RelayProc(proc, url, metrics, started, listening)
    finally:
        stop_process(proc, 30)


async def _client(url: str, cafile: str) -> Endpoint:
    return await Endpoint.connect(url, cafile=cafile, settings=SETTINGS)


async def _first_layer(c: KvConsumer, at: dict[str, float], key: str) -> int:
    found = await c.discover()
    assert found is not None, "publication not found"
    n = 0
    async for _ in c.layers(found):
        at.setdefault(key, time.perf_counter())
        n += 1
    assert n == LAYERS
    return c.stats.bytes


async def _publish(cert: str, relay: RelayProc, tokens: int, salt: int,
                   hand_over_s: float) -> tuple[Endpoint, np.ndarray]:
    """Publish every layer of a ``tokens``-token prompt through ``relay``: the publisher's
    endpoint (still open) and the prompt."""
    prompt = _prompt(tokens, salt)
    ep = await _client(relay.url, cert)
    pub = KvPublisher(ep, SCOPE, _desc(), prompt, PublisherOptions(hand_over_s=hand_over_s))
    for i in range(LAYERS):
        await pub.put_layer(i, *_layer(i, tokens))
    await pub.finish()
    return ep, prompt


# --------------------------------------------------------------------------- link copies

async def _link_copies(cert: str, root: RelayProc, edges: list[RelayProc]) -> float:
    # 256 tokens, 32 MiB: the ratio does not depend on the size, the run time does
    pub_ep, prompt = await _publish(cert, root, 256, 1, hand_over_s=120)
    pub_bytes = sum(t.bytes for t in pub_ep.tracks.values())
    out_before = await asyncio.to_thread(root.scrape, "kvcs_relay_bytes_out_total")
    spread = [edges[0]] * 3 + [edges[1]] * 3 + [edges[2]] * 2
    eps = [await _client(e.url, cert) for e in spread]
    at: dict[str, float] = {}
    await asyncio.gather(*[_first_layer(KvConsumer(ep, SCOPE, _desc(), prompt), at, str(i))
                           for i, ep in enumerate(eps)])
    out = await asyncio.to_thread(root.scrape, "kvcs_relay_bytes_out_total") - out_before
    for ep in (pub_ep, *eps):
        ep.close()
    ratio = out / (len(edges) * pub_bytes)
    print(f"  link copies: root sent {out / 2**20:.1f} MiB toward 3 edges for a "
          f"{pub_bytes / 2**20:.1f} MiB publication and 8 consumers: {ratio:.3f}")
    return ratio


# --------------------------------------------------------------------------- ttfl ratio

async def _ttfl_once(cert: str, root: RelayProc, edge: RelayProc, run: int) -> float:
    tokens = 1024
    prompt = _prompt(tokens, 10 + run)
    pub_ep = await _client(root.url, cert)
    pub = KvPublisher(pub_ep, SCOPE, _desc(), prompt)
    await pub.start()
    layers = [_layer(i, tokens) for i in range(LAYERS)]
    near = KvConsumer(await _client(root.url, cert), SCOPE, _desc(), prompt)
    far = KvConsumer(await _client(edge.url, cert), SCOPE, _desc(), prompt)
    at: dict[str, float] = {}
    tasks = [asyncio.ensure_future(_first_layer(c, at, k))
             for c, k in ((near, "one"), (far, "two"))]
    await asyncio.sleep(0.5)  # both have discovered it and subscribed
    t0 = time.perf_counter()
    for i, (k, v) in enumerate(layers):
        await pub.put_layer(i, k, v)
    await pub.finish()
    await asyncio.gather(*tasks)
    pub_ep.close()
    one, two = at["one"] - t0, at["two"] - t0
    print(f"  first verified layer: one hop {one * 1000:.0f} ms, two hops {two * 1000:.0f} ms")
    return two / one


# --------------------------------------------------------------------------- store restart

async def _fill_store(cert: str, relay: RelayProc) -> int:
    # 1024 tokens: 32 layers x 4 MiB = 128 MiB
    ep, _ = await _publish(cert, relay, 1024, 99, hand_over_s=300)
    ep.close()
    return sum(t.bytes for t in ep.tracks.values())


async def _restarted(cert: str, relay: RelayProc) -> float:
    c = KvConsumer(await _client(relay.url, cert), SCOPE, _desc(), _prompt(1024, 99))
    at: dict[str, float] = {}
    found = await c.discover()
    assert found is not None, "stored publication not found"
    async for _ in c.layers(found):
        at.setdefault("first", time.perf_counter())
    return at["first"]


def main() -> dict[str, Any]:
    """Print and return the tree figures."""
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cert = str(ensure_dev_certificate(tmp).certfile)
        with contextlib.ExitStack() as stack:
            root = stack.enter_context(_relay(tmp))
            up = ["--upstream", root.url, "--upstream-cafile", cert]
            edges = [stack.enter_context(_relay(tmp, *up)) for _ in range(3)]
            res["tree_link_copies"] = round(asyncio.run(_link_copies(cert, root, edges)), 3)
            ratios = [asyncio.run(_ttfl_once(cert, root, edges[0], run)) for run in range(3)]
            res["tree_ttfl_ratio"] = round(statistics.median(ratios), 2)
            res["tree_ttfl_ratio_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
        store = os.path.join(tmp, "store")
        with _relay(tmp, "--store", store) as relay:
            size = asyncio.run(_fill_store(cert, relay))
        with _relay(tmp, "--store", store) as relay:
            first = asyncio.run(_restarted(cert, relay))
            res["store_restart_s"] = round(first - relay.started, 2)
            res["store_restart_listening_s"] = round(first - relay.listening, 2)
    print(f"tree bench: link copies {res['tree_link_copies']:.3f} (target <= 1.05), "
          f"first layer two hops / one hop {res['tree_ttfl_ratio']:.2f} (target <= 1.5), "
          f"restart with a {size / 2**20:.0f} MiB publication on disk to its first "
          f"verified layer {res['store_restart_s']:.2f} s "
          f"({res['store_restart_listening_s']:.2f} s after listening)")
    return res


if __name__ == "__main__":
    main()
