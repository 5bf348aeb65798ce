"""Builds the optional compiled q8 kernels; the project's metadata is in pyproject.toml.

``kvcs/kv/_q8.c`` makes the ``q8`` codec about 10x faster than numpy (figures in
bench/bench_kv.py). It is optional: where no C compiler is found the build goes on without
it and kvcs.kv.codecs encodes and decodes the same bytes in numpy.
"""

import sys

from setuptools import Extension, setup

# -O3: GCC vectorises the kernels' loops at -O3 (some Pythons build extensions with -O2).
_CFLAGS = [] if sys.platform == "win32" else ["-O3"]

setup(
    ext_modules=[
        Extension("kvcs.kv._q8", ["kvcs/kv/_q8.c"], extra_compile_args=_CFLAGS, optional=True)
    ]
)
