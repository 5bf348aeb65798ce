"""The relay: sessions, namespace routing, one upstream subscription per track, fan-out.

Every accepted session becomes a :class:`Peer`. Requests are authorized, then routed:

* PUBLISH_NAMESPACE registers the peer as publisher of that namespace.
* SUBSCRIBE / FETCH / TRACK_STATUS are answered from the cache when the track is complete;
  otherwise the first request that needs a track opens ONE upstream subscription (a
  :class:`Link`) to the publisher with the longest field-wise namespace prefix, or to the
  upstream relay, with the exactly-once pattern (Next Object + fill of everything not yet
  cached). On SUBSCRIBE_OK the waiting requests are served from the cached
  :class:`~kvcs.moqt.track.Track` by each downstream session's
  :class:`~kvcs.moqt.serving.TrackServer`; their cursors pause on objects still in flight.
* SUBSCRIBE_NAMESPACE gets NAMESPACE / NAMESPACE_DONE for local publishers and, through
  one deduplicated upstream SUBSCRIBE_NAMESPACE per prefix, for the upstream relay's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from ..auth import PUBLISH, SUBSCRIBE, Authorizer, render_namespace
from ..endpoint import Endpoint, serve_endpoints
from ..moqt import events as ev
from ..moqt.errors import PublishDoneCode, RequestErrorCode, SessionCode, StreamResetCode
from ..moqt.track import CachedObject, FullTrackName, ImmutabilityError, Track
from ..moqt.wire import (
    END_OF_NON_EXISTENT_RANGE,
    AuthToken,
    Fetch,
    GroupOrder,
    Location,
    LocationFilter,
    Parameters,
    PublishNamespace,
    Subscribe,
    SubscribeNamespace,
    TrackNamespace,
    TrackStatus,
    namespace_has_prefix,
)
from ..transport import QuicSettings, ensure_dev_certificate
from ..transport.binding import Server
from .cache import Cache, exact_payload
from .config import RelayConfig, parse_hostport
from .metrics import Metrics, MetricsServer

log = logging.getLogger(__name__)

_TYPES = {Subscribe: "subscribe", Fetch: "fetch", TrackStatus: "track_status",
          PublishNamespace: "publish_namespace", SubscribeNamespace: "subscribe_namespace"}


@dataclass(eq=False)
class Peer:
    """One MOQT session of the relay (downstream client, publisher, or the upstream)."""

    endpoint: Endpoint
    id: int
    upstream: bool = False
    namespaces: dict[int, TrackNamespace] = field(default_factory=dict)
    watchers: dict[int, TrackNamespace] = field(default_factory=dict)
    announced: dict[int, set[TrackNamespace]] = field(default_factory=dict)
    waiting: dict[int, Link] = field(default_factory=dict)  # rid -> link it waits for
    served: dict[int, Link | None] = field(default_factory=dict)  # rid -> link (None: cache)
    fetches: set[int] = field(default_factory=set)
    status_fwd: dict[int, tuple[Peer, int]] = field(default_factory=dict)  # our rid -> (peer, rid)
    closed: bool = False

    @property
    def session(self) -> Any:
        """The sans-IO session."""
        return self.endpoint.session

    def open_requests(self) -> int:
        """Requests this peer has open with us."""
        return (len(self.waiting) + len(self.served) + len(self.namespaces)
                + len(self.watchers))

    def open_fetches(self) -> int:
        """Fetches of this peer being served or waiting."""
        return len(self.fetches)


@dataclass(eq=False)
class Link:
    """The one upstream subscription feeding a cached track."""

    key: FullTrackName
    source: Peer
    track: Track
    request_id: int = -1
    established: bool = False
    fill_end: Location | None = None
    fill_pending: bool = False
    fill_ended_early: bool = False
    """The fill stream ended before SUBSCRIBE_OK arrived (streams are not ordered)."""
    unknown_ranges: bool = False
    lost: bool = False
    waiting: list[tuple[Peer, ev.RequestReceived]] = field(default_factory=list)
    downstream: dict[tuple[int, int], Peer] = field(default_factory=dict)
    streams: dict[int, tuple[int, int]] = field(default_factory=dict)
    idle_handle: asyncio.TimerHandle | None = None
    closed: bool = False


class Relay:
    """A caching MOQT relay. ``await start()``, then ``await stop()``."""

    def __init__(self, config: RelayConfig, authorizer: Authorizer | None = None,
                 settings: QuicSettings | None = None) -> None:
        self.config = config
        if authorizer is None:
            authorizer = (Authorizer.from_file(config.auth) if config.auth
                          else Authorizer(anonymous=config.anonymous))
        self.auth = authorizer
        self.settings = settings or (QuicSettings.loopback() if config.quic_preset == "loopback"
                                     else QuicSettings())
        self.metrics = Metrics()
        self.cache = Cache(config.cache_bytes, self.metrics)
        self.cache.pinned = self._pinned
        self.cache.on_evict = self._on_evict
        self.server: Server | None = None
        self.metrics_server: MetricsServer | None = None
        self.host: str | None = None
        self.certfile: str | None = None
        self.keyfile: str | None = None
        """The relay's address and TLS identity once started (a KVSP HTTPS holder beside
        the relay uses them: :func:`kvcs.cli.start_kvsp_beside`)."""
        self.fingerprint: str | None = None
        self.peers: dict[int, Peer] = {}
        self.publishers: dict[TrackNamespace, list[Peer]] = {}
        self.links: dict[FullTrackName, Link] = {}
        self._link_by_req: dict[tuple[int, int], Link] = {}
        self.upstream: Peer | None = None
        self._upstream_tokens: tuple[AuthToken, ...] = ()
        self._up_watches: dict[TrackNamespace, int] = {}  # prefix -> upstream rid
        self._up_ns: dict[TrackNamespace, set[int]] = {}  # namespace -> upstream rids
        self._next_peer = 0
        self._dirty: set[Peer] = set()
        self._flush_scheduled = False
        self._sweeper: asyncio.Task[None] | None = None
        self._closed_out = [0, 0]  # objects/bytes sent by sessions already gone
        self.going_away = False
        m = self.metrics
        m.gauge("kvcs_relay_sessions", lambda: sum(1 for p in self.peers.values()
                                                   if not p.upstream))
        m.gauge("kvcs_relay_cache_bytes", lambda: self.cache.bytes)
        m.gauge("kvcs_relay_cache_tracks", lambda: len(self.cache.tracks))
        m.gauge("kvcs_relay_upstream_subscriptions", lambda: len(self.links))
        m.gauge("kvcs_relay_objects_out_total", lambda: self.objects_out()[0])
        m.gauge("kvcs_relay_bytes_out_total", lambda: self.objects_out()[1])

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        """The UDP port the relay listens on."""
        assert self.server is not None
        return self.server.port

    async def start(self) -> None:
        """Listen, connect upstream (if configured) and start the metrics endpoint."""
        cfg = self.config
        host, port = parse_hostport(cfg.listen, "--listen")
        if cfg.tls_cert:
            certfile, keyfile = cfg.tls_cert, cfg.tls_key
        else:
            dev = ensure_dev_certificate(cfg.cert_dir)
            certfile, keyfile = str(dev.certfile), str(dev.keyfile)
            self.fingerprint = dev.sha256
        self.host, self.certfile, self.keyfile = host, certfile, keyfile
        if cfg.upstream:
            await self._connect_upstream()
        self.server = await serve_endpoints(host, port, self._on_endpoint, certfile=certfile,
                                            keyfile=keyfile, settings=self.settings,
                                            implementation="kvcs-relay/0.1")
        if cfg.metrics:
            mh, mp = parse_hostport(cfg.metrics, "--metrics")
            self.metrics_server = MetricsServer(self.metrics)
            await self.metrics_server.start(mh, mp)
        self._sweeper = asyncio.create_task(self._sweep_loop())
        log.info("relay listening on %s:%d (upstream %s, cache %d bytes, %s)", host,
                 self.server.port, cfg.upstream or "none", cfg.cache_bytes,
                 "anonymous" if self.auth.anonymous else f"{len(self.auth.grants)} tokens")

    async def _connect_upstream(self) -> None:
        cfg = self.config
        assert cfg.upstream
        if cfg.upstream_token:
            tok = cfg.upstream_token.encode()
            if cfg.upstream_token.startswith("hex:"):
                tok = bytes.fromhex(cfg.upstream_token[4:])
            self._upstream_tokens = (AuthToken(3, token_type=0, value=tok),)
        ep = await Endpoint.connect(cfg.upstream, settings=self.settings,
                                    cafile=cfg.upstream_cafile,
                                    verify=not cfg.upstream_insecure,
                                    auth_tokens=self._upstream_tokens,
                                    implementation="kvcs-relay/0.1")
        peer = self._add_peer(ep, upstream=True)
        self.upstream = peer
        log.info("connected upstream %s", cfg.upstream)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: GOAWAY downstream, grace, unsubscribe upstream, close."""
        grace = self.config.goaway_grace if grace is None else grace
        self.going_away = True
        downs = [p for p in self.peers.values() if not p.upstream and not p.closed]
        for p in downs:
            p.session.goaway()
            self._mark(p)
        self._flush_all()
        if downs and grace > 0:
            waits = [asyncio.ensure_future(p.endpoint.wait_closed()) for p in downs]
            await asyncio.wait(waits, timeout=grace)
            for w in waits:
                w.cancel()
        for link in list(self.links.values()):
            self._cancel_link(link)
        if self.upstream is not None and not self.upstream.closed:
            self.upstream.endpoint.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.upstream.endpoint.wait_closed(), 1.0)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self.server is not None:
            await self.server.aclose(timeout=1.0)
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
        """Evict expired tracks that are not being fed, then enforce the byte budget."""
        for track in list(self.cache.tracks.values()):
            link = self.links.get(track.full_name)
            if track.expired() and (link is None or link.track is not track):
                self.cache.remove(track, "age")
        self.cache.enforce_budget()
        self._flush_all()

    def objects_out(self) -> tuple[int, int]:
        """(objects, payload bytes) sent to peers, over the relay's lifetime."""
        n, b = self._closed_out
        for p in self.peers.values():
            n += p.endpoint.server.objects_sent
            b += p.endpoint.server.bytes_sent
        return n, b

    # ------------------------------------------------------------------ sessions

    def _add_peer(self, ep: Endpoint, upstream: bool = False) -> Peer:
        self._next_peer += 1
        peer = Peer(ep, self._next_peer, upstream=upstream)
        self.peers[peer.id] = peer
        ep.request_handler = lambda _ep, e: self._on_request(peer, e)
        ep.event_hook = lambda _ep, e: self._on_event(peer, e)
        ep.server.request_done = lambda rid: self._on_served_done(peer, rid)
        if not upstream:
            self.metrics.inc("kvcs_relay_sessions_total")
        return peer

    def _on_endpoint(self, ep: Endpoint) -> None:
        peer = self._add_peer(ep)
        log.debug("session %d opened", peer.id)
        if self.going_away:
            ep.session.goaway()

    def _mark(self, peer: Peer) -> None:
        self._dirty.add(peer)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_all)

    def _flush_all(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for p in dirty:
            if not p.closed:
                p.endpoint.flush()

    def _close_peer(self, peer: Peer, code: int, reason: str) -> None:
        if peer.closed:
            return
        log.warning("closing session %d: %s (%#x)", peer.id, reason, code)
        if code == SessionCode.PROTOCOL_VIOLATION:
            self.metrics.inc("kvcs_relay_protocol_errors_total")
        peer.endpoint.close(code, reason)

    def _on_session_closed(self, peer: Peer, e: ev.SessionClosed) -> None:
        if peer.closed:
            return
        peer.closed = True
        log.info("session %d closed (%#x %s)", peer.id, e.code, e.reason)
        srv = peer.endpoint.server
        self._closed_out[0] += srv.objects_sent
        self._closed_out[1] += srv.bytes_sent
        self.peers.pop(peer.id, None)
        self._dirty.discard(peer)
        # requests it made
        for waited in list(peer.waiting.values()):
            waited.waiting = [(p, r) for p, r in waited.waiting if p is not peer]
        peer.waiting.clear()
        for rid, served in list(peer.served.items()):
            if served is not None:
                served.downstream.pop((peer.id, rid), None)
                self._maybe_idle(served)
        peer.served.clear()
        for rid in list(peer.watchers):
            self._drop_watcher(peer, rid)
        # TRACK_STATUS requests forwarded to it: answer them downstream now
        for fwd in list(peer.status_fwd):
            self._on_status_answer(peer, fwd, e)
        # namespaces it published
        for ns in list(peer.namespaces.values()):
            self._unregister(peer, ns)
        peer.namespaces.clear()
        # links it fed
        for link in [lk for lk in self.links.values() if lk.source is peer]:
            self._link_lost(link, PublishDoneCode.GOING_AWAY, "publisher went away")
        if peer is self.upstream:
            self.upstream = None
            self._up_watches.clear()
            for ns in list(self._up_ns):
                del self._up_ns[ns]
                self._ns_changed(ns)
            (log.info if self.going_away else log.error)(
                "upstream session lost (%#x %s)", e.code, e.reason)
        self._flush_all()

    # ------------------------------------------------------------------ requests

    def _tokens(self, peer: Peer, params: Parameters) -> list[bytes] | int:
        """Token values of a request (+ SETUP); an int is a session error code."""
        out: list[bytes] = []
        setup = peer.endpoint.peer_setup
        for tok in setup.auth_tokens if setup else ():
            if tok.alias_type in (1, 3) and tok.value is not None:
                out.append(bytes(tok.value))  # REGISTER over our cache size 0 = USE_VALUE
        for tok in params.auth_tokens:
            if tok.alias_type == 3 and tok.value is not None:
                out.append(bytes(tok.value))
            elif tok.alias_type == 1:
                return SessionCode.AUTH_TOKEN_CACHE_OVERFLOW  # MAX_AUTH_TOKEN_CACHE_SIZE 0
            else:
                return SessionCode.UNKNOWN_AUTH_TOKEN_ALIAS
        return out

    def _reject(self, peer: Peer, rid: int, kind: str, code: int, reason: str,
                retry: int = 0) -> None:
        try:
            name = RequestErrorCode(code).name.lower()
        except ValueError:
            name = f"0x{code:x}"
        self.metrics.inc("kvcs_relay_requests_total", type=kind, result=name)
        log.info("session %d: %s %d refused: %s (%s)", peer.id, kind, rid, name, reason)
        with contextlib.suppress(KeyError, ValueError):
            peer.session.request_error(rid, code, reason, retry_interval=retry)
        self._mark(peer)

    def _ok(self, kind: str) -> None:
        self.metrics.inc("kvcs_relay_requests_total", type=kind, result="ok")

    def _on_request(self, peer: Peer, e: ev.RequestReceived) -> bool:
        m = e.message
        kind = _TYPES.get(type(m), type(m).__name__.lower())
        rid = e.request_id
        if peer.upstream or kind not in _TYPES.values():
            self._reject(peer, rid, kind, RequestErrorCode.NOT_SUPPORTED,
                         "not supported by this relay")
            return True
        if self.going_away:
            self._reject(peer, rid, kind, RequestErrorCode.GOING_AWAY, "relay shutting down")
            return True
        tokens = self._tokens(peer, m.params)
        if isinstance(tokens, int):
            self._close_peer(peer, tokens, "authorization token alias not supported")
            return True
        if peer.open_requests() >= self.config.max_requests_per_session:
            self._reject(peer, rid, kind, RequestErrorCode.EXCESSIVE_LOAD,
                         "too many open requests", self.config.fetch_retry_ms)
            return True
        if isinstance(m, PublishNamespace):
            ns = tuple(m.namespace)
            if not self.auth.allowed(tokens, PUBLISH, ns):
                self._reject(peer, rid, kind, RequestErrorCode.UNAUTHORIZED,
                             "not authorized to publish this namespace")
                return True
            peer.namespaces[rid] = ns
            self.publishers.setdefault(ns, []).append(peer)
            peer.session.request_ok(rid)
            self._ok(kind)
            log.info("session %d publishes %s", peer.id, render_namespace(ns))
            self._ns_changed(ns)
            return True
        if isinstance(m, SubscribeNamespace):
            prefix = tuple(m.namespace_prefix)
            if not self.auth.allowed(tokens, SUBSCRIBE, prefix):
                self._reject(peer, rid, kind, RequestErrorCode.UNAUTHORIZED,
                             "not authorized for this namespace prefix")
                return True
            peer.session.request_ok(rid)
            self._ok(kind)
            peer.watchers[rid] = prefix
            peer.announced[rid] = set()
            for ns in self._known_namespaces():
                if namespace_has_prefix(ns, prefix):
                    peer.announced[rid].add(ns)
                    peer.session.namespace(rid, ns)
            self._watch_upstream(prefix)
            return True
        assert isinstance(m, Subscribe | Fetch | TrackStatus)
        ns = tuple(m.namespace)
        if not self.auth.allowed(tokens, SUBSCRIBE, ns):
            self._reject(peer, rid, kind, RequestErrorCode.UNAUTHORIZED,
                         "not authorized for this namespace")
            return True
        if isinstance(m, Fetch) and \
                peer.open_fetches() >= self.config.max_fetches_per_session:
            self._reject(peer, rid, kind, RequestErrorCode.EXCESSIVE_LOAD,
                         "too many concurrent fetches", self.config.fetch_retry_ms)
            return True
        self._route(peer, e, kind)
        return True

    def _route(self, peer: Peer, e: ev.RequestReceived, kind: str) -> None:
        m = e.message
        assert isinstance(m, Subscribe | Fetch | TrackStatus)
        key: FullTrackName = (tuple(m.namespace), bytes(m.name))
        rid = e.request_id
        track = self.cache.get(key)
        link = self.links.get(key)
        if track is not None and track.complete:
            self.metrics.inc("kvcs_relay_cache_hits_total")
            self._serve(peer, e, track, None)
            return
        if link is not None:
            if link.established:
                self.metrics.inc("kvcs_relay_cache_hits_total")
                self._serve(peer, e, link.track, link)
            else:
                self._wait(peer, e, link)
            return
        source = self._source(key[0])
        if source is None:
            self._reject(peer, rid, kind, RequestErrorCode.DOES_NOT_EXIST,
                         "no publisher for this namespace")
            return
        if isinstance(m, TrackStatus):
            fwd = source.session.track_status(key[0], key[1], self._up_params(source))
            source.status_fwd[fwd] = (peer, rid)
            peer.served[rid] = None
            self._mark(source)
            return
        self.metrics.inc("kvcs_relay_cache_misses_total")
        link = self._open_link(key, source, track)
        self._wait(peer, e, link)

    def _wait(self, peer: Peer, e: ev.RequestReceived, link: Link) -> None:
        link.waiting.append((peer, e))
        peer.waiting[e.request_id] = link
        if isinstance(e.message, Fetch):
            peer.fetches.add(e.request_id)

    def _serve(self, peer: Peer, e: ev.RequestReceived, track: Track,
               link: Link | None) -> None:
        m = e.message
        rid = e.request_id
        srv = peer.endpoint.server
        kind = _TYPES[type(m)]
        track.touch()
        if isinstance(m, TrackStatus):
            srv.serve_track_status(rid, m, track)
            self._ok(kind)
            self._mark(peer)
            return
        peer.served[rid] = link
        if link is not None:
            link.downstream[(peer.id, rid)] = peer
        if isinstance(m, Subscribe):
            ok = srv.serve_subscribe(rid, m, track)
        else:
            assert isinstance(m, Fetch)
            peer.fetches.add(rid)
            ok = srv.serve_fetch(rid, m, track)
        if ok:
            self._ok(kind)
        else:
            self.metrics.inc("kvcs_relay_requests_total", type=kind, result="rejected")
        if not srv.serving(rid):
            self._on_served_done(peer, rid)
        self._mark(peer)

    def _on_served_done(self, peer: Peer, rid: int) -> None:
        self._mark(peer)  # PUBLISH_DONE / FIN / reset to send
        link = peer.served.pop(rid, None)
        peer.fetches.discard(rid)
        if link is not None:
            link.downstream.pop((peer.id, rid), None)
            self._maybe_idle(link)

    # ------------------------------------------------------------------ routing

    def _source(self, ns: TrackNamespace) -> Peer | None:
        best: tuple[int, Peer] | None = None
        for pns, peers in self.publishers.items():
            live = [p for p in peers if not p.closed]
            if live and namespace_has_prefix(ns, pns) and (best is None or len(pns) > best[0]):
                best = (len(pns), live[-1])
        if best is not None:
            return best[1]
        if self.upstream is not None and not self.upstream.closed:
            return self.upstream
        return None

    def _up_params(self, source: Peer) -> Parameters:
        return Parameters(auth_tokens=self._upstream_tokens if source.upstream else ())

    def _open_link(self, key: FullTrackName, source: Peer, track: Track | None) -> Link:
        if track is None:
            track = Track(key[0], key[1], origin=False)
            self.cache.put(track)
        link = Link(key, source, track)
        start = self._first_unknown(track)
        fill_lf = LocationFilter.none() if start == Location(0, 0) else \
            LocationFilter.absolute_start(start.group, start.object)
        p = self._up_params(source)
        p.location_filter = LocationFilter.next_object()
        # ascending: the fill stream then tells, object by object, that every Location
        # before the one received is known (see _on_object)
        p.fill = Parameters(location_filter=fill_lf, group_order=GroupOrder.ASCENDING)
        p.forward = 1
        link.fill_end = start  # provisional; the real end is LARGEST_OBJECT of the OK
        link.request_id = source.session.subscribe(key[0], key[1], p)
        self.links[key] = link
        self._link_by_req[(source.id, link.request_id)] = link
        self._mark(source)
        log.info("upstream SUBSCRIBE %s/%r via session %d (fill from %s)",
                 render_namespace(key[0]), key[1], source.id, start)
        return link

    @staticmethod
    def _first_unknown(track: Track) -> Location:
        """First Location whose status the cached track does not know."""
        if track.complete:
            return Location(0, 0) if track.largest is None else Location(
                track.largest.group + 1, 0)
        g = 0
        for gid in track.group_ids():
            if gid != g or not track.group_closed(gid):
                break
            g += 1
        s = track.settled_until
        if s is not None and s.group >= g:
            return Location(s.group, s.object + 1)
        return Location(g, 0)

    # ------------------------------------------------------------------ upstream events

    def _on_event(self, peer: Peer, e: ev.Event) -> bool:
        if isinstance(e, ev.ObjectReceived):
            link = self._link_by_req.get((peer.id, e.request_id))
            if link is not None:
                self._on_object(link, e)
            return True
        if isinstance(e, ev.SessionClosed):
            self._on_session_closed(peer, e)
            return False
        if isinstance(e, ev.SessionEstablished | ev.GoAwayReceived):
            if isinstance(e, ev.GoAwayReceived):
                log.info("session %d sent GOAWAY", peer.id)
            return False
        rid = getattr(e, "request_id", None)
        if rid is None:
            return False
        link = self._link_by_req.get((peer.id, rid))
        if link is not None:
            self._on_link_event(link, e)
            return True
        if rid in peer.status_fwd:
            self._on_status_answer(peer, rid, e)
            return True
        if isinstance(e, ev.NamespaceAnnounced | ev.NamespaceWithdrawn | ev.RequestAccepted
                      | ev.RequestRejected | ev.RequestFailed) and peer is self.upstream \
                and rid in self._up_watches.values():
            self._on_upstream_ns(rid, e)
            return True
        if isinstance(e, ev.RequestCancelled):
            self._on_cancelled(peer, rid)
            return True
        return False

    def _on_cancelled(self, peer: Peer, rid: int) -> None:
        link = peer.waiting.pop(rid, None)
        if link is not None:
            link.waiting = [(p, r) for p, r in link.waiting
                            if not (p is peer and r.request_id == rid)]
            peer.fetches.discard(rid)
            self._maybe_idle(link)
            return
        ns = peer.namespaces.pop(rid, None)
        if ns is not None:
            self._unregister(peer, ns)
            return
        if rid in peer.watchers:
            self._drop_watcher(peer, rid)
            return
        peer.served.pop(rid, None)

    def _on_object(self, link: Link, e: ev.ObjectReceived) -> None:
        r = e.record
        track = link.track
        prio = r.publisher_priority
        if prio is None:
            prio = track.default_priority
        obj = CachedObject(r.group_id, r.object_id, r.subgroup_id, prio, r.status,
                           r.properties, exact_payload(r.payload))
        if e.fill_id is None and e.stream_id >= 0:
            link.streams[e.stream_id] = (r.group_id, r.subgroup_id)
        for p in link.downstream.values():
            self._mark(p)
        try:
            added = track.add(obj)
        except ImmutabilityError as exc:
            self._close_peer(link.source, SessionCode.PROTOCOL_VIOLATION, str(exc))
            return
        if e.fill_id is not None and not link.unknown_ranges:
            # The fill stream is in ascending order: every Location before this object is
            # now known (absent if not received). Settling at each new group lets FETCH
            # and fill cursors downstream move on while the fill is still running,
            # instead of stalling at the first group boundary until the fill ends.
            s = track.settled_until
            if s is None or r.group_id > s.group:
                track.settle(Location(r.group_id, r.object_id))
        n = len(r.payload)
        self.metrics.inc("kvcs_relay_objects_in_total")
        self.metrics.inc("kvcs_relay_bytes_in_total", n)
        if added:
            self.cache.added(n)

    def _on_link_event(self, link: Link, e: ev.Event) -> None:
        track = link.track
        if isinstance(e, ev.SubscribeAccepted):
            link.established = True
            msg = e.message
            if msg.track_properties:
                track.properties = tuple(msg.track_properties)
            largest = msg.params.largest_object
            if largest is not None and (track.largest is None or largest > track.largest):
                track.largest = largest
            start = link.fill_end or Location(0, 0)
            link.fill_end = largest
            if largest is None or start > largest or link.fill_ended_early:
                # empty fill range (no fill stream), or the fill already came in
                link.fill_pending = False
                if largest is not None and not link.lost and not link.unknown_ranges:
                    track.settle(largest)
            else:
                link.fill_pending = True
            waiting, link.waiting = link.waiting, []
            for p, req in waiting:
                p.waiting.pop(req.request_id, None)
                if not p.closed:
                    self._serve(p, req, track, link)
            self._maybe_idle(link)
        elif isinstance(e, ev.DataStreamEnded):
            if e.fill_id is not None:
                link.fill_pending = False
                if e.reset_code is not None or link.unknown_ranges:
                    link.lost = True
                elif not link.established:
                    link.fill_ended_early = True  # SUBSCRIBE_OK settles the range
                elif link.fill_end is not None:
                    track.settle(link.fill_end)
            else:
                key = link.streams.pop(e.stream_id, None)
                if e.reset_code is not None:
                    link.lost = True
                elif key is not None:
                    track.close_subgroup(*key)
            for p in link.downstream.values():
                self._mark(p)
        elif isinstance(e, ev.RangeMarkerReceived):
            if e.marker.kind != END_OF_NON_EXISTENT_RANGE:
                link.unknown_ranges = True
        elif isinstance(e, ev.SubscriptionEnded):
            done = e.message
            if done.status == PublishDoneCode.TRACK_ENDED and not link.lost \
                    and not link.unknown_ranges and not link.fill_pending:
                self._retire_link(link)
                track.finish()
                log.info("track %r complete (%d objects, %d bytes)", track.name, track.count,
                         track.bytes)
                for p in list(link.downstream.values()):
                    self._mark(p)
            else:
                self._link_lost(link, done.status, done.reason or "upstream ended")
        elif isinstance(e, ev.RequestRejected):
            code, reason = e.message.code, e.message.reason
            if e.update_id is not None:
                return
            self._link_failed(link, code, reason)
        elif isinstance(e, ev.RequestFailed):
            self._link_failed(link, RequestErrorCode.INTERNAL_ERROR, e.reason)
        elif isinstance(e, ev.PublishStateNotified):
            pass

    def _link_failed(self, link: Link, code: int, reason: str) -> None:
        if link.established:
            self._link_lost(link, PublishDoneCode.INTERNAL_ERROR, reason)
            return
        self._retire_link(link)
        for p, req in link.waiting:
            p.waiting.pop(req.request_id, None)
            p.fetches.discard(req.request_id)
            self._reject(p, req.request_id, _TYPES[type(req.message)], code,
                         f"upstream: {reason}")
        link.waiting.clear()
        if not link.track.count:
            self.cache.forget(link.track)

    def _link_lost(self, link: Link, status: int, reason: str) -> None:
        """The upstream subscription ended before the track was complete."""
        self._retire_link(link)
        for p, req in link.waiting:
            p.waiting.pop(req.request_id, None)
            p.fetches.discard(req.request_id)
            self._reject(p, req.request_id, _TYPES[type(req.message)],
                         RequestErrorCode.INTERNAL_ERROR, f"upstream: {reason}")
        link.waiting.clear()
        track = link.track
        if track.complete:
            return
        code = (PublishDoneCode.GOING_AWAY if status == PublishDoneCode.GOING_AWAY
                else PublishDoneCode.INTERNAL_ERROR)
        for (_pid, rid), p in list(link.downstream.items()):
            srv = p.endpoint.server
            srv.end_subscription(rid, code, reason)
            srv.fail_fetch(rid, StreamResetCode.INTERNAL_ERROR)
            self._mark(p)
        link.downstream.clear()
        # we cannot state the completeness of what is cached honestly: drop it
        self.cache.forget(track)
        log.info("dropped incomplete track %r: %s", track.name, reason)

    def _retire_link(self, link: Link) -> None:
        if link.closed:
            return
        link.closed = True
        if link.idle_handle is not None:
            link.idle_handle.cancel()
        if self.links.get(link.key) is link:
            del self.links[link.key]
        self._link_by_req.pop((link.source.id, link.request_id), None)

    def _cancel_link(self, link: Link) -> None:
        """Unsubscribe upstream; the cached objects stay (what is known stays known)."""
        self._retire_link(link)
        if not link.source.closed:
            link.source.session.cancel(link.request_id)
            self._mark(link.source)
        log.info("upstream subscription for %r released", link.track.name)

    def _maybe_idle(self, link: Link) -> None:
        if link.closed or link.downstream or link.waiting or not link.established:
            return
        if link.idle_handle is not None:
            link.idle_handle.cancel()
        linger = self.config.upstream_linger
        if linger <= 0:
            self._release_idle(link)
        else:
            link.idle_handle = asyncio.get_running_loop().call_later(
                linger, self._release_idle, link)

    def _release_idle(self, link: Link) -> None:
        link.idle_handle = None
        if link.closed or link.downstream or link.waiting:
            return
        self._cancel_link(link)
        self._flush_all()

    def _on_status_answer(self, source: Peer, rid: int, e: ev.Event) -> None:
        peer, drid = source.status_fwd.pop(rid)
        peer.served.pop(drid, None)
        if peer.closed:
            return
        if isinstance(e, ev.RequestAccepted):
            with contextlib.suppress(KeyError, ValueError):
                peer.session.request_ok(drid, e.message.params, e.message.track_properties)
            self._ok("track_status")
        elif isinstance(e, ev.RequestRejected):
            self._reject(peer, drid, "track_status", e.message.code, e.message.reason)
        else:
            reason = ("publisher went away" if isinstance(e, ev.SessionClosed)
                      else "upstream failed")
            self._reject(peer, drid, "track_status", RequestErrorCode.INTERNAL_ERROR, reason)
        self._mark(peer)

    # ------------------------------------------------------------------ namespaces

    def _known_namespaces(self) -> set[TrackNamespace]:
        known = {ns for ns, peers in self.publishers.items() if any(not p.closed for p in peers)}
        return known | set(self._up_ns)

    def _ns_changed(self, ns: TrackNamespace) -> None:
        live = ns in self._known_namespaces()
        for peer in list(self.peers.values()):
            if peer.closed:
                continue
            for rid, prefix in peer.watchers.items():
                if not namespace_has_prefix(ns, prefix):
                    continue
                sent = peer.announced[rid]
                if live and ns not in sent:
                    sent.add(ns)
                    peer.session.namespace(rid, ns)
                elif not live and ns in sent:
                    sent.discard(ns)
                    peer.session.namespace_done(rid, ns)
                else:
                    continue
                self._mark(peer)

    def _unregister(self, peer: Peer, ns: TrackNamespace) -> None:
        peers = self.publishers.get(ns)
        if peers and peer in peers:
            peers.remove(peer)
            if not peers:
                del self.publishers[ns]
            log.info("session %d withdrew %s", peer.id, render_namespace(ns))
            self._ns_changed(ns)

    def _drop_watcher(self, peer: Peer, rid: int) -> None:
        prefix = peer.watchers.pop(rid, None)
        peer.announced.pop(rid, None)
        if prefix is None or self.upstream is None:
            return
        if any(prefix == pp for p in self.peers.values() if not p.closed
               for pp in p.watchers.values()):
            return
        up_rid = self._up_watches.pop(prefix, None)
        if up_rid is not None:
            self.upstream.session.cancel(up_rid)
            self._mark(self.upstream)
            for ns in [n for n, rids in self._up_ns.items() if up_rid in rids]:
                self._up_ns[ns].discard(up_rid)
                if not self._up_ns[ns]:
                    del self._up_ns[ns]
                    self._ns_changed(ns)

    def _watch_upstream(self, prefix: TrackNamespace) -> None:
        up = self.upstream
        if up is None or up.closed or prefix in self._up_watches:
            return
        self._up_watches[prefix] = up.session.subscribe_namespace(prefix, self._up_params(up))
        self._mark(up)

    def _on_upstream_ns(self, rid: int, e: ev.Event) -> None:
        if isinstance(e, ev.NamespaceAnnounced):
            self._up_ns.setdefault(e.namespace, set()).add(rid)
            self._ns_changed(e.namespace)
        elif isinstance(e, ev.NamespaceWithdrawn):
            rids = self._up_ns.get(e.namespace)
            if rids is not None:
                rids.discard(rid)
                if not rids:
                    del self._up_ns[e.namespace]
                self._ns_changed(e.namespace)
        elif isinstance(e, ev.RequestRejected | ev.RequestFailed):
            for prefix, r in list(self._up_watches.items()):
                if r == rid:
                    del self._up_watches[prefix]
            log.warning("upstream SUBSCRIBE_NAMESPACE failed: %s", e)

    # ------------------------------------------------------------------ cache hooks

    def _pinned(self, track: Track) -> bool:
        link = self.links.get(track.full_name)
        return link is not None and link.track is track and bool(link.downstream)

    def _on_evict(self, track: Track, reason: str) -> None:
        link = self.links.get(track.full_name)
        if link is not None and link.track is track:
            self._cancel_link(link)
            for p, req in link.waiting:
                p.waiting.pop(req.request_id, None)
                self._reject(p, req.request_id, _TYPES[type(req.message)],
                             RequestErrorCode.EXCESSIVE_LOAD, "cache full")
            link.waiting.clear()
            for p in link.downstream.values():
                self._mark(p)
