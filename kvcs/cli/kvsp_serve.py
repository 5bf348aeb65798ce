"""``kvcs kvsp-serve``: serve KVSP containers over HTTPS (the HTTP fallback)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from .base import UsageError, command, stop_on_signals
from .common import setup_logging


@command("kvsp-serve")
def _kvsp_serve_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("kvsp-serve", help="serve KVSP containers over HTTPS (fallback path)",
                       description="Serve a directory of KVSP containers (written by `kvcs "
                                   "publish --store`) over HTTPS: GET /kvsp/v1/{scope}/{compat}"
                                   "/blocks/{key} and POST /kvsp/v1/{scope}/lookup (KVSP "
                                   "profile section 8). See docs/kvsp-profile.md.")
    p.add_argument("--store", required=True, metavar="DIR", help="the container directory")
    p.add_argument("--listen", default="127.0.0.1:8443", metavar="HOST:PORT",
                   help="TCP address (default 127.0.0.1:8443; port 0 picks a free one)")
    p.add_argument("--cert", metavar="PEM", help="certificate chain (PEM)")
    p.add_argument("--key", metavar="PEM", help="private key (PEM; default: in --cert)")
    p.add_argument("--cert-dir", metavar="DIR", help="where the self-signed dev certificate "
                   "goes when --cert is not given (default certs/)")
    auth = p.add_mutually_exclusive_group(required=True)
    auth.add_argument("--auth", metavar="FILE", help="JSON token file in the relay's format "
                      "(docs/relay.md): a token may read a scope it may subscribe to")
    auth.add_argument("--anonymous", action="store_true",
                      help="serve everyone without tokens (local demos only)")
    p.add_argument("--public-url", metavar="URL", help="base of the https:// holder URLs "
                   "that lookup returns (default: https://HOST:PORT as bound)")
    p.add_argument("--log-level", default="info", metavar="LEVEL")
    p.set_defaults(func=run_kvsp_serve)
    return p


def run_kvsp_serve(args: argparse.Namespace) -> int:
    """``kvcs kvsp-serve``: serve until SIGINT/SIGTERM."""
    from ..auth import AuthError, Authorizer
    from ..kv.store import BlockStore
    from ..kvnet.kvsp_http import KvspServer
    from ..relay.config import ConfigError, parse_hostport
    from ..transport.certs import ensure_dev_certificate, fingerprint_sha256, load_certificate

    setup_logging(args)
    try:
        host, port = parse_hostport(args.listen, "--listen")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if not Path(args.store).is_dir():
        raise UsageError(f"--store {args.store}: not a directory")
    if args.key and not args.cert:
        raise UsageError("--key needs --cert")
    if args.public_url and not args.public_url.startswith("https://"):
        raise UsageError("--public-url must start with https://")
    try:
        authorizer = (Authorizer(anonymous=True) if args.anonymous
                      else Authorizer.from_file(args.auth))
    except AuthError as exc:
        raise UsageError(str(exc)) from None
    try:
        if args.cert:
            certfile, keyfile = args.cert, args.key
            pin = fingerprint_sha256(load_certificate(certfile))
        else:
            dev = ensure_dev_certificate(args.cert_dir or "certs")
            certfile, keyfile, pin = str(dev.certfile), str(dev.keyfile), dev.sha256
        server = KvspServer(BlockStore(args.store), authorizer=authorizer, certfile=certfile,
                            keyfile=keyfile, host=host, port=port, public_url=args.public_url)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"certificate: {what}") from None

    async def run() -> None:
        stop = stop_on_signals()
        try:
            await server.start()
        except OSError as exc:
            raise UsageError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
        mode = "anonymous" if args.anonymous else f"{len(authorizer.grants)} token(s)"
        print(f"kvcs kvsp-serve listening on {server.url} (store {args.store}, {mode})",
              flush=True)
        print(f"certificate SHA-256 fingerprint: {pin}", flush=True)
        await stop.wait()
        print("shutting down", flush=True)
        await server.aclose()

    asyncio.run(run())
    return 0
