"""kvcs: stream the KV caches of language models over MOQT (draft-ietf-moq-transport-22)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvcs")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"
