"""The ``kvcs`` command line: relay flags, errors, subprocess start/stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvcs.cli import build_parser, main, relay_config
from kvcs.relay import ConfigError
from kvcs.transport import DevCertificate

from .processes import start_relay

PY = sys.executable


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "kvcs", *args], capture_output=True, text=True,
                          timeout=30, cwd=cwd)


def test_relay_without_auth_refuses_with_one_line(tmp_path: Path) -> None:
    p = run("relay", "--listen", "127.0.0.1:0", cwd=tmp_path)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--auth" in lines[0] and "--anonymous" in lines[0]
    assert "Traceback" not in p.stderr


def test_help() -> None:
    p = run("relay", "--help")
    assert p.returncode == 0 and "--upstream" in p.stdout and "--cache-bytes" in p.stdout


def test_user_mistakes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["relay", "--anonymous", "--listen", "nope"],
                 ["relay", "--auth", str(tmp_path / "missing.json")],
                 ["relay", "--anonymous", "--cache-bytes", "lots"],
                 ["relay", "--anonymous", "--upstream", "ftp://x"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("kvcs relay: error:"), err


def test_config_file_and_flags_win(tmp_path: Path) -> None:
    cfg = tmp_path / "relay.toml"
    cfg.write_text('[relay]\nlisten = "127.0.0.1:5000"\nanonymous = true\n'
                   'cache-bytes = "64MiB"\n')
    args = build_parser().parse_args(["relay", "--config", str(cfg), "--listen",
                                      "127.0.0.1:6000"])
    c = relay_config(args)
    assert c.listen == "127.0.0.1:6000" and c.anonymous and c.cache_bytes == 64 << 20
    limits = relay_config(build_parser().parse_args([
        "relay", "--anonymous", "--request-rate", "50", "--request-burst", "8",
        "--max-sessions", "10", "--accept-rate", "5", "--max-session-backlog", "8MiB"]))
    assert (limits.request_rate, limits.request_burst, limits.max_sessions,
            limits.accept_rate, limits.max_session_backlog) == (50, 8, 10, 5, 8 << 20)
    with pytest.raises(ConfigError, match="max-session-backlog"):
        relay_config(build_parser().parse_args(["relay", "--anonymous",
                                                "--max-session-backlog", "1KiB"]))
    cfg.write_text('bogus = 1\n')
    with pytest.raises(ConfigError, match="unknown configuration key"):
        relay_config(build_parser().parse_args(["relay", "--config", str(cfg)]))


def test_subprocess_start_fingerprint_sigterm(tmp_path: Path) -> None:
    proc, seen = start_relay(["--metrics", "127.0.0.1:0"], tmp_path, "fingerprint",
                             timeout=15)
    try:
        assert any("fingerprint" in s for s in seen), seen
        fp = seen[-1].split()[-1]
        assert len(fp.split(":")) == 32
        assert (tmp_path / "certs" / "dev-cert.pem").exists()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
        assert rc == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_relay_serves_kvsp_containers(tmp_path: Path) -> None:
    """``kvcs relay --kvsp-store``: HTTPS on the relay's port number, startup line, 404."""
    import urllib.error
    import urllib.request

    store = tmp_path / "store"
    store.mkdir()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([PY, "-m", "kvcs", "relay", "--anonymous", "--listen",
                             "127.0.0.1:0", "--kvsp-store", str(store)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert "KVSP containers" in lines[2], lines
        url = lines[2].split()[-1]
        port = lines[0].split()[4].rpartition(":")[2]
        assert url == f"https://127.0.0.1:{port}", lines
        import ssl

        ctx = ssl.create_default_context(cafile=str(tmp_path / "certs" / "dev-cert.pem"))
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{url}/kvsp/v1/{'0' * 32}/{'1' * 64}/blocks/{'2' * 64}",
                                   context=ctx, timeout=10)
        assert info.value.code == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_kvsp_flags_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, want in ((["--kvsp-store", str(tmp_path / "none")], "not a directory"),
                       (["--kvsp-listen", "127.0.0.1:1"], "needs --kvsp-store"),
                       (["--kvsp-store", str(tmp_path), "--kvsp-listen", "x"], "HOST:PORT")):
        assert main(["relay", "--anonymous", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and want in err[0], err


def test_busy_port_names_the_address_that_is_busy(tmp_path: Path,
                                                  cert: DevCertificate) -> None:
    """A busy --metrics (TCP) or --listen (UDP) port: status 2 and one line on stderr
    naming that address, nothing else."""
    import socket

    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp.bind(("127.0.0.1", 0))
        metrics = f"127.0.0.1:{tcp.getsockname()[1]}"
        listen = f"127.0.0.1:{udp.getsockname()[1]}"
        for flags, busy in ((["--listen", "127.0.0.1:0", "--metrics", metrics],
                             f"{metrics} (--metrics)"),
                            (["--listen", listen], listen)):
            p = run("relay", "--anonymous", "--tls-cert", str(cert.certfile), "--tls-key",
                    str(cert.keyfile), *flags, cwd=tmp_path)
            assert p.returncode == 2
            lines = p.stderr.splitlines()
            want = f"kvcs relay: error: cannot listen on {busy}: "
            assert len(lines) == 1 and lines[0].startswith(want), p.stderr
            assert "in use" in lines[0] and "('127.0.0.1'" not in lines[0]


def test_congestion_control_flags(tmp_path: Path) -> None:
    """``--congestion-control`` needs aioquic (one line, status 2 on qh3); the upstream
    link may take its own library and controller."""
    # a subprocess: --quic-backend sets this process's default library
    p = run("relay", "--anonymous", "--listen", "127.0.0.1:0", "--quic-backend", "qh3",
            "--congestion-control", "bbr", cwd=tmp_path)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and "needs the aioquic QUIC library" in err[0]
    c = relay_config(build_parser().parse_args([
        "relay", "--anonymous", "--quic-backend", "aioquic", "--congestion-control", "cubic",
        "--upstream", "moqt://127.0.0.1:4443/", "--upstream-quic-backend", "aioquic",
        "--upstream-congestion-control", "bbr"]))
    assert (c.congestion_control, c.upstream_quic_backend, c.upstream_congestion_control) == (
        "cubic", "aioquic", "bbr")
    with pytest.raises(ConfigError, match="upstream-congestion-control"):
        c.upstream_congestion_control = "vegas"
        c.validate()
