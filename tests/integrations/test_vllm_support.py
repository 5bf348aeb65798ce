"""The vLLM connector's pieces that need no engine: settings, the descriptor of a model
config, scopes of cache salts, the paged layout and the scope index (vLLM itself runs in
test_vllm.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from kvcs.integrations.vllm_support import (
    ConnectorConfigError,
    PagedLayout,
    Settings,
    StagingPool,
    descriptor_from_vllm,
    scope_for_salt,
)
from kvcs.kv.ids import ScopeKey, scope_id
from kvcs.kv.scopefile import ScopeFile


def _config(directory: Path, **changes: Any) -> Any:
    hf = SimpleNamespace(model_type="llama", rope_parameters={"rope_theta": 10000.0},
                         architectures=["LlamaForCausalLM"])
    model = SimpleNamespace(
        model=str(directory), revision=None, tokenizer_revision=None, dtype=torch.bfloat16,
        hf_config=hf, hf_text_config=hf, use_mla=False, is_hybrid=False,
        get_sliding_window=lambda: changes.get("sliding_window"),
        get_total_num_hidden_layers=lambda: 4, get_total_num_kv_heads=lambda: 2,
        get_head_size=lambda: 64)
    for key in ("revision", "use_mla", "dtype"):
        if key in changes:
            setattr(model, key, changes[key])
    return SimpleNamespace(
        model_config=model,
        cache_config=SimpleNamespace(block_size=32, cache_dtype=changes.get("cache_dtype",
                                                                            "auto")),
        parallel_config=SimpleNamespace(tensor_parallel_size=changes.get("tp", 1),
                                        pipeline_parallel_size=1))


def _weights(directory: Path, data: bytes) -> Path:
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(data)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return directory


def test_descriptor_from_weights_not_path(tmp_path: Path) -> None:
    a = descriptor_from_vllm(_config(_weights(tmp_path / "a", b"weights")))
    b = descriptor_from_vllm(_config(_weights(tmp_path / "b", b"weights")))
    c = descriptor_from_vllm(_config(_weights(tmp_path / "c", b"tuned")))
    assert a.compat_id == b.compat_id != c.compat_id  # same weights elsewhere: same caches
    d = a.to_dict()
    assert str(tmp_path) not in json.dumps(d)
    assert (d["model"], d["layers"], d["kv_heads"], d["head_dim"], d["dtype"],
            d["block_tokens"]) == ("LlamaForCausalLM", 4, 2, 64, "bfloat16", 32)
    named = descriptor_from_vllm(_config(tmp_path / "absent", revision="abc123"))
    assert named.to_dict()["revision"] == "abc123"


@pytest.mark.parametrize(("change", "message"), [
    ({"tp": 2}, "tensor/pipeline parallel"),
    ({"sliding_window": 4096}, "sliding-window"),
    ({"use_mla": True}, "MLA"),
    ({"cache_dtype": "fp8"}, "kv cache dtype"),
    ({"dtype": torch.int8}, "dtype"),
])
def test_unsupported_models_refused(tmp_path: Path, change: dict[str, Any],
                                    message: str) -> None:
    with pytest.raises(ConnectorConfigError, match=message):
        descriptor_from_vllm(_config(_weights(tmp_path / "m", b"w"), **change))


def test_settings(tmp_path: Path) -> None:
    scope = tmp_path / "scope.json"
    scope.write_bytes(ScopeFile.new().to_json())
    s = Settings.from_extra({"relay": "moqt://127.0.0.1:4443/", "scope_key": str(scope)})
    assert s.relays == ("moqt://127.0.0.1:4443/",) and s.protect and s.secure() is not None
    s = Settings.from_extra({"relay": ["moqt://a:1/", "moqt://b:2/"], "protect": False,
                             "scope_key": str(scope), "recompute_budget_s": 2})
    assert s.relays == ("moqt://a:1/", "moqt://b:2/") and s.secure() is None
    for extra, message in [
        ({"relay": "moqt://a:1/", "scope_key": str(scope), "relays": 1}, "unknown"),
        ({"relay": "http://a/", "scope_key": str(scope)}, "not moqt"),
        ({"relay": "moqt://a:1/"}, "scope_key"),
        ({"relay": "moqt://a:1/", "scope_key": str(scope), "recompute_budget_s": 0},
         "positive"),
        ({"relay": "moqt://a:1/", "scope_key": str(tmp_path / "none")}, "scope_key"),
    ]:
        with pytest.raises(ConnectorConfigError, match=message):
            Settings.from_extra(extra)


def test_cache_salts_name_distinct_scopes() -> None:
    base = ScopeKey(bytes(range(32)))
    assert scope_for_salt(base, None) == base == scope_for_salt(base, "")
    a, b = scope_for_salt(base, "tenant-a"), scope_for_salt(base, "tenant-b")
    assert len({scope_id(base), scope_id(a), scope_id(b)}) == 3
    assert scope_for_salt(base, "tenant-a") == a


def test_staging_pool_reuses_the_arrays_of_finished_loads() -> None:
    desc = descriptor_from_vllm(_config(Path("/nonexistent"), revision="r"))
    pool = StagingPool(desc, keep=1)
    a = pool.take(64)
    assert len(a) == desc.layers and a[0][0].shape == (64, 2, 64)
    assert a[0][0].dtype == desc.dtype and a[0][1].shape == (64, 2, 64)
    assert pool.take(64) is not a  # in use: a new set
    pool.give(a)
    assert pool.take(96) is not a  # too small
    assert pool.take(32) is a  # the idle set fits (its first rows are used)
    b = pool.take(128)
    pool.give(a)
    pool.give(b)  # one idle set kept: the largest
    assert pool.take(32) is b
    assert pool.take(32) is not a
    pool.give(a)
    pool.give(b)
    pool = StagingPool(desc, keep=3)
    c = pool.take(96)
    for arrays in (a, b, c):
        pool.give(arrays)
    assert pool.take(80) is c  # the smallest that fits
    assert pool.take(80) is b


def test_paged_layout_round_trip() -> None:
    desc = descriptor_from_vllm(_config(Path("/nonexistent"), revision="r"))
    layout = PagedLayout(desc)
    kv = torch.zeros((6, 2, 32, 128), dtype=torch.bfloat16)
    layout.check("model.layers.0.self_attn.attn", kv)
    rng = np.random.default_rng(0)
    k = torch.tensor(rng.standard_normal((64, 2, 64)), dtype=torch.bfloat16)
    v = torch.tensor(rng.standard_normal((64, 2, 64)), dtype=torch.bfloat16)
    from kvcs.integrations.vllm_support import _numpy

    layout.scatter(kv, [4, 1], _numpy(k), _numpy(v))
    # the CPU backend's view: per (block, head), block_size K rows then block_size V rows
    view = kv.view(6, 2, 64, 64)
    assert torch.equal(view[4, :, :32].permute(1, 0, 2), k[:32])
    assert torch.equal(view[1, :, 32:].permute(1, 0, 2), v[32:])
    gk, gv = layout.gather(kv, [4, 1])
    assert np.array_equal(gk.view(np.int16), _numpy(k).view(np.int16))
    assert np.array_equal(gv.view(np.int16), _numpy(v).view(np.int16))
    # float32 caches (the demo's) take the same path without the bfloat16 view
    kv32 = torch.zeros((6, 2, 32, 128), dtype=torch.float32)
    layout.scatter(kv32, [2, 5], k.float().numpy(), v.float().numpy())
    assert torch.equal(kv32.view(6, 2, 64, 64)[5, :, 32:].permute(1, 0, 2), v[32:].float())
    gk, _ = layout.gather(kv32, [2, 5])
    assert np.array_equal(gk, k.float().numpy())
    with pytest.raises(ConnectorConfigError, match="CPU backend"):
        layout.check("x", torch.zeros((6, 2, 2, 32, 64)))


def test_whole_loads_first_only_where_the_forward_pass_shares_the_transfer_cores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from vllm.platforms import current_platform

    from kvcs.integrations import vllm as connector

    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    monkeypatch.setattr(connector.os, "sched_getaffinity", lambda pid: {0, 1})
    assert connector._shares_transfer_cores([1])  # nothing bound (vLLM in-process)
    assert connector._shares_transfer_cores([])  # the transfer thread is not pinned
    monkeypatch.setattr(connector.os, "sched_getaffinity", lambda pid: {0})
    assert not connector._shares_transfer_cores([1])  # vLLM bound the forward pass to 0
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    assert not connector._shares_transfer_cores([0])  # a GPU's forward pass: never
