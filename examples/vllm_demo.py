"""vLLM with KvcsConnector: a relay, a vLLM prefill worker publishing SmolLM2-135M's KV cache
of a long system prompt, and a vLLM decode worker in another process reusing it.

1. converts the model once into ~/.cache/kvcs (examples/hf_model.py) and makes a scope
   file (what ``kvcs keygen`` writes: the scope key and a content key, so the relay only
   ever holds ciphertext),
2. starts ``kvcs relay`` on 127.0.0.1 (anonymous, self-signed certificate),
3. starts the prefill worker (``kv_role="kv_producer"``) and the decode worker
   (``kv_role="kv_consumer"``), each an ``LLM`` of vLLM's CPU build in its own process,
4. the prefill worker computes the system prompt; its connector publishes each layer into
   the relay while the next one is computed, and returns once the relay holds them,
5. the decode worker answers a question after the system prompt twice: with its own prefill
   (a ``cache_salt`` nothing was published under: the connector's one lookup misses) and
   reusing the published prefix; it prints both times to first token and whether the
   generated tokens are identical.

Run it with ``make demo-vllm``; exit status 0 means PASS.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hf_model  # noqa: E402
from vllm_run import ENV, Worker  # noqa: E402

QUESTION = "What is the phone number of the help line?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system-prompt-file", type=Path, default=HERE / "hf_system_prompt.txt")
    p.add_argument("--question", default=QUESTION)
    p.add_argument("--max-new-tokens", type=int, default=32)
    return p.parse_args(argv)


def say(name: str, line: str) -> None:
    print(f"[{name:>7}] {line}", flush=True)


async def start_relay(cert_dir: Path) -> tuple[asyncio.subprocess.Process, int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvcs", "relay", "--anonymous", "--listen", "127.0.0.1:0",
        "--quic-preset", "loopback", "--cert-dir", str(cert_dir), "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=ENV)
    assert proc.stdout is not None
    port = pin = None
    async with asyncio.timeout(60):
        while port is None or pin is None:
            line = (await proc.stdout.readline()).decode().rstrip()
            if not line:
                raise RuntimeError("the relay ended")
            say("relay", line)
            if m := re.search(r"listening on 127\.0\.0\.1:(\d+) ", line):
                port = int(m.group(1))
            if "fingerprint" in line:
                pin = line.rsplit(" ", 1)[1]
    return proc, port, pin


async def main(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from kvcs.kv.scopefile import ScopeFile

    model = hf_model.prepare()
    tokenizer = AutoTokenizer.from_pretrained(model)
    system = args.system_prompt_file.read_text()
    prefix = hf_model.chat_ids(tokenizer, system)
    full = hf_model.chat_ids(tokenizer, system, args.question)
    work = Path(tempfile.mkdtemp(prefix="kvcs-vllm-demo-"))
    (work / "scope.json").write_bytes(ScopeFile.new().to_json())
    relay, port, pin = await start_relay(work / "certs")
    # float32, the converted model's own dtype (as make demo): bfloat16 rounds the prefix's
    # K/V differently in a 1288-token pass and a 1307-token one, which changed a token
    common = ["--model", str(model), "--relay", f"moqt://127.0.0.1:{port}/", "--pin", pin,
              "--scope-key", str(work / "scope.json"), "--dtype", "float32"]
    say("demo", "starting the prefill and decode workers (vLLM CPU, 25-50 s each) ...")
    prefill = await Worker.start("prefill", work, *common, "--role", "producer")
    decode = await Worker.start("decode", work, *common, "--role", "consumer")
    ok = False
    try:
        await asyncio.gather(prefill.ready(), decode.ready())
        r = await prefill.generate(prefix, max_tokens=1)
        say("prefill", f"published the system prompt: {len(prefix)} tokens "
                       f"({len(prefix) // 128} blocks of 128) in {r['seconds']:.2f} s; "
                       "the relay holds it")
        own_ttft = await decode.generate(full, max_tokens=1, cache_salt="nothing-published")
        hit_ttft = await decode.generate(full, max_tokens=1)
        stop = [tokenizer.eos_token_id]
        own = await decode.generate(full, max_tokens=args.max_new_tokens,
                                    cache_salt="nothing-published", stop_token_ids=stop)
        hit = await decode.generate(full, max_tokens=args.max_new_tokens, stop_token_ids=stop)
        answer = tokenizer.decode(hit["tokens"], skip_special_tokens=True).strip()
        identical = own["tokens"] == hit["tokens"]
        speedup = own_ttft["seconds"] / hit_ttft["seconds"]
        say("decode", f"question: {args.question}")
        say("decode", f"answer:   {answer}")
        say("decode", f"reused {hit_ttft['num_cached_tokens']} of {len(full)} prompt tokens")
        say("decode", f"TTFT without reuse {own_ttft['seconds']:.2f} s, with reuse "
                      f"{hit_ttft['seconds']:.2f} s ({speedup:.1f}x)")
        say("decode", f"identical to the tokens generated after its own prefill: {identical}")
        ok = identical and hit_ttft["num_cached_tokens"] > 0 and own["num_cached_tokens"] == 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"demo-vllm: FAIL - {exc}", flush=True)
        return 1
    finally:
        await asyncio.gather(prefill.close(), decode.close())
        relay.terminate()
        await relay.wait()
    print("demo-vllm: " + ("PASS - the decode worker reused the published prefix and generated "
                           "exactly the tokens of its own prefill" if ok else "FAIL"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(parse_args())))
