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
ENV = {**os.environ, "PYTHONUNBUFFERED": "1",
       # the engine core in the worker's own process: one process per LLM, ~10 s less
       # start-up on 2 cores, and its logs in the worker's output
       "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING",
       "TOKENIZERS_PARALLELISM": "false"}


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
