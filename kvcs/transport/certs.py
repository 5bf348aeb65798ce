"""Development certificates for the QUIC/WebTransport binding.

:func:`ensure_dev_certificate` creates (or reuses) an EC P-256 certificate valid for
``localhost``, ``127.0.0.1`` and ``::1``, issued by a throw-away local CA whose key is
never stored. The certificate file holds the chain (leaf, then CA), so the same file
serves as a server's ``certfile`` and as a client's ``cafile`` for every QUIC library
(qh3 only accepts a CA certificate as a trust anchor, not a self-signed leaf). The
lifetime is 13 days, so that browsers can also trust the leaf through WebTransport
``serverCertificateHashes`` (at most 14 days). The leaf's SHA-256 fingerprint can be
handed to :func:`kvcs.transport.connect` as ``pin_sha256``.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

if TYPE_CHECKING:  # x509 is imported by the functions that use it: ~15 ms of `import kvcs`
    from cryptography import x509

logger = logging.getLogger(__name__)

DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
CERT_NAME = "dev-cert.pem"
KEY_NAME = "dev-key.pem"


@dataclass(frozen=True, slots=True)
class DevCertificate:
    """Paths of a certificate/key pair and the certificate's SHA-256 fingerprint."""

    certfile: Path
    keyfile: Path
    sha256: str
    """Fingerprint of the DER certificate, upper-case hex with colons (``AB:CD:...``)."""


def fingerprint_sha256(cert: x509.Certificate | bytes) -> str:
    """Return the SHA-256 fingerprint of a certificate (object or DER) as ``AB:CD:..``."""
    der = cert if isinstance(cert, bytes) else cert.public_bytes(serialization.Encoding.DER)
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def parse_fingerprint(value: str | bytes) -> bytes:
    """Parse a SHA-256 fingerprint given as raw bytes, hex, or hex with colons/spaces."""
    if isinstance(value, bytes):
        raw = value
    else:
        cleaned = value.replace(":", "").replace(" ", "").strip()
        try:
            raw = bytes.fromhex(cleaned)
        except ValueError as exc:
            raise ValueError(f"invalid SHA-256 fingerprint: {value!r}") from exc
    if len(raw) != 32:
        raise ValueError(f"a SHA-256 fingerprint has 32 bytes, got {len(raw)}")
    return raw


def load_certificate(path: str | os.PathLike[str]) -> x509.Certificate:
    """Load the first PEM certificate from ``path``."""
    from cryptography import x509

    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def load_private_key(path: str | os.PathLike[str]) -> ec.EllipticCurvePrivateKey:
    """Load an unencrypted PEM EC private key from ``path``."""
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: expected an EC private key")
    return key


def _san_entries(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _is_usable(
    certfile: Path, keyfile: Path, hosts: tuple[str, ...], min_remaining: datetime.timedelta
) -> bool:
    try:
        cert = load_certificate(certfile)
        key = load_private_key(keyfile)
    except (OSError, ValueError) as exc:
        logger.debug("dev certificate not reusable: %s", exc)
        return False
    now = datetime.datetime.now(datetime.UTC)
    if cert.not_valid_before_utc > now or cert.not_valid_after_utc - now < min_remaining:
        return False
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        return False
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    if len(x509.load_pem_x509_certificates(certfile.read_bytes())) < 2:
        return False  # an old single self-signed certificate: replace it by a chain
    return all(name in san for name in _san_entries(hosts))


def _build(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int
) -> x509.CertificateBuilder:
    from cryptography import x509

    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def generate_certificate(
    hosts: tuple[str, ...] = DEFAULT_HOSTS, days: int = 13
) -> tuple[list[x509.Certificate], ec.EllipticCurvePrivateKey]:
    """Create an EC P-256 certificate for ``hosts`` valid for ``days`` days.

    Returns the chain ``[leaf, ca]`` and the leaf's key. The CA is self-signed, valid as
    long as the leaf, and its key is discarded once the leaf is signed.
    """
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvcs development CA")])
    ca_usage = x509.KeyUsage(
        digital_signature=False, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )
    ca = (
        _build(ca_name, ca_name, ca_key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(ca_usage, critical=True)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "kvcs")])
    leaf = (
        _build(name, ca_name, key.public_key(), days)
        .add_extension(x509.SubjectAlternativeName(_san_entries(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return [leaf, ca], key


def ensure_dev_certificate(
    directory: str | os.PathLike[str] = "certs",
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    days: int = 13,
    min_remaining: datetime.timedelta = datetime.timedelta(days=1),
) -> DevCertificate:
    """Return a dev certificate in ``directory``, creating a new one when needed.

    An existing pair is reused when it loads, the key matches, it covers ``hosts`` and is
    valid for at least ``min_remaining`` more. The key file is written with mode 0600.
    """
    folder = Path(directory)
    certfile, keyfile = folder / CERT_NAME, folder / KEY_NAME
    if not _is_usable(certfile, keyfile, hosts, min_remaining):
        folder.mkdir(parents=True, exist_ok=True)
        chain, key = generate_certificate(hosts, days)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fp:
            fp.write(key_pem)
        certfile.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain))
        logger.info("generated dev certificate %s (%s)", certfile, fingerprint_sha256(chain[0]))
    return DevCertificate(certfile, keyfile, fingerprint_sha256(load_certificate(certfile)))
