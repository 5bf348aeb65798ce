"""``kvcs descriptor --from-model``: the descriptor of a local transformers model directory,
its revision tied to the weights' bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the hf extra is not installed (pip install '.[hf]')")

from kvcs.cli import main
from kvcs.integrations.hf import descriptor_for, weights_revision
from kvcs.integrations.hf_testing import random_llama


def test_descriptor_from_a_model_directory(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    model = random_llama(seed=1, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "m")
    assert main(["descriptor", "--from-model", str(tmp_path / "m"), "--model-id", "t/tiny",
                 "--block-tokens", "32"]) == 0
    printed = json.loads(capsys.readouterr().out)
    revision = weights_revision(tmp_path / "m")
    assert printed["revision"] == revision and revision.startswith("sha256:")
    assert printed == descriptor_for(model, model_id="t/tiny", revision=revision,
                                     block_tokens=32).to_dict()
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
