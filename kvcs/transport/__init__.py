"""asyncio binding of the sans-IO MOQT session to QUIC (raw QUIC and WebTransport over
HTTP/3), on qh3 or aioquic (:mod:`kvcs.transport.quic`; ``QuicSettings(library=...)``)."""

from .certs import DevCertificate, ensure_dev_certificate, fingerprint_sha256
from .client import connect
from .config import ALPN_H3, ALPN_MOQT, QuicSettings, max_datagram_size_limit
from .connection import MoqtConnection
from .interfaces import ConnectionInfo, SansIOSession, SessionFactory, SessionHandler
from .quic import default_library, use_library
from .server import Server, serve

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
    "default_library",
    "ensure_dev_certificate",
    "fingerprint_sha256",
    "max_datagram_size_limit",
    "serve",
    "use_library",
]
