"""Relay configuration: one dataclass, loadable from JSON or TOML; CLI flags win."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError, KvcsError
from ..transport.config import CONGESTION_CONTROLS


class ListenError(KvcsError, OSError):
    """A listening socket could not be opened; the message names the address and what
    it was for (``kvcs relay`` prints it as one line)."""

    def __init__(self, address: str, what: str, exc: OSError) -> None:
        # asyncio's messages repeat the address as a tuple: say only what went wrong
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        super().__init__(exc.errno, f"cannot listen on {address}{what}: {why}")
        self.address = address

    def __str__(self) -> str:
        return str(self.strerror)


def parse_hostport(value: str, what: str = "address") -> tuple[str, int]:
    """Parse ``HOST:PORT`` (IPv6 as ``[::1]:4443``); raises ConfigError."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what} must be HOST:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"{what} must be HOST:PORT, got {value!r}") from None
    if not 0 <= p <= 65535:
        raise ConfigError(f"{what}: port {p} out of range")
    return host, p


def check_url_port(url: str, what: str) -> None:
    """ConfigError for a moqt:// URL without a port, or with a bad one (a relay has no
    usual port: a missing one used to time out silently on 443)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{what} {url}: bad port") from None
    if not parts.hostname:
        raise ConfigError(f"{what} {url}: no host")
    if port is None and parts.scheme == "moqt":
        raise ConfigError(f"{what} {url}: no port; give the relay's, e.g. "
                          f"moqt://{parts.hostname}:4443/")


def check_certificate(certfile: str, keyfile: str) -> None:
    """ConfigError unless ``certfile`` and ``keyfile`` are a PEM certificate chain and its
    private key (checked before listening: a bad pair would fail every handshake)."""
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(f"--tls-cert {certfile} / --tls-key {keyfile}: not a certificate "
                          f"and its private key ({exc})") from None


@dataclass
class RelayConfig:
    """Everything the relay needs; the CLI builds one from flags and a config file."""

    listen: str = "127.0.0.1:4443"
    tls_cert: str | None = None
    tls_key: str | None = None
    cert_dir: str = "certs"
    upstream: str | list[str] | None = None
    """URL of the upstream relay, or several (peering: tried in order, the first that
    answers is used until its session is lost; :meth:`upstreams`)."""
    upstream_timeout: float = 10.0
    """Seconds to wait for one upstream relay to answer before trying the next."""
    upstream_cafile: str | None = None
    upstream_insecure: bool = False
    upstream_token: str | None = None
    auth: str | None = None
    anonymous: bool = False
    cache_bytes: int = 1 << 30
    metrics: str | None = None
    log_level: str = "info"
    quic_preset: str = "default"
    """``default``: datagram size per peer (the QUIC library's largest to loopback clients,
    1350 bytes to others); ``loopback``: the largest to every peer."""
    mtu: int | None = None
    """Path MTU of the network the relay serves (1500 Ethernet, 9000 jumbo frames): every
    peer gets datagrams of ``mtu - 48`` bytes (:meth:`kvcs.transport.QuicSettings.for_path`)."""
    quic_backend: str | None = None
    """QUIC library: ``auto`` (qh3 when installed), ``aioquic`` or ``qh3``; see
    :mod:`kvcs.transport.quic`. ``kvcs relay`` makes it the process default
    (:func:`kvcs.transport.use_library`) before it makes the relay's QuicSettings;
    unset: ``KVCS_QUIC_BACKEND`` if set, else ``auto``."""
    congestion_control: str | None = None
    """aioquic congestion controller of the relay's connections (``reno``, ``cubic``,
    ``bbr``; unset: reno). Needs ``quic_backend: aioquic``: qh3's cannot be chosen."""
    upstream_quic_backend: str | None = None
    """QUIC library of the upstream link only (unset: the relay's)."""
    upstream_congestion_control: str | None = None
    """Congestion controller of the upstream link only (unset: ``congestion_control``):
    e.g. ``bbr`` across sites while local links stay on qh3."""
    max_fetches_per_session: int = 16
    max_requests_per_session: int = 1024
    fetch_retry_ms: int = 1000
    request_rate: float = 1000.0
    """Requests per second the relay handles over all its sessions, least-served session
    first among those with some waiting (0: no pacing); see docs/relay.md, Fairness and
    bounded memory."""
    request_burst: int = 256
    """Requests handled at once before ``request_rate`` applies."""
    max_session_backlog: int = 64 << 20
    """Bytes written to a session and not yet taken by its QUIC connection past which a
    live object is not queued for it: the subscription ends with PUBLISH_DONE
    TOO_FAR_BEHIND (a subscriber that stopped reading). Fetches wait instead."""
    max_sessions: int = 1024
    """Sessions at once; a new client past it is not answered (its handshake times out)."""
    accept_rate: float = 100.0
    """New sessions per second (bursts of 32); past it a new client's first packets are
    dropped and QUIC resends them (:attr:`kvcs.transport.QuicSettings.accept_rate`)."""
    upstream_linger: float = 10.0
    """Seconds an upstream subscription is kept after its last downstream left."""
    goaway_grace: float = 2.0
    """Seconds between GOAWAY and closing sessions on shutdown."""
    sweep_interval: float = 1.0
    kvsp_store: str | None = None
    """A directory of KVSP containers (``kvcs publish --store``) that ``kvcs relay`` also
    serves over HTTPS beside the relay (KVSP profile section 8: "the relay can be one"),
    with the relay's certificate and auth file. The :class:`Relay` itself never reads it:
    the relay does not import the KV layer (:func:`kvcs.cli.start_kvsp_beside`)."""
    kvsp_listen: str | None = None
    """TCP ``HOST:PORT`` of that HTTPS server; default: the relay's own address and port
    number (QUIC uses UDP, so TCP can share the number)."""
    idle_timeout: float = 30.0
    """Seconds of silence after which a session's connection is dropped (QUIC idle
    timeout; the smaller of both ends' applies: `kvcs publish`/`fetch` ask for 6)."""
    keep_alive: float | None = None
    """Seconds of quiet after which the relay PINGs a peer (None or 0: never; clients
    keep their sessions alive)."""
    log_format: str = "text"
    """``text``: one human line per event; ``json``: one JSON object per line (time, level,
    logger, message), for log collectors."""
    store: str | None = None
    """Directory of the disk tier (:mod:`kvcs.relay.store`): completed publications kept
    there are served again after a restart."""
    store_bytes: int = 10 << 30
    """Byte budget of ``store`` (least recently used publications evicted first)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def keys(cls) -> set[str]:
        """Configuration keys accepted in files (with ``-`` or ``_``)."""
        return {f.name for f in fields(cls) if f.name != "extra"}

    def update(self, values: dict[str, Any]) -> None:
        """Apply ``values`` (file or flags); unknown keys raise ConfigError."""
        known = self.keys()
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in known:
                raise ConfigError(f"unknown configuration key {key!r}")
            current = getattr(self, name)
            if isinstance(current, bool) and not isinstance(value, bool):
                raise ConfigError(f"{key} must be true or false")
            if name in ("cache_bytes", "max_session_backlog", "store_bytes"):
                value = parse_size(value)
            elif isinstance(current, int | float) and not isinstance(current, bool):
                try:
                    value = type(current)(value)
                except (TypeError, ValueError):
                    raise ConfigError(f"{key}: expected a number, got {value!r}") from None
            setattr(self, name, value)

    def upstreams(self) -> list[str]:
        """The upstream relays' URLs, in the order they are tried."""
        if not self.upstream:
            return []
        return [self.upstream] if isinstance(self.upstream, str) else list(self.upstream)

    def validate(self) -> None:
        """Check cross-field rules; raises ConfigError with one clear line."""
        parse_hostport(self.listen, "--listen")
        if self.metrics:
            parse_hostport(self.metrics, "--metrics")
        if self.kvsp_listen:
            if not self.kvsp_store:
                raise ConfigError("--kvsp-listen needs --kvsp-store")
            parse_hostport(self.kvsp_listen, "--kvsp-listen")
        if self.kvsp_store and not Path(self.kvsp_store).is_dir():
            raise ConfigError(f"--kvsp-store {self.kvsp_store}: not a directory")
        if not self.auth and not self.anonymous:
            raise ConfigError("refusing to start without authorization: pass --auth FILE "
                              "(or --anonymous for a local demo)")
        if self.auth and self.anonymous:
            raise ConfigError("--auth and --anonymous are mutually exclusive")
        if self.tls_key and not self.tls_cert:
            raise ConfigError("--tls-key needs --tls-cert")
        if self.tls_cert and not self.tls_key:
            raise ConfigError("--tls-cert needs --tls-key (the certificate's private key, "
                              "PEM); or give neither for a self-signed dev certificate")
        for path in (self.tls_cert, self.tls_key, self.auth, self.upstream_cafile):
            if path and not Path(path).is_file():
                raise ConfigError(f"file not found: {path}")
        if self.tls_cert and self.tls_key:
            check_certificate(self.tls_cert, self.tls_key)
        if self.idle_timeout <= 0:
            raise ConfigError("--idle-timeout must be positive (seconds)")
        if self.keep_alive is not None and self.keep_alive < 0:
            raise ConfigError("--keep-alive must be 0 (never) or positive (seconds)")
        if self.log_format not in ("text", "json"):
            raise ConfigError("--log-format must be 'text' or 'json'")
        if not isinstance(self.upstream, str | list | type(None)):
            raise ConfigError("upstream must be a URL or a list of URLs")
        for url in self.upstreams():
            if not isinstance(url, str) or not url.startswith(("moqt://", "https://")):
                raise ConfigError(f"--upstream must be a moqt:// or https:// URL: {url}")
            check_url_port(url, "--upstream")
        if self.store_bytes <= 0:
            raise ConfigError("--store-bytes must be positive")
        if self.store and Path(self.store).exists() and not Path(self.store).is_dir():
            raise ConfigError(f"--store {self.store}: not a directory")
        if self.cache_bytes <= 0:
            raise ConfigError("--cache-bytes must be positive")
        if self.request_rate < 0 or self.request_burst < 1:
            raise ConfigError("request-rate must be >= 0 and request-burst >= 1")
        if self.max_session_backlog < 1 << 20:
            raise ConfigError("max-session-backlog must be at least 1MiB")
        if self.max_sessions < 1 or self.accept_rate <= 0:
            raise ConfigError("max-sessions and accept-rate must be positive")
        if self.quic_preset not in ("default", "loopback"):
            raise ConfigError("--quic-preset must be 'default' or 'loopback'")
        for flag, value in (("quic-backend", self.quic_backend),
                            ("upstream-quic-backend", self.upstream_quic_backend)):
            if value not in (None, "auto", "aioquic", "qh3"):
                raise ConfigError(f"--{flag} must be 'auto', 'aioquic' or 'qh3'")
        for flag, value in (("congestion-control", self.congestion_control),
                            ("upstream-congestion-control", self.upstream_congestion_control)):
            if value not in (None, *CONGESTION_CONTROLS):
                raise ConfigError(f"--{flag} must be one of {', '.join(CONGESTION_CONTROLS)}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"--log-level: unknown level {self.log_level!r}")


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1000**2, "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30,
          "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}


def parse_size(value: Any) -> int:
    """Parse a byte count: ``1073741824``, ``512MiB``, ``1G``, ``2gb``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip().lower().replace(" ", "")
    num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(num):]
    if unit not in _UNITS or not num:
        raise ConfigError(f"not a byte size: {value!r} (e.g. 1073741824, 512MiB, 1GiB)")
    try:
        return int(float(num) * _UNITS[unit])
    except ValueError:
        raise ConfigError(f"not a byte size: {value!r}") from None


def load_config_file(path: str) -> dict[str, Any]:
    """Read a JSON (``.json``) or TOML file of configuration keys; raises ConfigError.

    A TOML file may hold the keys at top level or in a ``[relay]`` table.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        is_json = p.suffix.lower() == ".json"
        data = json.loads(raw) if is_json else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a table/object of keys")
    if isinstance(data.get("relay"), dict):
        data = data["relay"]
    return data
