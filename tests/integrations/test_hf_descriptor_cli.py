"""``kvcs descriptor --from-model``: the descriptor of a local transformers model directory,
its revision tied to the weights' bytes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the hf extra is not installed (pip install '.[hf]')")

from kvcs.cli import main
from kvcs.integrations.hf import descriptor_for, weights_revision
from kvcs.integrations.hf_testing import random_llama
from kvcs.kv.model_id import identity_of_directory


def test_descriptor_from_a_model_directory(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    model = random_llama(seed=1, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    assert main(["descriptor", "--from-model", str(tmp_path / "m"), "--model-id", "t/tiny",
                 "--block-tokens", "32"]) == 0
    printed = json.loads(capsys.readouterr().out)
    revision = weights_revision(tmp_path / "m")
    assert printed["revision"] == revision and revision.startswith("sha256:")
    config_id = identity_of_directory(tmp_path / "m").config
    assert printed == descriptor_for(model, model_id="t/tiny", revision=revision,
                                     block_tokens=32,
                                     config_id=config_id).to_dict()
    # other weights, same config: another revision, so the two never share caches
    random_llama(seed=2, dtype=torch.bfloat16).save_pretrained(tmp_path / "other")
    assert weights_revision(tmp_path / "other") != revision


def test_descriptor_from_model_mistakes(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["descriptor", "--from-model", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["descriptor", "--from-model", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--from-model" in err


def kvcs(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real ``kvcs`` command, run in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "kvcs", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, check=False)


def test_identity_comes_from_the_model_not_the_path(tmp_path: Path) -> None:
    """The same model from a relative and an absolute path, and a copy elsewhere: one
    Compatibility ID; no member names the path. Another tokenizer: `descriptor --check`
    names the member that differs."""
    random_llama(seed=1, dtype=torch.bfloat16).save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    shutil.copytree(tmp_path / "m", tmp_path / "copy")
    rel = kvcs("descriptor", "--from-model", "m", "--out", "rel.json", cwd=tmp_path)
    assert rel.returncode == 0, rel.stderr
    for source, out in ((str(tmp_path / "m"), "abs.json"), ("copy", "copy.json")):
        r = kvcs("descriptor", "--from-model", source, "--out", out, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        r = kvcs("descriptor", "--check", "rel.json", "--against", out, cwd=tmp_path)
        assert r.returncode == 0 and "the same Compatibility ID" in r.stdout, r.stdout
    members = json.loads((tmp_path / "rel.json").read_text())
    assert members["model"] == "LlamaForCausalLM"
    assert members["tokenizer"].startswith("sha256:")
    assert members["extra"]["config"].startswith("sha256:")
    assert str(tmp_path) not in (tmp_path / "rel.json").read_text()
    (tmp_path / "copy" / "tokenizer.json").write_text('{"model": {"vocab": {"b": 0}}}')
    r = kvcs("descriptor", "--check", "rel.json", "--from-model", "copy", cwd=tmp_path)
    assert r.returncode == 1 and "caches are NOT shared" in r.stdout, r.stdout + r.stderr
    assert "  tokenizer: 'sha256:" in r.stdout and "revision" not in r.stdout
