"""How a dial fails: nothing listening on the port is reported from the ICMP answer as
ConnectionRefusedError, not after the handshake timeout; a CA file that cannot be read is a
ValueError naming it, before anything is sent (real sockets on 127.0.0.1)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kvcs.transport import DevCertificate, connect

from .conftest import echo_factory


def closed_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_nothing_listening_is_refused_not_timed_out(cert: DevCertificate) -> None:
    # a timeout would raise ConnectionError("timeout connecting ...") after 60 s instead
    with pytest.raises(ConnectionRefusedError, match="nothing listens"):
        await connect(f"moqt://127.0.0.1:{closed_udp_port()}/", echo_factory,
                      cafile=str(cert.certfile), timeout=60)


async def test_an_unreadable_cafile_is_named(tmp_path: Path) -> None:
    for path, why in ((tmp_path / "missing.pem", "No such file"),
                      (tmp_path / "empty.pem", "")):
        if not why:
            path.write_text("not a certificate\n")
        with pytest.raises(ValueError, match=f"cafile {path}"):
            await connect(f"moqt://127.0.0.1:{closed_udp_port()}/", echo_factory,
                          cafile=str(path), timeout=60)
