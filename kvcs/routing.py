"""One router for the requests a peer makes of a session that serves an origin.

The five request kinds (SUBSCRIBE, FETCH, TRACK_STATUS, PUBLISH_NAMESPACE,
SUBSCRIBE_NAMESPACE) are routed the same way by an application's
:class:`~kvcs.endpoint.Endpoint` and by every session of a relay: admission (tokens,
per-session limits: :class:`~kvcs.admission.Admission`), then

* SUBSCRIBE / FETCH / TRACK_STATUS: a track the :class:`~kvcs.moqt.origin.Origin` holds
  (and can vouch for: :meth:`Router.holds`) is served from it by the session's
  :class:`~kvcs.moqt.serving.TrackServer`; any other goes to :meth:`Router.resolve` (an
  endpoint: DOES_NOT_EXIST; a relay: its disk tier or upstream, :mod:`kvcs.relay.relay`),
* PUBLISH_NAMESPACE / SUBSCRIBE_NAMESPACE: accepted, then :meth:`Router.published` /
  :meth:`Router.watched` (an endpoint records them and answers from its origin; a relay
  also forwards the watch upstream).

A relay's router subclasses this one and overrides the hooks; nothing else routes.
"""

from __future__ import annotations

import contextlib
from typing import Generic, TypeVar

from .admission import Admission
from .binding import BoundSession, send_namespace_notices
from .moqt import events as ev
from .moqt.errors import RequestErrorCode
from .moqt.origin import Origin
from .moqt.track import FullTrackName, Track
from .moqt.wire import (
    Fetch,
    PublishNamespace,
    Subscribe,
    SubscribeNamespace,
    TrackNamespace,
    TrackStatus,
)

_KINDS: dict[type, str] = {
    Subscribe: "subscribe", Fetch: "fetch", TrackStatus: "track_status",
    PublishNamespace: "publish_namespace", SubscribeNamespace: "subscribe_namespace"}
ROUTED_REQUESTS = frozenset(_KINDS.values())
"""The request kinds a router handles (the relay's metrics label ``type``)."""


def request_kind(message: object) -> str:
    """The label of a request message (``subscribe``, ``fetch``, ...)."""
    return _KINDS.get(type(message), type(message).__name__.lower())


S = TypeVar("S", bound=BoundSession)


class Router(Generic[S]):
    """Routes the peer's requests of sessions serving ``origin``; see the module
    docstring. Subclasses override the hooks (:meth:`accepts`, :meth:`refuse`,
    :meth:`answered`, :meth:`holds`, :meth:`serve`, :meth:`resolve`, :meth:`published`,
    :meth:`watched`)."""

    def __init__(self, origin: Origin[S], admission: Admission | None = None) -> None:
        self.origin = origin
        self.admission = admission
        """Checks each request (tokens, limits) before it is routed; None: every request
        is routed (a client endpoint trusts its relay)."""

    def route(self, session: S, e: ev.RequestReceived) -> None:
        """Admit request ``e`` of ``session``'s peer, then route it by kind."""
        m = e.message
        kind = request_kind(m)
        rid = e.request_id
        if not self.accepts(session, e, kind):
            return
        if self.admission is not None:
            refusal = self.admission.check(session.peer_setup, m,
                                           session.open_requests(), session.open_fetches())
            if refusal is not None:
                if refusal.close_session:
                    self.close(session, refusal.code, refusal.reason)
                else:
                    self.refuse(session, e, refusal.code, refusal.reason, refusal.retry_ms)
                return
        if isinstance(m, PublishNamespace):
            session.session.request_ok(rid)
            self.answered(session, rid, kind)
            self.published(session, rid, tuple(m.namespace))
        elif isinstance(m, SubscribeNamespace):
            session.session.request_ok(rid)
            self.answered(session, rid, kind)
            self.watched(session, rid, tuple(m.namespace_prefix))
        else:
            self.route_track(session, e)

    def route_track(self, session: S, e: ev.RequestReceived) -> None:
        """Route SUBSCRIBE / FETCH / TRACK_STATUS ``e`` (admitted): serve it from the
        origin's track, or resolve it."""
        m = e.message
        assert isinstance(m, Subscribe | Fetch | TrackStatus)
        key: FullTrackName = (tuple(m.namespace), bytes(m.name))
        track = self.origin.get(key)
        if track is not None and self.holds(track):
            self.serve(session, e, track)
        else:
            self.resolve(session, e, key, track)

    # ------------------------------------------------------------------ hooks

    def accepts(self, session: S, e: ev.RequestReceived, kind: str) -> bool:
        """Checks before admission; refuses and returns False to stop. Default: the five
        kinds pass, others are NOT_SUPPORTED."""
        if kind in ROUTED_REQUESTS:
            return True
        self.refuse(session, e, RequestErrorCode.NOT_SUPPORTED,
                    f"{type(e.message).__name__} not supported here")
        return False

    def refuse(self, session: S, e: ev.RequestReceived, code: int, reason: str,
               retry_ms: int = 0) -> None:
        """REQUEST_ERROR for request ``e``."""
        with contextlib.suppress(KeyError, ValueError):  # the request ended meanwhile
            session.session.request_error(e.request_id, code, reason, retry_interval=retry_ms)
        session.schedule_flush()

    def close(self, session: S, code: int, reason: str) -> None:
        """Close a session whose request broke a rule that ends it."""
        session.close(code, reason)

    def answered(self, session: S, request_id: int, kind: str, result: str = "ok") -> None:
        """Request ``request_id`` (of ``kind``) was answered (``ok``, ``rejected``);
        default: nothing."""

    def holds(self, track: Track) -> bool:
        """True if ``track`` answers requests as it is (an application's track; a relay:
        only a complete copy, others are resolved)."""
        return True

    def serve(self, session: S, e: ev.RequestReceived, track: Track) -> None:
        """Serve SUBSCRIBE / FETCH / TRACK_STATUS ``e`` from ``track``."""
        m = e.message
        assert isinstance(m, Subscribe | Fetch | TrackStatus)
        ok = session.server.serve(e.request_id, m, track)
        self.answered(session, e.request_id, request_kind(m), "ok" if ok else "rejected")

    def resolve(self, session: S, e: ev.RequestReceived, key: FullTrackName,
                track: Track | None) -> None:
        """A request for a track the origin does not hold (``track``: an incomplete copy,
        or None). Default: DOES_NOT_EXIST."""
        self.refuse(session, e, RequestErrorCode.DOES_NOT_EXIST, "no such track")

    def published(self, session: S, request_id: int, namespace: TrackNamespace) -> None:
        """The peer's PUBLISH_NAMESPACE ``request_id`` was accepted (default: nothing)."""

    def watched(self, session: S, request_id: int, prefix: TrackNamespace) -> None:
        """The peer's SUBSCRIBE_NAMESPACE was accepted: NAMESPACE for every namespace
        available under ``prefix``, and for those that come later."""
        send_namespace_notices(self.origin.watch(session, request_id, prefix))


__all__ = ["ROUTED_REQUESTS", "Router", "request_kind"]
