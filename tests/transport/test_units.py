"""Unit tests of the transport helpers (no network)."""

from __future__ import annotations

import os

import pytest

from kvcs.transport import QuicSettings, default_library, ensure_dev_certificate
from kvcs.transport.certs import load_certificate, parse_fingerprint
from kvcs.transport.config import max_datagram_size_limit
from kvcs.transport.quic import LIBRARY_ENV, adapter, use_library
from kvcs.transport.webtransport import (
    CAPSULE_CLOSE_WEBTRANSPORT_SESSION,
    CapsuleParser,
    decode_close_capsule,
    decode_varint,
    encode_close_capsule,
    encode_varint,
    http_to_wt_error,
    parse_sf_string_list,
    wt_to_http_error,
)


def test_settings_validation() -> None:
    limit = 16000 if default_library() == "aioquic" else 60000
    assert QuicSettings.loopback().max_datagram_size == max_datagram_size_limit() == limit
    with pytest.raises(ValueError):
        QuicSettings(max_datagram_size=limit + 1)
    with pytest.raises(ValueError):
        QuicSettings(max_datagram_size=1000)


def test_dev_certificate_reused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    first = ensure_dev_certificate(tmp_path)
    second = ensure_dev_certificate(tmp_path)
    assert first == second
    assert len(parse_fingerprint(first.sha256)) == 32
    cert = load_certificate(first.certfile)
    assert cert.not_valid_after_utc > cert.not_valid_before_utc
    (tmp_path / "dev-cert.pem").write_text("garbage")
    assert ensure_dev_certificate(tmp_path).sha256 != first.sha256


def test_wt_error_mapping() -> None:
    for code in (0, 1, 0x1D, 0x1E, 0x1F, 0x3C, 0xFFFF, 0xFFFFFFFF):
        assert http_to_wt_error(wt_to_http_error(code)) == code
    assert http_to_wt_error(0x100) is None
    assert http_to_wt_error(wt_to_http_error(0x1D) + 1) is None  # reserved code point


def test_close_capsule_round_trip() -> None:
    parser = CapsuleParser()
    data = encode_close_capsule(0x12, "bye")
    assert parser.feed(data[:3]) == []
    ((ctype, value),) = parser.feed(data[3:])
    assert ctype == CAPSULE_CLOSE_WEBTRANSPORT_SESSION
    assert decode_close_capsule(value) == (0x12, "bye")


def test_sf_string_list() -> None:
    assert parse_sf_string_list('"moqt-22", "moqt-21";q=1, tok') == ["moqt-22", "moqt-21", "tok"]
    assert parse_sf_string_list('"a\\"b"') == ['a"b']
    assert parse_sf_string_list("") == []


def test_library_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for library, limit in (("aioquic", 16000), ("qh3", 60000)):
        settings = QuicSettings.loopback(library=library)
        assert (settings.library, settings.max_datagram_size) == (library, limit)
        assert adapter(library).name == library
    assert QuicSettings(library="auto").library == "qh3"  # qh3 is installed
    with pytest.raises(ValueError, match="unknown QUIC library"):
        QuicSettings(library="quiche")
    with pytest.raises(ValueError, match=r"1200\.\.16000 on aioquic"):
        QuicSettings(library="aioquic", max_datagram_size=60000)
    # settings made without a library take the process default at that moment
    before = default_library()
    monkeypatch.setenv(LIBRARY_ENV, before)  # use_library exports it; restored after
    try:
        assert use_library("aioquic") == "aioquic" == QuicSettings().library
        assert os.environ[LIBRARY_ENV] == "aioquic"
        with pytest.raises(ValueError):
            use_library("nope")
    finally:
        use_library(before)
    assert QuicSettings().library == before


def test_qh3_patches_are_guarded_by_version(monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    import qh3

    from kvcs.transport.quic import qh3 as qh3_adapter

    adapter("qh3")
    assert qh3_adapter.apply_patches()  # qh3 2.1 here: applied once, when first used
    monkeypatch.setattr(qh3_adapter, "_patched", False)
    monkeypatch.setattr(qh3, "__version__", "3.0.0")
    assert not qh3_adapter.apply_patches()
    assert "qh3 3.0.0: kvcs patches are written for qh3 2.1.x" in caplog.text


def test_quic_varint() -> None:
    for value, size in ((0, 1), (63, 1), (64, 2), (16383, 2), (16384, 4), (2**30 - 1, 4),
                        (2**30, 8), (2**62 - 1, 8)):
        data = encode_varint(value)
        assert len(data) == size and decode_varint(b"x" + data, 1) == (value, size + 1)
        assert decode_varint(data[:-1], 0) is None
    with pytest.raises(ValueError):
        encode_varint(2**62)
