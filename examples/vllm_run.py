"""Running examples/vllm_worker.py processes from asyncio (the vLLM tests, the demo and the
bench share it): start one, wait for READY, send requests, read results."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "examples" / "vllm_worker.py"
# glibc's malloc keeps what a request freed for the next one: no memory returned to the
# kernel (trim) and no mapping of its own (mmap) for any size. With glibc's defaults a
# worker returned its prefill's large buffers to the kernel and faulted them in again on
# the next request: 0 to 215,000 page faults (up to 0.41 s of system time) per 2048-token
# prefill of SmolLM2-135M, varying by instance and by the allocator's history; with these
# settings about 0 and 0.03 s (two instances each, 10 alternating rounds at load 5-8:
# fastest 1.33 and 1.19 s without, 1.14 and 1.17 s with; docs/vllm.md, "The instance
# spread's cause"). vLLM's CPU platform would LD_PRELOAD a tcmalloc bundled under
# vllm/libs for the same reason, but this wheel ships none (and its preload of torch's
# libgomp is for its OpenMP thread binding, which in-process engines do not do). The
# caller's own GLIBC_TUNABLES come after these and win.
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"

ENV = {**os.environ, "PYTHONUNBUFFERED": "1",
       # the engine core in the worker's own process: one process per LLM, ~10 s less
       # start-up on 2 cores, and its logs in the worker's output
       "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING",
       "TOKENIZERS_PARALLELISM": "false",
       "GLIBC_TUNABLES": ":".join(filter(None, (MALLOC_TUNABLES,
                                                os.environ.get("GLIBC_TUNABLES"))))}


class Worker:
    """One vLLM worker process."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.name = name
        self.proc = proc
        self.log = log

    @classmethod
    async def start(cls, name: str, log_dir: Path, *args: str,
                    env: dict[str, str] | None = None) -> Worker:
        """Start ``examples/vllm_worker.py`` with ``args``; ``env`` overrides :data:`ENV`."""
        log = log_dir / f"{name}.log"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), *args, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=log.open("wb"), env={**ENV, **(env or {})},
            cwd=str(ROOT))
        return cls(name, proc, log)

    async def _line(self, prefix: str, timeout: float) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while raw := await self.proc.stdout.readline():
                line = raw.decode(errors="replace").rstrip()
                if line.startswith(prefix):
                    return line
        tail = self.log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{self.name} ended before {prefix!r}:\n{tail}")

    async def ready(self, timeout: float = 600) -> None:
        await self._line("READY", timeout)

    async def generate(self, tokens: list[int], max_tokens: int = 16,
                       cache_salt: str | None = None, timeout: float = 300,
                       stop_token_ids: list[int] | None = None) -> dict[str, Any]:
        assert self.proc.stdin is not None
        req = {"prompt_token_ids": tokens, "max_tokens": max_tokens, "cache_salt": cache_salt,
               "stop_token_ids": stop_token_ids or []}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        await self.proc.stdin.drain()
        line = await self._line("RESULT ", timeout)
        return json.loads(line.split(" ", 1)[1])  # type: ignore[no-any-return]

    async def close(self) -> None:
        if self.proc.returncode is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
