"""kvcs.kv.model_id: a model's identity from the model, never from its path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcs.kv.model_id import (
    config_identity,
    differences,
    identity_of_directory,
    is_hub_id,
    model_name,
)


def model_dir(path: Path, weights: bytes = b"w" * 64, name_or_path: str = "") -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "_name_or_path": name_or_path or str(path), "transformers_version": "5.0"}))
    (path / "model.safetensors").write_bytes(weights)
    (path / "tokenizer.json").write_text('{"vocab": {"a": 0}}')
    return path


def test_the_same_model_anywhere_has_one_identity(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    a = identity_of_directory(model_dir(tmp_path / "a"))
    b = identity_of_directory(model_dir(tmp_path / "b"))
    monkeypatch.chdir(tmp_path)
    assert identity_of_directory("a") == identity_of_directory(tmp_path / "a") == a == b
    assert a.model == "LlamaForCausalLM" and str(tmp_path) not in repr(a)
    assert a.revision.startswith("sha256:") and a.tokenizer.startswith("sha256:")


def test_weights_tokenizer_and_config_change_it(tmp_path: Path) -> None:
    base = identity_of_directory(model_dir(tmp_path / "a"))
    other = identity_of_directory(model_dir(tmp_path / "b", weights=b"x" * 64))
    assert other.revision != base.revision and other.tokenizer == base.tokenizer
    (tmp_path / "b" / "tokenizer.json").write_text('{"vocab": {"b": 0}}')
    assert identity_of_directory(tmp_path / "b").tokenizer != base.tokenizer
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config_identity({**cfg, "_name_or_path": "/elsewhere"}) == base.config
    assert config_identity({**cfg, "rope_theta": 1e6}) != base.config


def test_hub_ids_are_kept_paths_are_not(tmp_path: Path) -> None:
    hub = identity_of_directory(model_dir(tmp_path / "a", name_or_path="org/model"))
    assert hub.model == "org/model"
    assert is_hub_id("HuggingFaceTB/SmolLM2-135M") and is_hub_id("gpt2")
    for path in ("./m", "/srv/models/m", "a/b/c", str(tmp_path / "a"), "~/m"):
        assert not is_hub_id(path), path
    assert model_name({"model_type": "llama"}, "/srv/m") == "llama"
    with pytest.raises(ValueError):
        model_name({}, "/srv/m")


def test_differences_name_each_member() -> None:
    a = {"model": "m", "revision": "r1", "extra": {"attention": "sdpa", "x": 1}}
    b = {"model": "m", "revision": "r2", "extra": {"attention": "eager", "x": 1}}
    assert differences(a, b) == ["extra.attention: 'sdpa' here, 'eager' there",
                                 "revision: 'r1' here, 'r2' there"]
    assert differences(a, a) == []
