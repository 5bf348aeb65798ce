"""Compiled q8 kernels (kvcs/kv/_q8.c); kvcs.kv.codecs holds the contract."""

from collections.abc import Sequence

from numpy.typing import NDArray

def encode(src: NDArray, kind: int, blocks: int, rows: int, dim: int) -> list[bytes] | int: ...
def decode(
    sections: Sequence[bytes | bytearray | memoryview], kind: int, rows: int, dim: int, out: NDArray
) -> int: ...
