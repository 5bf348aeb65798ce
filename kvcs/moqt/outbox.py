"""What a sans-IO session has produced and not yet handed out.

The session's parts (control plane, data streams) append to one :class:`Outbox`, so that
actions and events keep the order in which they happened. Once the session is closed,
actions are dropped: nothing reaches the wire after CONNECTION_CLOSE.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from . import events as ev
from .actions import Action, SendStreamData


@dataclass(slots=True)
class _Join:
    """Stream data written in pieces, joined into one buffer when the actions are taken
    (:meth:`Outbox.write_joined`); ``index`` is its place in the actions."""

    index: int
    stream_id: int
    parts: list[bytes | memoryview]
    size: int
    end: bool


class Outbox:
    """Actions for the I/O binding and events for the application, in order."""

    __slots__ = ("_counted", "_counted_bytes", "_join", "_join_bytes", "_joins", "actions",
                 "closed", "events")

    def __init__(self) -> None:
        self.actions: list[Action] = []
        """Pending actions; hot paths may append to it directly after checking
        :attr:`closed`."""
        self.events: deque[ev.Event] = deque()
        self.closed: tuple[int, str] | None = None
        """(code, reason) once the session is closed by either side."""
        self._counted = 0  # actions[:_counted] are summed in _counted_bytes
        self._counted_bytes = 0
        self._joins: list[_Join] = []  # joined writes waiting for take_actions
        self._join: _Join | None = None  # the last of them
        self._join_bytes = 0  # their bytes (their actions hold none until taken)

    def emit(self, action: Action) -> None:
        """Queue an action for the binding (dropped once the session is closed)."""
        if self.closed is None:
            self.actions.append(action)

    def write_joined(self, stream_id: int, head: bytes, payload: bytes | memoryview,
                     end: bool, limit: int) -> None:
        """Queue ``head`` + ``payload`` (and FIN if ``end``) on ``stream_id`` as ONE stream
        write, joined when the actions are taken, together with the writes before it if
        they were the last action, on the same stream, without FIN, and the whole stays
        within ``limit`` bytes. A producer that publishes object by object (one call
        chain each) then pays the binding's per-write costs (a trip through the send
        scheduler, a QUIC library call) once per ``limit`` bytes, as a run does, and
        every byte is still copied once, by the join (bench_moqt's publisher: MOQT / raw
        CPU per MiB 1.63 -> 1.34, alternating rounds; docs/perf-profile.md, "The MOQT
        object path"). The caller has checked :attr:`closed`."""
        n = len(head) + len(payload)
        actions = self.actions
        j = self._join
        if (j is not None and j.index == len(actions) - 1 and j.stream_id == stream_id
                and not j.end and j.size + n <= limit):
            if payload:
                j.parts += (head, payload)
            else:
                j.parts.append(head)
            j.size += n
            j.end = end
        else:
            j = self._join = _Join(len(actions), stream_id,
                                   [head, payload] if payload else [head], n, end)
            self._joins.append(j)
            actions.append(SendStreamData(stream_id, b"", end))  # its place
        self._join_bytes += n

    def event(self, event: ev.Event) -> None:
        """Queue an event for the application."""
        self.events.append(event)

    def take_actions(self) -> list[Action]:
        """Return and clear the pending actions."""
        out = self.actions
        self.actions = []
        self._counted = self._counted_bytes = 0
        if self._joins:
            for j in self._joins:
                parts = j.parts
                out[j.index] = SendStreamData(
                    j.stream_id, b"".join(parts) if len(parts) > 1 else parts[0], j.end)
            self._joins = []
            self._join = None
            self._join_bytes = 0
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
        return n + self._join_bytes
