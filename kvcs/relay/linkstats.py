"""Traffic per link: objects and payload bytes in and out per upstream relay and per
downstream session, so an operator sees what a tree of relays saved (one copy of each
object on each link whatever the number of consumers behind it).

Rows of ``kvcs_relay_link_{objects,bytes}_{in,out}_total{link}``: ``link`` is
``upstream <URL>`` for the upstream relay (summed over its reconnections) and
``session <id>`` for a downstream session (publisher, consumer or a relay below: the
session ID of the relay's log lines) while it is open. The counts are plain attributes of
each session, read at scrape time (a metric increment per object would cost more than the
forwarding it measures, docs/perf-profile.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .relay import Relay
    from .session import RelaySession

_ROWS = {"objects_in": lambda p: p.objects_in, "bytes_in": lambda p: p.bytes_in,
         "objects_out": lambda p: p.server.objects_sent,
         "bytes_out": lambda p: p.server.bytes_sent}


class LinkStats:
    """The per-link metrics of one relay; see the module docstring."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self._upstream_past: dict[str, dict[str, int]] = {}
        """Counts of upstream sessions already closed, by upstream URL."""
        for what in _ROWS:
            relay.metrics.labelled_gauge(f"kvcs_relay_link_{what}_total", "link",
                                         lambda what=what: self.rows(what))  # type: ignore[misc]

    @staticmethod
    def label(peer: RelaySession) -> str:
        """The ``link`` label of a session."""
        return f"upstream {peer.upstream_url}" if peer.upstream else f"session {peer.id}"

    def rows(self, what: str) -> dict[str, float]:
        """``{link: count}`` of ``what`` (objects_in, bytes_in, objects_out, bytes_out)."""
        get = _ROWS[what]
        out: dict[str, float] = {f"upstream {url}": past[what]
                                 for url, past in self._upstream_past.items()}
        for p in self.relay.sessions.values():
            name = self.label(p)
            out[name] = out.get(name, 0) + get(p)
        return out

    def session_closed(self, peer: RelaySession) -> None:
        """Keep the counts of a closed upstream session under its URL."""
        if peer.upstream:
            past = self._upstream_past.setdefault(peer.upstream_url,
                                                  dict.fromkeys(_ROWS, 0))
            for what, get in _ROWS.items():
                past[what] += get(peer)
