"""Serve one set of local tracks to every session a server accepts (no relay).

A :class:`TrackHost` offers the publishing API of :class:`~kvcs.endpoint.Endpoint`
(``create_track``, ``publish``, ``announce``, ``withdraw``, ``drain``) for a publisher that
accepts consumers directly instead of publishing into a relay: every accepted session
serves the host's one :class:`~kvcs.moqt.origin.Origin`, so all see the same tracks and
the same announced namespaces (SUBSCRIBE_NAMESPACE). Like a relay, it admits requests
through :class:`~kvcs.admission.Admission`: per-session limits on open requests and
concurrent FETCHes (REQUEST_ERROR EXCESSIVE_LOAD with a Retry Interval), and, given an
:class:`~kvcs.auth.Authorizer`, the same authorization tokens (UNAUTHORIZED).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .admission import Admission, Limits
from .auth import Authorizer
from .endpoint import Endpoint, send_namespace_notices, serve_endpoints
from .moqt.origin import Origin
from .moqt.wire import Parameters, TrackNamespace
from .publishing import OriginPublisher
from .transport import QuicSettings, Server


class TrackHost(OriginPublisher):
    """Local tracks served by a MOQT server to all its sessions.

    ``authorizer``: the tokens a request needs (default: none needed); ``limits``: per
    session (default: the relay's defaults, :class:`~kvcs.admission.Limits`).
    """

    def __init__(self, authorizer: Authorizer | None = None,
                 limits: Limits | None = None) -> None:
        self.origin: Origin[Endpoint] = Origin()
        self.endpoints: list[Endpoint] = []
        self.server: Server | None = None
        self.admission = Admission(authorizer or Authorizer(anonymous=True), limits)

    async def listen(self, host: str, port: int, *, certfile: str, keyfile: str | None = None,
                     settings: QuicSettings | None = None, **kw: Any) -> Server:
        """Start a server whose sessions all serve this host's origin."""
        self.server = await serve_endpoints(host, port, self._attach, certfile=certfile,
                                            keyfile=keyfile, settings=settings,
                                            origin=self.origin, admission=self.admission,
                                            **kw)
        return self.server

    def _attach(self, ep: Endpoint) -> None:
        self.endpoints.append(ep)
        ep.conn.add_close_callback(lambda: self._detach(ep))

    def _detach(self, ep: Endpoint) -> None:
        if ep in self.endpoints:
            self.endpoints.remove(ep)

    # create_track, publish, publish_run: OriginPublisher (every live subscriber on
    # every session gets what is added)

    async def announce(self, namespace: TrackNamespace, params: Parameters | None = None) -> None:
        """Make a namespace visible to SUBSCRIBE_NAMESPACE on every session."""
        send_namespace_notices(self.origin.publish(namespace))

    def withdraw(self, namespace: TrackNamespace) -> None:
        """Withdraw a namespace."""
        send_namespace_notices(self.origin.withdraw(namespace))

    async def drain(self, limit: int = 4 << 20) -> None:
        """Back-pressure over every session."""
        await asyncio.gather(*(ep.drain(limit) for ep in list(self.endpoints)
                               if not ep.is_closed), return_exceptions=True)

    async def aclose(self) -> None:
        """Close the server and its sessions."""
        if self.server is not None:
            await self.server.aclose()
