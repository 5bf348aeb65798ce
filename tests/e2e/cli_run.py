"""Running the ``kvcs`` command as a user does: a subprocess of this interpreter, with
input files written the way a user has them."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import numpy as np

from .conftest import DESC, PROMPT, cache

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


async def run_kvcs(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    """``python -m kvcs ARGS``: its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvcs", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=ENV)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def cli_inputs(tmp: Path, seed: int = 21) -> dict[str, str]:
    """Write the descriptor, prompt, scope key and ``cache(seed)`` as .npz into ``tmp``;
    their paths by kind (desc, tokens, scope, kv)."""
    (tmp / "desc.json").write_text(json.dumps(DESC.to_dict()))
    np.save(tmp / "prompt.npy", PROMPT)
    (tmp / "scope.key").write_bytes(bytes(range(32)))
    data = cache(seed)
    np.savez(tmp / "cache.npz", k=np.stack([k for k, _ in data]).view(np.uint16),
             v=np.stack([v for _, v in data]).view(np.uint16))
    return {"desc": str(tmp / "desc.json"), "tokens": str(tmp / "prompt.npy"),
            "scope": str(tmp / "scope.key"), "kv": str(tmp / "cache.npz")}


def load_kv_layers(path: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Layers written by ``kvcs fetch`` (bfloat16 stored as uint16 in .npz)."""
    with np.load(path) as z:
        names = sorted({int(n.split(".")[1]) for n in z.files if n.startswith("k.")})
        import ml_dtypes

        return {i: (z[f"k.{i}"].view(ml_dtypes.bfloat16), z[f"v.{i}"].view(ml_dtypes.bfloat16))
                for i in names}
