"""A prefill worker for the publisher-kill scenario, run in its own process so that it can
be SIGKILLed: ``python -m tests.faults.publisher_child PORT CAFILE SEED LAYERS [BLOCKS]``.

It publishes the first LAYERS layers of :func:`~tests.faults.workload.kv_cache` (SEED) to
the relay on 127.0.0.1:PORT and, given BLOCKS, the first BLOCKS blocks of the next layer
(K and V), waits until the relay has been sent all of it, prints ``published`` and waits
to be killed.
"""

from __future__ import annotations

import asyncio
import sys

from kvcs.endpoint import Endpoint
from kvcs.kv.codecs import encode_component_sections
from kvcs.kv.component import Component
from kvcs.kv.payload import build_payload
from kvcs.transport import QuicSettings

from .workload import BLOCK, kv_cache, publish

QUICK = QuicSettings.loopback(idle_timeout=1.5)
"""The relay notices the killed process after 1.5 s of silence (QUIC idle timeout, the
smaller of both ends' values)."""


async def main(port: int, cafile: str, seed: int, layers: int, blocks: int) -> None:
    ep = await Endpoint.connect(f"moqt://127.0.0.1:{port}/", cafile=cafile, settings=QUICK)
    data = kv_cache(seed)
    pub = await publish(ep, data[:layers], finish=False)
    if blocks:
        k, v = data[layers]
        for kind, name in ((Component.K, b"k.raw.s0"), (Component.V, b"v.raw.s0")):
            track = ep.tracks[(pub.fields, name)]
            sections = encode_component_sections(kind, "raw", k, v, BLOCK)
            for b, section in enumerate(sections[:blocks]):
                header, body = build_payload(kind, layers, b, b * BLOCK, BLOCK, "raw", section)
                ep.publish(track, layers, b, header + bytes(body))
    await ep.drain(0)
    print("published", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    port, cafile, seed, layers, *rest = sys.argv[1:]
    asyncio.run(main(int(port), cafile, int(seed), int(layers), int(rest[0]) if rest else 0))
