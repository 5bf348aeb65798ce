"""Error base classes shared by every part of kvcs."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user mistake in the configuration (bad file, bad value); one-line message."""


__all__ = ["ConfigError"]
