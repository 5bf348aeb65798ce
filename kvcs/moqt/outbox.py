"""What a sans-IO session has produced and not yet handed out.

The session's parts (control plane, data streams) append to one :class:`Outbox`, so that
actions and events keep the order in which they happened. Once the session is closed,
actions are dropped: nothing reaches the wire after CONNECTION_CLOSE.
"""

from __future__ import annotations

from collections import deque

from . import events as ev
from .actions import Action


class Outbox:
    """Actions for the I/O binding and events for the application, in order."""

    __slots__ = ("actions", "closed", "events")

    def __init__(self) -> None:
        self.actions: list[Action] = []
        """Pending actions; hot paths may append to it directly after checking
        :attr:`closed`."""
        self.events: deque[ev.Event] = deque()
        self.closed: tuple[int, str] | None = None
        """(code, reason) once the session is closed by either side."""

    def emit(self, action: Action) -> None:
        """Queue an action for the binding (dropped once the session is closed)."""
        if self.closed is None:
            self.actions.append(action)

    def event(self, event: ev.Event) -> None:
        """Queue an event for the application."""
        self.events.append(event)

    def take_actions(self) -> list[Action]:
        """Return and clear the pending actions."""
        out = self.actions
        self.actions = []
        return out
