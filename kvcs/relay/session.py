"""One MOQT session of the relay: the state of its requests and the routing of its events.

A :class:`RelaySession` is the relay's sibling of :class:`~kvcs.endpoint.Endpoint`: both
are :class:`~kvcs.binding.BoundSession` (event pump, SETUP timeout, serving through a
:class:`~kvcs.moqt.serving.TrackServer`, flushing). Where an endpoint answers from its own
tracks, a relay session hands the peer's requests to the :class:`~kvcs.relay.Relay` and
routes the answers and objects of the requests the relay made on it (upstream
subscriptions, forwarded TRACK_STATUS, upstream SUBSCRIBE_NAMESPACE) to the relay's parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..binding import BoundSession
from ..moqt import events as ev
from ..moqt.errors import StreamResetCode
from ..moqt.serving import CURSOR_COST
from ..moqt.wire import AuthToken, Parameters
from ..routing import ROUTED_REQUESTS, request_kind
from ..transport import MoqtConnection

__all__ = ["RELAYED_REQUESTS", "ROUTED_DOWN", "RelaySession", "request_kind"]

if TYPE_CHECKING:
    from .relay import Relay

RELAYED_REQUESTS = ROUTED_REQUESTS
"""The request kinds the relay handles (metrics label ``type``: :func:`request_kind`)."""
ROUTED_DOWN = frozenset(("subscribe", "fetch", "track_status"))
"""The request kinds the upstream relay may make of us (kvcs.relay.announce)."""


class RelaySession(BoundSession):
    """One session of the relay: a downstream client, a publisher, or the upstream relay."""

    def __init__(self, conn: MoqtConnection, relay: Relay, session_id: int, *,
                 upstream: bool = False, request_tokens: tuple[AuthToken, ...] = ()) -> None:
        super().__init__(conn, None if upstream else relay.admission.pacer,
                         relay.config.max_session_backlog,
                         relay.config.max_fetches_per_session)
        self.relay = relay
        self.id = session_id
        self.upstream = upstream
        """The session to the upstream relay (its peer makes no requests of us)."""
        self.request_tokens = request_tokens
        """Authorization tokens the relay sends with its requests on this session."""
        self.upstream_url = ""
        """The URL of the upstream relay (an upstream session)."""
        self.objects_in = 0
        self.bytes_in = 0
        """Objects (payload bytes) received on the relay's subscriptions to this peer
        (:mod:`kvcs.relay.linkstats`)."""
        # the requests the peer made of the relay are records of relay.requests; those the
        # relay made on this session are its links (relay.links) and forwarded TRACK_STATUS
        # (relay.requests)

    def request_params(self) -> Parameters:
        """Parameters for a request the relay makes on this session (its tokens)."""
        return Parameters(auth_tokens=self.request_tokens)

    @property
    def held_bytes(self) -> int:
        """What this session makes the relay hold now, as accounted: the MOQT session's
        buffers and request state (control, data and early bytes: parser buffers
        included), the objects queued for the peer, and the fetch and fill cursors. At
        most :attr:`Relay.session_memory_bound <kvcs.relay.Relay.session_memory_bound>`;
        0 once the session has left."""
        u = self.session.usage
        running, waiting = self.server.cursors
        return (u.control_bytes + u.data_bytes + u.early_bytes + self.conn.queued_bytes
                + (running + waiting) * CURSOR_COST)

    def open_requests(self) -> int:
        """Requests this session's peer has open with the relay."""
        return (self.relay.requests.open_requests(self)
                + self.relay.namespaces.open_requests(self))

    def open_fetches(self) -> int:
        """Fetches of this session's peer being served or waiting."""
        return self.relay.requests.open_fetches(self)

    def abort_served(self, request_id: int, status: int, reason: str,
                     reset_code: int = StreamResetCode.INTERNAL_ERROR) -> None:
        """End a served subscription (PUBLISH_DONE ``status``) or fetch (its stream reset
        with ``reset_code``) before its track is complete."""
        self.server.end_subscription(request_id, status, reason)
        self.server.fail_fetch(request_id, reset_code)
        self.schedule_flush()

    # ------------------------------------------------------------ BoundSession

    def handle_request(self, e: ev.RequestReceived) -> None:
        self.relay.router.route(self, e)

    def handle_event(self, e: ev.Event) -> None:
        relay = self.relay
        if isinstance(e, ev.ObjectReceived):
            link = relay.links.fed(self, e.request_id)
            if link is not None:
                # the objects of the link queued right behind this one go in with it, in
                # order: one call chain per run instead of per object
                run = self.session.next_objects(e.request_id)
                relay.links.on_objects(link, [e, *run] if run else [e])
            return
        rid = getattr(e, "request_id", None)
        if rid is None:
            return
        link = relay.links.fed(self, rid)
        if link is not None:
            relay.links.on_event(link, e)
        elif relay.requests.answered_by(self, rid) is not None:
            relay.on_status_answer(self, rid, e)
        elif self.upstream and (relay.namespaces.on_upstream_event(rid, e)
                                or relay.announcer.on_event(rid, e)):
            return
        elif isinstance(e, ev.UpdateReceived):
            relay.namespaces.sync(self, e)  # of a namespace watch (the server took the rest)
        elif isinstance(e, ev.RequestCancelled):
            relay.on_cancelled(self, rid)

    def served_request_ended(self, request_id: int) -> None:
        self.relay.on_served_done(self, request_id)

    def session_ended(self, code: int, reason: str) -> None:
        self.relay.on_session_closed(self, code, reason)
