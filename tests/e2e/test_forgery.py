"""A consistent forgery (issue 27): a relay rewrites an object, its Data Digest and the
unsigned manifest's listed digest, so every check a keyless consumer can make passes.
A consumer without keys ("trusted relays") takes the forged tensor; one using what `kvcs
keygen` wrote (the scope file names a producer key: the publisher signs, the consumer has
the keyring and so requires signatures by default) refuses it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvcs.cli import main
from kvcs.kv.codecs import encode_component
from kvcs.kv.component import Component
from kvcs.kv.payload import build_payload_bytes
from kvcs.kv.scopefile import load_scope_file
from kvcs.kvnet.consumer import KvConsumer
from kvcs.kvnet.publisher import PublisherOptions
from kvcs.moqt.wire import ObjectRecord
from kvcs.testing import LocalNet

from .conftest import BLOCK, DESC, LAYERS, PROMPT, SCOPE, cache, same
from .helpers import publish_cache
from .test_protected_tampering import EditingRelay

GROUP, BLOCK_INDEX = 2, 3
"""The forged object: block 3 of layer 2 of the key track."""


def _forger() -> dict:
    """Edits that replace the key object of (GROUP, BLOCK_INDEX) with other data under its
    own correct digest, and list that digest in every unsigned manifest version."""
    k, v = cache(99)[GROUP]
    rows = slice(BLOCK_INDEX * BLOCK, (BLOCK_INDEX + 1) * BLOCK)
    data = encode_component(Component.K, "raw", k[rows], v[rows])
    payload = build_payload_bytes(Component.K, GROUP, BLOCK_INDEX, BLOCK_INDEX * BLOCK, BLOCK,
                                  "raw", data)
    digest = hashlib.sha256(bytes(data)).hexdigest()

    def obj(r: ObjectRecord) -> None:
        r.payload = memoryview(payload)

    def manifest(r: ObjectRecord) -> None:
        doc = json.loads(bytes(r.payload))
        for seg in doc["segments"]:
            groups = seg.get("object_digests", {}).get("k.raw.s0", [])
            if len(groups) > GROUP:
                groups[GROUP][BLOCK_INDEX] = digest
        r.payload = memoryview(json.dumps(doc).encode())

    return {(b"k.raw.s0", GROUP, BLOCK_INDEX): obj, (b"manifest", None, 0): manifest}


def _forged_block_taken(layers: list, data: list) -> bool:
    rows = slice(BLOCK_INDEX * BLOCK, (BLOCK_INDEX + 1) * BLOCK)
    got = next(x for x in layers if x.index == GROUP)
    return not same(got.k[rows], data[GROUP][0][rows])


async def test_a_consistent_forgery_fools_only_a_consumer_without_keys(
        net: LocalNet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = await net.relay()
    evil = await net.relay(EditingRelay, upstream=clean)
    evil.edits = _forger()  # type: ignore[attr-defined]

    # trusted relays: no content keys, no producer key; the forgery is believed
    _, data = await publish_cache(net, clean, 61)
    naive = KvConsumer(await net.client(evil), SCOPE, DESC, PROMPT)
    found = await naive.discover()
    assert found is not None and not naive.require_signed
    got = [x async for x in naive.layers(found)]
    assert _forged_block_taken(got, data)
    assert naive.stats.rejected == 0

    # signed: the scope file `kvcs keygen` wrote, used by both ends as it comes
    path = tmp_path / "scope.json"
    assert main(["keygen", str(path), "--scope-key", str(_scope_key_file(tmp_path))]) == 0
    assert "signing key 'producer'" in capsys.readouterr().out
    scope = load_scope_file(path)
    pub, data = await publish_cache(net, clean, 62,
                                    PublisherOptions(producer_key=scope.producer_key()))
    evil.only = pub.fields  # type: ignore[attr-defined]
    careful = KvConsumer([await net.client(evil), await net.client(clean)], SCOPE, DESC,
                         PROMPT, keyring=scope.keyring(), recompute_budget_s=5)
    assert careful.require_signed  # by default, with the producer's public key
    pubs = await careful.discover_all()
    target = next(p for p in pubs if p.namespace.publication_id == pub.publication_id)
    got = [x async for x in careful.layers(target)]
    assert [x.index for x in got] == list(range(LAYERS))
    assert not _forged_block_taken(got, data)
    assert careful.stats.rejected >= 1  # the forged object, recovered from the clean relay


def _scope_key_file(tmp_path: Path) -> Path:
    """The tests' scope key S as a plain scope key file (keygen builds the scope around it,
    so identifiers stay those of the tests' publications)."""
    p = tmp_path / "scope.key"
    p.write_bytes(SCOPE.key)
    return p
