"""Error and status code registries of MOQT draft-22, and the session's exceptions.

Every malformed or forbidden input from the peer raises :class:`ProtocolError`, carrying
the session-termination code the draft names and a readable reason. The session layer
turns it into a session close (or, where the draft says so, a REQUEST_ERROR). Input that
spoils one data stream only (a malformed track, a local limit) raises
:class:`StreamError`: the session stops that stream and goes on. A call the application
makes that the session cannot honour (unknown request, wrong state, wrong side) raises
:class:`SessionUsageError` and changes nothing.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from ..errors import KvcsError


class SessionCode(IntEnum):
    """Session termination codes (CONNECTION_CLOSE / WT close), digest section 9.1."""

    NO_ERROR = 0x0
    INTERNAL_ERROR = 0x1
    UNAUTHORIZED = 0x2
    PROTOCOL_VIOLATION = 0x3
    INVALID_REQUEST_ID = 0x4
    DUPLICATE_TRACK_ALIAS = 0x5
    KEY_VALUE_FORMATTING_ERROR = 0x6
    INVALID_PATH = 0x8
    MALFORMED_PATH = 0x9
    GOAWAY_TIMEOUT = 0x10
    CONTROL_MESSAGE_TIMEOUT = 0x11
    DATA_STREAM_TIMEOUT = 0x12
    AUTH_TOKEN_CACHE_OVERFLOW = 0x13
    DUPLICATE_AUTH_TOKEN_ALIAS = 0x14
    MALFORMED_AUTH_TOKEN = 0x16
    UNKNOWN_AUTH_TOKEN_ALIAS = 0x17
    EXPIRED_AUTH_TOKEN = 0x18
    INVALID_AUTHORITY = 0x19
    MALFORMED_AUTHORITY = 0x1A
    TOO_MANY_REQUEST_UPDATES = 0x1B


class RequestErrorCode(IntEnum):
    """REQUEST_ERROR codes, digest section 9.2. Unknown codes mean INTERNAL_ERROR."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    MALFORMED_AUTH_TOKEN = 0x4
    EXPIRED_AUTH_TOKEN = 0x5
    GOING_AWAY = 0x6
    EXCESSIVE_LOAD = 0x9
    DOES_NOT_EXIST = 0x10
    INVALID_RANGE = 0x11
    MALFORMED_TRACK = 0x12
    UNINTERESTED = 0x20
    PREFIX_OVERLAP = 0x30
    NAMESPACE_TOO_LARGE = 0x31
    UNSUPPORTED_EXTENSION = 0x33
    REDIRECT = 0x34
    CONFLICTING_FILTERS = 0x35
    INVALID_FILTER = 0x36


class PublishDoneCode(IntEnum):
    """PUBLISH_DONE status codes, digest section 9.3."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TRACK_ENDED = 0x2
    GOING_AWAY = 0x4
    TOO_FAR_BEHIND = 0x5
    EXPIRED = 0x6
    UPDATE_FAILED = 0x8
    EXCESSIVE_LOAD = 0x9
    MALFORMED_TRACK = 0x12


class StreamResetCode(IntEnum):
    """RESET_STREAM / STOP_SENDING codes for any MOQT stream, digest section 9.4."""

    INTERNAL_ERROR = 0x0
    CANCELLED = 0x1
    DELIVERY_TIMEOUT = 0x2
    SESSION_CLOSED = 0x3
    GOING_AWAY = 0x4
    TOO_FAR_BEHIND = 0x5
    UNKNOWN_OBJECT_STATUS = 0x6
    EXPIRED_AUTH_TOKEN = 0x7
    EXCESSIVE_LOAD = 0x9
    MALFORMED_TRACK = 0x12


class ProtocolError(KvcsError):
    """Malformed or forbidden wire input.

    ``code`` is the session termination code (:class:`SessionCode`) the draft names for
    the violation; ``reason`` is a short human-readable explanation.
    """

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{_code_name(code)}: {reason}")
        self.code = int(code)
        self.reason = reason


class StreamError(KvcsError):
    """One incoming data stream cannot be read further; the session goes on.

    ``code`` is the STOP_SENDING code (:class:`StreamResetCode`: MALFORMED_TRACK for a
    track the stream shows to be malformed, EXCESSIVE_LOAD for a local limit). ``items``
    are what the stream yielded before the fault, in order: still valid, delivered.
    """

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = int(code)
        self.reason = reason
        self.items: list[Any] = []


def over_limit(reason: str) -> StreamError:
    """A data stream needs more than the session lets its peer hold: EXCESSIVE_LOAD."""
    return StreamError(StreamResetCode.EXCESSIVE_LOAD, reason)


def malformed_track(reason: str) -> StreamError:
    """A data stream contradicts itself (digest 8.8): MALFORMED_TRACK."""
    return StreamError(StreamResetCode.MALFORMED_TRACK, reason)


class SessionUsageError(KvcsError, ValueError):
    """The application asked the session for something it cannot do now: an unknown or
    finished request, a message its side may not send in the request's state, a closed
    session. Nothing was sent. (A ValueError, so older ``except ValueError`` still work.)
    """


def _code_name(code: int) -> str:
    try:
        return SessionCode(code).name
    except ValueError:
        return f"0x{code:x}"


def violation(reason: str) -> ProtocolError:
    """Shorthand for a PROTOCOL_VIOLATION error."""
    return ProtocolError(SessionCode.PROTOCOL_VIOLATION, reason)
