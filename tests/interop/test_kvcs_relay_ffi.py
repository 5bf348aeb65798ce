"""moq-ffi publisher -> kvcs relay -> moq-ffi subscriber, at MOQT draft 22.

The kvcs relay offers only ALPN ``moqt-22`` (raw QUIC) and ``h3`` (WebTransport offering
``moqt-22``), so moq-ffi clients, which prefer moq-lite, speak draft 22 to it. The test
records every session the relay accepts and checks the negotiated ALPN and the parsed
peer SETUP (moq-ffi's implementation string and its unknown/GREASE options).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("moq")

from moq_helpers import collect_track, make_groups, publish_track

from kvcs.relay import Relay, RelayConfig
from kvcs.relay.session import RelaySession
from kvcs.transport import ALPN_MOQT, DevCertificate, MoqtConnection, QuicSettings

pytestmark = pytest.mark.interop

GROUPS = 80
OBJECTS = 64
BIG = (40, 10)  # (group, object) carrying a 1 MiB payload


class RecordingRelay(Relay):
    """A relay that keeps every accepted session for inspection."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.accepted: list[RelaySession] = []

    def new_session(self, conn: MoqtConnection, **kw: Any) -> RelaySession:
        session = super().new_session(conn, **kw)
        self.accepted.append(session)
        return session



async def test_ffi_pub_sub_through_kvcs_relay(cert: DevCertificate) -> None:
    groups = make_groups(
        GROUPS, OBJECTS, size=lambda g, o: 64 + (g * 31 + o * 7) % 1500, overrides={BIG: 1 << 20}
    )
    cfg = RelayConfig(listen="127.0.0.1:0", tls_cert=str(cert.certfile),
                      tls_key=str(cert.keyfile), quic_preset="loopback", goaway_grace=0.2,
                      anonymous=True)
    relay = RecordingRelay(cfg, None, QuicSettings.loopback())
    await relay.start()
    try:
        url = f"moqt://127.0.0.1:{relay.port}"
        done = asyncio.Event()
        sub = asyncio.create_task(
            collect_track(url, "interop/relay", "kv", expected_groups=GROUPS, done=done)
        )
        await publish_track(url, "interop/relay", "kv", groups, release=done)
        received = await sub
    finally:
        await relay.stop(grace=0)

    assert [g.sequence for g in received] == list(range(GROUPS))
    for g in received:
        assert len(g.objects) == OBJECTS, f"group {g.sequence}"
        assert g.objects == groups[g.sequence], f"group {g.sequence} payload mismatch"

    # draft 22: the relay offers only moqt-22 / h3, both sessions negotiated moqt-22 and
    # their SETUP (type 0x2F00) parsed, including moq-ffi's unknown (GREASE) options
    assert ALPN_MOQT == "moqt-22"
    assert relay.metrics.get("kvcs_relay_sessions_total") == 2
    assert len(relay.accepted) == 2
    for ep in relay.accepted:
        assert ep.conn.info is not None and ep.conn.info.alpn == "moqt-22"
        setup = ep.peer_setup
        assert setup is not None
        assert setup.implementation == "moq-lite-rs"
        assert setup.unknown  # options kvcs does not know are kept, not rejected
    m = relay.metrics
    assert m.get("kvcs_relay_requests_total", type="publish_namespace", result="ok") == 1
    assert m.get("kvcs_relay_requests_total", type="subscribe", result="ok") >= 1
    assert m.get("kvcs_relay_protocol_errors_total") == 0
