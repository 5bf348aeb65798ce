"""The QUIC libraries kvcs runs on (qh3, aioquic), one adapter each, and the choice.

The library is a property of :class:`~kvcs.transport.QuicSettings` (``library=``): every
connection and server uses the library of the settings it was made with, so one process
can run both (a relay on one, its clients on the other). Settings made without a
``library`` take the process default, resolved when they are made:

1. the last :func:`use_library` call (``kvcs relay --quic-backend`` makes one),
2. else the environment variable ``KVCS_QUIC_BACKEND``,
3. else ``auto``: qh3 when installed (a kvcs dependency), else aioquic.

Both libraries speak the same wire protocol and interoperate; ``make test`` runs the
network suites on each. Adapters are made (and their library imported and patched) on
first use.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import QuicAdapter

LIBRARY_ENV = "KVCS_QUIC_BACKEND"
"""Environment variable naming the default QUIC library (``qh3``, ``aioquic`` or ``auto``)."""

LIBRARIES = ("qh3", "aioquic")
"""The QUIC libraries kvcs has an adapter for, preferred first."""

CHOICES = ("auto", *LIBRARIES)
"""Accepted library names."""

_default: str | None = None
_adapters: dict[str, QuicAdapter] = {}


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def resolve(name: str | None) -> str:
    """Map a library name (``None``/empty = ``auto``) to an installed library.

    Raises :class:`ValueError` for an unknown name or a library that is not installed."""
    value = (name or "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"unknown QUIC library {name!r}: use one of {', '.join(CHOICES)}")
    if value == "auto":
        return next((lib for lib in LIBRARIES if _installed(lib)), LIBRARIES[-1])
    if not _installed(value):
        raise ValueError(f"QUIC library {value!r} is not installed (pip install {value})")
    return value


def use_library(name: str) -> str:
    """Make ``name`` (``auto``, ``qh3`` or ``aioquic``) the library of the settings made
    from now on without one, in this process and (through ``KVCS_QUIC_BACKEND``) in the
    processes it starts. Returns the library chosen; ValueError for an unknown name."""
    global _default
    _default = resolve(name)
    os.environ[LIBRARY_ENV] = _default
    return _default


def default_library() -> str:
    """The library of settings made without one (see the module docstring)."""
    return _default or resolve(os.environ.get(LIBRARY_ENV))


def adapter(name: str | None = None) -> QuicAdapter:
    """The adapter of library ``name`` (default: :func:`default_library`), made once per
    process: the first call imports the library and applies its patches."""
    library = resolve(name) if name else default_library()
    found = _adapters.get(library)
    if found is None:
        module = importlib.import_module(f"{__name__}.{library}")
        found = _adapters[library] = module.ADAPTER()
    return found


__all__ = ["CHOICES", "LIBRARIES", "LIBRARY_ENV", "adapter", "default_library", "resolve",
           "use_library"]
