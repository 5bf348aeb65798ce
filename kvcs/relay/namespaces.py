"""The relay's namespaces: who publishes what, who watches which prefix, and the upstream.

Local publishers (PUBLISH_NAMESPACE of a session) and the namespaces the upstream relay
announces (NAMESPACE on the relay's own SUBSCRIBE_NAMESPACE) are publications in one
:class:`~kvcs.moqt.origin.Origin`; the sessions' SUBSCRIBE_NAMESPACE requests are its
watches, so every watcher gets one NAMESPACE / NAMESPACE_DONE per change whatever its
sources. A prefix watched downstream is watched upstream by ONE SUBSCRIBE_NAMESPACE,
cancelled when its last watcher goes.

A completed publication outlives its publisher: when the last publisher of a namespace
goes (its PUBLISH_NAMESPACE cancelled, its session closed, the upstream relay's
NAMESPACE_DONE, or the upstream session itself), the relay keeps the namespace published
in its own name if it holds at least one track under it and every such track is
complete. It withdraws it (NAMESPACE_DONE to the watchers) once age has emptied every one
of those tracks, or as soon as one is evicted for space (the publication would no longer
be whole). See docs/relay.md.
"""

from __future__ import annotations

import logging

from ..auth import render_namespace
from ..binding import answer_namespace_update, send_namespace_notices
from ..moqt import events as ev
from ..moqt.errors import SessionUsageError
from ..moqt.origin import NamespaceNotice, Origin
from ..moqt.track import Track
from ..moqt.wire import Parameters, TrackNamespace, namespace_has_prefix
from .session import RelaySession

log = logging.getLogger(__name__)


class Namespaces:
    """Namespace table and routing of one relay; see the module docstring."""

    def __init__(self, origin: Origin[RelaySession]) -> None:
        self.origin = origin
        """The relay's origin: its namespace table here, its tracks (the cache) too."""
        self.upstream: RelaySession | None = None
        """The session to the upstream relay, while it is open."""
        self.retained: set[TrackNamespace] = set()
        """Namespaces the relay publishes itself: completed publications whose publishers
        left."""
        self._upstream_watches: dict[TrackNamespace, int] = {}  # prefix -> upstream rid
        # an upstream REQUEST_UPDATE id -> the downstream update it answers (sync)
        self._syncs: dict[int, tuple[RelaySession, ev.UpdateReceived]] = {}

    # ------------------------------------------------------------------ routing

    def source(self, namespace: TrackNamespace) -> RelaySession | None:
        """Where requests for a track in ``namespace`` go: the session publishing the
        longest prefix of it, else the upstream relay, else None."""
        local = self.origin.publisher(namespace,
                                      lambda s: not s.upstream and not s.is_closed)
        if local is not None:
            return local
        up = self.upstream
        return up if up is not None and not up.is_closed else None

    def local_publishers(self) -> dict[TrackNamespace, list[RelaySession]]:
        """The namespaces published by the relay's sessions, with their publishers."""
        out: dict[TrackNamespace, list[RelaySession]] = {}
        for ns in self.origin.namespaces:
            local = [s for s in self.origin.publishers(ns) if s is not None and not s.upstream]
            if local:
                out[ns] = local
        return out

    def open_requests(self, session: RelaySession) -> int:
        """PUBLISH_NAMESPACE and SUBSCRIBE_NAMESPACE requests ``session``'s peer has open."""
        return len(self.origin.publications(session)) + len(self.origin.watches(session))

    # ------------------------------------------------------------------ publishers

    def publish(self, session: RelaySession, request_id: int, namespace: TrackNamespace) -> None:
        """``session``'s peer publishes ``namespace`` (its PUBLISH_NAMESPACE was accepted)."""
        log.info("session %d publishes %s", session.id, render_namespace(namespace))
        send_namespace_notices(self.origin.publish(namespace, session, request_id))

    def withdraw(self, session: RelaySession, request_id: int) -> bool:
        """End the publication of request ``request_id``; False if it is none."""
        for rid, ns in self.origin.publications(session):
            if rid == request_id:
                log.info("session %d withdrew %s", session.id, render_namespace(ns))
                send_namespace_notices(self._end(session, rid, ns))
                return True
        return False

    def _end(self, session: RelaySession, request_id: int,
             namespace: TrackNamespace) -> list[NamespaceNotice[RelaySession]]:
        """End one publication; the relay keeps a completed one it was the last of."""
        if self.origin.publishers(namespace) == [session]:
            self._keep_if_complete(namespace, "its publisher left")  # still available: no notice
        return self.origin.withdraw(namespace, session, request_id)

    def _keep_if_complete(self, namespace: TrackNamespace,
                          why: str) -> list[NamespaceNotice[RelaySession]]:
        """Publish ``namespace`` in the relay's own name if it holds it complete (and does
        not already); the NAMESPACE notices if it was not available before."""
        if namespace in self.retained or not self._holds_complete(namespace):
            return []
        self.retained.add(namespace)
        log.info("keeping %s: %s, the relay holds it complete", render_namespace(namespace),
                 why)
        return self.origin.publish(namespace)

    def _holds_complete(self, namespace: TrackNamespace) -> bool:
        held = [t for t in self.origin.under(namespace) if t.count]
        return bool(held) and all(t.complete for t in held)

    def track_evicted(self, track: Track, reason: str) -> None:
        """The cache evicted ``track``: a namespace kept for it goes when it was the last
        one holding objects, or at once if it was evicted for space (``reason`` not age)."""
        for ns in [n for n in self.retained if namespace_has_prefix(track.namespace, n)]:
            if reason == "age" and any(t.count and t is not track
                                       for t in self.origin.under(ns)):
                continue
            self.retained.discard(ns)
            log.info("withdrawing kept %s: a track was evicted (%s)", render_namespace(ns),
                     reason)
            send_namespace_notices(self.origin.withdraw(ns))

    def keep_stored(self, namespace: TrackNamespace) -> None:
        """Publish ``namespace`` in the relay's own name: its disk tier holds it complete
        (a restarted relay, :mod:`kvcs.relay.tier`)."""
        if namespace not in self.retained:
            self.retained.add(namespace)
            log.info("keeping %s: stored complete", render_namespace(namespace))
            send_namespace_notices(self.origin.publish(namespace))

    def release_kept(self, namespace: TrackNamespace) -> None:
        """Withdraw a kept namespace nothing holds any more (e.g. aged out on disk)."""
        if namespace in self.retained:
            self.retained.discard(namespace)
            log.info("withdrawing kept %s: nothing held any more", render_namespace(namespace))
            send_namespace_notices(self.origin.withdraw(namespace))

    # ------------------------------------------------------------------ watchers

    def watch(self, session: RelaySession, request_id: int, prefix: TrackNamespace) -> None:
        """``session``'s peer watches ``prefix`` (SUBSCRIBE_NAMESPACE accepted): it gets the
        known namespaces now, and the upstream relay is asked about the prefix."""
        send_namespace_notices(self.origin.watch(session, request_id, prefix))
        self._watch_upstream(tuple(prefix))

    def upstream_connected(self, session: RelaySession) -> None:
        """A (new) session to the upstream relay: ask it about every prefix watched here."""
        self.upstream = session
        for prefix in self.origin.watched_prefixes():
            self._watch_upstream(prefix)

    def _watch_upstream(self, prefix: TrackNamespace) -> None:
        up = self.upstream
        if up is None or up.is_closed or prefix in self._upstream_watches:
            return
        self._upstream_watches[prefix] = up.session.subscribe_namespace(
            prefix, up.request_params())
        up.schedule_flush()

    def sync(self, session: RelaySession, e: ev.UpdateReceived) -> bool:
        """Answer a REQUEST_UPDATE of ``session``'s peer on one of its watches (False if
        the request is no watch). One that changes nothing asks whether the watcher has
        every namespace the relay can know (:meth:`NamespaceWatch.sync
        <kvcs.endpoint.NamespaceWatch.sync>`): answered at once, or, when the prefix is
        watched upstream, once the upstream relay answered the same question, so that
        its NAMESPACEs come first."""
        prefix = self.origin.watches(session).get(e.request_id)
        if prefix is None:
            return False
        up = self.upstream
        up_rid = self._upstream_watches.get(prefix)
        if e.params.track_namespace_prefix is None and up is not None and \
                not up.is_closed and up_rid is not None:
            try:
                uid = up.session.request_update(up_rid, Parameters())
            except (SessionUsageError, KeyError, ValueError) as exc:
                log.info("cannot ask the upstream relay to confirm %s: %s",
                         render_namespace(prefix), exc)
            else:
                self._syncs[uid] = (session, e)
                up.schedule_flush()
                return True
        answer_namespace_update(session.session, e)
        session.schedule_flush()
        return True

    def _answer_syncs(self, upstream_update: int | None = None) -> None:
        """Answer the downstream updates waiting for the upstream one (None: all)."""
        uids = list(self._syncs) if upstream_update is None else [upstream_update]
        for uid in uids:
            waiting = self._syncs.pop(uid, None)
            if waiting is None:
                continue
            session, e = waiting
            if not session.is_closed and e.request_id in self.origin.watches(session):
                answer_namespace_update(session.session, e)
                session.schedule_flush()

    def unwatch(self, session: RelaySession, request_id: int) -> bool:
        """End the watch of request ``request_id``; False if it is none. The upstream
        SUBSCRIBE_NAMESPACE of its prefix ends with the last watcher of that prefix."""
        prefix = self.origin.unwatch(session, request_id)
        if prefix is None:
            return False
        for uid, (waiting, e) in list(self._syncs.items()):
            if waiting is session and e.request_id == request_id:
                del self._syncs[uid]  # nobody to answer when the upstream does
        up = self.upstream
        if up is None or self.origin.is_watched(prefix):
            return True
        up_rid = self._upstream_watches.pop(prefix, None)
        if up_rid is not None:
            up.session.cancel(up_rid)
            up.schedule_flush()
            # as for a NAMESPACE_DONE: a completed publication the relay holds stays
            for rid, ns in self.origin.publications(up):
                if rid == up_rid:
                    send_namespace_notices(self._end(up, rid, ns))
        return True

    # ------------------------------------------------------------------ events

    def session_closed(self, session: RelaySession) -> None:
        """Drop the watches and publications of a session that ended."""
        for rid in self.origin.watches(session):
            self.unwatch(session, rid)
        for rid, ns in self.origin.publications(session):
            log.info("session %d withdrew %s", session.id, render_namespace(ns))
            send_namespace_notices(self._end(session, rid, ns))
        if session is self.upstream:
            self.upstream = None
            self._upstream_watches.clear()
            self._answer_syncs()
            self._keep_held_publications()

    def _keep_held_publications(self) -> None:
        """The upstream relay is gone: publish in the relay's own name every namespace
        whose tracks it holds complete and nobody publishes (the upstream's NAMESPACEs
        end with the last downstream watcher, often before its tracks were pulled)."""
        for ns in dict.fromkeys(t.namespace for t in self.origin.tracks.values()):
            if not self.origin.publishers(ns):
                send_namespace_notices(self._keep_if_complete(ns, "the upstream is gone"))

    def on_upstream_event(self, request_id: int, e: ev.Event) -> bool:
        """Take an event of an upstream SUBSCRIBE_NAMESPACE; False if it is not one."""
        up = self.upstream
        if up is None or request_id not in self._upstream_watches.values():
            return False
        if isinstance(e, ev.NamespaceAnnounced):
            send_namespace_notices(self.origin.publish(e.namespace, up, request_id))
        elif isinstance(e, ev.NamespaceWithdrawn):
            send_namespace_notices(self._end(up, request_id, e.namespace))
        elif isinstance(e, ev.RequestAccepted | ev.RequestRejected) and \
                e.update_id is not None:
            self._answer_syncs(e.update_id)  # refused: the downstream gets what is known
        elif isinstance(e, ev.RequestRejected | ev.RequestFailed):
            self._answer_syncs()
            for prefix, rid in list(self._upstream_watches.items()):
                if rid == request_id:
                    del self._upstream_watches[prefix]
            log.warning("upstream SUBSCRIBE_NAMESPACE failed: %s", e)
        elif not isinstance(e, ev.RequestAccepted):
            return False
        return True
