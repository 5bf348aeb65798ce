"""asyncio + QUIC (qh3 or aioquic) transport binding for the sans-IO MOQT session (raw QUIC and
WebTransport over HTTP/3)."""

from .binding import (
    ConnectionInfo,
    MoqtConnection,
    SansIOSession,
    Server,
    SessionFactory,
    SessionHandler,
    connect,
    serve,
)
from .certs import DevCertificate, ensure_dev_certificate, fingerprint_sha256
from .config import ALPN_H3, ALPN_MOQT, QuicSettings

__all__ = [
    "ALPN_H3",
    "ALPN_MOQT",
    "ConnectionInfo",
    "DevCertificate",
    "MoqtConnection",
    "QuicSettings",
    "SansIOSession",
    "Server",
    "SessionFactory",
    "SessionHandler",
    "connect",
    "ensure_dev_certificate",
    "fingerprint_sha256",
    "serve",
]
