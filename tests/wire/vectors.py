"""Shared access to /work/shared/spec/moqt-22-vectors.json for the wire tests."""

from __future__ import annotations

import json
from pathlib import Path

SPEC = Path("/work/shared/spec/moqt-22-vectors.json")
_LOCAL = Path(__file__).resolve().parents[2] / "tests" / "vectors" / "moqt-22-vectors.json"


def load_vectors() -> list[dict]:
    """All vectors (name, kind, source, hex, encodes)."""
    path = SPEC if SPEC.exists() else _LOCAL
    return json.loads(path.read_text())["vectors"]


VECTORS = load_vectors()
BY_NAME = {v["name"]: v for v in VECTORS}


def vec(name: str) -> bytes:
    """Bytes of the named vector."""
    return bytes.fromhex(BY_NAME[name]["hex"])
