"""vLLM (CPU build) with KvcsConnector: a producer process publishes prompts' KV caches
into a relay on 127.0.0.1, a consumer process in another vLLM reuses them through a second,
rewriting relay chained below it. One producer and one consumer LLM serve every scenario
(each LLM start costs 25-50 s on 2 cores):

* a hit generates exactly the greedy tokens of the consumer's own prefill (the same prompt
  with another ``cache_salt``, which must not hit), and ``num_cached_tokens`` is the
  published prefix;
* a tampered object and a withheld layer each end in exactly those blocks reported for
  recompute, and identical tokens;
* a miss costs one lookup and no load;
* a second hit of a publication reuses its checked manifest;
* both sides of a forward pass that shares its cores with the transfer thread (vLLM's engine
  in the worker's process: whole loads first, written by the forward pass; layers sent
  after the forward pass) and of one vLLM binds to its own cores (its engine in a
  subprocess, a ``kv_both`` worker: layers used as they arrive, and sent while the next
  one computes), the paths of a GPU host.

Skipped only when vLLM is not installed (``make test`` installs it: the Makefile's vllm stamp).
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'kvcs[vllm]'; make "
                    "test installs it)")

from e2e.test_tampering import RewritingRelay

from kvcs.kv.scopefile import ScopeFile
from kvcs.moqt.track import Track
from kvcs.moqt.wire import ObjectRecord
from kvcs.testing import LocalNet
from kvcs.transport import DevCertificate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import hf_model
from vllm_run import Worker, read_events

BLOCK = 128  # vLLM's CPU block size (one KVCS block)
PUBLISHED_BLOCKS = 3
TAMPERED = (2, 1)  # (layer, block) flipped in the second publication
WITHHELD_LAYER = 4  # dropped from the third publication
pytestmark = pytest.mark.timeout(1800)


class EvilRelay(RewritingRelay):
    """Flips one object of one publication and drops one layer of another (by
    Publication ID, the namespace's last field)."""

    tamper: bytes = b""
    withhold: bytes = b""

    def rewrite(self, track: Track, record: ObjectRecord) -> bool:
        pub = bytes(track.namespace[-1]) if track.namespace else b""
        if not track.name.startswith((b"k.", b"v.")):
            return True
        if pub == self.withhold and record.group_id == WITHHELD_LAYER:
            return False
        if (pub == self.tamper and track.name.startswith(b"k.")
                and (record.group_id, record.object_id) == TAMPERED):
            bad = bytearray(record.payload)
            bad[-1] ^= 0x40
            record.payload = memoryview(bytes(bad))
        return True


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


async def scenarios(cert: DevCertificate, tmp: Path) -> dict[str, Any]:
    model = hf_model.prepare()
    scope = tmp / "scope.json"
    scope.write_bytes(ScopeFile.new().to_json())
    out: dict[str, Any] = {}
    async with LocalNet(cert) as net:
        origin = await net.relay()
        evil = await net.relay(EvilRelay, upstream=origin)
        assert isinstance(evil, EvilRelay)
        common = ["--model", str(model), "--cafile", str(cert.certfile), "--scope-key",
                  str(scope), "--dtype", "float32", "--recompute-budget-s", "6"]
        producer = await Worker.start(
            "producer", tmp, *common, "--role", "producer", "--events", str(tmp / "p.jsonl"),
            "--relay", f"moqt://127.0.0.1:{origin.port}/")
        consumer = await Worker.start(
            "consumer", tmp, *common, "--role", "consumer", "--events", str(tmp / "c.jsonl"),
            "--relay", f"moqt://127.0.0.1:{evil.port}/")
        # vLLM binds the OpenMP threads of an engine in its own process to their cores
        bound = await Worker.start(
            "bound", tmp, *common, "--role", "both", "--events", str(tmp / "b.jsonl"),
            "--relay", f"moqt://127.0.0.1:{origin.port}/",
            env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
        try:
            await asyncio.gather(producer.ready(), consumer.ready(), bound.ready())
            prompts = [prompt(i, PUBLISHED_BLOCKS * BLOCK + 10) for i in range(3)]
            exact = prompt(3, PUBLISHED_BLOCKS * BLOCK)  # its last block holds its last token
            for p in [*prompts, exact]:  # each returns once the relay holds the publication
                await producer.generate(p, max_tokens=1)
            published = [e for e in read_events(tmp / "p.jsonl") if e["event"] == "publish"]
            failed = [e for e in published if "error" in e]
            assert not failed, (f"the producer could not publish: {failed}\n"
                                + (tmp / "producer.log").read_text(errors="replace")[-4000:])
            out["published"] = published
            evil.tamper = bytes.fromhex(published[1]["publication"])
            evil.withhold = bytes.fromhex(published[2]["publication"])
            for name, p in zip(("clean", "tampered", "withheld"), prompts, strict=True):
                full = p + prompt(100, 30)
                out[name + "_own"] = await consumer.generate(full, cache_salt="another-tenant")
                out[name] = await consumer.generate(full)
            out["exact_own"] = await consumer.generate(exact, cache_salt="another-tenant")
            out["exact"] = await consumer.generate(exact)
            out["miss"] = await consumer.generate(prompt(200, PUBLISHED_BLOCKS * BLOCK + 40))
            # the clean publication again: its manifest is known, its objects are verified
            out["clean_again"] = await consumer.generate(prompts[0] + prompt(100, 30))
            out["events"] = read_events(tmp / "c.jsonl")
            # bound cores: a hit of the clean publication, and a publication of its own
            # (under a salt nothing else uses) that the consumer then reuses
            full = prompts[0] + prompt(100, 30)
            out["bound_hit_own"] = await bound.generate(full, cache_salt="bound-own")
            out["bound_hit"] = await bound.generate(full)
            fresh = prompt(300, PUBLISHED_BLOCKS * BLOCK + 10)
            await bound.generate(fresh, cache_salt="bound")
            out["bound_reused_own"] = await consumer.generate(fresh, cache_salt="another-tenant")
            out["bound_reused"] = await consumer.generate(fresh, cache_salt="bound")
        finally:
            await asyncio.gather(producer.close(), consumer.close(), bound.close())
    out["events_all"] = read_events(tmp / "c.jsonl")
    out["bound_events"] = read_events(tmp / "b.jsonl")
    return out


@pytest.fixture(scope="module")
def run(cert: DevCertificate, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return asyncio.run(scenarios(cert, tmp_path_factory.mktemp("vllm")))


def _loads(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in run["events"] if e["event"] == "load"]


def test_publications_handed_over(run: dict[str, Any]) -> None:
    assert len(run["published"]) == 4
    assert all(e.get("blocks") == PUBLISHED_BLOCKS for e in run["published"])


def test_prompt_ending_on_a_block_boundary(run: dict[str, Any]) -> None:
    """The consumer's prompt is the published one: all blocks but the last are loaded (the
    last token is computed), checked against the whole publication's Block Keys."""
    assert run["exact"]["tokens"] == run["exact_own"]["tokens"]
    assert run["exact"]["num_cached_tokens"] == (PUBLISHED_BLOCKS - 1) * BLOCK
    assert _loads(run)[3]["failed_blocks"] == []


def test_hit_identical_tokens_and_cached_tokens(run: dict[str, Any]) -> None:
    assert run["clean"]["tokens"] == run["clean_own"]["tokens"]
    assert run["clean"]["num_cached_tokens"] == PUBLISHED_BLOCKS * BLOCK
    assert _loads(run)[0]["failed_blocks"] == []


def test_other_cache_salt_gets_no_hit(run: dict[str, Any]) -> None:
    for name in ("clean", "tampered", "withheld", "exact"):
        assert run[name + "_own"]["num_cached_tokens"] == 0
    salted = [e for e in run["events"] if e["event"] == "lookup" and e["salt"]]
    assert len(salted) == 4 and all(e["blocks"] == 0 for e in salted)


def test_second_hit_reuses_the_checked_manifest(run: dict[str, Any]) -> None:
    """A completed publication's manifest is read and checked once per decode worker; a
    later hit of it fetches the layers at once and generates the same tokens."""
    first, again = _loads(run)[0], _loads(run)[4]
    assert not first["manifest_kept"] and again["manifest_kept"]
    assert again["failed_blocks"] == []
    assert run["clean_again"]["tokens"] == run["clean_own"]["tokens"]
    assert run["clean_again"]["num_cached_tokens"] == PUBLISHED_BLOCKS * BLOCK


def test_tampered_object_recomputed(run: dict[str, Any]) -> None:
    assert run["tampered"]["tokens"] == run["tampered_own"]["tokens"]
    assert _loads(run)[1]["failed_blocks"] == [TAMPERED[1]]


def test_withheld_layer_recomputed(run: dict[str, Any]) -> None:
    assert run["withheld"]["tokens"] == run["withheld_own"]["tokens"]
    assert _loads(run)[2]["failed_blocks"] == list(range(PUBLISHED_BLOCKS))


def test_miss_costs_one_lookup_and_no_load(run: dict[str, Any]) -> None:
    """Structural, not timed: every request makes one lookup in its scope's live index; only
    the first one of a scope opens it (one round trip: the default scope's is opened at
    start-up), so a miss makes no round trip and starts no load: nothing waits in the
    forward pass."""
    assert run["miss"]["num_cached_tokens"] == 0
    lookups = [e for e in run["events"] if e["event"] == "lookup"]
    assert len(lookups) == 10
    assert [e["round_trips"] for e in lookups] == [1] + [0] * 9  # the salted scope's first
    assert lookups[-2]["blocks"] == 0  # the miss (the last one is the clean prompt again)
    assert len(_loads(run)) == 5  # the hits only


def test_shared_and_bound_cores(run: dict[str, Any]) -> None:
    """In-process engines share their cores with the transfer thread: the producer sent
    its layers after the forward pass, the consumer's forward pass wrote whole loads. The
    bound worker used each layer as it arrived and sent each while the next computed, with
    the same tokens, and the consumer reused its publication."""
    assert all(e["deferred"] for e in run["published"])
    assert all(e["forward_writes"] for e in _loads(run))
    bound = run["bound_events"]
    assert [e["forward_writes"] for e in bound if e["event"] == "load"] == [False]
    published = [e for e in bound if e["event"] == "publish"]
    # its own prefills publish (kv_both): the one under "bound-own" and the fresh prompt
    assert len(published) == 2 and not any(e["deferred"] for e in published)
    assert all(e.get("blocks") == PUBLISHED_BLOCKS for e in published)
    assert run["bound_hit"]["tokens"] == run["bound_hit_own"]["tokens"]
    assert run["bound_hit"]["num_cached_tokens"] == PUBLISHED_BLOCKS * BLOCK
    assert run["bound_reused"]["tokens"] == run["bound_reused_own"]["tokens"]
    assert run["bound_reused"]["num_cached_tokens"] == PUBLISHED_BLOCKS * BLOCK
    last = [e for e in run["events_all"] if e["event"] == "load"][-1]
    assert last["failed_blocks"] == []
