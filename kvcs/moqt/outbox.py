"""What a sans-IO session has produced and not yet handed out.

The session's parts (control plane, data streams) append to one :class:`Outbox`, so that
actions and events keep the order in which they happened. Once the session is closed,
actions are dropped: nothing reaches the wire after CONNECTION_CLOSE.
"""

from __future__ import annotations

from collections import deque

from . import events as ev
from .actions import Action, SendStreamData


class Outbox:
    """Actions for the I/O binding and events for the application, in order."""

    __slots__ = ("_counted", "_counted_bytes", "actions", "closed", "events")

    def __init__(self) -> None:
        self.actions: list[Action] = []
        """Pending actions; hot paths may append to it directly after checking
        :attr:`closed`."""
        self.events: deque[ev.Event] = deque()
        self.closed: tuple[int, str] | None = None
        """(code, reason) once the session is closed by either side."""
        self._counted = 0  # actions[:_counted] are summed in _counted_bytes
        self._counted_bytes = 0

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
        self._counted = self._counted_bytes = 0
        return out

    def stream_bytes(self) -> int:
        """Stream data bytes in the pending actions (each action is counted once, so
        asking after every write costs O(1) per action)."""
        actions = self.actions
        n = self._counted_bytes
        for i in range(self._counted, len(actions)):
            a = actions[i]
            if type(a) is SendStreamData:
                n += len(a.data)
        self._counted, self._counted_bytes = len(actions), n
        return n
