"""Reading and writing the files the CLI and the examples use, with clear errors.

* Compatibility Descriptor: a JSON object (``kvsp-profile.md`` section 2).
* Token IDs: ``.npy`` (1-D integer array), ``.json`` (a list of integers) or text
  (whitespace- or comma-separated integers).
* K/V: ``.npz`` or ``.safetensors`` with arrays ``k`` and ``v`` of shape
  [layers, tokens, kv_heads, head_dim], or per-layer arrays ``k.0`` ... / ``k_0`` ...
  (and ``v.N`` / ``v_N``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .errors import DescriptorError
from .ids import CompatDescriptor

PathLike = str | os.PathLike[str]


class FileFormatError(ConfigError):
    """A file is missing, unreadable or not in the expected format."""


def _read(path: PathLike) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise FileFormatError(f"{path}: {exc.strerror or exc}") from None


def load_descriptor(path: PathLike) -> CompatDescriptor:
    """Load and validate a Compatibility Descriptor JSON file."""
    try:
        return CompatDescriptor.from_json(_read(path))
    except DescriptorError as exc:
        raise FileFormatError(f"{path}: {exc}") from None


def load_tokens(path: PathLike) -> np.ndarray:
    """Load token IDs (uint32 range) from .npy, .json or a text file."""
    p = Path(path)
    try:
        if p.suffix == ".npy":
            arr = np.load(p, allow_pickle=False)
        elif p.suffix == ".json":
            arr = np.asarray(json.loads(_read(p)))
        else:
            text = _read(p).decode("ascii", errors="strict")
            parts = [x for x in re.split(r"[\s,]+", text.strip()) if x]
            arr = np.asarray([int(x) for x in parts], dtype=np.int64)
    except FileFormatError:
        raise
    except (ValueError, UnicodeDecodeError, OSError) as exc:
        raise FileFormatError(f"{path}: not a token file ({exc})") from None
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise FileFormatError(f"{path}: expected a flat list of integer token IDs")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF):
        raise FileFormatError(f"{path}: token IDs must be in 0..2^32-1")
    return arr.astype(np.int64)


def _arrays(path: PathLike) -> dict[str, np.ndarray]:
    p = Path(path)
    if not p.exists():
        raise FileFormatError(f"{path}: no such file")
    try:
        if p.suffix == ".safetensors":
            from safetensors.numpy import load_file

            return dict(load_file(str(p)))
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileFormatError:
        raise
    except Exception as exc:  # numpy/safetensors raise assorted types on bad files
        raise FileFormatError(f"{path}: cannot read K/V arrays ({exc})") from None


def load_kv(path: PathLike, desc: CompatDescriptor) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Load per-layer K and V arrays ([tokens, kv_heads, head_dim]) in the descriptor dtype."""
    arrays = _arrays(path)
    stored = arrays.pop(DTYPE_ENTRY, None)
    if stored is not None and str(stored) != desc.dtype_name:
        raise FileFormatError(f"{path}: holds a {stored} cache, but the descriptor says dtype "
                              f"{desc.dtype_name}: publish it under a descriptor of its dtype, "
                              "or convert the arrays")
    L = desc.layers
    if "k" in arrays and "v" in arrays:
        k_all, v_all = arrays["k"], arrays["v"]
        if k_all.ndim != 4 or v_all.ndim != 4 or k_all.shape[0] != L or v_all.shape[0] != L:
            raise FileFormatError(f"{path}: k and v must be [layers={L}, tokens, heads, dim]")
        ks, vs = list(k_all), list(v_all)
    else:
        ks, vs = [], []
        for i in range(L):
            k = arrays.get(f"k.{i}", arrays.get(f"k_{i}"))
            v = arrays.get(f"v.{i}", arrays.get(f"v_{i}"))
            if k is None or v is None:
                raise FileFormatError(f"{path}: missing k/v arrays for layer {i} "
                                      f"(expected 'k' and 'v', or 'k.{i}' and 'v.{i}')")
            ks.append(k)
            vs.append(v)
    out_k, out_v = [], []
    for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
        for name, arr, shape in (("k", k, desc.k_shape()), ("v", v, desc.v_shape())):
            if arr.ndim != 3 or arr.shape[1:] != shape[1:]:
                raise FileFormatError(f"{path}: layer {i} {name} has shape {arr.shape}, "
                                      f"expected [tokens, {shape[1]}, {shape[2]}]")
        k, v = _as_dtype(path, i, "k", k, desc), _as_dtype(path, i, "v", v, desc)
        out_k.append(np.ascontiguousarray(k))
        out_v.append(np.ascontiguousarray(v))
    return out_k, out_v


def _as_dtype(path: PathLike, layer: int, name: str, arr: np.ndarray,
              desc: CompatDescriptor) -> np.ndarray:
    """``arr`` in the descriptor's dtype: as it is, or unsigned integers of the same width
    taken as its bits (.npz stores bfloat16 and float8 so). Any other dtype is refused: a
    bfloat16 cache under a float16 descriptor would reach consumers as reinterpreted bits."""
    dt = desc.dtype
    if arr.dtype == dt:
        return arr
    bits = arr.dtype.kind == "u" or arr.dtype.name.startswith("void")  # untyped bits
    if bits and arr.dtype.itemsize == dt.itemsize:
        return arr.view(dt)
    raise FileFormatError(f"{path}: layer {layer} {name} is {arr.dtype}, but the descriptor "
                          f"says dtype {desc.dtype_name}: publish the cache under a "
                          f"descriptor of its dtype, or convert the arrays")


DTYPE_ENTRY = "dtype"
"""The .npz entry naming the dtype of arrays stored as bits (bfloat16, float8: .npz cannot
describe them), so that :func:`load_kv` refuses them under a descriptor of another dtype
of the same width."""


def _dtype_entry(npz: bool, arrays: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    kinds = {a.dtype.name for a in arrays if a.dtype.kind == "V"}
    return {DTYPE_ENTRY: np.array(kinds.pop())} if npz and len(kinds) == 1 else {}


def _storable(arr: np.ndarray, npz: bool) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    if npz and arr.dtype.kind == "V":
        # .npz cannot describe ml_dtypes types (bfloat16, float8): store the bits
        arr = arr.view(f"<u{arr.dtype.itemsize}")
    return arr


def _write_arrays(path: PathLike, data: dict[str, np.ndarray]) -> None:
    """Write to a temporary name beside ``path``, then rename: a failure (disk full, an
    interrupt) leaves no half-written file under ``path``."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        if p.suffix == ".safetensors":
            from safetensors.numpy import save_file

            save_file(data, str(tmp))
        else:
            with tmp.open("wb") as f:
                np.savez(f, **data)  # type: ignore[arg-type]  # numpy stub: kwds vs flags
        os.replace(tmp, p)
    except OSError as exc:
        raise FileFormatError(f"{path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def save_stacked_kv(path: PathLike, k: np.ndarray, v: np.ndarray) -> None:
    """Write arrays ``k`` and ``v`` [layers, tokens, kv_heads, head_dim] (what
    :func:`load_kv` reads) to .npz or .safetensors."""
    npz = Path(path).suffix != ".safetensors"
    _write_arrays(path, {"k": _storable(k, npz), "v": _storable(v, npz),
                         **_dtype_entry(npz, [k, v])})


def save_kv(path: PathLike, layers: Sequence[tuple[int, np.ndarray, np.ndarray]]) -> None:
    """Write per-layer arrays ``k.N``/``v.N`` to .npz or .safetensors."""
    npz = Path(path).suffix != ".safetensors"
    data: dict[str, np.ndarray] = {}
    for idx, k, v in layers:
        data[f"k.{idx}"] = _storable(k, npz)
        data[f"v.{idx}"] = _storable(v, npz)
    data.update(_dtype_entry(npz, [a for _, k, v in layers for a in (k, v)]))
    _write_arrays(path, data)
