"""Serve one set of local tracks to every session a server accepts (no relay).

A :class:`TrackHost` offers the publishing API of :class:`~kvcs.endpoint.Endpoint`
(``create_track``, ``publish``, ``announce``, ``withdraw``, ``drain``) for a publisher that
accepts consumers directly instead of publishing into a relay: every accepted session
serves the same tracks and sees the same announced namespaces (SUBSCRIBE_NAMESPACE).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .endpoint import Endpoint, serve_endpoints
from .moqt.track import Track, origin_track
from .moqt.wire import ObjectStatus, Parameters, Properties, TrackNamespace, namespace_has_prefix
from .transport import QuicSettings
from .transport.binding import Server


class TrackHost:
    """Local tracks served by a MOQT server to all its sessions."""

    def __init__(self) -> None:
        self.tracks: dict[tuple[TrackNamespace, bytes], Track] = {}
        self.announced: dict[TrackNamespace, int] = {}
        self.endpoints: list[Endpoint] = []
        self.server: Server | None = None

    async def listen(self, host: str, port: int, *, certfile: str, keyfile: str | None = None,
                     settings: QuicSettings | None = None, **kw: Any) -> Server:
        """Start a server whose sessions all serve this host's tracks."""
        self.server = await serve_endpoints(host, port, self._attach, certfile=certfile,
                                            keyfile=keyfile, settings=settings, **kw)
        return self.server

    def _attach(self, ep: Endpoint) -> None:
        ep.tracks = self.tracks
        ep.announced = self.announced
        self.endpoints.append(ep)
        ep.conn.add_close_callback(lambda: self._detach(ep))

    def _detach(self, ep: Endpoint) -> None:
        if ep in self.endpoints:
            self.endpoints.remove(ep)

    def create_track(self, namespace: TrackNamespace, name: bytes,
                     properties: Properties = ()) -> Track:
        """Create (or return) a local origin track."""
        return origin_track(self.tracks, namespace, name, properties)

    def publish(self, track: Track, group_id: int, object_id: int, payload: bytes | memoryview,
                *, status: int = ObjectStatus.NORMAL, priority: int | None = None,
                subgroup_id: int = 0, properties: Properties = ()) -> None:
        """Add one object; every live subscriber on every session gets it."""
        track.append(group_id, object_id, payload, status=status, priority=priority,
                     subgroup_id=subgroup_id, properties=properties)
        for ep in self.endpoints:
            ep.schedule_flush()

    async def announce(self, namespace: TrackNamespace, params: Parameters | None = None) -> None:
        """Make a namespace visible to SUBSCRIBE_NAMESPACE on every session."""
        ns = tuple(namespace)
        self.announced[ns] = -1
        for ep in self.endpoints:
            for wid, prefix in ep._ns_watchers.items():
                if namespace_has_prefix(ns, prefix):
                    ep.session.namespace(wid, ns)
            ep.flush()

    def withdraw(self, namespace: TrackNamespace) -> None:
        """Withdraw a namespace."""
        ns = tuple(namespace)
        self.announced.pop(ns, None)
        for ep in self.endpoints:
            for wid, prefix in ep._ns_watchers.items():
                if namespace_has_prefix(ns, prefix):
                    ep.session.namespace_done(wid, ns)
            ep.flush()

    async def drain(self, limit: int = 4 << 20) -> None:
        """Back-pressure over every session."""
        await asyncio.gather(*(ep.drain(limit) for ep in list(self.endpoints)
                               if not ep.is_closed), return_exceptions=True)

    async def aclose(self) -> None:
        """Close the server and its sessions."""
        if self.server is not None:
            await self.server.aclose()
