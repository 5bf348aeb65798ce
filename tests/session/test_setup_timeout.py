"""A client that never sends SETUP is closed with CONTROL_MESSAGE_TIMEOUT (real QUIC)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kvcs.binding as binding_mod
from kvcs.endpoint import Endpoint, serve_endpoints
from kvcs.moqt.errors import SessionCode
from kvcs.transport import QuicSettings, connect, ensure_dev_certificate


class _Mute:
    """A sans-IO peer that completes the QUIC handshake but never speaks MOQT."""

    def __init__(self) -> None:
        self.lost: list[int | None] = []

    def stream_data(self, stream_id: int, data: bytes, end: bool) -> None: ...
    def stream_reset(self, stream_id: int, code: int) -> None: ...
    def stop_sending(self, stream_id: int, code: int) -> None: ...
    def datagram(self, data: bytes) -> None: ...
    def actions(self) -> list:
        return []

    def connection_lost(self, code: int | None, reason: str) -> None:
        self.lost.append(code)


async def test_no_setup_closes_with_control_message_timeout(tmp_path: Path,
                                                             monkeypatch) -> None:
    monkeypatch.setattr(binding_mod, "SETUP_TIMEOUT", 0.3)
    cert = ensure_dev_certificate(tmp_path)
    eps: list[Endpoint] = []
    settings = QuicSettings.loopback()
    server = await serve_endpoints("127.0.0.1", 0, eps.append, certfile=str(cert.certfile),
                                   keyfile=str(cert.keyfile), settings=settings)
    mute = _Mute()
    try:
        conn = await connect(f"moqt://127.0.0.1:{server.port}/", lambda o, i: mute, settings,
                             cafile=str(cert.certfile))
        code, _ = await asyncio.wait_for(eps[0].wait_closed(), 5)
        assert code == SessionCode.CONTROL_MESSAGE_TIMEOUT
        await asyncio.wait_for(conn.wait_closed(), 5)
        assert mute.lost == [SessionCode.CONTROL_MESSAGE_TIMEOUT]
    finally:
        await server.aclose()
