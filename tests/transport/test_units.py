"""Unit tests of the transport helpers (no network)."""

from __future__ import annotations

import pytest

from kvcs.transport import QuicSettings, ensure_dev_certificate
from kvcs.transport.backend import BACKEND
from kvcs.transport.certs import load_certificate, parse_fingerprint
from kvcs.transport.config import MAX_DATAGRAM_SIZE_LIMIT
from kvcs.transport.webtransport import (
    CAPSULE_CLOSE_WEBTRANSPORT_SESSION,
    CapsuleParser,
    decode_close_capsule,
    encode_close_capsule,
    http_to_wt_error,
    parse_sf_string_list,
    wt_to_http_error,
)


def test_settings_validation() -> None:
    limit = 16000 if BACKEND == "aioquic" else 60000
    assert QuicSettings.loopback().max_datagram_size == MAX_DATAGRAM_SIZE_LIMIT == limit
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
