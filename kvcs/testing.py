"""Helpers for integration tests of code built on kvcs: local relays and endpoints on
127.0.0.1 with ephemeral ports and a throwaway certificate, all closed together.

    async with LocalNet(tmp_path) as net:
        relay = await net.relay()
        pub = await net.client(relay)
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .endpoint import Endpoint
from .moqt.wire import AuthToken
from .relay import Authorizer, Relay, RelayConfig
from .transport import DevCertificate, QuicSettings, ensure_dev_certificate

if TYPE_CHECKING:
    from .kv.store import BlockStore
    from .kvnet.kvsp_http import KvspServer

E = TypeVar("E", bound=Endpoint)


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``cond`` every 2 ms until it is true; AssertionError after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)


async def reached(event: asyncio.Event, *watch: asyncio.Future[Any],
                  timeout: float = 60.0) -> None:
    """Wait until ``event`` is set: AssertionError if one of ``watch`` (the tasks that
    would set it) ends first, with how it ended, or after ``timeout`` s. A test waiting
    for a milestone of a transfer must not wait forever when the transfer ended before
    it (a consumer whose budget ran out on a loaded machine: ``make faults`` hung)."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter, *watch}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if event.is_set():
        return
    for task in watch:
        if task.done():
            outcome = (task.exception() or task.result()) if not task.cancelled() \
                else "cancelled"
            raise AssertionError(f"ended before the event: {outcome!r:.500}")
    raise AssertionError(f"event not set within {timeout:g} s")


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM ``proc`` and wait ``timeout`` s for it; a process still running then is
    killed (a hung relay must not outlive its test or bench run)."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class LocalNet:
    """Relays, endpoints and KVSP servers on loopback; :meth:`aclose` (or ``async with``)
    ends them."""

    def __init__(self, cert: str | Path | DevCertificate,
                 settings: QuicSettings | None = None) -> None:
        self.cert: DevCertificate = (cert if isinstance(cert, DevCertificate)
                                     else ensure_dev_certificate(Path(cert)))
        self.settings = settings or QuicSettings.loopback()
        self.relays: list[Relay] = []
        self.endpoints: list[Endpoint] = []
        self.kvsp_servers: list[KvspServer] = []

    async def __aenter__(self) -> LocalNet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def relay(self, relay_class: type[Relay] = Relay, *,
                    authorizer: Authorizer | None = None, upstream: Relay | str | None = None,
                    **config: Any) -> Relay:
        """Start a relay (anonymous unless ``authorizer``/``auth`` is given); ``upstream``
        (a local relay or a URL) chains it below another relay; ``config`` are
        :class:`~kvcs.relay.RelayConfig` fields."""
        cfg = RelayConfig(tls_cert=str(self.cert.certfile), tls_key=str(self.cert.keyfile),
                          quic_preset="loopback",
                          **{"listen": "127.0.0.1:0", "goaway_grace": 0.1, **config})
        if upstream is not None:
            cfg.upstream = (upstream if isinstance(upstream, str)
                            else f"moqt://127.0.0.1:{upstream.port}/")
            cfg.upstream_cafile = cfg.upstream_cafile or str(self.cert.certfile)
        if authorizer is None and not cfg.auth:
            cfg.anonymous = True
        relay = relay_class(cfg, authorizer, self.settings)
        await relay.start()
        self.relays.append(relay)
        return relay

    async def client(self, relay: Relay, token: bytes | None = None, scheme: str = "moqt",
                     endpoint_class: type[E] = Endpoint) -> E:  # type: ignore[assignment]
        """Connect an endpoint (an ``endpoint_class``, e.g. one that answers requests its
        own way) to a local relay."""
        tokens = (AuthToken(3, token_type=0, value=token),) if token else ()
        ep = await endpoint_class.connect(f"{scheme}://127.0.0.1:{relay.port}/",
                                          cafile=str(self.cert.certfile),
                                          settings=self.settings, auth_tokens=tokens)
        self.endpoints.append(ep)
        return ep

    async def kvsp_server(self, store: BlockStore, authorizer: Authorizer | None = None,
                          **options: Any) -> KvspServer:
        """Start a KVSP HTTP server for ``store`` with this net's certificate (anonymous
        unless ``authorizer``; ``options``: KvspServer keywords); :meth:`aclose` stops it."""
        from .kvnet.kvsp_http import KvspServer  # aiohttp: only for the tests that use it

        server = KvspServer(store, authorizer=authorizer or Authorizer(anonymous=True),
                            certfile=str(self.cert.certfile), keyfile=str(self.cert.keyfile),
                            **options)
        await server.start()
        self.kvsp_servers.append(server)
        return server

    async def close_endpoints(self) -> None:
        """Close every endpoint and wait (2 s at most each) until it is closed."""
        for ep in self.endpoints:
            ep.close()
        for ep in self.endpoints:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ep.wait_closed(), 2)

    async def aclose(self) -> None:
        """Close every endpoint, then every KVSP server, then every relay (downstream
        first)."""
        await self.close_endpoints()
        for server in self.kvsp_servers:
            with contextlib.suppress(Exception):
                await server.aclose()
        for relay in reversed(self.relays):
            with contextlib.suppress(Exception):
                await relay.stop(grace=0)
