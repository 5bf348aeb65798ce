"""The sans-IO layer assembler: objects and containers in, verified layers and exactly
what is missing out."""

from __future__ import annotations

import hashlib
import logging

import ml_dtypes
import numpy as np
import pytest

from kvcs.kv.assembly import AssemblyStats, LayerAssembler, Outcome, select_tracks
from kvcs.kv.codecs import encode_component
from kvcs.kv.component import Component
from kvcs.kv.container import build_container
from kvcs.kv.errors import ManifestError
from kvcs.kv.ids import CompatDescriptor, ScopeKey, block_keys
from kvcs.kv.manifest import Manifest, Segment
from kvcs.kv.payload import build_payload_bytes, data_digest
from kvcs.kv.secure import CipherSuite, ContentKey, SecureObjects, effective_priority
from kvcs.kv.tracks import TrackName
from kvcs.moqt.wire import ObjectRecord, ObjectStatus

K, V, KV = Component.K, Component.V, Component.KV
LAYERS = 3
B = 2  # tokens per block
BLOCKS = 4
DESC = CompatDescriptor.from_dict({
    "kvsp": 1, "model": "assembly", "revision": "0", "tokenizer": "t", "layers": LAYERS,
    "kv_heads": 2, "head_dim": 4, "dtype": "bfloat16", "block_tokens": B, "layout": "tnd",
    "rope": "post"})
SCOPE = ScopeKey(bytes(range(32)))
TOKENS = np.arange(100, 100 + B * BLOCKS + 1)  # four blocks and a partial one
KEYS = block_keys(SCOPE, DESC.compat_id, TOKENS, B)
KV_TRACKS = {K: TrackName.data(K, "raw", 0), V: TrackName.data(V, "raw", 0)}


def cache(seed: int = 1, tokens: int = B * BLOCKS) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer (K, V), [tokens, 2, 4] bfloat16."""
    rng = np.random.default_rng(seed)
    return [tuple(rng.standard_normal((tokens, 2, 4)).astype(ml_dtypes.bfloat16)
                  for _ in "kv") for _ in range(LAYERS)]  # type: ignore[misc]


DATA = cache()


def obj(kind: Component, layer: int, block: int, data: list | None = None, *,
        codec: str = "raw", first_block: int = 0, token_start: int | None = None) -> bytes:
    """The payload of one object of ``data`` (default DATA), as a publisher builds it."""
    k, v = (data or DATA)[layer]
    rows = slice(block * B, (block + 1) * B)
    body = encode_component(kind, codec, k[rows], v[rows])
    start = (first_block + block) * B if token_start is None else token_start
    return build_payload_bytes(kind, layer, block, start, B, codec, body)


def assembler(layers: range = range(LAYERS), blocks: int = BLOCKS, **kw) -> LayerAssembler:
    kw.setdefault("tracks", KV_TRACKS)
    return LayerAssembler(DESC, layers, blocks, block_keys=KEYS, **kw)


def feed_layer(asm: LayerAssembler, layer: int, kinds=(K, V), data=None) -> list[Outcome]:
    return [asm.accept(kind, layer, b, obj(kind, layer, b, data))
            for kind in kinds for b in range(asm.blocks)]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint16), b.view(np.uint16))


def test_good_objects_give_layers_in_order() -> None:
    asm = assembler()
    for layer in range(LAYERS):
        outcomes = feed_layer(asm, layer)
        assert outcomes[-1] is Outcome.LAYER_COMPLETE
        assert set(outcomes[:-1]) == {Outcome.PLACED}
        [got] = asm.pop_ready()
        assert got.index == layer and got.blocks == BLOCKS
        assert same(got.k, DATA[layer][0]) and same(got.v, DATA[layer][1])
    assert asm.done and asm.missing() == {} and asm.pop_ready() == []
    assert asm.stats.objects == LAYERS * BLOCKS * 2 and asm.stats.rejected == 0
    assert asm.stats.bytes == sum(len(obj(K, 0, b)) + len(obj(V, 0, b))
                                  for b in range(BLOCKS)) * LAYERS


def test_out_of_order_objects_and_layers() -> None:
    asm = assembler()
    order = [(kind, layer, b) for layer in (2, 1, 0) for b in (3, 0, 2, 1) for kind in (V, K)]
    ready = []
    for kind, layer, b in order:
        asm.accept(kind, layer, b, obj(kind, layer, b))
        ready += asm.pop_ready()
        if layer > 0:
            assert ready == []  # nothing before layer 0
    assert [x.index for x in ready] == [0, 1, 2]
    assert all(same(x.k, DATA[x.index][0]) and same(x.v, DATA[x.index][1]) for x in ready)


def test_k_without_v_is_missing_until_v_arrives() -> None:
    asm = assembler()
    assert set(feed_layer(asm, 0, kinds=(K,))) == {Outcome.PLACED}
    assert asm.pop_ready() == []
    assert asm.missing() == {layer: [0, 1, 2, 3] for layer in range(LAYERS)}
    asm.accept(V, 0, 1, obj(V, 0, 1))
    assert asm.missing()[0] == [0, 2, 3]
    for b in (0, 2, 3):
        asm.accept(V, 0, b, obj(V, 0, b))
    assert [x.index for x in asm.pop_ready()] == [0]
    assert asm.missing() == {1: [0, 1, 2, 3], 2: [0, 1, 2, 3]}


def flip(payload: bytes, offset: int) -> bytes:
    bad = bytearray(payload)
    bad[offset] ^= 0x40
    return bytes(bad)


@pytest.mark.parametrize(("what", "payload"), [
    ("magic", flip(obj(K, 0, 2), 0)),
    ("data (digest mismatch)", flip(obj(K, 0, 2), -1)),
    ("digest field", flip(obj(K, 0, 2), 40)),
    ("layer != group", obj(K, 1, 2)),
    ("block index != object", obj(K, 0, 1)),
    ("component v on the k track", obj(V, 0, 2)),
    ("token start", obj(K, 0, 2, token_start=0)),
    ("codec", obj(K, 0, 2, codec="zstd")),
    ("truncated", obj(K, 0, 2)[:-1]),
    ("shorter than the header", obj(K, 0, 2)[:60]),
])
def test_bad_object_is_rejected_and_missing(what: str, payload: bytes) -> None:
    asm = assembler()
    feed_layer(asm, 0)
    asm = assembler()  # again, with the bad object in place of (k, 0, 2)
    for kind in (K, V):
        for b in range(BLOCKS):
            p = payload if (kind, b) == (K, 2) else obj(kind, 0, b)
            expected = Outcome.REJECTED if (kind, b) == (K, 2) else Outcome.PLACED
            assert asm.accept(kind, 0, b, p) is expected, what
    assert asm.stats.rejected == 1 and asm.stats.objects == 2 * BLOCKS - 1
    assert asm.pop_ready() == []
    assert asm.missing()[0] == [2]
    assert asm.accept(K, 0, 2, obj(K, 0, 2)) is Outcome.LAYER_COMPLETE  # recovered
    [layer] = asm.pop_ready()
    assert same(layer.k, DATA[0][0])


def test_token_count_checked() -> None:
    k, _ = DATA[0]
    body = encode_component(K, "raw", k[:B], k[:B])
    short = build_payload_bytes(K, 0, 0, 0, B - 1, "raw", body)
    asm = assembler()
    assert asm.accept(K, 0, 0, short) is Outcome.REJECTED


def test_duplicate_excess_and_ignored() -> None:
    asm = assembler(layers=range(1, 3), blocks=2)
    assert asm.accept(K, 1, 0, obj(K, 1, 0)) is Outcome.PLACED
    assert asm.accept(K, 1, 0, obj(K, 1, 0)) is Outcome.DUPLICATE
    assert asm.accept(K, 1, 2, obj(K, 1, 2)) is Outcome.EXCESS  # only 2 blocks wanted
    assert asm.accept(K, 0, 0, obj(K, 0, 0)) is Outcome.IGNORED  # outside the range
    feed_layer(asm, 1)
    assert [x.index for x in asm.pop_ready()] == [1]
    assert asm.accept(V, 1, 1, obj(V, 1, 1)) is Outcome.IGNORED  # already handed out
    st = asm.stats
    assert (st.duplicates, st.excess, st.objects) == (1 + 1, 1, 4)  # feed_layer repeats k0


def test_partial_layer_range_and_first_blocks() -> None:
    asm = assembler(layers=range(1, 3), blocks=3)
    for layer in (1, 2):
        feed_layer(asm, layer)
    got = asm.pop_ready()
    assert [x.index for x in got] == [1, 2]
    for x in got:
        assert x.k.shape == (3 * B, 2, 4) and x.blocks == 3
        assert same(x.k, DATA[x.index][0][: 3 * B]) and same(x.v, DATA[x.index][1][: 3 * B])
    assert asm.stats.excess == 0  # feed_layer only sends the wanted blocks
    with pytest.raises(ValueError, match="contiguous range"):
        assembler(layers=range(2, 4))
    with pytest.raises(ValueError, match="contiguous range"):
        assembler(layers=range(1, 1))


def test_later_segment_token_starts() -> None:
    """Blocks of segment 1 start at first_block: their token starts are absolute."""
    tracks = {K: TrackName.data(K, "raw", 1), V: TrackName.data(V, "raw", 1)}
    asm = assembler(tracks=tracks, first_block=2, blocks=2)
    assert asm.accept(K, 0, 0, obj(K, 0, 0)) is Outcome.REJECTED  # token start 0, not 4
    for kind in (K, V):
        for b in range(2):
            asm.accept(kind, 0, b, obj(kind, 0, b, first_block=2))
    assert [x.index for x in asm.pop_ready()] == [0]


@pytest.mark.parametrize("codec", ["raw", "zstd", "q8"])
def test_joint_kv_track(codec: str) -> None:
    asm = assembler(tracks={KV: TrackName.data(KV, codec, 0)})
    outcomes = [asm.accept(KV, 0, b, obj(KV, 0, b, codec=codec)) for b in range(BLOCKS)]
    assert outcomes[-1] is Outcome.LAYER_COMPLETE
    assert asm.accept(K, 1, 0, obj(K, 1, 0)) is Outcome.REJECTED  # no k track selected
    [layer] = asm.pop_ready()
    k, v = DATA[0]
    if codec == "q8":  # within the q8 bound: scale/2 per row, plus bfloat16 rounding
        for got, want in ((layer.k, k), (layer.v, v)):
            a, b = got.astype(np.float32), want.astype(np.float32)
            scale = np.abs(b).max(axis=-1, keepdims=True) / 127
            assert np.all(np.abs(a - b) <= scale * 0.51 + np.abs(b) / 128)
    else:
        assert same(layer.k, k) and same(layer.v, v)


# ---------------------------------------------------------------------- containers


def container(block: int, data: list | None = None, *, key: bytes | None = None,
              token_start: int | None = None, desc: CompatDescriptor = DESC) -> bytes:
    rows = slice(block * B, (block + 1) * B)
    layers = data or DATA
    return build_container(desc, "raw", KEYS[block] if key is None else key,
                           block * B if token_start is None else token_start,
                           [k[rows] for k, _ in layers], [v[rows] for _, v in layers])


def test_containers_alone_give_every_layer() -> None:
    """The HTTP-only path: no tracks, every block from a container."""
    asm = LayerAssembler(DESC, range(LAYERS), BLOCKS, block_keys=KEYS)
    assert asm.container_blocks() == [0, 1, 2, 3]
    for b in (3, 1, 0, 2):
        assert asm.accept_container(b, container(b))
    got = asm.pop_ready()
    assert [x.index for x in got] == [0, 1, 2]
    assert all(same(x.k, DATA[x.index][0]) and same(x.v, DATA[x.index][1]) for x in got)
    assert asm.stats.http_blocks == BLOCKS and asm.stats.rejected == 0


OTHER_DESC = CompatDescriptor.from_dict({**DESC.members, "revision": "1"})


@pytest.mark.parametrize(("what", "data"), [
    ("block key", container(1, key=KEYS[2])),
    ("token start", container(1, token_start=0)),
    ("compat id", container(1, desc=OTHER_DESC)),
    ("layer digest", flip(container(1), -1)),
    ("truncated", container(1)[:-3]),
])
def test_bad_container_is_rejected(what: str, data: bytes) -> None:
    asm = assembler()
    for layer in range(LAYERS):
        for kind in (K, V):
            for b in (0, 2, 3):
                asm.accept(kind, layer, b, obj(kind, layer, b))
    assert not asm.accept_container(1, data), what
    assert asm.stats.rejected == 1 and asm.stats.http_blocks == 0
    assert asm.missing() == {layer: [1] for layer in range(LAYERS)}
    assert asm.accept_container(1, container(1))
    assert [x.index for x in asm.pop_ready()] == [0, 1, 2]


def test_container_fills_only_what_is_missing() -> None:
    """Objects already placed stay; layers handed out are not touched."""
    asm = assembler()
    feed_layer(asm, 0)
    [first] = asm.pop_ready()
    feed_layer(asm, 1, kinds=(K,))
    other = cache(seed=2)
    assert asm.accept_container(0, container(0, other))
    assert same(first.k, DATA[0][0])  # the handed-out layer is untouched
    assert asm.missing() == {1: [1, 2, 3], 2: [1, 2, 3]}
    for b in (1, 2, 3):
        asm.accept(V, 1, b, obj(V, 1, b))
    [second] = asm.pop_ready()
    assert same(second.v[:B], other[1][1][:B]) and same(second.v[B:], DATA[1][1][B:])
    assert asm.container_blocks() == [1, 2, 3]


def test_container_blocks_need_a_block_key() -> None:
    short_keys = KEYS[:3]  # the consumer's prompt covers three blocks of the segment
    asm = LayerAssembler(DESC, range(LAYERS), BLOCKS, tracks=KV_TRACKS, block_keys=short_keys)
    assert asm.container_blocks() == [0, 1, 2]
    later = LayerAssembler(DESC, range(LAYERS), 2, tracks=KV_TRACKS, block_keys=KEYS,
                           first_block=3)
    assert later.container_blocks() == [0]  # absolute block 3 has a key, block 4 none
    assert later.block_key(0) == KEYS[3]


# ---------------------------------------------------------------------- signed digests


def manifest(listed_layers: int, data: list | None = None,
             tracks: dict[Component, TrackName] = KV_TRACKS) -> Manifest:
    """A manifest listing the object digests of the first ``listed_layers`` layers."""
    digests = {str(t): [[data_digest(obj(kind, layer, b, data, codec=t.codec or "")).hex()
                         for b in range(BLOCKS)] for layer in range(listed_layers)]
               for kind, t in tracks.items()}
    seg = Segment(0, 0, BLOCKS, "00" * 32, [str(t) for t in tracks.values()],
                  listed_layers == LAYERS, digests)
    return Manifest.for_descriptor(DESC, segments=[seg])


def test_signed_digest_checked_at_accept() -> None:
    asm = assembler(require_signed=True)
    asm.use_manifest(manifest(LAYERS))
    other = cache(seed=3)  # another publication's objects: valid, but not the signed ones
    assert asm.accept(K, 0, 1, obj(K, 0, 1, other)) is Outcome.REJECTED
    feed_layer(asm, 0)
    assert [x.index for x in asm.pop_ready()] == [0]
    assert asm.stats.rejected == 1


def test_signed_layers_wait_for_the_manifest_and_drop_what_differs() -> None:
    asm = assembler(require_signed=True)
    asm.use_manifest(manifest(0))
    other = cache(seed=3)
    feed_layer(asm, 0)
    feed_layer(asm, 1)
    assert asm.pop_ready() == []  # complete, but not listed yet
    assert asm.missing() == {layer: [0, 1, 2, 3] for layer in range(LAYERS)}
    # layer 1 block 2 of K came from elsewhere before the digests were listed
    asm2 = assembler(require_signed=True)
    asm2.use_manifest(manifest(0))
    for layer in (0, 1):
        for kind in (K, V):
            for b in range(BLOCKS):
                src = other if (kind, layer, b) == (K, 1, 2) else None
                asm2.accept(kind, layer, b, obj(kind, layer, b, src))
    asm2.use_manifest(manifest(2))
    assert [x.index for x in asm2.pop_ready()] == [0]
    assert asm2.stats.rejected == 1  # dropped on confirmation
    assert asm2.missing() == {1: [2], 2: [0, 1, 2, 3]}
    assert asm2.accept(K, 1, 2, obj(K, 1, 2)) is Outcome.LAYER_COMPLETE
    [layer] = asm2.pop_ready()
    assert same(layer.k, DATA[1][0])


def test_signed_containers_confirmed_by_raw_digests() -> None:
    asm = assembler(require_signed=True)
    asm.use_manifest(manifest(LAYERS))
    for b in range(BLOCKS):
        asm.accept_container(b, container(b))
    assert [x.index for x in asm.pop_ready()] == [0, 1, 2]
    forged = assembler(require_signed=True)
    forged.use_manifest(manifest(LAYERS))
    forged.accept_container(0, container(0, cache(seed=4)))  # verifies, but is not signed
    for b in range(1, BLOCKS):
        forged.accept_container(b, container(b))
    assert forged.pop_ready() == []
    assert forged.missing() == {layer: [0] for layer in range(LAYERS)}


@pytest.mark.parametrize("codec", ["q8", "zstd"])
def test_signed_non_raw_tracks_confirm_containers_by_encoding_again(codec: str) -> None:
    """A raw container stands for the q8/zstd objects its rows encode to: the signed
    digests of those objects confirm it (KVCS: HTTP recovery of signed non-raw tracks)."""
    tracks = {KV: TrackName.data(KV, codec, 0)}
    asm = assembler(require_signed=True, tracks=tracks)
    asm.use_manifest(manifest(LAYERS, tracks=tracks))
    for b in range(BLOCKS):
        assert asm.accept_container(b, container(b))
    got = asm.pop_ready()
    assert [x.index for x in got] == [0, 1, 2]
    assert all(same(x.k, DATA[x.index][0]) for x in got)  # the exact rows, not q8's
    forged = assembler(require_signed=True, tracks=tracks)
    forged.use_manifest(manifest(LAYERS, tracks=tracks))
    forged.accept_container(2, container(2, cache(seed=4)))
    assert forged.missing() == {layer: [0, 1, 2, 3] for layer in range(LAYERS)}
    for b in (0, 1, 3):
        forged.accept_container(b, container(b))
    assert forged.pop_ready() == [] and forged.missing() == {layer: [2] for layer in range(LAYERS)}


def test_signed_needs_tracks_and_a_manifest_of_this_segment() -> None:
    with pytest.raises(ValueError, match="require_signed"):
        LayerAssembler(DESC, range(LAYERS), BLOCKS, block_keys=KEYS, require_signed=True)
    small = manifest(LAYERS)
    small.segments[0].blocks = BLOCKS - 1  # lists fewer blocks than wanted: unusable
    asm = assembler(require_signed=True)
    asm.use_manifest(small)
    feed_layer(asm, 0)
    assert asm.pop_ready() == [] and asm.missing()[0] == [0, 1, 2, 3]


def test_shared_stats() -> None:
    stats = AssemblyStats()
    for _ in range(2):
        asm = assembler(stats=stats)
        feed_layer(asm, 0)
    assert stats.objects == 2 * 2 * BLOCKS


# ---------------------------------------------------------------------- track selection


def seg(*tracks: str) -> Segment:
    return Segment(0, 0, BLOCKS, "00" * 32, list(tracks), True)


def test_select_tracks() -> None:
    assert select_tracks(seg("k.q8.s0", "v.q8.s0", "kv.q8.s0"), "q8") == {
        K: TrackName.parse("k.q8.s0"), V: TrackName.parse("v.q8.s0")}
    assert select_tracks(seg("k.raw.s0", "v.raw.s0", "kv.zstd.s0"), "zstd") == {
        KV: TrackName.parse("kv.zstd.s0")}
    assert select_tracks(seg("k.raw.s0", "v.raw.s0", "kv.zstd.s0"), "q8") == KV_TRACKS
    with pytest.raises(ManifestError, match="no usable tracks"):
        select_tracks(seg("k.raw.s0", "kv.zstd.s0"), "q8")


def test_digest_helpers_agree() -> None:
    p = obj(K, 1, 2)
    k, _ = DATA[1]
    assert data_digest(p) == data_digest(p[:68]) == hashlib.sha256(
        k[2 * B:3 * B].tobytes()).digest()


def test_select_tracks_by_preference_skipping_what_is_not_implemented(
        monkeypatch: pytest.MonkeyPatch) -> None:
    offered = seg("k.raw.s0", "v.raw.s0", "kv.zstd.s0", "kv.brotli.s0", "k.q8.s0", "v.q8.s0")
    assert select_tracks(offered, ["brotli", "zstd", "raw"]) == {
        KV: TrackName.parse("kv.zstd.s0")}  # brotli is listed but not implemented here
    assert select_tracks(offered, ["q8", "zstd"])[K] == TrackName.parse("k.q8.s0")
    import kvcs.kv.codecs as codecs  # the zstd record asks codecs.zstd_available

    monkeypatch.setattr(codecs, "zstd_available", lambda: False)  # zstandard missing
    assert select_tracks(offered, ["zstd", "raw"]) == KV_TRACKS
    with pytest.raises(ManifestError, match="no usable tracks"):
        select_tracks(offered, ["brotli", "zstd"])


# ---------------------------------------------------------------------- listed digests


def test_unsigned_manifest_digests_are_checked_when_listed() -> None:
    """A manifest without a signature still lists object digests: an object that differs
    is discarded at receipt (listed layer) or when its layer is handed out (listed later)."""
    other = cache(seed=5)
    asm = assembler()
    asm.use_manifest(manifest(1))
    assert asm.accept(K, 0, 1, obj(K, 0, 1, other)) is Outcome.REJECTED
    feed_layer(asm, 0)
    assert [x.index for x in asm.pop_ready()] == [0]
    for kind in (K, V):  # layer 1: not listed yet, a foreign object is placed
        for b in range(BLOCKS):
            asm.accept(kind, 1, b, obj(kind, 1, b, other if (kind, b) == (V, 3) else None))
    asm.use_manifest(manifest(2))
    assert asm.pop_ready() == [] and asm.missing()[1] == [3]
    assert asm.stats.rejected == 2
    feed_layer(asm, 2)
    unlisted = asm.missing()
    assert 2 not in unlisted  # unsigned and not listed: usable as received


def test_partial_keeps_what_was_verified() -> None:
    asm = assembler()
    feed_layer(asm, 0)
    asm.pop_ready()
    for kind in (K, V):
        for b in (0, 2):
            asm.accept(kind, 1, b, obj(kind, 1, b))
    asm.accept(K, 1, 3, obj(K, 1, 3))
    partial = asm.partial()
    assert set(partial) == {1}  # layer 2: nothing verified
    layer = partial[1]
    assert asm.missing()[1] == [1, 3]
    assert same(layer.k[:B], DATA[1][0][:B]) and same(layer.v[2 * B:3 * B],
                                                      DATA[1][1][2 * B:3 * B])
    assert not layer.k[B:2 * B].astype(np.float32).any()  # missing rows are zero
    assert not layer.v[3 * B:].astype(np.float32).any()


# --------------------------------------------------------------------------- protected

PROTECTED_NS = (b"kvcs-1", b"\x01" * 16, DESC.compat_id, KEYS[-1], b"\x02" * 16)


def content_keys(*key_ids: int) -> SecureObjects:
    return SecureObjects([ContentKey(i, CipherSuite.AES_128_GCM_SHA256_128, bytes([i]) * 32)
                          for i in key_ids])


def sealed(keys: SecureObjects, kind: Component, layer: int, block: int,
           data: list | None = None, *, in_band: bool = False,
           key_id: int | None = None) -> dict:
    """accept() arguments of a protected object, as a publisher sends it."""
    prio = 128 * layer // LAYERS
    p = keys.encrypt_object(PROTECTED_NS, str(KV_TRACKS[kind]).encode(), layer, block,
                            obj(kind, layer, block, data), publisher_priority=prio,
                            key_id=key_id)
    if in_band:
        return {"payload": p.in_band_payload(), "publisher_priority": 3}
    return {"payload": p.payload, "publisher_priority": prio, "properties": p.properties}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def protected(keys: SecureObjects, clock: Clock | None = None, **kw) -> LayerAssembler:
    return assembler(secure=keys, namespace=PROTECTED_NS, clock=clock or Clock(), **kw)


@pytest.mark.parametrize("in_band", [False, True])
def test_protected_objects_decrypt_then_verify(in_band: bool) -> None:
    keys = content_keys(1)
    asm = protected(keys)
    for layer in range(LAYERS):
        for kind in (K, V):
            for b in range(BLOCKS):
                asm.accept(kind, layer, b, **sealed(keys, kind, layer, b, in_band=in_band))
    got = asm.pop_ready()
    assert [x.index for x in got] == [0, 1, 2]
    assert all(same(x.k, DATA[x.index][0]) and same(x.v, DATA[x.index][1]) for x in got)
    assert asm.stats.rejected == 0


def _tampered(keys: SecureObjects) -> dict[str, dict]:
    good = sealed(keys, K, 0, 1)  # under Key ID 2
    payload = good["payload"]
    flipped_first = bytes([payload[0] ^ 1]) + payload[1:]
    flipped_tag = payload[:-1] + bytes([payload[-1] ^ 0x80])
    outsider = SecureObjects([ContentKey(1, CipherSuite.AES_128_GCM_SHA256_128, bytes(32))])
    return {
        "plaintext": {"payload": obj(K, 0, 1)},
        "wrong key": sealed(outsider, K, 0, 1),
        "wrong key id": {**good, "properties": sealed(keys, K, 0, 1, key_id=1)["properties"]},
        "flipped ciphertext byte": {**good, "payload": flipped_first},
        "flipped tag byte": {**good, "payload": flipped_tag},
        "other group": sealed(keys, K, 1, 1),
        "other object": sealed(keys, K, 0, 2),
        "other track": sealed(keys, V, 0, 1),
        "other publication": {**good, "namespace": (*PROTECTED_NS[:4], b"\x03" * 16)},
        "wrong priority": {**good, "publisher_priority": good["publisher_priority"] + 1},
        "truncated": {**good, "payload": payload[:40]},
        "no key id": {"payload": payload, "properties": ()},
        "garbled properties": {**good, "properties": ((0x0B, b"\xff"),)},
    }


@pytest.mark.parametrize("what", sorted(_tampered(content_keys(1, 2))))
def test_protected_tampering_is_a_missing_object(what: str) -> None:
    keys = content_keys(1, 2)
    asm = protected(keys)
    args = _tampered(keys)[what]
    assert asm.accept(K, 0, 1, **args) is Outcome.REJECTED
    assert asm.stats.rejected == 1 and asm.missing()[0] == [0, 1, 2, 3]
    feed_layer_protected(asm, keys, 0)
    assert [x.index for x in asm.pop_ready()] == [0]  # the real object replaced it


def feed_layer_protected(asm: LayerAssembler, keys: SecureObjects, layer: int) -> None:
    for kind in (K, V):
        for b in range(BLOCKS):
            asm.accept(kind, layer, b, **sealed(keys, kind, layer, b))


def test_protected_needs_the_keys_and_refuses_keyless_decoding() -> None:
    keys = content_keys(1)
    plain = assembler()  # no keys: a protected object cannot be mistaken for data
    assert plain.accept(K, 0, 0, **sealed(keys, K, 0, 0)) is Outcome.REJECTED
    assert plain.accept(K, 0, 0, **sealed(keys, K, 0, 0, in_band=True)) is Outcome.REJECTED


def test_unknown_key_id_held_until_the_key_arrives() -> None:
    sender = content_keys(1, 2)
    receiver = content_keys(1)
    clock = Clock()
    asm = protected(receiver, clock, key_wait_s=2.0)
    feed_layer_protected(asm, sender, 0)  # under key 2, which the receiver lacks
    assert asm.stats.held == 2 * BLOCKS and asm.held_until == 102.0
    assert asm.pop_ready() == [] and asm.missing()[0] == [0, 1, 2, 3]
    clock.now = 101.0
    assert asm.release_held() is False  # still waiting
    receiver.add_key(ContentKey(2, CipherSuite.AES_128_GCM_SHA256_128, bytes([2]) * 32))
    assert asm.release_held() is True
    assert [x.index for x in asm.pop_ready()] == [0]
    assert asm.held_until is None and asm.stats.rejected == 0


def test_unknown_key_id_missing_after_the_wait() -> None:
    sender = content_keys(1, 2)
    clock = Clock()
    asm = protected(content_keys(1), clock, key_wait_s=2.0)
    assert asm.accept(K, 0, 0, **sealed(sender, K, 0, 0)) is Outcome.HELD
    assert asm.accept(K, 0, 0, **sealed(sender, K, 0, 0)) is Outcome.HELD  # held once
    clock.now = 102.0
    assert asm.release_held() is False
    assert asm.held_until is None and asm.stats.rejected == 1 and asm.stats.held == 1
    # a Key ID that waited in vain is not waited for again
    assert asm.accept(K, 0, 1, **sealed(sender, K, 0, 1)) is Outcome.REJECTED
    assert asm.missing()[0] == [0, 1, 2, 3]
    for b in range(BLOCKS):  # the same blocks under a held key are taken
        for kind in (K, V):
            asm.accept(kind, 0, b, **sealed(sender, kind, 0, b, key_id=1))
    assert [x.index for x in asm.pop_ready()] == [0]


def test_protected_containers_need_the_manifest_digests() -> None:
    """Containers (KVSP HTTP) of a protected retrieval are taken only where the manifest,
    which decrypted with the content keys, lists their digests."""
    keys = content_keys(1)
    asm = protected(keys)
    asm.use_manifest(manifest(1))  # lists layer 0 only
    for b in range(BLOCKS):
        asm.accept_container(b, container(b))
    assert [x.index for x in asm.pop_ready()] == [0]
    assert asm.missing() == {1: [0, 1, 2, 3], 2: [0, 1, 2, 3]}  # unlisted: unconfirmed
    asm.use_manifest(manifest(LAYERS))
    assert [x.index for x in asm.pop_ready()] == [1, 2]
    forged = protected(keys)
    forged.use_manifest(manifest(LAYERS))
    forged.accept_container(0, container(0, cache(seed=4)))  # self-consistent, not listed
    for b in range(1, BLOCKS):
        forged.accept_container(b, container(b))
    assert forged.pop_ready() == [] and forged.missing() == {layer: [0] for layer in range(3)}
    feed_layer_protected(forged, keys, 0)  # objects that decrypt need no listing
    # a q8 track's listed digests confirm containers encoded again, listed layers only
    q8_tracks = {KV: TrackName.data(KV, "q8", 0)}
    q8 = protected(keys, tracks=q8_tracks)
    q8.use_manifest(manifest(1, tracks=q8_tracks))
    for b in range(BLOCKS):
        assert q8.accept_container(b, container(b))
    assert [x.index for x in q8.pop_ready()] == [0]
    assert q8.missing() == {1: [0, 1, 2, 3], 2: [0, 1, 2, 3]}


@pytest.mark.parametrize("codec", ["q8", "zstd"])
def test_sections_decoded_into_the_layer(codec: str) -> None:
    """q8 and zstd objects are decoded straight into the layer buffer, as decode_component
    would decode them."""
    from kvcs.kv.codecs import decode_component

    tracks = {K: TrackName.data(K, codec, 0), V: TrackName.data(V, codec, 0)}
    asm = assembler(tracks=tracks)
    for kind in (K, V):
        for b in range(BLOCKS):
            assert asm.accept(kind, 0, b, obj(kind, 0, b, codec=codec)) in (
                Outcome.PLACED, Outcome.LAYER_COMPLETE)
    [layer] = asm.pop_ready()
    for b in range(BLOCKS):
        rows = slice(b * B, (b + 1) * B)
        k, v = DATA[0]
        data = encode_component(K, codec, k[rows], v[rows])
        want, _ = decode_component(K, codec, data, DESC.dtype, (B, 2, 4), (B, 2, 4))
        assert want is not None and same(layer.k[rows], want)


def test_data_digest_computed_beforehand() -> None:
    """A digest hashed elsewhere (the consumer's worker thread) decides like one hashed
    here: the right one places the object, a wrong one rejects it (missing)."""
    asm = assembler()
    good = obj(K, 0, 0)
    assert asm.accept(K, 0, 0, good, data_sha256=hashlib.sha256(good[68:]).digest()) \
        is Outcome.PLACED
    assert asm.accept(K, 0, 1, obj(K, 0, 1), data_sha256=bytes(32)) is Outcome.REJECTED
    assert asm.stats.rejected == 1 and asm.missing()[0] == [0, 1, 2, 3]


def test_protected_objects_ignore_a_digest_of_the_ciphertext() -> None:
    keys = content_keys(1)
    asm = protected(keys)
    assert asm.accept(K, 0, 0, **sealed(keys, K, 0, 0), data_sha256=bytes(32)) \
        is Outcome.PLACED


def test_layers_assembled_into_given_arrays() -> None:
    given = {layer: (np.zeros((B * BLOCKS + 1, 2, 4), DESC.dtype),
                     np.zeros((B * BLOCKS + 1, 2, 4), DESC.dtype)) for layer in range(LAYERS)}
    asked: list[int] = []

    def arrays(layer: int) -> tuple[np.ndarray, np.ndarray]:
        asked.append(layer)
        return given[layer]

    asm = assembler(arrays=arrays)
    for layer in (1, 0):
        feed_layer(asm, layer)
    got = asm.pop_ready()
    assert asked == [1, 0] and [x.index for x in got] == [0, 1]
    for x in got:
        assert np.shares_memory(x.k, given[x.index][0]) and x.k.shape[0] == B * BLOCKS
        assert same(x.k, DATA[x.index][0]) and same(x.v, DATA[x.index][1])


def test_given_arrays_are_checked() -> None:
    asm = assembler(arrays=lambda layer: (np.zeros((B * BLOCKS, 2, 4), np.float16),) * 2)
    with pytest.raises(ValueError, match="arrays: K dtype float16"):
        asm.accept(K, 0, 0, obj(K, 0, 0))


# ----------------------------------------------------------------- runs in one call


def record(layer: int, block: int, payload: bytes, properties: tuple = (),
           priority: int | None = None) -> ObjectRecord:
    """An object as a subscription delivers it (payload a view of what was received)."""
    return ObjectRecord(layer, block, 0, priority, ObjectStatus.NORMAL, properties,
                        memoryview(payload))


Run = tuple[Component, list[ObjectRecord], list[bytes | None] | None]


def one_by_one(asm: LayerAssembler, kind: Component, recs: list[ObjectRecord],
               sha: list[bytes | None] | None, namespace=None) -> list[Outcome]:
    return [asm.accept(kind, r.group_id, r.object_id, r.payload,
                       publisher_priority=effective_priority(r.publisher_priority),
                       properties=r.properties, namespace=namespace,
                       data_sha256=None if sha is None else sha[i])
            for i, r in enumerate(recs)]


def assert_runs_assemble_as_objects(make, runs: list[Run], caplog, namespace=None) -> None:
    """accept_run on each run gives what accept gives object by object: the outcomes, the
    failures logged (with their reasons), counters, what is missing, and the layers."""
    caplog.set_level(logging.INFO, logger="kvcs.kv.assembly")
    each, whole = make(), make()
    caplog.clear()
    want = [one_by_one(each, kind, recs, sha, namespace) for kind, recs, sha in runs]
    want_log = [r.getMessage() for r in caplog.records]
    caplog.clear()
    got = [whole.accept_run(kind, recs, data_sha256=sha, namespace=namespace)
           for kind, recs, sha in runs]
    assert got == want
    assert [r.getMessage() for r in caplog.records] == want_log
    assert whole.stats == each.stats
    assert whole.missing() == each.missing()
    for a, b in ((each.partial(), whole.partial()), ):
        assert sorted(a) == sorted(b)
        assert all(same(a[i].k, b[i].k) and same(a[i].v, b[i].v) for i in a)
    ready_each, ready_whole = each.pop_ready(), whole.pop_ready()
    assert [x.index for x in ready_whole] == [x.index for x in ready_each]
    for x, y in zip(ready_each, ready_whole, strict=True):
        assert same(x.k, y.k) and same(x.v, y.v)


def q8_refused(kind: Component, layer: int, block: int) -> bytes:
    """An object whose Data digest is right but whose q8 Data holds -128: refused only by
    the decoder."""
    k, v = DATA[layer]
    rows = slice(block * B, (block + 1) * B)
    body = bytearray(encode_component(kind, "q8", k[rows], v[rows]))
    body[-1] = 0x80
    return build_payload_bytes(kind, layer, block, block * B, B, "q8", bytes(body))


@pytest.mark.parametrize("codec", ["raw", "q8"])
def test_a_run_assembles_as_its_objects(codec: str, caplog) -> None:
    tracks = {kind: TrackName.data(kind, codec, 0) for kind in (K, V)}
    good = {(kind, layer, b): obj(kind, layer, b, codec=codec)
            for kind in (K, V) for layer in range(LAYERS) for b in range(BLOCKS + 1)}
    sha = {key: hashlib.sha256(p[68:]).digest() for key, p in good.items()}
    refused = q8_refused(K, 0, 2) if codec == "q8" else obj(K, 0, 2, codec=codec)[:-1]
    k_run = [record(0, 0, good[K, 0, 0]), record(0, 1, good[K, 0, 1]),
             record(0, 2, refused),  # refused by the decoder (q8) or by its length
             record(0, 3, good[K, 0, 3]),
             record(0, 1, good[K, 0, 1]),  # a duplicate
             record(0, 2, good[K, 0, 2]),  # the refused block again: placed
             record(0, 4, good[K, 0, 4]),  # excess
             record(0, 2, good[K, 0, 2])]  # a duplicate of a block just placed
    v_run = [record(0, 3, good[V, 0, 3]), record(0, 0, flip(good[V, 0, 0], -1)),
             record(0, 1, good[V, 0, 1]), record(0, 2, good[V, 0, 2]),
             record(1, 0, obj(V, 1, 0, codec=codec, token_start=5)),
             record(1, 1, good[V, 1, 1]), record(2, 0, good[V, 2, 0])]
    layer_1 = [record(1, b, good[K, 1, b]) for b in range(BLOCKS)]
    runs: list[Run] = [
        (K, k_run, None),
        (V, v_run, [sha.get((V, r.group_id, r.object_id)) for r in v_run]),
        (K, layer_1, [sha[K, 1, b] for b in range(BLOCKS)]),
        (V, [record(0, 0, good[V, 0, 0])], None),  # completes layer 0
        (V, [record(0, 0, good[V, 0, 0])], None),
    ]
    assert_runs_assemble_as_objects(
        lambda: assembler(layers=range(LAYERS), tracks=tracks), runs, caplog)
    # layers handed out by now are IGNORED in a later run
    asm = assembler(tracks=tracks)
    for kind in (K, V):
        asm.accept_run(kind, [record(0, b, good[kind, 0, b]) for b in range(BLOCKS)])
    assert [x.index for x in asm.pop_ready()] == [0]
    assert asm.accept_run(K, [record(0, 0, good[K, 0, 0]), record(1, 0, good[K, 1, 0])]) \
        == [Outcome.IGNORED, Outcome.PLACED]


IN_A_RUN = {
    "magic": flip(obj(K, 0, 2), 0),
    "data (digest mismatch)": flip(obj(K, 0, 2), -1),
    "digest field": flip(obj(K, 0, 2), 40),
    "layer != group": obj(K, 1, 2),
    "block index != object": obj(K, 0, 1),
    "component v on the k track": obj(V, 0, 2),
    "token start": obj(K, 0, 2, token_start=0),
    "codec": obj(K, 0, 2, codec="zstd"),
    "truncated": obj(K, 0, 2)[:-1],
    "longer": obj(K, 0, 2) + b"\0",
    "shorter than the header": obj(K, 0, 2)[:60],
    "empty": b"",
}


@pytest.mark.parametrize("what", sorted(IN_A_RUN))
@pytest.mark.parametrize("hashed", [False, True])
def test_a_tampered_object_inside_a_run(what: str, hashed: bool, caplog) -> None:
    """Every check of accept holds for an object in the middle of a run: it is rejected
    (with accept's reason), its neighbours are placed, its block stays missing."""
    payload = IN_A_RUN[what]
    recs = [record(0, b, payload if b == 2 else obj(K, 0, b)) for b in range(BLOCKS)]
    sha = [hashlib.sha256(r.payload[68:]).digest() for r in recs] if hashed else None
    assert_runs_assemble_as_objects(assembler, [(K, recs, sha)], caplog)
    asm = assembler()
    assert asm.accept_run(K, recs, data_sha256=sha) == [
        Outcome.PLACED, Outcome.PLACED, Outcome.REJECTED, Outcome.PLACED]
    assert asm.stats.rejected == 1 and asm.missing()[0] == [0, 1, 2, 3]
    feed_layer(asm, 0, kinds=(V,))
    assert asm.missing()[0] == [2]


def test_a_run_checks_the_listed_digests(caplog) -> None:
    """An object whose digest is not the one the manifest lists is rejected in a run too
    (here a block of another cache, self-consistent)."""
    other = cache(seed=2)
    recs = [record(0, b, obj(K, 0, b, other if b == 1 else None)) for b in range(BLOCKS)]

    def make() -> LayerAssembler:
        asm = assembler()
        asm.use_manifest(manifest(LAYERS))
        return asm

    assert_runs_assemble_as_objects(make, [(K, recs, None)], caplog)
    asm = make()
    assert asm.accept_run(K, recs)[1] is Outcome.REJECTED


def test_a_run_of_objects_with_properties_or_protected(caplog) -> None:
    """Objects with properties (a protected publication's) go through accept: decrypted,
    then verified; tampered ones rejected as one by one; the same for in-band ones and
    for plaintext objects in a retrieval that has keys."""
    keys = content_keys(1, 2)
    runs: list[Run] = []
    for kind in (K, V):
        recs = []
        for b in range(BLOCKS):
            args = sealed(keys, kind, 0, b, in_band=b == 3)
            recs.append(record(0, b, args["payload"], args.get("properties", ()),
                               args["publisher_priority"]))
        runs.append((kind, recs, [bytes(32)] * BLOCKS))  # a digest of ciphertext: ignored
    tampered = _tampered(keys)
    bad = [tampered[w] for w in ("flipped tag byte", "plaintext", "no key id")]
    runs.append((K, [record(0, 1, a["payload"], a.get("properties", ()),
                            a.get("publisher_priority")) for a in bad], None))
    assert_runs_assemble_as_objects(lambda: protected(keys), runs, caplog,
                                    namespace=PROTECTED_NS)
    # without keys, protected objects in a run are refused (keys are needed)
    plain = runs[0][1]
    assert_runs_assemble_as_objects(assembler, [(K, plain, None)], caplog)
    assert set(assembler().accept_run(K, plain)) == {Outcome.REJECTED}


def test_a_joint_kv_run_and_a_track_not_selected(caplog) -> None:
    kv_tracks = {KV: TrackName.data(KV, "raw", 0)}
    recs = [record(0, b, obj(KV, 0, b)) for b in range(BLOCKS)]
    assert_runs_assemble_as_objects(lambda: assembler(tracks=kv_tracks),
                                    [(KV, recs, None)], caplog)
    assert_runs_assemble_as_objects(assembler, [(KV, recs, None)], caplog)
