"""Unit tests of the transport helpers (no network)."""

from __future__ import annotations

import os

import pytest

from kvcs.transport import QuicSettings, default_library, ensure_dev_certificate
from kvcs.transport.certs import load_certificate, parse_fingerprint
from kvcs.transport.config import max_datagram_size_limit
from kvcs.transport.quic import LIBRARY_ENV, adapter, use_library
from kvcs.transport.server import same_destination
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


def test_datagram_size_per_peer() -> None:
    from kvcs.transport.config import INTERNET_DATAGRAM_SIZE, is_loopback

    for address in (("127.0.0.1", 1), ("127.3.2.1", 1), ("::1", 1, 0, 0),
                    ("::ffff:127.0.0.1", 1, 0, 0)):
        assert is_loopback(address), address
    for address in (("192.0.2.1", 1), ("2001:db8::1", 1, 0, 0), ("::ffff:10.0.0.1", 1, 0, 0),
                    ("0.0.0.0", 1), None, ("not-an-address", 1)):
        assert not is_loopback(address), address
    for library, limit in (("qh3", 60000), ("aioquic", 16000)):
        auto = QuicSettings(library=library)
        assert auto.max_datagram_size is None
        assert auto.datagram_size_for(("127.0.0.1", 4443)) == limit
        assert auto.datagram_size_for(("192.0.2.1", 4443)) == INTERNET_DATAGRAM_SIZE == 1350
        fixed = QuicSettings(library=library, max_datagram_size=1452)
        assert {fixed.datagram_size_for(a) for a in (("::1", 1, 0, 0), ("192.0.2.1", 1))} == {
            1452}


def test_settings_for_a_path() -> None:
    assert QuicSettings.for_path(mtu=1500).max_datagram_size == 1452
    assert QuicSettings.for_path(mtu=9000, library="qh3").max_datagram_size == 8952
    assert QuicSettings.for_path().max_datagram_size is None
    assert QuicSettings.for_path(preset="loopback") == QuicSettings.loopback()
    with pytest.raises(ValueError, match=r"--mtu must be within 1248\.\.16048 on aioquic"):
        QuicSettings.for_path(mtu=60000, library="aioquic")
    with pytest.raises(ValueError, match="--mtu"):
        QuicSettings.for_path(mtu=1000)
    with pytest.raises(ValueError, match="unknown QUIC preset"):
        QuicSettings.for_path(preset="lan")


def test_gro_buffer_routed_whole_only_to_one_connection() -> None:
    """A GRO buffer goes to a connection whole only when every segment is a short-header
    packet to the first one's connection ID (a peer may run several connections from one
    socket; a handshake mixes long headers)."""
    cid, other, size = os.urandom(8), os.urandom(8), 1452

    def buffer(*cids: bytes, first: int = 0x41, last: int = size) -> bytes:
        segments = [bytes([first]) + c + os.urandom(size - 9) for c in cids]
        segments[-1] = segments[-1][:last]
        return b"".join(segments)

    assert same_destination(buffer(cid, cid, cid), size, 9)
    assert same_destination(buffer(cid, cid, cid, last=100), size, 9)  # shorter last
    assert same_destination(buffer(cid), size, 9)
    assert not same_destination(buffer(cid, other, cid), size, 9)
    assert not same_destination(buffer(cid, cid, other, last=100), size, 9)
    assert not same_destination(buffer(cid, cid, cid, last=5), size, 9)  # cut in the ID
    assert not same_destination(buffer(cid, cid, first=0xC1), size, 9)  # long headers
