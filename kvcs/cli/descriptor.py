"""``kvcs descriptor`` (template, check, from a model directory) and ``kvcs sample``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .base import UsageError, command
from .common import check_out, write_new_file

DESCRIPTOR_TEMPLATE = {
    "kvsp": 1,
    "model": "my-org/my-model",
    "revision": "weights-revision-or-hash",
    "tokenizer": "tokenizer-id-or-hash",
    "layers": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "dtype": "bfloat16",
    "block_tokens": 16,
    "layout": "tnd",
    "rope": "post",
}
"""What ``kvcs descriptor`` prints: every required member of the KVSP Compatibility
Descriptor (docs/kvsp-profile.md) with an example value (a Llama-style 32-layer model)."""


@command("descriptor")
def _descriptor_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "descriptor", help="print a Compatibility Descriptor template, or check one",
        description="Without options: print a valid KVSP Compatibility Descriptor template "
                    "(JSON) to edit. The required members are kvsp (1), model, revision, "
                    "tokenizer (strings), layers, kv_heads, head_dim, block_tokens "
                    "(integers), dtype (float32, float16, bfloat16, float8_e4m3fn, "
                    "float8_e5m2), layout (tnd) and rope (post, pre or none); optional "
                    "v_head_dim and extra (an object). No floats: write them as strings. "
                    "See docs/kvsp-profile.md.")
    p.add_argument("--check", metavar="FILE", help="validate FILE and print its "
                   "Compatibility ID; with --against or --from-model, compare them and "
                   "list every member that differs (status 1 if any)")
    p.add_argument("--against", metavar="FILE", help="with --check: the other descriptor "
                   "(e.g. the publisher's, when a fetch finds nothing)")
    p.add_argument("--from-model", metavar="DIR",
                   help="derive the descriptor of a local transformers model directory "
                        "(config.json + weights; needs the [hf] extra): the revision is the "
                        "SHA-256 of its weight files unless --revision is given, the "
                        "tokenizer the SHA-256 of its tokenizer files; the path itself is "
                        "never part of it")
    p.add_argument("--model-id", metavar="NAME", help="with --from-model: the model name "
                   "(default: the hub ID the config names, else its architecture; never "
                   "the directory's path)")
    p.add_argument("--revision", metavar="REV", help="with --from-model: the weights "
                   "revision (e.g. a hub commit)")
    p.add_argument("--block-tokens", type=int, default=16, metavar="B",
                   help="with --from-model: tokens per block (default 16)")
    p.add_argument("--out", metavar="FILE", help="write the template to FILE instead of "
                   "printing it (never overwrites)")
    p.set_defaults(func=run_descriptor)
    return p


def run_descriptor(args: argparse.Namespace) -> int:
    """``kvcs descriptor``."""
    from ..kv.files import FileFormatError, load_descriptor

    if args.check:
        try:
            desc = load_descriptor(args.check)
        except FileFormatError as exc:
            raise UsageError(str(exc)) from None
        print(f"{args.check}: valid; Compatibility ID {desc.compat_id.hex()}")
        print(f"  {desc.layers} layers, {desc.kv_heads} KV heads x {desc.head_dim} dims, "
              f"{desc.dtype_name}, {desc.block_tokens} tokens per block, model "
              f"{desc.members['model']!r}")
        if args.against and args.from_model:
            raise UsageError("--check compares with --against FILE or --from-model DIR, "
                             "not both")
        if args.against:
            try:
                other = load_descriptor(args.against)
            except FileFormatError as exc:
                raise UsageError(str(exc)) from None
            return _compare(desc, other, args.check, args.against)
        if args.from_model:
            return _compare(desc, _descriptor_from_model(args), args.check, args.from_model)
        return 0
    if args.against:
        raise UsageError("--against needs --check FILE")
    members: dict[str, Any] = DESCRIPTOR_TEMPLATE
    if args.from_model:
        members = _descriptor_from_model(args).to_dict()
    text = json.dumps(members, indent=2) + "\n"
    if args.out:
        try:
            write_new_file(args.out, text)
        except FileExistsError:
            raise UsageError(f"--out {args.out}: exists (not overwritten)") from None
        except OSError as exc:
            raise UsageError(f"--out {args.out}: {exc.strerror or exc}") from None
        print(f"wrote the descriptor of {args.from_model} to {args.out}" if args.from_model
              else f"wrote a descriptor template to {args.out}: edit model, revision, "
                   "tokenizer and the geometry to match your model", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _compare(desc: Any, other: Any, here: str, there: str) -> int:
    """Print whether two descriptors give one Compatibility ID, and if not, every member
    that differs (``here``: the --check file, ``there``: the other); 1 if they differ."""
    from ..kv.model_id import differences

    if desc.compat_id == other.compat_id:
        print(f"{there}: the same Compatibility ID: caches are shared")
        return 0
    diff = differences(desc.members, other.members)
    print(f"{there}: another Compatibility ID {other.compat_id.hex()}: caches are NOT "
          f"shared; {len(diff)} member(s) differ ('here' is {here}):")
    for line in diff:
        print(f"  {line}")
    return 1


def _descriptor_from_model(args: argparse.Namespace) -> Any:
    """``descriptor --from-model``: the [hf] integration reads the model directory."""
    try:
        from ..integrations.hf import descriptor_for_directory
    except ImportError as exc:
        raise UsageError(f"--from-model needs the hf extra (pip install 'kvcs[hf]'): "
                         f"{exc}") from None
    if not Path(args.from_model).is_dir():
        raise UsageError(f"--from-model {args.from_model}: not a directory")
    try:
        return descriptor_for_directory(args.from_model, model_id=args.model_id,
                                        revision=args.revision,
                                        block_tokens=args.block_tokens)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--from-model {args.from_model}: {exc}") from None


# ---------------------------------------------------------------------------- sample


@command("sample")
def _sample_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "sample", help="write a random KV cache and prompt matching a descriptor (to try "
                       "the commands)",
        description="Write random token IDs (--tokens-out, .npy) and a random K/V cache of "
                    "them (--kv-out: arrays 'k' and 'v' [layers, tokens, kv_heads, head_dim] "
                    "in the descriptor's dtype), the inputs `kvcs publish` takes. Not a "
                    "model's cache: for trying relay, publish, inspect and fetch.")
    p.add_argument("--descriptor", required=True, metavar="JSON",
                   help="Compatibility Descriptor file (`kvcs descriptor --out`)")
    p.add_argument("--tokens", type=int, default=1024, metavar="N",
                   help="prompt length (default 1024)")
    p.add_argument("--tokens-out", required=True, metavar="FILE", help="token IDs (.npy)")
    p.add_argument("--kv-out", required=True, metavar="FILE", help="K/V arrays (.npz)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_sample)
    return p


def run_sample(args: argparse.Namespace) -> int:
    """``kvcs sample``."""
    import numpy as np

    from ..kv.files import FileFormatError, load_descriptor, save_stacked_kv

    try:
        desc = load_descriptor(args.descriptor)
    except FileFormatError as exc:
        raise UsageError(str(exc)) from None
    if args.tokens < 1:
        raise UsageError("--tokens must be at least 1")
    for out in (args.tokens_out, args.kv_out):
        check_out(out)
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, 32000, args.tokens, dtype=np.int64)
    shape = (desc.layers, args.tokens, desc.kv_heads, desc.head_dim)
    k = rng.standard_normal(shape, dtype=np.float32).astype(desc.dtype)
    v = rng.standard_normal((*shape[:3], desc.v_shape()[2]), dtype=np.float32).astype(desc.dtype)
    try:
        _save_npy(args.tokens_out, tokens)
        save_stacked_kv(args.kv_out, k, v)
    except (OSError, FileFormatError) as exc:
        raise UsageError(str(exc)) from None
    mib = (k.nbytes + v.nbytes) / 2**20
    print(f"wrote {args.tokens} token IDs to {args.tokens_out} and a {desc.layers}-layer "
          f"K/V cache of them ({mib:.1f} MiB) to {args.kv_out}")
    return 0


def _save_npy(path: str, array: Any) -> None:
    """``np.save`` through a temporary name (``.npy`` appended as np.save does): a failed
    write leaves nothing under ``path``."""
    import os

    import numpy as np

    target = Path(path if path.endswith(".npy") else path + ".npy")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            np.save(f, array)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
