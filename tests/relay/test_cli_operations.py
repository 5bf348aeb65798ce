"""Operating ``kvcs relay`` as a subprocess: /healthz, /readyz and /metrics (with request
latency histograms) beside each other, JSON logs, and SIGHUP reloading the token file and
the TLS certificate without dropping open sessions (real QUIC on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from kvcs.endpoint import Endpoint, MoqtRequestError
from kvcs.moqt.wire import AuthToken
from kvcs.transport import ensure_dev_certificate

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def grants(token: str) -> str:
    return json.dumps({"tokens": [{"token": token, "subscribe": ["kvcs-1"],
                                   "publish": ["kvcs-1"]}]})


async def http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def client(port: int, token: str, pin: str) -> Endpoint:
    return await Endpoint.connect(f"moqt://127.0.0.1:{port}/", pin_sha256=pin,
                                  auth_tokens=(AuthToken(3, token_type=0, value=token.encode()),))


async def test_health_metrics_json_logs_and_sighup_reload(tmp_path: Path) -> None:
    old_cert, new_cert = (ensure_dev_certificate(tmp_path / d) for d in ("a", "b"))
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    shutil.copy(old_cert.certfile, cert)
    shutil.copy(old_cert.keyfile, key)
    auth = tmp_path / "auth.json"
    auth.write_text(grants("old-token"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvcs", "relay", "--auth", str(auth), "--listen", "127.0.0.1:0",
        "--metrics", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key),
        "--log-format", "json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=ENV)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        port = metrics = 0
        while not metrics:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert line, "the relay exited"
            if "listening on" in line:
                port = int(line.split("listening on ")[1].split()[0].rsplit(":", 1)[1])
            if line.startswith("metrics on"):
                metrics = int(line.split(":")[-1].split("/")[0])
        assert await http_get(metrics, "/healthz") == (200, "ok\n")
        assert await http_get(metrics, "/readyz") == (200, "ready\n")
        status, body = await http_get(metrics, "/nothing-here")
        assert status == 404 and "/metrics" in body

        first = await client(port, "old-token", old_cert.sha256)
        watch = await first.subscribe_namespace((b"kvcs-1",))
        await watch.cancel()

        auth.write_text(grants("new-token"))
        shutil.copy(new_cert.certfile, cert)
        shutil.copy(new_cert.keyfile, key)
        proc.send_signal(signal.SIGHUP)
        for _ in range(100):  # until the relay has reloaded (it logs it)
            try:
                second = await client(port, "new-token", new_cert.sha256)
                break
            except ConnectionError:  # still the old certificate
                await asyncio.sleep(0.1)
        else:
            pytest.fail("the relay never presented the new certificate")
        watch = await second.subscribe_namespace((b"kvcs-1",))
        await watch.cancel()
        # the open session stays up, and its old token no longer grants anything
        assert not first.is_closed
        with pytest.raises(MoqtRequestError, match="UNAUTHORIZED"):
            await first.subscribe_namespace((b"kvcs-1",))
        for ep in (first, second):
            ep.close()
            await ep.wait_closed()

        status, text = await http_get(metrics, "/metrics")
        assert status == 200
        assert 'kvcs_relay_request_seconds_bucket{result="ok",type="subscribe_namespace",' \
               'le="+Inf"} 2' in text
        assert 'kvcs_relay_request_seconds_count{result="unauthorized"' in text
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    logs = [json.loads(line) for line in err.decode().splitlines() if line.strip()]
    assert logs and all({"time", "level", "logger", "message"} <= set(e) for e in logs)
    assert any("SIGHUP: reloaded" in e["message"] for e in logs)
