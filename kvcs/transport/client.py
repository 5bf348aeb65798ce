"""The dialing side: :func:`connect` to ``moqt://`` (raw QUIC) or ``https://``
(WebTransport) URLs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

from .certs import parse_fingerprint
from .config import ALPN_H3, ALPN_MOQT, QuicSettings
from .connection import DatagramSizeFellBack, MoqtConnection
from .interfaces import SessionFactory
from .quic import adapter
from .quic.base import NetworkAddress
from .udp import udp_socket

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL points."""

    host: str
    port: int
    authority: str
    path: str
    """Path with query."""
    webtransport: bool


def parse_url(url: str) -> Target:
    """Parse ``moqt://host[:port]/path`` or ``https://...`` (default port 443);
    ValueError with a one-line reason otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("moqt", "https"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} (use moqt:// or https://)")
    if not parts.hostname:
        raise ValueError(f"URL without host: {url!r}")
    try:
        port = parts.port or 443
    except ValueError as exc:
        raise ValueError(f"bad port in URL {url!r}: {exc}") from None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(parts.hostname, port, parts.netloc, path, parts.scheme == "https")


def _check_cafile(cafile: str) -> None:
    """ValueError naming ``cafile`` if it cannot be read as PEM certificates: the QUIC
    library reads it only during the handshake, where a missing file became a logged
    traceback and then a "timeout connecting" (5.8 s measured)."""
    try:
        ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ValueError(f"cafile {cafile}: {why}") from None


async def _dial(
    url: str,
    target: Target,
    addr: NetworkAddress,
    factory: SessionFactory,
    settings: QuicSettings,
    configuration: Any,
    pin: bytes | None,
    timeout: float,
    redial_on_fallback: bool,
) -> MoqtConnection:
    """One connection attempt: a new socket and QUIC connection, until the session is
    ready; raises ConnectionError (DatagramSizeFellBack: dial again)."""
    lib = adapter(settings.library)
    sock = udp_socket(socket.AF_INET6, ("::", 0, 0, 0), settings, dual_stack=True,
                      report_errors=True)
    try:
        conn = MoqtConnection(
            lib.client_connection(configuration, settings),
            lib,
            factory=factory,
            settings=settings,
            authority=target.authority,
            path=target.path,
            webtransport=target.webtransport,
            pin_sha256=pin,
            redial_on_fallback=redial_on_fallback,
            sock=sock,
        )
    except BaseException:
        sock.close()
        raise
    conn.connect(addr)
    try:
        await asyncio.wait_for(conn.wait_ready(), timeout)
    except DatagramSizeFellBack:
        conn.close_socket()  # our CONNECTION_CLOSE is sent; nothing to wait for
        raise
    except BaseException as exc:
        if not conn.is_closed:
            conn.close(0, "connect failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(conn.wait_closed(), 1.0)
        conn.close_socket()
        if isinstance(exc, TimeoutError):
            raise ConnectionError(f"timeout connecting to {url}") from exc
        raise
    return conn


async def _open_connection(
    url: str,
    factory: SessionFactory,
    settings: QuicSettings | None,
    verify: bool,
    cafile: str | None,
    pin_sha256: str | bytes | None,
    timeout: float,
) -> MoqtConnection:
    target = parse_url(url)
    settings = settings or QuicSettings()
    pin = parse_fingerprint(pin_sha256) if pin_sha256 is not None else None
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_DGRAM)
    addr: NetworkAddress = infos[0][4]
    configuration = settings.quic_configuration(
        is_client=True, alpn_protocols=[ALPN_H3 if target.webtransport else ALPN_MOQT],
        peer=addr)
    if len(addr) == 2:
        addr = ("::ffff:" + addr[0], addr[1], 0, 0)
    configuration.server_name = target.host
    if pin is not None or not verify:
        # a pin replaces CA validation; it is checked right after the handshake
        configuration.verify_mode = ssl.CERT_NONE
    else:
        configuration.verify_mode = ssl.CERT_REQUIRED
        if cafile is not None:
            _check_cafile(cafile)
            configuration.load_verify_locations(cafile=cafile)
    if pin is not None and cafile is not None and verify:
        configuration.verify_mode = ssl.CERT_REQUIRED
        configuration.load_verify_locations(cafile=cafile)

    deadline = loop.time() + timeout
    try:
        return await _dial(url, target, addr, factory, settings, configuration, pin,
                           timeout, redial_on_fallback=True)
    except DatagramSizeFellBack as exc:
        # A late server (busy, just started) made the library shrink this connection's
        # datagrams for good (issue #19: 1-2 KB instead of 60 KB on loopback, 3-4x
        # slower). The server is up now: a second handshake keeps the configured size.
        # Once only: if it falls back again, the path may really drop large datagrams.
        logger.info("redialing %s: %s", url, exc)
    return await _dial(url, target, addr, factory, settings, configuration, pin,
                       max(0.1, deadline - loop.time()), redial_on_fallback=False)


class _Connect:
    """Awaitable and async context manager returned by :func:`connect`."""

    def __init__(self, opener: Callable[[], Awaitable[MoqtConnection]]) -> None:
        self._opener = opener
        self._conn: MoqtConnection | None = None

    def __await__(self) -> Generator[Any, None, MoqtConnection]:
        return self._opener().__await__()

    async def __aenter__(self) -> MoqtConnection:
        self._conn = await self._opener()
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()
            await self._conn.wait_closed()


def connect(
    url: str,
    factory: SessionFactory,
    settings: QuicSettings | None = None,
    *,
    verify: bool = True,
    cafile: str | None = None,
    pin_sha256: str | bytes | None = None,
    timeout: float = 10.0,
) -> _Connect:
    """Connect to ``moqt://host[:port]/path`` (raw QUIC, ALPN ``moqt-22``) or
    ``https://host[:port]/path`` (WebTransport). Default port 443. The QUIC library is
    that of ``settings`` (:attr:`QuicSettings.library`).

    TLS: the server certificate is verified against the system CAs (certifi) unless
    ``cafile`` is given; ``verify=False`` disables verification; ``pin_sha256`` (hex,
    colons allowed) accepts exactly the certificate with that SHA-256 fingerprint instead
    of CA validation (the connection is closed on mismatch).

    The connection's datagram size follows the server's address unless ``settings`` fix
    it (:meth:`QuicSettings.datagram_size_for`); it pings a quiet server before the idle
    timeout (:attr:`QuicSettings.keep_alive_s`).

    A handshake the server answered so late that the QUIC library cut the datagram size
    for the connection's life is dialed once more (qh3: see
    :meth:`~kvcs.transport.quic.qh3.Qh3Adapter.datagram_size_fell_back`).

    ``await connect(...)`` returns the ready :class:`MoqtConnection`; ``async with
    connect(...) as conn`` also closes it on exit. Raises ConnectionError on failure.
    """
    return _Connect(
        functools.partial(
            _open_connection,
            url,
            factory,
            settings,
            verify,
            cafile,
            pin_sha256,
            timeout,
        )
    )
