"""Fixtures for the transport binding tests: a dev certificate, an echo session, a server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from kvcs.moqt.actions import Action, SendDatagram, SendStreamData, StreamOpener
from kvcs.transport import (
    ConnectionInfo,
    DevCertificate,
    MoqtConnection,
    QuicSettings,
    Server,
    serve,
)


@dataclass
class EchoSession:
    """Tiny sans-IO test session: records inputs; the server echoes peer bidi streams
    and datagrams. Tests append actions to ``out`` and call ``conn.flush()``."""

    opener: StreamOpener
    info: ConnectionInfo
    echo: bool
    out: list[Action] = field(default_factory=list)
    received: dict[int, bytearray] = field(default_factory=dict)
    ended: list[int] = field(default_factory=list)
    resets: list[tuple[int, int]] = field(default_factory=list)
    stops: list[tuple[int, int]] = field(default_factory=list)
    datagrams: list[bytes] = field(default_factory=list)
    lost: tuple[int | None, str] | None = None

    def stream_data(self, stream_id: int, data: bytes, end: bool) -> None:
        self.received.setdefault(stream_id, bytearray()).extend(data)
        if end:
            self.ended.append(stream_id)
        peer_bidi = stream_id % 4 == (0 if not self.info.is_client else 1)
        if self.echo and peer_bidi:
            self.out.append(SendStreamData(stream_id, data, end))

    def stream_reset(self, stream_id: int, code: int) -> None:
        self.resets.append((stream_id, code))

    def stop_sending(self, stream_id: int, code: int) -> None:
        self.stops.append((stream_id, code))

    def datagram(self, data: bytes) -> None:
        self.datagrams.append(data)
        if self.echo:
            self.out.append(SendDatagram(data))

    def connection_lost(self, code: int | None, reason: str) -> None:
        assert self.lost is None, "connection_lost called twice"
        self.lost = (code, reason)

    def actions(self) -> list[Action]:
        out, self.out = self.out, []
        return out


def echo_factory(opener: StreamOpener, info: ConnectionInfo) -> EchoSession:
    """Session factory: echo on the server, record-only on the client."""
    return EchoSession(opener, info, echo=not info.is_client)




@dataclass
class ServerHandle:
    server: Server
    conns: list[MoqtConnection]
    cert: DevCertificate

    def url(self, scheme: str, path: str = "/moq") -> str:
        return f"{scheme}://127.0.0.1:{self.server.port}{path}"

    def session(self, index: int = -1) -> EchoSession:
        session = self.conns[index].session
        assert isinstance(session, EchoSession)
        return session


@contextlib.asynccontextmanager
async def echo_server(cert: DevCertificate,
                      settings: QuicSettings | None = None) -> AsyncIterator[ServerHandle]:
    """An echo server on 127.0.0.1 (``settings`` default: loopback), closed on exit."""
    conns: list[MoqtConnection] = []
    srv = await serve(
        "127.0.0.1",
        0,
        echo_factory,
        settings or QuicSettings.loopback(),
        str(cert.certfile),
        str(cert.keyfile),
        on_session=conns.append,
    )
    try:
        yield ServerHandle(srv, conns, cert)
    finally:
        await srv.aclose()


@pytest.fixture
async def server(cert: DevCertificate) -> AsyncIterator[ServerHandle]:
    async with echo_server(cert) as handle:
        yield handle
