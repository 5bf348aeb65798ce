"""What the binding exchanges with the sans-IO session and with the application.

:class:`SansIOSession` is what a connection feeds (a :class:`kvcs.moqt.session.Session`),
:class:`SessionHandler` what it calls after each batch of inputs (an endpoint, a relay
peer), :data:`SessionFactory` what builds the session once the transport is ready.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from kvcs.moqt.actions import Action, StreamOpener

from .quic.base import NetworkAddress

if TYPE_CHECKING:
    from .connection import MoqtConnection

logger = logging.getLogger(__name__)


class SansIOSession(Protocol):
    """What the binding needs from a sans-IO MOQT session."""

    def stream_data(self, stream_id: int, data: bytes, end: bool) -> None:
        """Bytes received on a stream (after any WebTransport preamble)."""
        ...

    def stream_reset(self, stream_id: int, code: int) -> None:
        """Peer RESET_STREAM."""
        ...

    def stop_sending(self, stream_id: int, code: int) -> None:
        """Peer STOP_SENDING (the binding already dropped queued data of the stream)."""
        ...

    def datagram(self, data: bytes) -> None:
        """One QUIC DATAGRAM (WebTransport: payload after the quarter stream ID)."""
        ...

    def connection_lost(self, code: int | None, reason: str) -> None:
        """The connection or WebTransport session ended (called once)."""
        ...

    def actions(self) -> list[Action]:
        """Drain pending actions."""
        ...


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """What the session factory learns about a new connection."""

    is_client: bool
    transport: Literal["quic", "webtransport"]
    authority: str | None
    """Client: from the URL (raw QUIC: to send as SETUP AUTHORITY). WebTransport server:
    the CONNECT ``:authority``. Raw QUIC server: ``None`` (learnt from SETUP)."""
    path: str | None
    """Path with query, as for ``authority``."""
    peer_address: NetworkAddress | None
    alpn: str | None


SessionFactory = Callable[[StreamOpener, ConnectionInfo], SansIOSession]
"""Builds the session once the transport is ready; the opener is the connection."""

SessionHook = Callable[["MoqtConnection"], None]
"""Called with each new connection once its session exists (``serve(on_session=...)``)."""


class SessionHandler(Protocol):
    """What the binding calls on the application side of a session (an endpoint, a relay
    peer): attach one with :meth:`MoqtConnection.attach`."""

    def session_changed(self) -> None:
        """The session took input (it may have events); called after each batch of inputs
        and after streams drained, before the session's actions are sent."""
        ...


class SessionInputs:
    """Hands what arrives on a connection to its session, for the raw QUIC and the
    WebTransport paths alike, and notes that the session took input (:attr:`taken`). A
    session that raises closes the connection (``on_error``)."""

    __slots__ = ("_drop", "_on_error", "session", "taken")

    def __init__(self, drop_stream: Callable[[int], object],
                 on_error: Callable[[], None]) -> None:
        self.session: SansIOSession | None = None
        """Set once the session exists; the methods below need it."""
        self.taken = False
        """The session took input since the connection last handled its events."""
        self._drop = drop_stream  # discard what the scheduler still holds for a stream
        self._on_error = on_error

    def _failed(self, what: str) -> None:
        logger.exception("session failed on %s", what)
        self._on_error()

    def stream_data(self, stream_id: int, data: bytes, end: bool) -> None:
        """Stream bytes (and FIN) from the peer."""
        self.taken = True
        try:
            self.session.stream_data(stream_id, data, end)  # type: ignore[union-attr]
        except Exception:
            self._failed("stream data")

    def stream_reset(self, stream_id: int, code: int) -> None:
        """Peer RESET_STREAM."""
        self.taken = True
        try:
            self.session.stream_reset(stream_id, code)  # type: ignore[union-attr]
        except Exception:
            self._failed("stream reset")

    def stop_sending(self, stream_id: int, code: int) -> None:
        """Peer STOP_SENDING: queued data of the stream is dropped first."""
        self._drop(stream_id)
        self.taken = True
        try:
            self.session.stop_sending(stream_id, code)  # type: ignore[union-attr]
        except Exception:
            self._failed("STOP_SENDING")

    def datagram(self, data: bytes) -> None:
        """One datagram payload."""
        self.taken = True
        try:
            self.session.datagram(data)  # type: ignore[union-attr]
        except Exception:
            self._failed("datagram")
