"""The relay's relayed requests: one record per request, its lifecycle as an enum.

A SUBSCRIBE, FETCH or TRACK_STATUS of a downstream peer that the relay routes (beyond a
TRACK_STATUS answered at once from the origin) is one :class:`Relayed` record from its
arrival to its end, in the style of :mod:`kvcs.moqt.requests`: its
:class:`RelayedState` says where it is (waiting for the upstream subscription that feeds
its track, forwarded to the source, served from the origin's track), and the
:class:`RelayedRequests` table indexes the records by peer, by the link they depend on
and by the upstream request that answers them. Nothing else keeps a relayed request's
state: the links, the sessions and the router ask the table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..moqt import events as ev
from ..moqt.wire import Fetch
from ..routing import request_kind

if TYPE_CHECKING:
    from .links import Link
    from .session import RelaySession


class RelayedState(enum.Enum):
    """Where a relayed request is."""

    WAITING = "waiting"
    """Its track's upstream subscription (:attr:`Relayed.link`) has no SUBSCRIBE_OK yet."""
    FORWARDED = "forwarded"
    """A TRACK_STATUS asked of the source (:attr:`Relayed.source`,
    :attr:`Relayed.upstream_id`); answered downstream when the source answers."""
    SERVED = "served"
    """The peer's TrackServer serves it from the origin's track (fed by
    :attr:`Relayed.link`, or complete: no link)."""
    ENDED = "ended"
    """Answered or ended; no longer in the table."""


@dataclass(eq=False, slots=True)
class Relayed:
    """One request of a downstream peer that the relay routes."""

    peer: RelaySession
    event: ev.RequestReceived
    state: RelayedState
    link: Link | None = None
    """The upstream subscription it waits for or is fed by."""
    source: RelaySession | None = None
    upstream_id: int | None = None
    """FORWARDED: the session asked and the Request ID of the relay's TRACK_STATUS there."""

    @property
    def request_id(self) -> int:
        """The peer's Request ID."""
        return self.event.request_id

    @property
    def kind(self) -> str:
        """``subscribe``, ``fetch`` or ``track_status``."""
        return request_kind(self.event.message)

    @property
    def is_fetch(self) -> bool:
        """True for a FETCH (admission counts them)."""
        return isinstance(self.event.message, Fetch)


class RelayedRequests:
    """Every relayed request of one relay; see the module docstring."""

    def __init__(self) -> None:
        self._by_peer: dict[RelaySession, dict[int, Relayed]] = {}
        self._by_link: dict[Link, dict[Relayed, None]] = {}
        self._by_upstream: dict[tuple[RelaySession, int], Relayed] = {}

    def __len__(self) -> int:
        return sum(len(mine) for mine in self._by_peer.values())

    # ------------------------------------------------------------------ lookups

    def get(self, peer: RelaySession, request_id: int) -> Relayed | None:
        """The record of ``peer``'s request ``request_id``, if it is relayed."""
        return self._by_peer.get(peer, {}).get(request_id)

    def of_peer(self, peer: RelaySession) -> list[Relayed]:
        """``peer``'s relayed requests."""
        return list(self._by_peer.get(peer, {}).values())

    def on_link(self, link: Link, state: RelayedState | None = None) -> list[Relayed]:
        """The requests that wait for or are fed by ``link`` (in ``state`` only, if
        given), oldest first."""
        return [r for r in self._by_link.get(link, ()) if state is None or r.state is state]

    def feeds_served(self, link: Link) -> bool:
        """True while ``link`` feeds some request being served (its track is followed)."""
        return any(r.state is RelayedState.SERVED for r in self._by_link.get(link, ()))

    def needs(self, link: Link) -> bool:
        """True while some request waits for or is fed by ``link``."""
        return bool(self._by_link.get(link))

    def answered_by(self, source: RelaySession, upstream_id: int) -> Relayed | None:
        """The FORWARDED request that ``source``'s answer to ``upstream_id`` is for."""
        return self._by_upstream.get((source, upstream_id))

    def forwarded_to(self, source: RelaySession) -> list[Relayed]:
        """The requests forwarded to ``source`` and not answered yet."""
        return [r for (s, _), r in self._by_upstream.items() if s is source]

    def open_requests(self, peer: RelaySession) -> int:
        """Relayed requests ``peer``'s peer has open."""
        return len(self._by_peer.get(peer, ()))

    def open_fetches(self, peer: RelaySession) -> int:
        """Relayed FETCHes ``peer``'s peer has open."""
        return sum(1 for r in self._by_peer.get(peer, {}).values() if r.is_fetch)

    # ------------------------------------------------------------------ transitions

    def wait(self, peer: RelaySession, e: ev.RequestReceived, link: Link) -> Relayed:
        """Request ``e`` waits for ``link``'s SUBSCRIBE_OK."""
        return self._add(Relayed(peer, e, RelayedState.WAITING, link))

    def forward(self, peer: RelaySession, e: ev.RequestReceived, source: RelaySession,
                upstream_id: int) -> Relayed:
        """TRACK_STATUS ``e`` was asked of ``source`` as ``upstream_id``."""
        r = self._add(Relayed(peer, e, RelayedState.FORWARDED, None, source, upstream_id))
        self._by_upstream[source, upstream_id] = r
        return r

    def serve(self, peer: RelaySession, e: ev.RequestReceived, link: Link | None) -> Relayed:
        """Request ``e`` is served from the origin's track (fed by ``link``); a waiting
        record moves on, keeping its place."""
        r = self.get(peer, e.request_id)
        if r is None:
            return self._add(Relayed(peer, e, RelayedState.SERVED, link))
        if r.link is not link:
            self._unlink(r)
            r.link = link
            if link is not None:
                self._by_link.setdefault(link, {})[r] = None
        r.state = RelayedState.SERVED
        return r

    def detach(self, r: Relayed) -> None:
        """``r`` no longer depends on its link (the link ended; the track stays)."""
        self._unlink(r)
        r.link = None

    def end(self, r: Relayed) -> None:
        """Forget a record (answered, ended, cancelled, its peer gone)."""
        if r.state is RelayedState.ENDED:
            return
        mine = self._by_peer.get(r.peer)
        if mine is not None and mine.get(r.request_id) is r:
            del mine[r.request_id]
            if not mine:
                del self._by_peer[r.peer]
        self._unlink(r)
        if r.source is not None and r.upstream_id is not None:
            self._by_upstream.pop((r.source, r.upstream_id), None)
        r.state = RelayedState.ENDED

    def _add(self, r: Relayed) -> Relayed:
        self._by_peer.setdefault(r.peer, {})[r.request_id] = r
        if r.link is not None:
            self._by_link.setdefault(r.link, {})[r] = None
        return r

    def _unlink(self, r: Relayed) -> None:
        if r.link is None:
            return
        mine = self._by_link.get(r.link)
        if mine is not None:
            mine.pop(r, None)
            if not mine:
                del self._by_link[r.link]


__all__ = ["Relayed", "RelayedRequests", "RelayedState"]
