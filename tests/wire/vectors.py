"""The MOQT draft-22 wire vectors for the wire tests.

Read from the specification folder next to the repository (``../shared/spec``) when it is
there, else from the copy committed under ``tests/vectors/`` (identical at the time of
copying; CI runs from a clone that may live elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
SPEC = _ROOT.parent / "shared" / "spec" / "moqt-22-vectors.json"
_LOCAL = _ROOT / "tests" / "vectors" / "moqt-22-vectors.json"


def load_vectors() -> list[dict]:
    """All vectors (name, kind, source, hex, encodes)."""
    path = SPEC if SPEC.exists() else _LOCAL
    return json.loads(path.read_text())["vectors"]


VECTORS = load_vectors()
BY_NAME = {v["name"]: v for v in VECTORS}


def vec(name: str) -> bytes:
    """Bytes of the named vector."""
    return bytes.fromhex(BY_NAME[name]["hex"])
