"""``kvcs relay``: run the caching relay (and, with ``--kvsp-store``, a KVSP HTTPS holder
beside it, composed here so that the relay never imports the KV layer)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any

from .base import UsageError, add_quic_options, command, setup_relay_logging, stop_on_signals

log = logging.getLogger("kvcs")


@command("relay")
def _relay_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "relay", help="run the caching MOQT relay",
        description="Caching MOQT draft-22 relay (raw QUIC moqt-22 + WebTransport on one "
                    "UDP port). See docs/relay.md.")
    p.add_argument("--config", metavar="FILE", help="JSON or TOML file with the same keys "
                   "as the flags (listen, auth, cache_bytes, ...); flags win")
    p.add_argument("--listen", metavar="HOST:PORT", help="UDP address (default 127.0.0.1:4443)")
    p.add_argument("--tls-cert", metavar="PEM", help="certificate chain (PEM)")
    p.add_argument("--tls-key", metavar="PEM", help="private key (PEM)")
    p.add_argument("--cert-dir", metavar="DIR",
                   help="where the self-signed dev certificate goes (default certs/)")
    p.add_argument("--upstream", metavar="URL", action="append",
                   help="moqt:// or https:// URL of an upstream relay; repeat it to list "
                        "several, tried in order (the first that answers is used)")
    p.add_argument("--upstream-cafile", metavar="PEM", help="CA/cert to verify the upstream")
    p.add_argument("--upstream-insecure", action="store_true", default=None,
                   help="do not verify the upstream certificate (testing only)")
    p.add_argument("--upstream-token", metavar="TOKEN",
                   help="authorization token sent upstream (text or hex:...)")
    p.add_argument("--auth", metavar="FILE", help="JSON token file (see docs/relay.md)")
    p.add_argument("--anonymous", action="store_true", default=None,
                   help="allow everything without tokens (local demos only)")
    p.add_argument("--cache-bytes", metavar="SIZE", help="cache budget, e.g. 1GiB (default)")
    p.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics over HTTP")
    p.add_argument("--log-level", metavar="LEVEL", help="debug, info (default), warning, error")
    p.add_argument("--log-format", choices=["text", "json"],
                   help="text (default): one line per event; json: one JSON object per line")
    p.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                   help="drop a connection silent this long (QUIC idle timeout, default 30; "
                        "the smaller of both ends' applies)")
    p.add_argument("--keep-alive", type=float, metavar="SECONDS",
                   help="PING a quiet peer after this long (default: never; clients ping, and "
                        "so does the relay's upstream session)")
    p.add_argument("--quic-preset", choices=["default", "loopback"],
                   help="default: datagram size per client (the QUIC library's largest to "
                        "clients on loopback, 1350 bytes to others); loopback: the largest "
                        "to every client")
    add_quic_options(p)
    p.add_argument("--upstream-quic-backend", choices=["auto", "aioquic", "qh3"],
                   help="QUIC library of the --upstream link only (default: the relay's)")
    p.add_argument("--upstream-congestion-control", choices=["reno", "cubic", "bbr"],
                   help="congestion controller of what the relay sends on its --upstream "
                        "link only (aioquic; default: --congestion-control)")
    p.add_argument("--max-fetches-per-session", type=int, metavar="N")
    p.add_argument("--max-requests-per-session", type=int, metavar="N")
    p.add_argument("--request-rate", type=float, metavar="PER_SECOND",
                   help="requests handled per second, all sessions together, least-served "
                        "session first (default 1000; 0: no pacing)")
    p.add_argument("--request-burst", type=int, metavar="N",
                   help="requests handled at once before --request-rate applies (default 256)")
    p.add_argument("--max-sessions", type=int, metavar="N",
                   help="sessions at once; a client past it is not answered (default 1024)")
    p.add_argument("--accept-rate", type=float, metavar="PER_SECOND",
                   help="new QUIC connections accepted per second (default 100)")
    p.add_argument("--max-session-backlog", metavar="SIZE",
                   help="bytes queued for one session past which a live subscriber that does "
                        "not read is ended with TOO_FAR_BEHIND (default 64MiB)")
    p.add_argument("--upstream-linger", type=float, metavar="SECONDS",
                   help="keep an idle upstream subscription this long (default 10)")
    p.add_argument("--kvsp-store", metavar="DIR",
                   help="also serve this directory of KVSP containers (kvcs publish --store) "
                        "over HTTPS: the KVSP HTTP fallback (docs/kvsp-profile.md)")
    p.add_argument("--kvsp-listen", metavar="HOST:PORT",
                   help="TCP address of that HTTPS server (default: the relay's address and "
                        "port number)")
    p.add_argument("--store", metavar="DIR",
                   help="keep completed publications in this directory and serve them "
                        "again after a restart (docs/relay.md, Disk tier)")
    p.add_argument("--store-bytes", metavar="SIZE",
                   help="byte budget of --store, least recently used first out "
                        "(default 10GiB)")
    p.set_defaults(func=run_relay)
    return p


_RELAY_KEYS = ("listen", "tls_cert", "tls_key", "cert_dir", "upstream", "upstream_cafile",
               "upstream_insecure", "upstream_token", "auth", "anonymous", "cache_bytes",
               "metrics", "log_level", "quic_preset", "mtu", "quic_backend",
               "max_fetches_per_session",
               "max_requests_per_session", "request_rate", "request_burst", "max_sessions",
               "accept_rate", "max_session_backlog", "upstream_linger", "kvsp_store",
               "kvsp_listen", "store", "store_bytes", "log_format", "idle_timeout",
               "keep_alive", "congestion_control", "upstream_quic_backend",
               "upstream_congestion_control")


def relay_config(args: argparse.Namespace) -> Any:
    """Build the RelayConfig from ``--config`` and the flags (flags win)."""
    from ..relay.config import RelayConfig, load_config_file

    cfg = RelayConfig()
    if args.config:
        cfg.update(load_config_file(args.config))
    cfg.update({k: getattr(args, k) for k in _RELAY_KEYS if getattr(args, k) is not None})
    cfg.validate()
    return cfg


async def start_kvsp_beside(relay: Any) -> Any:
    """Start the KVSP HTTPS holder of ``relay.config.kvsp_store`` beside a started relay:
    same certificate and auth file, TCP on the relay's port number unless ``kvsp_listen``
    says otherwise. Returns the :class:`~kvcs.kvnet.kvsp_http.KvspServer` (the caller
    closes it); the relay itself never imports the KV layer."""
    from ..kv.store import BlockStore
    from ..kvnet.kvsp_http import KvspServer  # aiohttp: loaded only when configured
    from ..relay.config import ListenError, parse_hostport

    cfg = relay.config
    assert cfg.kvsp_store and relay.certfile is not None
    host, port = (parse_hostport(cfg.kvsp_listen, "--kvsp-listen") if cfg.kvsp_listen
                  else (relay.host, relay.port))
    server = KvspServer(BlockStore(cfg.kvsp_store), authorizer=relay.auth,
                        certfile=relay.certfile, keyfile=relay.keyfile, host=host, port=port)
    try:
        await server.start()
    except OSError as exc:
        raise ListenError(f"{host}:{port}", " (KVSP HTTPS)", exc) from exc
    log.info("serving KVSP containers of %s on %s", cfg.kvsp_store, server.url)
    return server


def _relay_settings(cfg: Any) -> Any:
    """The relay's QuicSettings: datagram sizes, idle timeout and keep-alive of ``cfg``."""
    import dataclasses

    from ..relay.config import ConfigError
    from ..transport import QuicSettings

    try:
        settings = QuicSettings.for_path(mtu=cfg.mtu, preset=cfg.quic_preset)
        # no --keep-alive: automatic (None), so the relay does not ping its clients but its
        # own upstream session, a client, still does (0 here cut an edge off its upstream
        # after every idle timeout)
        return dataclasses.replace(settings, idle_timeout=cfg.idle_timeout,
                                   keep_alive_s=cfg.keep_alive or None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def reload_on_sighup(relay: Any) -> None:
    """SIGHUP: read the token file (``--auth``) and the TLS certificate again. Sessions stay
    open; requests from then on are checked against the new tokens, new connections get the
    new certificate. A file that does not load is logged and the previous one kept."""
    import signal

    from ..auth import AuthError, Authorizer

    def reload() -> None:
        cfg = relay.config
        if cfg.auth:
            try:
                relay.auth.replace_rules(Authorizer.from_file(cfg.auth))
                log.info("SIGHUP: reloaded %s", cfg.auth)
            except AuthError as exc:
                log.error("SIGHUP: %s; keeping the previous tokens", exc)
        if cfg.tls_cert and relay.server is not None:
            try:
                relay.server.reload_certificate()
                log.info("SIGHUP: reloaded the certificate %s", cfg.tls_cert)
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                log.error("SIGHUP: certificate %s: %s; keeping the previous one",
                          cfg.tls_cert, exc)

    with contextlib.suppress(NotImplementedError, AttributeError):  # no SIGHUP (Windows)
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)


def run_relay(args: argparse.Namespace) -> int:
    """``kvcs relay``: run until SIGINT/SIGTERM, then shut down gracefully."""
    from ..relay import Relay
    from ..relay.config import ConfigError, ListenError
    from ..transport import default_library, use_library

    try:
        cfg = relay_config(args)
        # the relay's settings are made without a library: they take this default
        backend = use_library(cfg.quic_backend) if cfg.quic_backend else default_library()
    except (ConfigError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    setup_relay_logging(cfg.log_level, cfg.log_format)
    try:
        relay = Relay(cfg, settings=_relay_settings(cfg))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None

    async def run() -> None:
        stop = stop_on_signals()
        kvsp = None
        try:
            await relay.start()  # leaves nothing open when it fails
        except ListenError as exc:
            raise UsageError(str(exc)) from None
        except ConnectionError as exc:
            raise UsageError("cannot connect upstream "
                             f"{' or '.join(cfg.upstreams())}: {exc}") from None
        except OSError as exc:  # e.g. the certificate directory
            raise UsageError(str(exc)) from None
        if cfg.kvsp_store:
            try:
                kvsp = await start_kvsp_beside(relay)
            except ListenError as exc:
                await relay.stop(grace=0)
                raise UsageError(str(exc)) from None
        print(f"kvcs relay listening on {cfg.listen.rpartition(':')[0]}:{relay.port} "
              f"(moqt-22 over QUIC and WebTransport, QUIC library {backend})", flush=True)
        if relay.upstream_url:
            print(f"upstream: {relay.upstream_url}", flush=True)
        if relay.fingerprint:
            print(f"self-signed certificate SHA-256 fingerprint: {relay.fingerprint}",
                  flush=True)
        if relay.metrics_server is not None:
            print(f"metrics on http://{cfg.metrics.rpartition(':')[0]}:"
                  f"{relay.metrics_server.port}/metrics", flush=True)
        if kvsp is not None:
            print(f"KVSP containers of {cfg.kvsp_store} over HTTPS on {kvsp.url}", flush=True)
        reload_on_sighup(relay)
        await stop.wait()
        print("shutting down (GOAWAY sent to all sessions)", flush=True)
        if kvsp is not None:
            await kvsp.aclose()
        await relay.stop()

    asyncio.run(run())
    return 0
