"""Announcements up the tree: a relay with an upstream forwards the namespaces published
to it, so requests made anywhere in the tree can be routed down to it.

Every namespace available here through something other than the upstream relay (a
session's PUBLISH_NAMESPACE, a relay below us, or a completed publication the relay keeps
in its own name, in memory or on disk) is announced upstream with ONE PUBLISH_NAMESPACE,
withdrawn (the request cancelled: PUBLISH_NAMESPACE_DONE) when it is no longer available
here. The upstream relay then counts this relay as a publisher of it: its SUBSCRIBE_
NAMESPACE watchers, and those of every relay below it, see the namespace, and its
SUBSCRIBE / FETCH / TRACK_STATUS for tracks under it come down to this relay, which
serves them like any other request (cache, disk tier, local publisher), each hop caching
and keeping one subscription per track.

Loops. Draft-22 carries no hop list (message parameters are hop-by-hop), so loops are
prevented by direction, on a tree: (1) a namespace learned from the upstream relay is
never announced back up; (2) a request that came from the upstream relay is never routed
back up (no local source: DOES_NOT_EXIST). A request a relay sends up for a namespace it
announced itself (it keeps the namespace but not the track) comes back down once and is
refused there, so it ends. With several upstreams listed, one is used at a time, so the
relays still form a tree (docs/relay.md, Limits).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..auth import render_namespace
from ..moqt import events as ev
from ..moqt.wire import TrackNamespace, namespace_has_prefix

if TYPE_CHECKING:
    from .relay import Relay
    from .session import RelaySession

log = logging.getLogger(__name__)


class Announcer:
    """The PUBLISH_NAMESPACEs one relay keeps open upstream; see the module docstring."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.forwarded: dict[TrackNamespace, int] = {}
        """Namespace -> Request ID of its PUBLISH_NAMESPACE on the current upstream."""
        self._session: RelaySession | None = None

    def wanted(self) -> list[TrackNamespace]:
        """The namespaces available here other than through the upstream relay."""
        origin = self.relay.namespaces.origin
        return [ns for ns in origin.namespaces
                if any(s is None or not s.upstream for s in origin.publishers(ns))]

    def sync(self) -> None:
        """Announce what became available, withdraw what is no longer."""
        up = self.relay.upstream
        if up is None or up.is_closed:
            self.forwarded.clear()
            self._session = None
            return
        if up is not self._session:  # a new upstream session: announce everything again
            self.forwarded.clear()
            self._session = up
        want = self.wanted()
        changed = False
        for ns in want:
            if ns not in self.forwarded:
                self.forwarded[ns] = up.session.publish_namespace(ns, up.request_params())
                log.info("announcing %s upstream", render_namespace(ns))
                changed = True
        for ns in set(self.forwarded) - set(want):
            up.session.cancel(self.forwarded.pop(ns))
            log.info("withdrawing %s upstream", render_namespace(ns))
            changed = True
        if changed:
            up.schedule_flush()

    def covers(self, namespace: TrackNamespace) -> bool:
        """True if ``namespace`` is under a namespace announced upstream (the upstream
        relay may ask for its tracks)."""
        return any(namespace_has_prefix(namespace, ns) for ns in self.forwarded)

    def on_event(self, request_id: int, e: ev.Event) -> bool:
        """Take the answer to a PUBLISH_NAMESPACE sent upstream; False if it is none."""
        ns = next((n for n, rid in self.forwarded.items() if rid == request_id), None)
        if ns is None:
            return False
        if isinstance(e, ev.RequestRejected | ev.RequestFailed):
            # stays in `forwarded`, so it is not sent again on this session
            log.warning("upstream refused PUBLISH_NAMESPACE %s: %s", render_namespace(ns), e)
        return True
