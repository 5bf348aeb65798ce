"""A model's identity, from the model and never from where it lies: what the ``model``,
``revision`` and ``tokenizer`` members of a Compatibility Descriptor say.

Two workers share caches only when their descriptors are equal, so these members must not
depend on the path a model was loaded from: before, ``kvcs descriptor --from-model DIR``
wrote DIR as typed, and the same weights got one Compatibility ID from ``./m`` and another
from ``/srv/m``. Here:

* ``model``: the hub ID when the model was named by one (``org/name``), else the
  architecture from its config (``LlamaForCausalLM``);
* ``revision``: the hub commit when given, else ``sha256:`` of the weight files (names and
  bytes), so that two fine-tunes with one config never share caches;
* ``tokenizer``: ``sha256:`` of the tokenizer files (vocabulary, merges, special tokens),
  else the model's name;
* ``config`` (recorded in ``extra``): ``sha256:`` of the config, without the members that
  name a path or a library version.

Used by ``kvcs descriptor --from-model`` (through :mod:`kvcs.integrations.hf`) and by
integrations that derive a descriptor from a serving engine's model config. Pure Python:
no torch, no transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
"""Files of a model directory that hold weights: their bytes define its revision."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja")
"""Files of a model directory that define its tokenizer (those present are hashed)."""

VOLATILE_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "_commit_hash",
                                  "_attn_implementation_autoset"})
"""Config members that name a location or a library version, not the model."""


@dataclass(frozen=True)
class ModelIdentity:
    """The descriptor members that name a model (see the module docstring)."""

    model: str
    revision: str
    tokenizer: str
    config: str | None = None
    """``sha256:`` of the config (for ``extra``); None when there is no config."""


def _sha256_files(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                digest.update(chunk)
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()


def weights_revision(directory: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of a model directory's weight files (names and bytes, in name
    order): two directories get the same revision only if they hold the same weights.
    Reads every weight file once (SHA-256 runs at ~1.4 GiB/s here). ValueError without
    weight files."""
    files = sorted(f for f in Path(directory).iterdir()
                   if f.is_file() and f.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise ValueError(f"{directory}: no weight files ({', '.join(WEIGHT_SUFFIXES)}): "
                         "give the revision explicitly")
    return _sha256_files(files)


def tokenizer_identity(directory: str | os.PathLike[str]) -> str | None:
    """``sha256:<hex>`` of the tokenizer files of a model directory (None: it has none)."""
    files = sorted(f for name in TOKENIZER_FILES if (f := Path(directory) / name).is_file())
    return _sha256_files(files) if files else None


def config_identity(config: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a model config (canonical JSON) without the members that name a
    path or a library version: equal for the same model wherever it is loaded from."""
    kept = {k: v for k, v in config.items() if k not in VOLATILE_CONFIG_KEYS}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def is_hub_id(name: str) -> bool:
    """True for a hub model ID (``org/name`` or ``name``), False for a local path: an
    absolute or ``./`` path, one that exists here, or one with more than one ``/``."""
    if not name or name.startswith((".", "/", "~")) or os.sep in name.replace("/", ""):
        return False
    if Path(name).exists():
        return False
    return name.count("/") <= 1 and all(part for part in name.split("/"))


def model_name(config: Mapping[str, Any], name_or_path: str | None = None) -> str:
    """The ``model`` member: ``name_or_path`` when it is a hub ID, else the architecture of
    the config (``architectures[0]``, else ``model_type``); never a local path."""
    if name_or_path and is_hub_id(name_or_path):
        return name_or_path
    arch = config.get("architectures") or []
    if arch and isinstance(arch[0], str):
        return arch[0]
    if isinstance(config.get("model_type"), str):
        return str(config["model_type"])
    raise ValueError("the config names neither architectures nor model_type: give the "
                     "model's name explicitly")


def identity_of_directory(directory: str | os.PathLike[str], *, model_id: str | None = None,
                          revision: str | None = None,
                          tokenizer: str | None = None) -> ModelIdentity:
    """The identity of a local model directory (``config.json``, weights, tokenizer
    files). Explicit ``model_id``, ``revision`` and ``tokenizer`` win. OSError/ValueError
    for an unreadable directory or config."""
    path = Path(directory)
    config_file = path / "config.json"
    config: dict[str, Any] = {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except ValueError as exc:
            raise ValueError(f"{config_file}: not JSON ({exc})") from None
    name = model_id or model_name(config, str(config.get("_name_or_path") or ""))
    return ModelIdentity(model=name, revision=revision or weights_revision(path),
                         tokenizer=tokenizer or tokenizer_identity(path) or name,
                         config=config_identity(config) if config else None)


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Member by member, how two descriptors differ (``extra`` members one by one):
    ``"revision: 'sha256:ab..' here, 'sha256:cd..' there"``; empty when equal."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if key == "extra" and isinstance(x, Mapping) and isinstance(y, Mapping):
            out += [f"extra.{d}" for d in differences(x, y)]
        elif x != y:
            out.append(f"{key}: {_short(x)} here, {_short(y)} there")
    return out


def _short(value: Any) -> str:
    text = "(absent)" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
