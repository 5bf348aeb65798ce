"""A hostile MOQT client for real-QUIC tests: a kvcs sans-IO :class:`Session` for what it
does by the book (SETUP, requests, answers), plus raw bytes it writes on streams of its
choosing. Public APIs only: :func:`kvcs.transport.connect` with a session factory."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kvcs.moqt import events as ev
from kvcs.moqt.actions import Action, ResetStream, SendStreamData, StreamOpener
from kvcs.moqt.session import Session, SessionConfig
from kvcs.testing import until
from kvcs.transport import ConnectionInfo, MoqtConnection, QuicSettings, connect

T = TypeVar("T")


@dataclass
class HostileSession:
    """A :class:`~kvcs.transport.SansIOSession`: the wrapped session's actions, then the
    raw writes queued by :meth:`write`. What arrives on raw streams is kept, not parsed."""

    opener: StreamOpener
    session: Session
    raw: list[Action] = field(default_factory=list)
    raw_streams: set[int] = field(default_factory=set)
    received: dict[int, bytearray] = field(default_factory=dict)
    """Bytes the peer sent on our raw streams (its answers)."""
    ended: set[int] = field(default_factory=set)
    """Raw streams the peer finished (FIN) or reset."""
    stopped: dict[int, int] = field(default_factory=dict)
    """STOP_SENDING codes the peer sent on our raw streams."""
    events: Counter[str] = field(default_factory=Counter)
    rejected: Counter[int] = field(default_factory=Counter)
    """REQUEST_ERROR codes our by-the-book requests got."""
    requests: list[ev.RequestReceived] = field(default_factory=list)
    """Requests the peer made of us."""
    cancelled: list[ev.RequestCancelled] = field(default_factory=list)

    def write(self, data: bytes, *, unidirectional: bool = False, end: bool = False,
              stream_id: int | None = None) -> int:
        """Queue raw bytes on a new stream (or ``stream_id``); returns the stream ID."""
        sid = self.opener.open_stream(unidirectional) if stream_id is None else stream_id
        self.raw_streams.add(sid)
        self.raw.append(SendStreamData(sid, data, end))
        return sid

    def reset(self, stream_id: int, code: int = 0) -> None:
        """Queue a RESET_STREAM on a raw stream."""
        self.raw.append(ResetStream(stream_id, code))

    @property
    def answered(self) -> int:
        """Requests of the by-the-book session that got their answer (or failed)."""
        e = self.events
        return (e["RequestRejected"] + e["RequestFailed"] + e["FetchAccepted"]
                + e["SubscribeAccepted"] + e["RequestAccepted"])

    # -- SansIOSession ------------------------------------------------------------------

    def stream_data(self, stream_id: int, data: bytes, end: bool) -> None:
        if stream_id in self.raw_streams:
            self.received.setdefault(stream_id, bytearray()).extend(data)
            if end:
                self.ended.add(stream_id)
        else:
            self.session.stream_data(stream_id, data, end)

    def stream_reset(self, stream_id: int, code: int) -> None:
        if stream_id in self.raw_streams:
            self.ended.add(stream_id)
        else:
            self.session.stream_reset(stream_id, code)

    def stop_sending(self, stream_id: int, code: int) -> None:
        if stream_id in self.raw_streams:
            self.stopped[stream_id] = code
        else:
            self.session.stop_sending(stream_id, code)

    def datagram(self, data: bytes) -> None:
        self.session.datagram(data)

    def connection_lost(self, code: int | None, reason: str) -> None:
        self.session.connection_lost(code, reason)

    def stream_writable(self, stream_id: int) -> None:
        if stream_id not in self.raw_streams:
            self.session.stream_writable(stream_id)

    def actions(self) -> list[Action]:
        out = self.session.actions()
        if self.raw:
            out += self.raw
            self.raw = []
        return out

    # -- SessionHandler -----------------------------------------------------------------

    def session_changed(self) -> None:
        """Count the events of the by-the-book session (objects are dropped)."""
        for e in self.session.events():
            self.events[type(e).__name__] += 1
            if isinstance(e, ev.RequestRejected):
                self.rejected[e.message.code] += 1
            elif isinstance(e, ev.RequestReceived):
                self.requests.append(e)
            elif isinstance(e, ev.RequestCancelled):
                self.cancelled.append(e)


async def retry(conn: MoqtConnection, call: Callable[[], T]) -> T:
    """``call()`` once the transport can open one more stream: qh3 refuses to open a
    stream past the peer's stream limit (ValueError) until the peer grants more."""
    for _ in range(5000):
        try:
            return call()
        except ValueError:
            conn.flush()
            await asyncio.sleep(0.002)
    raise AssertionError("the peer never granted another stream")


async def hostile_client(port: int, cafile: str, settings: QuicSettings
                         ) -> tuple[MoqtConnection, HostileSession]:
    """Connect a hostile client to ``127.0.0.1:port`` and wait for the peer's SETUP."""
    made: list[HostileSession] = []

    def factory(opener: StreamOpener, info: ConnectionInfo) -> HostileSession:
        cfg = SessionConfig(is_client=True, path=(info.path or "/").encode(),
                            authority=(info.authority or "").encode())
        made.append(HostileSession(opener, Session(cfg, opener)))
        return made[0]

    conn = await connect(f"moqt://127.0.0.1:{port}/", factory, settings, cafile=cafile)
    hostile = made[0]
    conn.attach(hostile)
    await until(lambda: hostile.session.peer_setup is not None)
    return conn, hostile
