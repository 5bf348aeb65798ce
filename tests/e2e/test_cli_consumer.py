"""``kvcs fetch`` as a user runs it (subprocesses against in-process relays and KVSP
servers on 127.0.0.1): every covering segment, --codec, and ``publish --index`` /
``fetch --index`` discovery through a KVSP Index without probing the relay."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from kvcs.auth import Authorizer
from kvcs.kv.ids import block_keys, scope_id
from kvcs.kv.store import BlockStore
from kvcs.kvnet.kvsp_http import KvspServer
from kvcs.kvnet.publisher import PublisherOptions
from kvcs.testing import LocalNet

from .cli_run import cli_inputs, load_kv_layers, run_kvcs
from .conftest import BLOCK, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .test_segments import EXTRA, two_segments


async def test_fetch_joins_segments_and_follows_the_codec_preference(
        net: LocalNet, tmp_path: Path) -> None:
    relay = await net.relay()
    f = cli_inputs(tmp_path)
    np.save(tmp_path / "full.npy", np.concatenate([PROMPT, EXTRA]))
    seg0, seg1 = await two_segments(net, relay, 90, PublisherOptions(joint_codec="q8"))
    common = ["--relay", f"moqt://127.0.0.1:{relay.port}/", "--cafile",
              str(net.cert.certfile), "--descriptor", f["desc"], "--scope-key", f["scope"],
              "--loopback", "--tokens", str(tmp_path / "full.npy")]
    rc, out, err = await run_kvcs("fetch", *common, "--out", str(tmp_path / "raw.npz"),
                                  "--codec", "lz4,raw")
    assert rc == 0, err
    assert "covering 19 of 19 blocks in 2 segment(s)" in out
    got = load_kv_layers(tmp_path / "raw.npz")
    for i in range(LAYERS):
        assert same(got[i][0], np.concatenate([seg0[i][0], seg1[i][0]]))
        assert same(got[i][1], np.concatenate([seg0[i][1], seg1[i][1]]))
    rc, out, err = await run_kvcs("fetch", *common, "--out", str(tmp_path / "q8.npz"),
                                  "--codec", "q8", "--layers", "0:1")
    assert rc == 0, err
    k0 = load_kv_layers(tmp_path / "q8.npz")[0][0].astype(np.float32)
    want = np.concatenate([seg0[0][0], seg1[0][0]]).astype(np.float32)
    assert k0.shape == want.shape and not np.array_equal(k0, want)  # q8 is lossy
    assert np.allclose(k0, want, atol=0.05)
    rc, _, err = await run_kvcs("fetch", *common, "--out", str(tmp_path / "x.npz"),
                                "--codec", "Bad!")
    assert rc == 2 and "--codec" in err and err.count("\n") == 1


async def test_publish_registers_with_the_index_and_fetch_finds_it_there(
        net: LocalNet, tmp_path: Path) -> None:
    relay = await net.relay()
    f = cli_inputs(tmp_path)
    np.save(tmp_path / "short.npy", PROMPT[: 10 * BLOCK])
    cert = net.cert
    store = tmp_path / "store"
    async with KvspServer(BlockStore(tmp_path / "index"), authorizer=Authorizer(anonymous=True),
                          certfile=str(cert.certfile), keyfile=str(cert.keyfile)) as index:
        relay_opts = ["--cafile", str(cert.certfile), "--descriptor", f["desc"],
                      "--scope-key", f["scope"], "--loopback"]
        idx = ["--index", index.url, "--index-pin", cert.sha256]
        t0 = time.time()
        publisher = asyncio.create_task(run_kvcs(
            "publish", "--relay", f"moqt://127.0.0.1:{relay.port}/", *relay_opts, *idx,
            "--tokens", f["tokens"], "--kv", f["kv"], "--store", str(store),
            "--retention", "30", "--linger", "5"))
        sid, compat = scope_id(SCOPE), DESC.compat_id
        keys = block_keys(SCOPE, compat, PROMPT, BLOCK)
        for _ in range(200):  # until the registration arrived
            if index.index.holders(sid, compat, keys[0], time.time()):
                break
            await asyncio.sleep(0.05)
        # no --relay: the index names it; the prompt is shorter than the publication
        rc, out, err = await run_kvcs("fetch", *relay_opts, *idx, "--discovery", "index",
                                      "--tokens", str(tmp_path / "short.npy"),
                                      "--out", str(tmp_path / "got.npz"))
        assert rc == 0, err
        assert "covering 10 of 10 blocks" in out
        got = load_kv_layers(tmp_path / "got.npz")
        data = cache(21)
        assert all(same(got[i][0], data[i][0][: 10 * BLOCK]) for i in range(LAYERS))
        rc, out, err = await publisher
        assert rc == 0, err
        assert "registered with the KVSP Index for 16 Block Keys: moqt://127.0.0.1:" in out
    # the containers expire with --retention
    until = BlockStore(store).expires_at(sid, compat, keys[0])
    assert until is not None and t0 + 30 <= until <= time.time() + 30
