"""The main job: a local relay, a prefill worker and two decode workers, end to end.

1. starts ``kvcs relay`` on 127.0.0.1 (anonymous, self-signed certificate, loopback QUIC),
2. starts the prefill worker, which computes a synthetic 32-layer KV cache layer by layer
   and publishes it into the relay as it goes,
3. starts a decode worker while the cache is still being produced (live: it gets layer 0
   before the prefill has finished) and another one after the cache is complete (served
   from the relay's cache),
4. checks that both received exactly the published tensors, then shuts everything down.

Run it with ``make demo``. Exit status 0 means every check passed.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


async def _pump(name: str, proc: asyncio.subprocess.Process, lines: list[str],
                seen: asyncio.Event | None = None, pattern: str | None = None) -> None:
    assert proc.stdout is not None
    while raw := await proc.stdout.readline():
        line = raw.decode(errors="replace").rstrip()
        lines.append(line)
        print(f"[{name:>11}] {line}", flush=True)
        if seen is not None and pattern is not None and re.search(pattern, line):
            seen.set()


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        PY, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=ENV, cwd=str(HERE.parent))


async def main() -> int:
    """Run the demo; returns the exit status."""
    relay = await _spawn("-m", "kvcs", "relay", "--anonymous", "--listen", "127.0.0.1:0",
                         "--quic-preset", "loopback", "--log-level", "warning")
    relay_lines: list[str] = []
    ready = asyncio.Event()
    relay_task = asyncio.create_task(_pump("relay", relay, relay_lines, ready, "fingerprint"))
    try:
        await asyncio.wait_for(ready.wait(), 30)
    except TimeoutError:
        print("demo: the relay did not start", flush=True)
        relay.kill()
        return 1
    port = next(re.search(r":(\d+) ", x).group(1) for x in relay_lines  # type: ignore[union-attr]
                if "listening on" in x)
    pin = next(x.rsplit(" ", 1)[1] for x in relay_lines if "fingerprint" in x)
    url = f"moqt://127.0.0.1:{port}/"
    common = ["--relay", url, "--pin", pin]

    prefill = await _spawn(str(HERE / "prefill_worker.py"), *common)
    p_lines: list[str] = []
    third = asyncio.Event()
    p_task = asyncio.create_task(_pump("prefill", prefill, p_lines, third, r"layer 3 published"))
    await asyncio.wait_for(third.wait(), 60)

    live = await _spawn(str(HERE / "decode_worker.py"), *common, "--name", "decode-live")
    live_lines: list[str] = []
    live_task = asyncio.create_task(_pump("decode-live", live, live_lines))

    while not any("complete" in x for x in p_lines):
        if prefill.returncode is not None:
            break
        await asyncio.sleep(0.05)
    late = await _spawn(str(HERE / "decode_worker.py"), *common, "--name", "decode-late")
    late_lines: list[str] = []
    late_task = asyncio.create_task(_pump("decode-late", late, late_lines))

    rc_live = await asyncio.wait_for(live.wait(), 120)
    rc_late = await asyncio.wait_for(late.wait(), 120)
    await asyncio.gather(live_task, late_task)
    if prefill.stdin is not None:
        prefill.stdin.close()
    rc_prefill = await asyncio.wait_for(prefill.wait(), 30)
    await p_task
    relay.terminate()
    await asyncio.wait_for(relay.wait(), 30)
    await relay_task

    ok = rc_live == 0 and rc_late == 0 and rc_prefill == 0
    print("", flush=True)
    print(f"demo: prefill exit {rc_prefill}, decode-live exit {rc_live}, "
          f"decode-late exit {rc_late}", flush=True)
    overlap = any("live, still being produced" in x for x in live_lines)
    print(f"demo: decode-live joined while the cache was still being produced: {overlap}",
          flush=True)
    print("demo: " + ("PASS - both decode workers hold exactly the published KV cache"
                      if ok else "FAIL"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
