"""The relay: sessions, request admission and routing, cache, fan-out.

Every accepted session (and the one to the upstream relay) is a
:class:`~kvcs.relay.session.RelaySession`. Requests are authorized, then routed:

* PUBLISH_NAMESPACE registers the session as publisher of that namespace and
  SUBSCRIBE_NAMESPACE watches a prefix (:mod:`kvcs.relay.namespaces`: NAMESPACE /
  NAMESPACE_DONE for local publishers and, through one deduplicated upstream
  SUBSCRIBE_NAMESPACE per prefix, for the upstream relay's).
* SUBSCRIBE / FETCH / TRACK_STATUS are answered from the cache when the track is complete;
  otherwise the first request that needs a track opens ONE upstream subscription
  (:mod:`kvcs.relay.links`) to the session publishing the longest field-wise namespace
  prefix, or to the upstream relay. On SUBSCRIBE_OK the waiting requests are served from
  the cached :class:`~kvcs.moqt.track.Track` by each downstream session's
  :class:`~kvcs.moqt.serving.TrackServer`; their cursors pause on objects still in flight.
  TRACK_STATUS for a track not cached is forwarded to the source.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

from ..admission import Admission, Limits
from ..auth import Authorizer
from ..backoff import Backoff
from ..binding import WRITE_WINDOW, open_session, serve_sessions
from ..errors import ConfigError
from ..moqt import events as ev
from ..moqt.config import SessionConfig, state_bound
from ..moqt.errors import RequestErrorCode, SessionCode
from ..moqt.origin import Origin
from ..moqt.track import Track
from ..moqt.wire import (
    AuthToken,
    Fetch,
    Subscribe,
    TrackNamespace,
    TrackStatus,
)
from ..transport import MoqtConnection, QuicSettings, Server, ensure_dev_certificate
from .announce import Announcer
from .config import ListenError, RelayConfig, parse_hostport
from .links import Link, Links
from .linkstats import LinkStats
from .metrics import Metrics, MetricsServer
from .namespaces import Namespaces
from .requests import RelayedRequests, RelayedState
from .routing import RelayRouter
from .session import RelaySession, request_kind
from .store import Store
from .tier import DiskTier

log = logging.getLogger(__name__)

IMPLEMENTATION = "kvcs-relay/0.1"
UPSTREAM_BACKOFF = Backoff(initial=0.1, maximum=5.0)
"""Waits between attempts to reach a lost upstream relay (jittered: the edges of a site
that lost the same upstream do not all come back at once)."""


class Relay:
    """A caching MOQT relay. ``await start()``, then ``await stop()``."""

    def __init__(self, config: RelayConfig, authorizer: Authorizer | None = None,
                 settings: QuicSettings | None = None) -> None:
        self.config = config
        if authorizer is None:
            authorizer = (Authorizer.from_file(config.auth) if config.auth
                          else Authorizer(anonymous=config.anonymous))
        self.auth = authorizer
        self.admission = Admission(authorizer, Limits(
            max_requests=config.max_requests_per_session,
            max_fetches=config.max_fetches_per_session, retry_ms=config.fetch_retry_ms,
            request_rate=config.request_rate, request_burst=config.request_burst))
        try:
            settings = settings or QuicSettings.for_path(mtu=config.mtu,
                                                         preset=config.quic_preset)
            settings = settings.with_transport(congestion_control=config.congestion_control)
            self.settings = dataclasses.replace(settings, max_connections=config.max_sessions,
                                                accept_rate=config.accept_rate)
            self.upstream_settings = self.settings.with_transport(
                config.upstream_quic_backend, config.upstream_congestion_control)
            """The settings of the upstream link: the relay's, or another library and
            controller for a link across sites (``upstream_quic_backend``,
            ``upstream_congestion_control``)."""
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.metrics = Metrics()
        self.origin: Origin[RelaySession] = Origin(config.cache_bytes, _Retention(self))
        """What the relay serves: the tracks it holds (its cache: copies filled from
        upstream, read from disk, kept after their publishers left) with their retention,
        and the namespace table (:attr:`namespaces` routes by it)."""
        self.server: Server | None = None
        self.metrics_server: MetricsServer | None = None
        self.host: str | None = None
        self.certfile: str | None = None
        self.keyfile: str | None = None
        """The relay's address and TLS identity once started (a KVSP HTTPS holder beside
        the relay uses them: :func:`kvcs.cli.start_kvsp_beside`)."""
        self.fingerprint: str | None = None
        self.sessions: dict[int, RelaySession] = {}
        self.namespaces = Namespaces(self.origin)
        self.links = Links(self)
        self.requests = RelayedRequests()
        """Every relayed request, one record each (:mod:`kvcs.relay.requests`)."""
        self.router = RelayRouter(self)
        """Routes every session's requests (:mod:`kvcs.relay.routing`)."""
        self.link_stats = LinkStats(self)
        self.announcer = Announcer(self)
        self.upstream_url: str | None = None
        """The upstream relay in use (the first of ``config.upstream`` that answered)."""
        self.tier = DiskTier(self, Store(config.store, config.store_bytes)) \
            if config.store else None
        """The disk tier (``--store``), or None."""
        self._next_session = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        """Opens a new upstream session after the last one was lost."""
        self._closed_out = [0, 0]  # objects/bytes sent by sessions already gone
        self.going_away = False
        m = self.metrics
        m.gauge("kvcs_relay_sessions", lambda: sum(1 for p in self.sessions.values()
                                                   if not p.upstream))
        m.gauge("kvcs_relay_cache_bytes", lambda: self.origin.bytes)
        m.gauge("kvcs_relay_cache_tracks", lambda: len(self.origin.tracks))
        m.gauge("kvcs_relay_upstream_subscriptions", lambda: len(self.links))
        m.gauge("kvcs_relay_retained_namespaces", lambda: len(self.namespaces.retained))
        m.gauge("kvcs_relay_objects_in_total", lambda: self.links.objects_in)
        m.gauge("kvcs_relay_bytes_in_total", lambda: self.links.bytes_in)
        m.gauge("kvcs_relay_objects_out_total", lambda: self.objects_out()[0])
        m.gauge("kvcs_relay_bytes_out_total", lambda: self.objects_out()[1])
        m.labelled_gauge("kvcs_relay_session_datagram_size_bytes", "session", lambda: {
            str(p.id): p.max_datagram_size for p in self.sessions.values()})
        m.gauge("kvcs_relay_sessions_refused_total",
                lambda: self.server.refused_connections if self.server else 0)
        pacer = self.admission.pacer
        if pacer is not None:
            m.gauge("kvcs_relay_requests_delayed_total", lambda: pacer.delayed)
            m.gauge("kvcs_relay_requests_waiting", lambda: pacer.waiting)

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        """The UDP port the relay listens on."""
        assert self.server is not None
        return self.server.port

    @property
    def session_memory_bound(self) -> int:
        """The most bytes one session makes the relay hold besides its cache (see
        docs/relay.md, Fairness and bounded memory): the session's MOQT state
        (:func:`~kvcs.moqt.config.state_bound` at the transport's stream limits), what
        waits to be sent to it (``max_session_backlog``, then TOO_FAR_BEHIND), a write
        window for each fetch or fill stream it may have written at once
        (``max_fetches_per_session``: more wait their turn, so 100 concurrent fills hold
        what 16 do), QUIC's flow-control windows each way (``max_data``) and the send
        watermark. The object being queued when a bound is reached comes on top. What a
        session holds now, as accounted: :attr:`RelaySession.held_bytes
        <kvcs.relay.session.RelaySession.held_bytes>`."""
        cfg, st = self.config, self.settings
        return (state_bound(SessionConfig(is_client=False), st.max_streams_bidi,
                            st.max_streams_uni)
                + cfg.max_session_backlog + cfg.max_fetches_per_session * WRITE_WINDOW
                + 2 * st.max_data + st.send_watermark)

    @property
    def upstream(self) -> RelaySession | None:
        """The session to the upstream relay, while it is open."""
        return self.namespaces.upstream

    @property
    def publishers(self) -> dict[TrackNamespace, list[RelaySession]]:
        """Namespaces published by the relay's sessions, with their publishers."""
        return self.namespaces.local_publishers()

    async def start(self) -> None:
        """Listen, connect upstream (if configured) and start the metrics endpoint; a
        socket that cannot be opened raises :class:`ListenError` (nothing stays open)."""
        cfg = self.config
        host, port = parse_hostport(cfg.listen, "--listen")
        if cfg.tls_cert:
            certfile, keyfile = cfg.tls_cert, cfg.tls_key
        else:
            dev = ensure_dev_certificate(cfg.cert_dir)
            certfile, keyfile = str(dev.certfile), str(dev.keyfile)
            self.fingerprint = dev.sha256
        self.host, self.certfile, self.keyfile = host, certfile, keyfile
        if cfg.metrics:
            mh, mp = parse_hostport(cfg.metrics, "--metrics")
            metrics_server = MetricsServer(self.metrics, ready=self.not_ready)
            try:
                await metrics_server.start(mh, mp)
            except OSError as exc:
                raise ListenError(cfg.metrics, " (--metrics)", exc) from exc
            self.metrics_server = metrics_server
        if self.tier is not None:
            try:
                self.tier.start()
            except OSError as exc:
                await self._close_started()
                raise ConfigError(f"--store {cfg.store}: {exc.strerror or exc}") from None
        try:
            if cfg.upstream:
                await self._connect_upstream()
            lim = self.admission.limits
            self.server = await serve_sessions(host, port, self._on_connection,
                                               certfile=certfile, keyfile=keyfile,
                                               settings=self.settings,
                                               implementation=IMPLEMENTATION,
                                               request_rate=lim.request_rate,
                                               request_burst=lim.request_burst)
        except OSError as exc:
            await self._close_started()
            if isinstance(exc, ConnectionError):
                raise  # the upstream relay
            raise ListenError(cfg.listen, "", exc) from exc
        self._sweeper = asyncio.create_task(self._sweep_loop())
        log.info("relay listening on %s:%d (upstream %s, cache %d bytes, %s)", host,
                 self.server.port, self.upstream_url or "none", cfg.cache_bytes,
                 "anonymous" if self.auth.anonymous else f"{len(self.auth.grants)} tokens")

    async def _close_started(self) -> None:
        """Close what a failed :meth:`start` opened."""
        up = self.upstream
        if up is not None and not up.is_closed:
            up.close()
        if self.metrics_server is not None:
            await self.metrics_server.aclose()
            self.metrics_server = None

    async def _connect_upstream(self) -> None:
        """Open a session to the first upstream relay of the list that answers (tried in
        order); raises the last one's error if none does."""
        cfg = self.config
        urls = cfg.upstreams()
        assert urls
        tokens: tuple[AuthToken, ...] = ()
        if cfg.upstream_token:
            tok = cfg.upstream_token.encode()
            if cfg.upstream_token.startswith("hex:"):
                tok = bytes.fromhex(cfg.upstream_token[4:])
            tokens = (AuthToken(3, token_type=0, value=tok),)
        for i, url in enumerate(urls):
            def bind(conn: MoqtConnection, url: str = url) -> RelaySession:
                peer = self.new_session(conn, upstream=True, request_tokens=tokens)
                peer.upstream_url = url
                return peer
            try:
                session = await open_session(
                    url, bind, settings=self.upstream_settings, cafile=cfg.upstream_cafile,
                    verify=not cfg.upstream_insecure, auth_tokens=tokens,
                    implementation=IMPLEMENTATION, timeout=cfg.upstream_timeout)
            except (ConnectionError, OSError, TimeoutError) as exc:
                if i == len(urls) - 1:
                    raise
                log.warning("upstream %s unreachable (%s), trying %s", url, exc, urls[i + 1])
                continue
            self.upstream_url = url
            self.namespaces.upstream_connected(session)
            log.info("connected upstream %s", url)
            self.announcer.sync()
            return

    async def _reconnect_upstream(self) -> None:
        """The upstream session was lost: open a new one (jittered backoff, attempts at
        INFO) and watch every prefix watched here again; requests meanwhile are answered
        from the cache (or DOES_NOT_EXIST), and consumers resume by themselves."""
        async def attempt(_n: int) -> None:
            if not self.going_away:  # a stopping relay opens no new upstream session
                await self._connect_upstream()

        await UPSTREAM_BACKOFF.retry(attempt,
                                     what="reconnecting upstream "
                                          + " or ".join(self.config.upstreams()),
                                     retry_on=(ConnectionError, OSError, TimeoutError))
        if not self.going_away:
            self.metrics.inc("kvcs_relay_upstream_reconnects_total")

    def not_ready(self) -> str | None:
        """Why the relay cannot take sessions now (None: it can): ``/readyz``."""
        if self.going_away:
            return "shutting down"
        if self.server is None:
            return "not listening yet"
        return None

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: GOAWAY downstream, grace, unsubscribe upstream, close."""
        grace = self.config.goaway_grace if grace is None else grace
        self.going_away = True
        downs = [p for p in self.sessions.values() if not p.upstream and not p.is_closed]
        for p in downs:
            p.session.goaway()
            p.flush()
        if downs and grace > 0:
            waits = [asyncio.ensure_future(p.wait_closed()) for p in downs]
            await asyncio.wait(waits, timeout=grace)
            for w in waits:
                w.cancel()
        for link in self.links.all():
            self.links.cancel(link)
        if self._reconnecting is not None:
            # Python 3.11's asyncio.wait_for can lose a cancel that races its inner
            # future (gh-86296): the retry loop then went on against an upstream already
            # gone, and stop() waited forever (make test hung once in ~300 runs). The
            # loop's next attempt sees going_away and ends; the wait is bounded anyway.
            self._reconnecting.cancel()
            await asyncio.wait({self._reconnecting}, timeout=self.config.upstream_timeout
                               + UPSTREAM_BACKOFF.maximum)
        up = self.upstream
        if up is not None and not up.is_closed:
            up.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(up.wait_closed(), 1.0)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self.tier is not None:
            await self.tier.aclose()
        if self.server is not None:
            await self.server.aclose(timeout=1.0)
        if self.admission.pacer is not None:
            self.admission.pacer.close()
        if self.metrics_server is not None:
            await self.metrics_server.aclose()
        log.info("relay stopped")

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            try:
                self.sweep()
            except Exception:  # pragma: no cover - defensive
                log.exception("cache sweep failed")

    def sweep(self) -> None:
        """Drop aged-out objects and the tracks they emptied, then enforce the byte
        budget (:meth:`Origin.sweep <kvcs.moqt.origin.Origin.sweep>`); the disk tier ages
        out and saves (``--store``)."""
        self.origin.sweep()
        if self.tier is not None:
            self.tier.sweep()
        self.announcer.sync()

    def objects_out(self) -> tuple[int, int]:
        """(objects, payload bytes) sent to peers, over the relay's lifetime."""
        n, b = self._closed_out
        for p in self.sessions.values():
            n += p.server.objects_sent
            b += p.server.bytes_sent
        return n, b

    # ------------------------------------------------------------------ sessions

    def new_session(self, conn: MoqtConnection, *, upstream: bool = False,
                    request_tokens: tuple[AuthToken, ...] = ()) -> RelaySession:
        """Bind a new connection (accepted, or the upstream one) to a relay session."""
        self._next_session += 1
        peer = RelaySession(conn, self, self._next_session, upstream=upstream,
                            request_tokens=request_tokens)
        self.sessions[peer.id] = peer
        if not upstream:
            self.metrics.inc("kvcs_relay_sessions_total")
        return peer

    def _on_connection(self, conn: MoqtConnection) -> None:
        peer = self.new_session(conn)
        log.debug("session %d opened", peer.id)
        if self.going_away:
            peer.session.goaway()

    def close_session(self, peer: RelaySession, code: int, reason: str) -> None:
        """Close a session that broke the protocol (or a rule of the relay)."""
        if peer.is_closed:
            return
        log.warning("closing session %d: %s (%#x)", peer.id, reason, code)
        if code == SessionCode.PROTOCOL_VIOLATION:
            self.metrics.inc("kvcs_relay_protocol_errors_total")
        peer.close(code, reason)

    def on_session_closed(self, peer: RelaySession, code: int, reason: str) -> None:
        """Forget a session that ended, and what it asked for, published and fed."""
        log.info("session %d closed (%#x %s)", peer.id, code, reason)
        self._closed_out[0] += peer.server.objects_sent
        self._closed_out[1] += peer.server.bytes_sent
        self.link_stats.session_closed(peer)
        self.sessions.pop(peer.id, None)
        # requests it made
        for r in self.requests.of_peer(peer):
            link, served = r.link, r.state is RelayedState.SERVED
            self.requests.end(r)
            if link is not None and served:
                self.links.maybe_idle(link)
        was_upstream = peer is self.upstream
        # its watches and the namespaces it published (or announced, as the upstream)
        self.namespaces.session_closed(peer)
        # TRACK_STATUS requests forwarded to it: answer them downstream now
        for r in self.requests.forwarded_to(peer):
            assert r.upstream_id is not None
            self.on_status_answer(peer, r.upstream_id, None)
        # links it fed
        self.links.source_closed(peer)
        self.announcer.sync()
        if was_upstream:
            (log.info if self.going_away else log.error)(
                "upstream session lost (%#x %s)", code, reason)
            if not self.going_away and self._reconnecting is None:
                self._reconnecting = asyncio.create_task(self._reconnect_upstream())
                self._reconnecting.add_done_callback(self._reconnected)

    def _reconnected(self, _task: asyncio.Task[None]) -> None:
        self._reconnecting = None

    # ------------------------------------------------------------------ requests

    def reject(self, peer: RelaySession, rid: int, kind: str, code: int, reason: str,
               retry: int = 0) -> None:
        """REQUEST_ERROR for request ``rid`` of ``peer`` (and count it)."""
        try:
            name = RequestErrorCode(code).name.lower()
        except ValueError:
            name = f"0x{code:x}"
        self.metrics.request_answered((peer.id, rid), kind, name)
        # DOES_NOT_EXIST is the everyday answer to a discovery probe (a consumer asks for
        # prefixes nobody published): debug, not one info line per fetch
        log.log(logging.DEBUG if code == RequestErrorCode.DOES_NOT_EXIST else logging.INFO,
                "session %d: %s %d refused: %s (%s)", peer.id, kind, rid, name, reason)
        with contextlib.suppress(KeyError, ValueError):
            peer.session.request_error(rid, code, reason, retry_interval=retry)
        peer.schedule_flush()

    def _ok(self, kind: str, peer: RelaySession, rid: int) -> None:
        self.metrics.request_answered((peer.id, rid), kind, "ok")

    def on_cancelled(self, peer: RelaySession, rid: int) -> None:
        """``peer``'s peer cancelled request ``rid`` (one the TrackServer did not serve)."""
        self.metrics.request_forgotten((peer.id, rid))
        if self.tier is not None and self.tier.cancelled(peer, rid):
            return
        r = self.requests.get(peer, rid)
        if r is not None:
            self.requests.end(r)
            if r.link is not None and r.state is RelayedState.WAITING:
                self.links.maybe_idle(r.link)
            source = r.source
            if source is not None and r.upstream_id is not None and not source.is_closed:
                source.session.cancel(r.upstream_id)  # the TRACK_STATUS forwarded for it
                source.schedule_flush()
            return
        if self.namespaces.withdraw(peer, rid):
            self.announcer.sync()
            return
        if self.namespaces.unwatch(peer, rid):
            self.announcer.sync()

    # ------------------------------------------------------------------ routing

    def route_again(self, peer: RelaySession, e: ev.RequestReceived) -> None:
        """Route request ``e`` of ``peer`` again (it waited for the disk tier)."""
        self.router.route_track(peer, e)

    def wait(self, peer: RelaySession, e: ev.RequestReceived, link: Link) -> None:
        """Request ``e`` of ``peer`` waits until ``link`` is established (or fails)."""
        self.requests.wait(peer, e, link)

    def serve(self, peer: RelaySession, e: ev.RequestReceived, track: Track,
              link: Link | None) -> None:
        """Serve request ``e`` of ``peer`` from the cached ``track`` (fed by ``link``)."""
        m = e.message
        assert isinstance(m, Subscribe | Fetch | TrackStatus)
        rid = e.request_id
        kind = request_kind(m)
        track.touch()
        if isinstance(m, TrackStatus):
            waited = self.requests.get(peer, rid)
            if waited is not None:
                self.requests.end(waited)
            peer.server.serve(rid, m, track)
            self._ok(kind, peer, rid)
            peer.schedule_flush()
            return
        self.requests.serve(peer, e, link)
        if peer.server.serve(rid, m, track):
            self._ok(kind, peer, rid)
        else:
            self.metrics.request_answered((peer.id, rid), kind, "rejected")
        if not peer.server.serving(rid):
            self.on_served_done(peer, rid)
        peer.schedule_flush()

    def on_served_done(self, peer: RelaySession, rid: int) -> None:
        """A subscription or fetch served to ``peer`` ended (done, cancelled, failed)."""
        peer.schedule_flush()  # PUBLISH_DONE / FIN / reset to send
        r = self.requests.get(peer, rid)
        if r is None:
            return
        link = r.link
        self.requests.end(r)
        if link is not None:
            self.links.maybe_idle(link)

    def on_status_answer(self, source: RelaySession, rid: int, e: ev.Event | None) -> None:
        """The answer to a forwarded TRACK_STATUS (None: ``source`` went away)."""
        r = self.requests.answered_by(source, rid)
        assert r is not None
        self.requests.end(r)
        peer, drid = r.peer, r.request_id
        if peer.is_closed:
            return
        if isinstance(e, ev.RequestAccepted):
            with contextlib.suppress(KeyError, ValueError):
                peer.session.request_ok(drid, e.message.params, e.message.track_properties)
            self._ok("track_status", peer, drid)
        elif isinstance(e, ev.RequestRejected):
            self.reject(peer, drid, "track_status", e.message.code, e.message.reason)
        else:
            reason = "publisher went away" if e is None else "upstream failed"
            self.reject(peer, drid, "track_status", RequestErrorCode.INTERNAL_ERROR, reason)
        peer.schedule_flush()


class _Retention:
    """The relay's retention policy for its origin: a track its upstream link feeds to
    subscribers is followed, an evicted one ends its link and may end a kept
    publication; every eviction, aged-out object and shed byte is counted."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def pinned(self, track: Track) -> bool:
        link = self.relay.links.feeding(track)
        return link is not None and self.relay.requests.feeds_served(link)

    def fed(self, track: Track) -> bool:
        return self.relay.links.feeding(track) is not None

    def evicted(self, track: Track, reason: str) -> None:
        relay = self.relay
        relay.metrics.inc("kvcs_relay_cache_evictions_total", reason=reason)
        link = relay.links.feeding(track)
        if link is not None:
            relay.links.evicted(link)
        if reason == "bytes" and relay.tier is not None \
                and relay.tier.store.has(track.full_name):
            return  # evicted from memory only: the store still holds it whole
        relay.namespaces.track_evicted(track, reason)
        relay.announcer.sync()

    def expired(self, track: Track, objects: int) -> None:
        self.relay.metrics.inc("kvcs_relay_cache_expired_objects_total", objects)

    def shed(self, track: Track, nbytes: int) -> None:
        self.relay.metrics.inc("kvcs_relay_cache_shed_bytes_total", nbytes)
