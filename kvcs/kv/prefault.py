"""Fault in a new array's memory in one system call instead of one page fault per page.

A consumer assembles every layer into new arrays (unless the caller lends its own, the
``into`` of :meth:`~kvcs.kvnet.consumer.KvConsumer.layers`), and the first write to each
4 KiB page of them is a page fault: 0.6-0.8 ms per MiB on the development machine (a VM),
a quarter to a third of the consumer's CPU. ``MADV_POPULATE_WRITE`` (Linux 5.14) makes the
kernel fault the whole range in at once: 32 layers of 2 x 2 MiB written in 32 KiB pieces,
0.73-0.99 -> 0.60-0.70 ms/MiB (4 alternating runs). Elsewhere (another OS, an older
kernel) :func:`prefault` does nothing and the pages fault in as they are written.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Callable

import numpy as np

__all__ = ["empty", "prefault"]

MADV_POPULATE_WRITE = 23
"""Linux's madvise advice (include/uapi/asm-generic/mman-common.h)."""

MIN_BYTES = 256 * 1024
"""Smaller arrays come from the allocator's heap, mostly faulted in already."""

_madvise: Callable[[int, int, int], int] | None = None
_usable = sys.platform == "linux"


def _load() -> Callable[[int, int, int], int] | None:
    global _madvise, _usable
    if _madvise is None and _usable:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):  # pragma: no cover - no libc symbol
            _usable = False
            return None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_int
        _madvise = fn
    return _madvise


def prefault(arr: np.ndarray) -> None:
    """Fault in the pages under ``arr`` (a new, contiguous array about to be written).
    The contents do not change; any failure (EINVAL before Linux 5.14) turns it off."""
    global _usable
    if arr.nbytes < MIN_BYTES or not _usable:
        return
    fn = _load()
    if fn is None:
        return
    page = mmap.PAGESIZE
    start = arr.ctypes.data // page * page
    end = -(-(arr.ctypes.data + arr.nbytes) // page) * page
    if fn(start, end - start, MADV_POPULATE_WRITE) != 0:
        _usable = False


def empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """``np.empty(shape, dtype)`` about to be written whole: its pages faulted in at once
    (:func:`prefault`)."""
    arr = np.empty(shape, dtype)
    prefault(arr)
    return arr
