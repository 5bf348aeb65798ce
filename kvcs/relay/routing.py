"""The relay's routing: :class:`~kvcs.routing.Router` (the one router endpoints use too)
with the relay's hooks.

Before admission, a request the relay does not relay is NOT_SUPPORTED, one that comes
while the relay goes away GOING_AWAY, and one from the upstream relay (a track under a
namespace announced to it, :mod:`kvcs.relay.announce`) is routed without admission (it
authorized its own client). A track the origin holds complete is served from it (a cache
hit); any other is resolved: the link already open for it (served once it is established,
else the request waits), the disk tier, or the source (the session publishing the
longest prefix, else the upstream relay): a TRACK_STATUS is forwarded to it, a SUBSCRIBE
or FETCH opens ONE upstream subscription (:mod:`kvcs.relay.links`). Every answer is
counted and timed (``kvcs_relay_requests_total``, ``kvcs_relay_request_seconds``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..moqt import events as ev
from ..moqt.errors import RequestErrorCode
from ..moqt.track import FullTrackName, Track
from ..moqt.wire import Fetch, Subscribe, TrackNamespace, TrackStatus
from ..routing import ROUTED_REQUESTS, Router, request_kind
from .session import ROUTED_DOWN, RelaySession

if TYPE_CHECKING:
    from .relay import Relay


class RelayRouter(Router[RelaySession]):
    """The router of a relay's sessions; see the module docstring."""

    def __init__(self, relay: Relay) -> None:
        super().__init__(relay.origin, relay.admission)
        self.relay = relay

    def accepts(self, peer: RelaySession, e: ev.RequestReceived, kind: str) -> bool:
        relay = self.relay
        rid = e.request_id
        relay.metrics.request_started((peer.id, rid))
        if kind not in ROUTED_REQUESTS or (peer.upstream and kind not in ROUTED_DOWN):
            relay.reject(peer, rid, kind, RequestErrorCode.NOT_SUPPORTED,
                         "not supported by this relay")
            return False
        if relay.going_away:
            relay.reject(peer, rid, kind, RequestErrorCode.GOING_AWAY, "relay shutting down")
            return False
        if peer.upstream:
            # the upstream relay asks for a track under a namespace we announced to it
            # (kvcs.relay.announce): it authorized its own client; we chose to connect to it
            m = e.message
            assert isinstance(m, Subscribe | Fetch | TrackStatus)
            if relay.announcer.covers(tuple(m.namespace)):
                self.route_track(peer, e)
            else:
                relay.reject(peer, rid, kind, RequestErrorCode.DOES_NOT_EXIST,
                             "not announced upstream")
            return False
        return True

    def refuse(self, peer: RelaySession, e: ev.RequestReceived, code: int, reason: str,
               retry_ms: int = 0) -> None:
        self.relay.reject(peer, e.request_id, request_kind(e.message), code, reason, retry_ms)

    def close(self, peer: RelaySession, code: int, reason: str) -> None:
        self.relay.close_session(peer, code, reason)

    def answered(self, peer: RelaySession, request_id: int, kind: str,
                 result: str = "ok") -> None:
        self.relay.metrics.request_answered((peer.id, request_id), kind, result)

    def holds(self, track: Track) -> bool:
        return track.complete  # a copy still being filled is resolved (its link)

    def serve(self, peer: RelaySession, e: ev.RequestReceived, track: Track) -> None:
        self.relay.metrics.inc("kvcs_relay_cache_hits_total")
        self.relay.serve(peer, e, track, None)

    def resolve(self, peer: RelaySession, e: ev.RequestReceived, key: FullTrackName,
                track: Track | None) -> None:
        relay = self.relay
        link = relay.links.get(key)
        if link is not None and peer.upstream and link.source.upstream:
            # the upstream asks for what we are asking it: a loop (a namespace we announced
            # and it routes back to us); refusing ends both requests
            self.refuse(peer, e, RequestErrorCode.DOES_NOT_EXIST,
                        "not held here (asked upstream)")
            return
        if link is not None:
            if link.established:
                relay.metrics.inc("kvcs_relay_cache_hits_total")
                relay.serve(peer, e, link.track, link)
            else:
                relay.wait(peer, e, link)
            return
        if track is None and relay.tier is not None and relay.tier.route(peer, e, key):
            return  # the store holds it: routed again once loaded
        source = relay.namespaces.source(key[0])
        if source is not None and source.upstream and peer.upstream:
            source = None  # never back up where the request came from (no loops)
        if source is None:
            self.refuse(peer, e, RequestErrorCode.DOES_NOT_EXIST,
                        "no publisher for this namespace")
            return
        if isinstance(e.message, TrackStatus):
            fwd = source.session.track_status(key[0], key[1], source.request_params())
            relay.requests.forward(peer, e, source, fwd)
            source.schedule_flush()
            return
        relay.metrics.inc("kvcs_relay_cache_misses_total")
        relay.wait(peer, e, relay.links.open(key, source, track))

    def published(self, peer: RelaySession, request_id: int,
                  namespace: TrackNamespace) -> None:
        self.relay.namespaces.publish(peer, request_id, namespace)
        self.relay.announcer.sync()

    def watched(self, peer: RelaySession, request_id: int, prefix: TrackNamespace) -> None:
        self.relay.namespaces.watch(peer, request_id, prefix)


__all__ = ["RelayRouter"]
