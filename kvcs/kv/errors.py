"""Typed failures of the KV object model.

Callers discard objects that fail verification and treat them as missing.
"""

from __future__ import annotations

from ..errors import KvcsError

__all__ = [
    "CodecError",
    "ContainerError",
    "DescriptorError",
    "DigestError",
    "HeaderError",
    "KvcsError",
    "ManifestError",
    "SignatureError",
    "UnsupportedCodecError",
    "VerificationError",
]


# KvcsError is the root of every kvcs error (kvcs/errors.py); it is re-exported here.


class DescriptorError(KvcsError, ValueError):
    """A Compatibility Descriptor (or other local input) violates the KVSP profile."""


class VerificationError(KvcsError):
    """Received data failed a check; the object must be discarded and treated as missing."""


class HeaderError(VerificationError):
    """An object payload header is malformed or inconsistent with its Location."""


class DigestError(VerificationError):
    """A SHA-256 digest does not match the data."""


class ManifestError(VerificationError):
    """A manifest is malformed or inconsistent with the namespace."""


class SignatureError(VerificationError):
    """A COSE_Sign1 manifest failed signature verification or could not be decoded."""


class ContainerError(VerificationError):
    """A KVSP container is malformed or corrupt."""


class CodecError(VerificationError, ValueError):
    """Section data cannot be decoded with its codec (wrong length, bad framing...)."""


class UnsupportedCodecError(KvcsError, ValueError):
    """A codec is unknown, or known but not available here (e.g. ``zstandard`` missing).

    A consumer treats the track as unusable and selects another one.
    """
