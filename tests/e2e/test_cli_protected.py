"""``kvcs publish --protect`` and ``kvcs fetch --protect`` as a user runs them: a scope file
from ``kvcs keygen``, a protected publication through an in-process relay, a fetch with
the content keys; without them the publication is refused, and mistakes are one line."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from kvcs.testing import LocalNet

from .cli_run import ENV, cli_inputs, load_kv_layers, run_kvcs
from .conftest import LAYERS, cache, same


async def test_publish_and_fetch_protected(net: LocalNet, tmp_path: Path) -> None:
    relay = await net.relay()
    f = cli_inputs(tmp_path)
    scope_file = str(tmp_path / "scope.json")
    rc, out, err = await run_kvcs("keygen", scope_file, "--scope-key", f["scope"])
    assert rc == 0, err
    common = ["--relay", f"moqt://127.0.0.1:{relay.port}/", "--cafile", str(net.cert.certfile),
              "--descriptor", f["desc"], "--scope-key", scope_file, "--loopback"]
    # the publisher serves until interrupted (SIGINT once the fetches are done), unless it
    # hands the publication over to the relay and leaves
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvcs", "publish", *common, "--tokens", f["tokens"], "--kv",
        f["kv"], "--protect", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=ENV)
    try:
        for _ in range(100):  # wait until the publication is announced
            rc, out, err = await run_kvcs("inspect", *common)
            if "1 publication(s)" in out:
                assert "trust: protected, signed (docs/security.md)" in out
                break
            await asyncio.sleep(0.1)
        out_path = tmp_path / "got.npz"
        rc, out, err = await run_kvcs("fetch", *common, "--tokens", f["tokens"], "--out",
                                      str(out_path), "--protect")
        assert rc == 0, err
        # keygen's producer key: the publisher signs, the fetch requires it (issue 27)
        assert "trust: protected, signed (docs/security.md)" in out
        got = load_kv_layers(out_path)
        data = cache(21)
        assert sorted(got) == list(range(LAYERS))
        for i, (k, v) in got.items():
            assert same(k, data[i][0]) and same(v, data[i][1])
        # the same scope file without --protect: refused, with the reason, nothing written
        rc, out, err = await run_kvcs("fetch", *common, "--tokens", f["tokens"],
                                      "--out", str(tmp_path / "plain.npz"))
        assert rc == 1 and "protected" in err and "no content keys" in err
        assert not (tmp_path / "plain.npz").exists()
        assert publisher.stdout is not None
        async with asyncio.timeout(30):  # everything published: it serves, or it has left
            lines = []
            while (line := await publisher.stdout.readline()) and b"serving" not in line:
                lines.append(line)
            assert b"trust: protected, signed (docs/security.md)\n" in lines
    finally:
        if publisher.returncode is None:
            publisher.send_signal(signal.SIGINT)
    _, err_b = await asyncio.wait_for(publisher.communicate(), 30)
    assert publisher.returncode in (0, 130), err_b.decode()  # 0: handed over to the relay


async def test_protect_mistakes_are_one_line(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    f = cli_inputs(tmp_path)
    ident = ["--relay", "moqt://127.0.0.1:9/", "--descriptor", f["desc"], "--tokens",
             f["tokens"]]
    rc, _, err = await run_kvcs("publish", *ident, "--kv", f["kv"], "--scope-key", f["scope"],
                                "--protect")
    assert rc == 2 and err.count("\n") == 1 and "no content keys" in err and "keygen" in err
    monkeypatch.setitem(ENV, "KVCS_SCOPE_KEY", "01" * 32)  # a scope key, but no content keys
    rc, _, err = await run_kvcs("fetch", *ident, "--out", str(tmp_path / "x.npz"), "--protect")
    assert rc == 2 and err.count("\n") == 1 and "--protect needs --scope-key" in err
    (tmp_path / "broken.json").write_text('{"kvcs_scope": 1, "scope_key": "zz"}')
    rc, _, err = await run_kvcs("publish", *ident, "--kv", f["kv"], "--protect-in-band",
                                "--scope-key", str(tmp_path / "broken.json"))
    assert rc == 2 and err.count("\n") == 1 and "broken.json" in err


async def test_inspect_reads_both_and_protect_explains_plaintext(net: LocalNet,
                                                                 tmp_path: Path) -> None:
    """A plaintext publication: `inspect` with a scope file reads it (and says it is
    unprotected); `fetch --protect` refuses it in words that say what to do."""
    relay = await net.relay()
    f = cli_inputs(tmp_path)
    scope_file = str(tmp_path / "scope.json")
    rc, _, err = await run_kvcs("keygen", scope_file, "--scope-key", f["scope"],
                                "--no-signing-key")
    assert rc == 0, err
    trusted = ["--relay", f"moqt://127.0.0.1:{relay.port}/", "--cafile",
               str(net.cert.certfile), "--descriptor", f["desc"], "--loopback"]
    rc, out, err = await run_kvcs("publish", *trusted, "--scope-key", f["scope"], "--tokens",
                                  f["tokens"], "--kv", f["kv"])
    assert rc == 0 and "the relay holds the whole publication" in out, err
    rc, out, err = await run_kvcs("inspect", *trusted, "--scope-key", scope_file)
    assert rc == 0, err
    assert "1 publication(s)" in out and "unprotected (plaintext)" in out
    assert "unreadable" not in out and "Key ID" not in out
    rc, out, err = await run_kvcs("fetch", *trusted, "--scope-key", scope_file, "--protect",
                                  "--tokens", f["tokens"], "--out", str(tmp_path / "x.npz"))
    assert rc == 1 and err.count("\n") == 1, err
    assert "not protected (plaintext)" in err and "without --protect" in err
    assert "Key ID" not in err
