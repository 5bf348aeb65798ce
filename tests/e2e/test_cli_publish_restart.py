"""``kvcs publish`` outlives a relay restart: it publishes through a reconnecting target,
so when its relay goes away and comes back on the same address, it reconnects, announces
again and serves its tracks to the new relay (real QUIC on 127.0.0.1; the relay is
in-process, the publisher a subprocess as a user runs it)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

from kvcs.relay import Relay, RelayConfig
from kvcs.testing import LocalNet
from kvcs.transport import QuicSettings

from .conftest import LAYERS, cache, same
from .test_cli import ENV, _files, _run, load_kv_layers


async def _relay(net: LocalNet, port: int) -> Relay:
    cfg = RelayConfig(listen=f"127.0.0.1:{port}", tls_cert=str(net.cert.certfile),
                      tls_key=str(net.cert.keyfile), anonymous=True, goaway_grace=0)
    relay = Relay(cfg, settings=QuicSettings.loopback())
    await relay.start()
    return relay


async def _fetch_until_whole(common: list[str], tokens: str, out: Path) -> str:
    """Fetch until it succeeds (the publisher may still be reconnecting): the last output."""
    err = ""
    for _ in range(60):
        rc, stdout, err = await _run("fetch", *common, "--tokens", tokens, "--out", str(out))
        if rc == 0:
            return stdout
        await asyncio.sleep(0.25)
    raise AssertionError(f"fetch never succeeded: {err}")


async def test_publish_reconnects_after_the_relay_restarts(net: LocalNet,
                                                           tmp_path: Path) -> None:
    relay = await _relay(net, 0)
    port = relay.port
    f = _files(tmp_path)
    common = ["--relay", f"moqt://127.0.0.1:{port}/", "--cafile", str(net.cert.certfile),
              "--descriptor", f["desc"], "--scope-key", f["scope"], "--loopback"]
    # --no-hand-over: the relay holds nothing by itself, every fetch pulls from the publisher
    pub = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvcs", "publish", *common,
        "--tokens", f["tokens"], "--kv", f["kv"], "--no-hand-over", "--linger", "60",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ENV)
    try:
        await _fetch_until_whole(common, f["tokens"], tmp_path / "before.npz")
        await relay.stop(grace=0)  # the publisher's session ends
        relay = await _relay(net, port)  # same address, empty cache, no publication
        out = await _fetch_until_whole(common, f["tokens"], tmp_path / "after.npz")
        assert f"verified layer {LAYERS}/{LAYERS}" in out
        got, data = load_kv_layers(tmp_path / "after.npz"), cache(21)
        for i, (k, v) in enumerate(data):
            assert same(got[i][0], k[: got[i][0].shape[0]]) and same(got[i][1],
                                                                       v[: got[i][1].shape[0]])
        assert relay.publishers, "the publisher announced again on the restarted relay"
    finally:
        with contextlib.suppress(ProcessLookupError):
            pub.terminate()
        _out, err = await asyncio.wait_for(pub.communicate(), 30)
        await relay.stop(grace=0)
    assert b"Traceback" not in err, err.decode()[-2000:]
