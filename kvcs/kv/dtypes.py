"""Element data types of the KVSP profile, as little-endian numpy dtypes."""

from __future__ import annotations

import functools

import numpy as np

from .errors import DescriptorError

__all__ = ["DTYPE_NAMES", "dtype_for", "dtype_name"]

#: Names of the element types allowed in a Compatibility Descriptor, in profile order.
DTYPE_NAMES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


@functools.cache
def _dtypes() -> dict[str, np.dtype]:
    # ml_dtypes is imported on first use: importing it takes ~0.45 s, 59% of `import kvcs`
    # on the 2-core machine, and a process that never touches a tensor must not pay it.
    import ml_dtypes

    return {
        "float32": np.dtype("<f4"),
        "float16": np.dtype("<f2"),
        "bfloat16": np.dtype(ml_dtypes.bfloat16),
        "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
        "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    }


@functools.cache
def _names() -> dict[np.dtype, str]:
    return {dt: name for name, dt in _dtypes().items()}


def dtype_for(name: str) -> np.dtype:
    """Return the numpy dtype (little-endian) for a KVSP dtype name.

    Raises DescriptorError for a name that is not in the profile's list.
    """
    try:
        return _dtypes()[name]
    except (KeyError, TypeError):
        raise DescriptorError(
            f"unknown dtype {name!r}; expected one of {', '.join(DTYPE_NAMES)}"
        ) from None


def dtype_name(dtype: np.dtype | type) -> str:
    """Return the KVSP name of a numpy dtype (byte order must be little-endian or n/a)."""
    if isinstance(dtype, np.dtype) and (name := _names().get(dtype)) is not None:
        return name  # the common case, in 0.1 us (the scan below: 2 us)
    dt = np.dtype(dtype)
    for name, candidate in _dtypes().items():
        if dt == candidate:
            return name
    raise DescriptorError(f"dtype {dt!r} is not a KVSP element type")
