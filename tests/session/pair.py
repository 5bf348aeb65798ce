"""Two sans-IO sessions wired back to back in memory (no sockets, deterministic)."""

from __future__ import annotations

from kvcs.moqt.actions import (
    CloseSession,
    ResetStream,
    SendDatagram,
    SendStreamData,
    StopSending,
)
from kvcs.moqt.session import Session, SessionConfig


class Opener:
    """Allocates QUIC stream IDs like a real connection would."""

    def __init__(self, is_client: bool) -> None:
        base = 0 if is_client else 1
        self.next = {False: base, True: base + 2}

    def open_stream(self, unidirectional: bool) -> int:
        sid = self.next[unidirectional]
        self.next[unidirectional] += 4
        return sid


class Pair:
    """A client and a server session; :meth:`pump` moves actions until quiet."""

    def __init__(self, client_cfg: SessionConfig | None = None,
                 server_cfg: SessionConfig | None = None, chunk: int | None = None) -> None:
        self.client = Session(client_cfg or SessionConfig(is_client=True), Opener(True))
        self.server = Session(server_cfg or SessionConfig(is_client=False), Opener(False))
        self.chunk = chunk
        self.closed: dict[str, tuple[int, str]] = {}
        """CloseSession actions keyed by the *receiving* side's name."""
        self.closed_by: dict[str, tuple[int, str]] = {}
        """CloseSession actions keyed by the side that closed (\"client\"/\"server\")."""
        self.wire: list[tuple[str, object]] = []

    def pump(self, rounds: int = 1000) -> None:
        for _ in range(rounds):
            a = self.client.actions()
            b = self.server.actions()
            if not a and not b:
                return
            self._deliver(a, self.server, "server")
            self._deliver(b, self.client, "client")
            # like a binding: streams whose queued data went out are writable again
            for src, acts in ((self.client, a), (self.server, b)):
                for sid in {x.stream_id for x in acts if isinstance(x, SendStreamData)}:
                    src.stream_writable(sid)
        raise AssertionError("sessions did not settle")

    def _deliver(self, actions: list, dst: Session, name: str) -> None:
        for act in actions:
            self.wire.append((name, act))
            if isinstance(act, SendStreamData):
                data = bytes(act.data)
                if self.chunk and len(data) > self.chunk:
                    for i in range(0, len(data), self.chunk):
                        dst.stream_data(act.stream_id, data[i:i + self.chunk],
                                        act.end and i + self.chunk >= len(data))
                else:
                    dst.stream_data(act.stream_id, data, act.end)
            elif isinstance(act, ResetStream):
                dst.stream_reset(act.stream_id, act.code)
            elif isinstance(act, StopSending):
                dst.stop_sending(act.stream_id, act.code)
            elif isinstance(act, SendDatagram):
                dst.datagram(act.data)
            elif isinstance(act, CloseSession):
                self.closed[name] = (act.code, act.reason)
                sender = "client" if name == "server" else "server"
                self.closed_by[sender] = (act.code, act.reason)
                dst.connection_lost(act.code, act.reason)

    @staticmethod
    def events(session: Session) -> list:
        return list(session.events())


# -- helpers for protocol tests -------------------------------------------------------


def established(client_cfg: SessionConfig | None = None,
                server_cfg: SessionConfig | None = None, chunk: int | None = None) -> Pair:
    """A Pair whose SETUP exchange is done and whose SessionEstablished events are drained."""
    p = Pair(client_cfg, server_cfg, chunk)
    p.pump()
    p.events(p.client)
    p.events(p.server)
    return p


def subscribed(p: Pair, namespace: tuple[bytes, ...], name: bytes = b"t",
               track_alias: int | None = None) -> tuple[int, int]:
    """The client subscribes, the server accepts (with ``track_alias`` if given), both ends
    drain their events; returns (request id, track alias)."""
    rid = p.client.subscribe(namespace, name)
    p.pump()
    p.events(p.server)
    alias = p.server.subscribe_ok(rid, track_alias=track_alias)
    p.pump()
    p.events(p.client)
    return rid, alias


def kinds(events: list) -> list[str]:
    """Event class names, for compact assertions."""
    return [type(e).__name__ for e in events]


def of_type(events: list, cls: type) -> list:
    """The events of one class."""
    return [e for e in events if isinstance(e, cls)]


def close_codes(actions: list) -> list[int]:
    """Codes of the CloseSession actions in ``actions``."""
    return [a.code for a in actions if isinstance(a, CloseSession)]


def raw_server(server_cfg: SessionConfig | None = None,
               setup: bool = True) -> tuple[Session, list]:
    """A server session fed a client's SETUP on client uni stream 2 (raw-injection tests).

    Returns the session and the actions it produced so far.
    """
    from kvcs.moqt.wire import Setup, SetupOptions, encode_message

    s = Session(server_cfg or SessionConfig(is_client=False), Opener(False))
    if setup:
        s.stream_data(2, encode_message(Setup(SetupOptions(path=b"/", authority=b"x"))), False)
    acts = s.actions()
    list(s.events())
    return s, acts
