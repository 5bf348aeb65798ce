"""Tests of kvcs.kv.ids: descriptor validation, IDs, Block Keys and namespaces."""

from __future__ import annotations

import copy
import hashlib
import hmac
import struct

import numpy as np
import pytest

from kvcs.kv import ids
from kvcs.kv.errors import DescriptorError
from kvcs.kv.vectors import FIXED_DESCRIPTOR

S = bytes(range(32))


def desc(**changes):
    d = copy.deepcopy(FIXED_DESCRIPTOR)
    for k, v in changes.items():
        if v is ...:
            del d[k]
        else:
            d[k] = v
    return d


def test_canonical_and_compat_id():
    cb = ids.canonical_bytes(FIXED_DESCRIPTOR)
    assert cb.startswith(b'{"block_tokens":4,"dtype":"bfloat16"')
    assert b" " not in cb
    assert ids.compat_id(FIXED_DESCRIPTOR) == hashlib.sha256(cb).digest()
    # key order of the input does not matter
    rev = dict(reversed(list(FIXED_DESCRIPTOR.items())))
    assert ids.compat_id(rev) == ids.compat_id(FIXED_DESCRIPTOR)


def test_non_ascii_unescaped_and_extra_nested_sorted():
    d = desc(model="modèle", extra={"z": 1, "a": {"y": [1, "2"], "b": True}})
    cb = ids.canonical_bytes(d)
    assert "modèle".encode() in cb
    assert b'"extra":{"a":{"b":true,"y":[1,"2"]},"z":1}' in cb


def test_unknown_members_are_hashed():
    assert ids.compat_id(desc(foo="bar")) != ids.compat_id(FIXED_DESCRIPTOR)


def test_descriptor_properties():
    d = ids.CompatDescriptor.from_dict(desc(v_head_dim=64))
    assert (d.layers, d.kv_heads, d.head_dim, d.v_head_dim, d.block_tokens) == (2, 8, 128, 64, 4)
    assert d.k_shape() == (4, 8, 128) and d.v_shape() == (4, 8, 64)
    assert d.dtype.itemsize == 2 and d.dtype_name == "bfloat16"
    assert ids.CompatDescriptor.from_json(ids.canonical_bytes(d)) == d


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"model": ...}, "missing required member 'model'"),
        ({"layers": ...}, "missing required member 'layers'"),
        ({"layers": "2"}, "layers must be an integer"),
        ({"layers": True}, "layers must be an integer"),
        ({"layers": 2.0}, "floats are not allowed"),
        ({"layers": 0}, "outside 1..2"),
        ({"kv_heads": (1 << 20) + 1}, "outside 1..2"),
        ({"head_dim": -1}, "outside 1..2"),
        ({"block_tokens": 0}, "outside 1..2"),
        ({"v_head_dim": 0}, "v_head_dim"),
        ({"model": 3}, "model must be a string"),
        ({"dtype": "int8"}, "dtype"),
        ({"layout": "ntd"}, "layout"),
        ({"rope": "yes"}, "rope"),
        ({"kvsp": 2}, "kvsp"),
        ({"extra": [1]}, "extra must be an object"),
        ({"extra": {"scale": 0.5}}, r"descriptor\.extra\.scale: floats"),
        ({"extra": {"a": [1, 2.5]}}, "floats"),
        ({"extra": {"a": None}}, "null"),
        ({"extra": {"a": 1 << 60}}, "2\\^53"),
    ],
)
def test_descriptor_rejections(changes, match):
    with pytest.raises(DescriptorError, match=match):
        ids.compat_id(desc(**changes))


def test_descriptor_error_is_value_error():
    with pytest.raises(ValueError):
        ids.CompatDescriptor.from_dict([1, 2])
    with pytest.raises(DescriptorError, match="JSON"):
        ids.CompatDescriptor.from_json(b"{")


def test_dim_bounds_inclusive():
    ids.compat_id(desc(layers=1 << 20, block_tokens=1))


def test_scope_key_sources(tmp_path, monkeypatch):
    raw = tmp_path / "raw.key"
    raw.write_bytes(S)
    hexf = tmp_path / "hex.key"
    hexf.write_text(S.hex() + "\n")
    monkeypatch.setenv("KVCS_TEST_SCOPE", S.hex().upper())
    for k in (
        ids.ScopeKey.from_bytes(S),
        ids.ScopeKey.from_file(raw),
        ids.ScopeKey.from_file(hexf),
        ids.ScopeKey.from_env("KVCS_TEST_SCOPE"),
    ):
        assert k.key == S
    assert S.hex() not in repr(ids.ScopeKey(S))
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"\xff" * 31)
    with pytest.raises(DescriptorError):
        ids.ScopeKey.from_file(bad)
    with pytest.raises(DescriptorError):
        ids.ScopeKey.from_bytes(b"short")
    with pytest.raises(DescriptorError, match="not set"):
        ids.ScopeKey.from_env("KVCS_TEST_UNSET_VAR")
    monkeypatch.setenv("KVCS_TEST_SCOPE", "zz" * 32)
    with pytest.raises(DescriptorError, match="hex"):
        ids.ScopeKey.from_env("KVCS_TEST_SCOPE")


def test_scope_id():
    expect = hmac.new(S, b"kvsp-1 scope-id", hashlib.sha256).digest()[:16]
    assert ids.scope_id(ids.ScopeKey(S)) == expect == ids.scope_id(S)


def reference_block_keys(key, cid, tokens, b):
    prev = bytes(32)
    out = []
    for i in range(len(tokens) // b):
        msg = b"kvsp-1 block" + cid + prev
        msg += b"".join(struct.pack(">I", t) for t in tokens[i * b : (i + 1) * b])
        prev = hmac.new(key, msg, hashlib.sha256).digest()
        out.append(prev)
    return out


def test_block_keys_match_reference_and_chain():
    cid = ids.compat_id(FIXED_DESCRIPTOR)
    tokens = [0xFFFFFFFF, 0, 7, 123456, *range(100, 113)]  # 17 tokens: 4 blocks + partial
    keys = ids.block_keys(S, cid, tokens, 4)
    assert keys == reference_block_keys(S, cid, tokens, 4)
    assert len(keys) == 4
    # numpy input of any integer dtype gives the same keys
    assert ids.block_keys(S, cid, np.array(tokens, dtype=np.int64), 4) == keys
    assert ids.block_keys(S, cid, np.array(tokens, dtype=np.uint32), 4) == keys
    # a prefix has the prefix's keys
    assert ids.block_keys(S, cid, tokens[:8], 4) == keys[:2]
    assert ids.block_keys(S, cid, tokens[:3], 4) == []
    assert ids.anchor_key(keys, 2) == keys[1]
    assert ids.block_keys_sha256(keys) == hashlib.sha256(b"".join(keys)).digest()
    # bound to compat id and scope
    assert ids.block_keys(S, bytes(32), tokens, 4) != keys
    assert ids.block_keys(bytes(32), cid, tokens, 4) != keys


@pytest.mark.parametrize("tokens", [[-1, 0, 0, 0], [1 << 32, 0, 0, 0], [0.5, 1.0, 2.0, 3.0]])
def test_block_keys_reject_bad_tokens(tokens):
    with pytest.raises(DescriptorError):
        ids.block_keys(S, bytes(32), tokens, 4)


def test_block_keys_reject_bad_args():
    with pytest.raises(DescriptorError):
        ids.block_keys(S, b"short", [1, 2], 1)
    with pytest.raises(DescriptorError):
        ids.block_keys(S, bytes(32), [1, 2], 0)
    with pytest.raises(DescriptorError):
        ids.anchor_key([bytes(32)], 2)
    with pytest.raises(DescriptorError):
        ids.anchor_key([bytes(32)], 0)


def make_ns():
    return ids.KvcsNamespace(bytes(range(16)), bytes(32), bytes(range(32)),
                             ids.new_publication_id())


def test_namespace_roundtrip_and_prefix():
    ns = make_ns()
    fields = ns.to_fields()
    assert fields[0] == b"kvcs-1" and [len(f) for f in fields] == [6, 16, 32, 32, 16]
    assert ids.KvcsNamespace.from_fields(fields) == ns
    assert ids.KvcsNamespace.from_tuple(ns.to_tuple()) == ns
    assert ns.prefix(2) == fields[:2]
    assert ns.prefix(4) == fields[:4]
    with pytest.raises(ValueError):
        ns.prefix(0)
    with pytest.raises(ValueError):
        ns.prefix(6)


def test_namespace_hex_fields():
    ns = make_ns()
    hf = ns.to_fields(hex_fields=True)
    assert [len(f) for f in hf] == [6, 32, 64, 64, 32]
    assert all(f.decode("utf-8") == f.decode("ascii").lower() for f in hf)
    assert ids.KvcsNamespace.from_fields(hf, hex_fields=True) == ns
    assert ns.prefix(2, hex_fields=True) == hf[:2]
    # the two encodings are not interchangeable
    with pytest.raises(ValueError):
        ids.KvcsNamespace.from_fields(hf)
    with pytest.raises(ValueError):
        ids.KvcsNamespace.from_fields(ns.to_fields(), hex_fields=True)
    upper = (hf[0], hf[1].upper(), *hf[2:])
    with pytest.raises(ValueError, match="lowercase hex"):
        ids.KvcsNamespace.from_fields(upper, hex_fields=True)


@pytest.mark.parametrize("index", [1, 2, 3, 4])
def test_namespace_rejects_wrong_field_lengths(index):
    fields = list(make_ns().to_fields())
    fields[index] = fields[index] + b"\x00"
    with pytest.raises(ValueError, match="octets"):
        ids.KvcsNamespace.from_fields(fields)


def test_namespace_rejects_wrong_shape():
    fields = make_ns().to_fields()
    with pytest.raises(ValueError, match="5 fields"):
        ids.KvcsNamespace.from_fields(fields[:4])
    with pytest.raises(ValueError, match="field 0"):
        ids.KvcsNamespace.from_fields((b"kvcs-2", *fields[1:]))
    with pytest.raises(ValueError):
        ids.KvcsNamespace(bytes(15), bytes(32), bytes(32), bytes(16))


def test_new_publication_id():
    a, b = ids.new_publication_id(), ids.new_publication_id()
    assert len(a) == 16 and a != b
