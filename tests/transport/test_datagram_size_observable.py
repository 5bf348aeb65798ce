"""Issue #19: the datagram size each connection uses is observable: a property of the
endpoint, a gauge per session in the relay's metrics, and a DEBUG line per connection;
``--mtu`` sets it for every peer (issue #16)."""

from __future__ import annotations

import logging

import pytest

from kvcs.cli import main
from kvcs.endpoint import Endpoint
from kvcs.relay import Relay, RelayConfig
from kvcs.testing import LocalNet, until
from kvcs.transport import DevCertificate, QuicSettings, max_datagram_size_limit

GAUGE = "kvcs_relay_session_datagram_size_bytes"


async def test_endpoint_and_relay_metrics_show_each_sessions_datagram_size(
        cert: DevCertificate, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="kvcs.transport.connection")
    auto = QuicSettings()  # the relay: per peer, so the library's largest to loopback
    async with LocalNet(cert, auto) as net:
        relay = await net.relay()
        url = f"moqt://127.0.0.1:{relay.port}/"
        small = await Endpoint.connect(url, settings=QuicSettings(max_datagram_size=1452),
                                       cafile=str(cert.certfile))
        large = await Endpoint.connect(url, settings=auto, cafile=str(cert.certfile))
        net.endpoints += [small, large]
        limit = max_datagram_size_limit(auto.library)
        assert (small.max_datagram_size, large.max_datagram_size) == (1452, limit)
        await until(lambda: len(relay.sessions) == 2)
        ids = sorted(relay.sessions)
        # the relay sends the library's largest to both: each end caps only what it sends
        assert [relay.metrics.get(GAUGE, session=str(i)) for i in ids] == [limit, limit]
        text = relay.metrics.render()
        assert f"# TYPE {GAUGE} gauge" in text
        for i in ids:
            assert f'{GAUGE}{{session="{i}"}} {limit}' in text
        assert "client connection with " in caplog.text
        assert "datagram size 1452 bytes (configured 1452)" in caplog.text
        small.close()
        await until(lambda: len(relay.sessions) == 1)
        assert f'{GAUGE}{{session="{ids[0]}"}}' not in relay.metrics.render()


async def test_relay_mtu_sets_every_sessions_datagram_size(cert: DevCertificate) -> None:
    """``kvcs relay --mtu 1500``: 1452-byte datagrams to every client, loopback ones too."""
    async with LocalNet(cert, QuicSettings.for_path(mtu=1500)) as net:
        relay = Relay(RelayConfig(listen="127.0.0.1:0", tls_cert=str(cert.certfile),
                                  tls_key=str(cert.keyfile), anonymous=True, mtu=1500,
                                  goaway_grace=0.1))
        await relay.start()
        net.relays.append(relay)
        ep = await net.client(relay)
        await until(lambda: len(relay.sessions) == 1)
        (session_id,) = relay.sessions
        assert relay.metrics.get(GAUGE, session=str(session_id)) == 1452
        assert ep.max_datagram_size == 1452


def test_bad_mtu_is_one_line(capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVCS_SCOPE_KEY", "ab" * 32)
    for argv in (["relay", "--anonymous", "--listen", "127.0.0.1:0", "--mtu", "1000"],
                 ["inspect", "--relay", "moqt://127.0.0.1:1/", "--mtu", "70000"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--mtu must be within" in err[0], err
