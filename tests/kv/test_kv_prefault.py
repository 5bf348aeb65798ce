"""kvcs.kv.prefault: a new array's pages faulted in at once, its contents unchanged."""

from __future__ import annotations

import resource
import sys

import numpy as np
import pytest

from kvcs.kv import prefault as pf

MiB = 1 << 20


def _faults_writing(arr: np.ndarray) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arr[:] = 7
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_contents_are_kept() -> None:
    arr = np.arange(MiB, dtype=np.uint32)  # 4 MiB, written already
    pf.prefault(arr)
    pf.prefault(arr[1:-1])  # unaligned start and end: rounded out to whole pages
    pf.prefault(np.arange(10))  # small: nothing to do
    assert np.array_equal(arr, np.arange(MiB, dtype=np.uint32))


@pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE is Linux's")
def test_writing_a_prefaulted_array_takes_no_page_faults() -> None:
    # 2 MiB arrays: under numpy's 4 MiB huge-page threshold, so 4 KiB pages (512 faults)
    fresh = np.empty(2 * MiB, dtype=np.uint8)
    faults_fresh = _faults_writing(fresh)
    populated = np.empty(2 * MiB, dtype=np.uint8)
    pf.prefault(populated)
    assert pf._usable, "madvise(MADV_POPULATE_WRITE) failed: Linux >= 5.14 is needed"
    faults_populated = _faults_writing(populated)
    if faults_fresh < 256:  # the allocator reused faulted-in memory: nothing to compare
        assert faults_populated <= faults_fresh + 8
    else:
        assert faults_populated < faults_fresh / 8
