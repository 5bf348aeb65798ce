"""The root of every error kvcs raises, and the families a caller can catch.

::

    KvcsError                       every kvcs error
    ├── ConfigError (ValueError)    a bad setting, file or argument; one-line message
    ├── VerificationError           received bytes that fail a check: discard, treat as missing
    ├── ProtocolError               a peer broke MOQT: the session closes with ``code``
    └── SessionError                a MOQT session or a request over it failed
                                    (MoqtRequestError, SessionClosedError, HandOverError)

Other kvcs errors derive from :class:`KvcsError` directly (e.g. ``RecomputeRequired``,
``PublicationError``). Errors that were a ``ValueError``, ``ConnectionError`` or ``OSError``
still are. ``VerificationError`` lives in :mod:`kvcs.kv.errors`, ``ProtocolError`` in
:mod:`kvcs.moqt.errors`; this module imports nothing of kvcs, so every layer may use it.
"""

from __future__ import annotations

__all__ = ["ConfigError", "KvcsError", "SessionError"]


class KvcsError(Exception):
    """Base class of every error kvcs raises."""


class ConfigError(KvcsError, ValueError):
    """A user mistake in the configuration (bad file, bad value); one-line message."""


class SessionError(KvcsError):
    """A MOQT session, or a request over it, failed (refused, or the session ended)."""
