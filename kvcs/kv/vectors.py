"""Deterministic generator of the kvcs test vectors (KVSP profile section 9 fixed inputs).

Run ``python -m kvcs.kv.vectors`` to rewrite ``tests/vectors/kvsp-v1.json`` or
``python -m kvcs.kv.vectors --check`` to compare the committed file with fresh output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ed25519

from . import ids
from .codecs import encode_section, layer_digest, raw_section
from .component import Component
from .container import build_container
from .cose import ProducerKey, sign_manifest
from .manifest import Manifest, Segment
from .payload import build_payload
from .tracks import TrackName

__all__ = [
    "DEFAULT_PATH",
    "FIXED_DESCRIPTOR",
    "FIXED_PUBLICATION_ID",
    "FIXED_SCOPE_KEY",
    "FIXED_TOKENS",
    "element_block",
    "encode_namespace",
    "encode_vi64",
    "generate",
    "main",
    "render",
]

#: Section 9 fixed inputs.
FIXED_SCOPE_KEY = bytes(range(32))
FIXED_DESCRIPTOR: dict[str, Any] = {
    "kvsp": 1,
    "model": "kvcs-test",
    "revision": "0",
    "tokenizer": "t0",
    "layers": 2,
    "kv_heads": 8,
    "head_dim": 128,
    "dtype": "bfloat16",
    "block_tokens": 4,
    "layout": "tnd",
    "rope": "post",
}
FIXED_TOKENS = tuple(range(16))
FIXED_PUBLICATION_ID = bytes.fromhex("0123456789abcdef0123456789abcdef")
#: Ed25519 seed and kid of the cose-manifest.md regression vector.
FIXED_PRODUCER_SEED = bytes(range(32))
FIXED_PRODUCER_KID = b"prod-ed"

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "tests" / "vectors" / "kvsp-v1.json"


def encode_vi64(value: int) -> bytes:
    """MOQT (draft 22) variable-length integer: leading 1-bits give the number of extra bytes."""
    if value < 0 or value >= 1 << 64:
        raise ValueError("vi64 holds 0..2^64-1")
    for n in range(1, 8):  # n total bytes carry 7*n value bits
        if value < 1 << (7 * n):
            prefix = (0xFF << (8 - (n - 1))) & 0xFF if n > 1 else 0
            out = value.to_bytes(n, "big")
            return bytes([out[0] | prefix]) + out[1:]
    if value < 1 << 56:
        return b"\xfe" + value.to_bytes(7, "big")
    return b"\xff" + value.to_bytes(8, "big")


def encode_namespace(fields: Sequence[bytes]) -> bytes:
    """Track Namespace wire form: vi64 field count, then per field vi64 length and octets."""
    out = [encode_vi64(len(fields))]
    for f in fields:
        out += [encode_vi64(len(f)), bytes(f)]
    return b"".join(out)


def element_block(desc: ids.CompatDescriptor, layer: int, block: int, *,
                  v: bool = False) -> np.ndarray:
    """Section 9 tensor of one block and layer: ((l*131 + t*31 + h*7 + d) % 251) - 125, V negated.

    ``t`` is the absolute token position.
    """
    b, h, d = desc.k_shape() if not v else desc.v_shape()
    t = np.arange(block * b, (block + 1) * b).reshape(b, 1, 1)
    hh = np.arange(h).reshape(1, h, 1)
    dd = np.arange(d).reshape(1, 1, d)
    vals = ((layer * 131 + t * 31 + hh * 7 + dd) % 251) - 125
    if v:
        vals = -vals
    return vals.astype(np.float32).astype(desc.dtype)


def _sha(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def generate() -> dict[str, Any]:
    """Compute every vector from the fixed inputs."""
    desc = ids.CompatDescriptor.from_dict(FIXED_DESCRIPTOR)
    cid = desc.compat_id
    skey = ids.ScopeKey.from_bytes(FIXED_SCOPE_KEY)
    sid = ids.scope_id(skey)
    keys = ids.block_keys(skey, cid, list(FIXED_TOKENS), desc.block_tokens)
    anchor = ids.anchor_key(keys, len(keys))
    ns = ids.KvcsNamespace(sid, cid, anchor, FIXED_PUBLICATION_ID)

    objects: list[dict[str, Any]] = []
    tracks = {kind: TrackName.data(kind, "raw", 0).format() for kind in (Component.K, Component.V)}
    digests: dict[str, list[list[str]]] = {name: [] for name in tracks.values()}
    layer_digests: list[list[str]] = []
    for layer in range(desc.layers):
        row: list[str] = []
        for name in tracks.values():
            digests[name].append([])
        for blk in range(len(keys)):
            k_raw = raw_section(element_block(desc, layer, blk))
            v_raw = raw_section(element_block(desc, layer, blk, v=True))
            row.append(layer_digest(k_raw, v_raw).hex())
            for kind, data in ((Component.K, k_raw), (Component.V, v_raw)):
                header, _ = build_payload(
                    kind, layer, blk, blk * desc.block_tokens, desc.block_tokens, "raw", data
                )
                objects.append(
                    {
                        "track": tracks[kind],
                        "group": layer,
                        "object": blk,
                        "data_length": len(data),
                        "data_sha256": _sha(data),
                        "header": header.hex(),
                    }
                )
                digests[tracks[kind]][layer].append(_sha(data))
        layer_digests.append(row)

    segment = Segment(
        segment=0,
        first_block=0,
        blocks=len(keys),
        block_keys_sha256=ids.block_keys_sha256(keys).hex(),
        tracks=list(tracks.values()),
        complete=True,
        object_digests=digests,
    )
    manifest = Manifest.for_descriptor(desc, deterministic=True, segments=[segment])
    manifest_json = manifest.to_json_bytes()
    producer = ProducerKey(
        ed25519.Ed25519PrivateKey.from_private_bytes(FIXED_PRODUCER_SEED), FIXED_PRODUCER_KID
    )
    container = build_container(
        desc,
        "raw",
        keys[0],
        0,
        [element_block(desc, lyr, 0) for lyr in range(desc.layers)],
        [element_block(desc, lyr, 0, v=True) for lyr in range(desc.layers)],
    )
    q8 = encode_section("q8", element_block(desc, 0, 0))

    return {
        "description": "kvcs KVSP profile v1 vectors from kvsp-profile.md section 9 "
        "(generated by kvcs.kv.vectors; do not edit)",
        "inputs": {
            "scope_key": FIXED_SCOPE_KEY.hex(),
            "descriptor": FIXED_DESCRIPTOR,
            "tokens": list(FIXED_TOKENS),
            "publication_id": FIXED_PUBLICATION_ID.hex(),
            "element_formula": "K(l,t,h,d) = ((l*131 + t*31 + h*7 + d) % 251) - 125 "
            "as bfloat16, t absolute; V = -K",
            "producer_ed25519_seed": FIXED_PRODUCER_SEED.hex(),
            "producer_kid": FIXED_PRODUCER_KID.decode(),
        },
        "canonical_descriptor": desc.canonical.decode("utf-8"),
        "compat_id": cid.hex(),
        "scope_id": sid.hex(),
        "block_keys": [k.hex() for k in keys],
        "anchor_key": anchor.hex(),
        "block_keys_sha256": ids.block_keys_sha256(keys).hex(),
        "namespace_fields": [f.hex() for f in ns.to_fields()],
        "namespace": encode_namespace(ns.to_fields()).hex(),
        "namespace_hex_fields": encode_namespace(ns.to_fields(hex_fields=True)).hex(),
        "objects": objects,
        "layer_digests": layer_digests,
        "manifest": manifest_json.decode("utf-8"),
        "manifest_cose": sign_manifest(manifest_json, producer).hex(),
        "container_block0_raw": container.hex(),
        "q8_k_layer0_block0_sha256": _sha(q8),
    }


def render() -> str:
    """The vectors as the exact text of the committed JSON file."""
    return json.dumps(generate(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write (default) or ``--check`` the vector file."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    ap.add_argument("--out", type=Path, default=DEFAULT_PATH)
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
