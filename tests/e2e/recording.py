"""A publisher serving consumers directly (TrackHost, real QUIC on 127.0.0.1) whose
endpoints record what consumers request, and refuse some tracks: to check the requests a
consumer sends (filters, fills, which tracks) without a relay rewriting them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kvcs.endpoint import Endpoint
from kvcs.hosting import TrackHost
from kvcs.moqt import events as ev
from kvcs.moqt.wire import Fetch, Subscribe
from kvcs.transport import DevCertificate, QuicSettings

SETTINGS = QuicSettings.loopback()


@dataclass
class Requests:
    """What consumers asked the publisher (track name, request), and how it answers."""

    seen: list[tuple[bytes, Subscribe | Fetch]] = field(default_factory=list)
    refuse: dict[bytes, int] = field(default_factory=dict)
    """Track name -> the REQUEST_ERROR code its SUBSCRIBE and FETCH get."""
    refuse_once: dict[bytes, list[int]] = field(default_factory=dict)
    """Track name -> the codes its next requests get, one each (then ``refuse``)."""

    def names(self, kind: type = object) -> list[bytes]:
        """Names of the requested tracks (of one request type), in order."""
        return [n for n, m in self.seen if isinstance(m, kind)]


class Recorder(Endpoint):
    """A publisher-side endpoint that records SUBSCRIBE and FETCH and refuses some."""

    log = Requests()

    def handle_request(self, e: ev.RequestReceived) -> None:
        m = e.message
        if isinstance(m, Subscribe | Fetch):
            name = bytes(m.name)
            self.log.seen.append((name, m))
            once = self.log.refuse_once.get(name)
            code = once.pop(0) if once else self.log.refuse.get(name)
            if code is not None:
                self.session.request_error(e.request_id, code, "refused")
                self.flush()
                return
        super().handle_request(e)


@contextlib.asynccontextmanager
async def direct_host(cert: DevCertificate, **listen: Any,
                      ) -> AsyncIterator[tuple[TrackHost, str, Requests]]:
    """(host, its moqt:// URL, the request log); the host is closed on exit. ``listen``:
    more :meth:`TrackHost.listen` options (e.g. ``max_filter_ranges``)."""
    log = Requests()
    cls = type("Recording", (Recorder,), {"log": log})
    host = TrackHost()
    server = await host.listen("127.0.0.1", 0, certfile=str(cert.certfile),
                               keyfile=str(cert.keyfile), settings=SETTINGS,
                               endpoint_class=cls, **listen)
    try:
        yield host, f"moqt://127.0.0.1:{server.port}/", log
    finally:
        await host.aclose()


async def connect(url: str, cert: DevCertificate) -> Endpoint:
    """A consumer-side endpoint to ``url``."""
    return await Endpoint.connect(url, cafile=str(cert.certfile), settings=SETTINGS)
