"""What ``publish``, ``fetch`` and ``inspect`` share: the relay options, the inputs
(descriptor, tokens, scope key, keyring, content keys), the connection to the relay, the
KVSP Index options, logging and progress lines."""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

from .base import UsageError, add_quic_options

log = logging.getLogger("kvcs")

KEYRING_HELP = ("producer public keys: a directory of <kid>.pem files (the key ID is the file "
                "name without .pem), a JSON keyring {\"keys\": [{\"kid\": ..., \"pem\": "
                "...}]}, or one PEM file (key ID: its name without .pem)")


def add_relay_options(p: argparse.ArgumentParser, *, tokens: bool = True,
                      relay: bool = True) -> None:
    """--relay, --descriptor, --tokens, --scope-key, --token, TLS and transport options."""
    p.add_argument("--relay", required=relay, metavar="URL",
                   help="moqt://host:port/ (raw QUIC) or https://host:port/ (WebTransport)")
    p.add_argument("--descriptor", required=tokens, metavar="JSON",
                   help="Compatibility Descriptor file")
    if tokens:
        p.add_argument("--tokens", required=True, metavar="FILE",
                       help="token IDs (.npy, .json or whitespace-separated text)")
    p.add_argument("--scope-key", metavar="FILE",
                   help="scope key file (32 raw bytes or 64 hex chars); "
                        "default: $KVCS_SCOPE_KEY (hex)")
    p.add_argument("--token", metavar="TOKEN", help="relay authorization token")
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--cafile", metavar="PEM", help="trust this certificate (e.g. the "
                     "relay's self-signed certs/dev-cert.pem)")
    tls.add_argument("--pin", metavar="SHA256", help="accept exactly the certificate with "
                     "this SHA-256 fingerprint (printed by `kvcs relay`)")
    tls.add_argument("--insecure", action="store_true",
                     help="do not verify the relay certificate (testing only)")
    p.add_argument("--hex-namespace", action="store_true",
                   help="UTF-8-safe namespace encoding for relays that reject binary fields "
                        "(a deviation from the KVCS document; both ends must use it)")
    add_quic_options(p)
    p.add_argument("--loopback", action="store_true",
                   help="the QUIC library's largest datagrams whatever the relay's address "
                        "(a relay on 127.0.0.1 or ::1 gets them without it)")
    p.add_argument("--log-level", default="warning", metavar="LEVEL")


def scope_key(args: argparse.Namespace) -> Any:
    from ..kv.errors import DescriptorError
    from ..kv.ids import ScopeKey

    try:
        if args.scope_key:
            return ScopeKey.from_file(args.scope_key)
        return ScopeKey.from_env()
    except (DescriptorError, ValueError, OSError) as exc:
        raise UsageError(f"scope key: {exc}") from None


PROTECT_HELP = ("protect end to end: every data track and the manifest are MOQT Secure "
                "Objects under the content keys of --scope-key, a scope file made by `kvcs "
                "keygen`; relays forward ciphertext they cannot read (docs/security.md)")


def content_keys(args: argparse.Namespace) -> Any:
    """The SecureObjects of ``--scope-key`` for ``--protect`` (None without it); a missing
    or keyless scope file is a one-line usage error."""
    if not args.protect:
        return None
    from ..kv.scopefile import ScopeFileError, load_scope_file

    if not args.scope_key:
        raise UsageError("--protect needs --scope-key <scope file with content keys> "
                         "(create one with `kvcs keygen scope.json`)")
    try:
        scope = load_scope_file(args.scope_key)
    except ScopeFileError as exc:
        raise UsageError(str(exc)) from None
    if not scope.content_keys:
        raise UsageError(f"--protect: {args.scope_key} holds no content keys; make a scope "
                         f"file from it: kvcs keygen scope.json --scope-key {args.scope_key}")
    return scope.secure_objects()


def scope_file_keys(args: argparse.Namespace) -> Any:
    """The content keys of ``--scope-key`` when it is a scope file that holds some (None
    otherwise): ``inspect`` reads protected manifests with them."""
    from ..kv.scopefile import ScopeFileError, load_scope_file

    if not args.scope_key:
        return None
    try:
        scope = load_scope_file(args.scope_key)
    except (ScopeFileError, OSError, ValueError):
        return None  # a plain scope.key file: scope_key() reads it
    return scope.secure_objects() if scope.content_keys else None


def load_keyring(args: argparse.Namespace) -> Any:
    """The ``--keyring`` (None without it); a bad file is a one-line usage error."""
    from ..kv.cose import Keyring
    from ..kv.errors import KvcsError

    if not args.keyring:
        return None
    try:
        return Keyring.load(args.keyring)
    except OSError as exc:
        raise UsageError(f"--keyring {args.keyring}: {exc.strerror or exc}") from None
    except (ValueError, KvcsError) as exc:
        raise UsageError(f"--keyring {args.keyring}: {exc}") from None


def load_inputs(args: argparse.Namespace) -> tuple[Any, Any]:
    from ..kv.files import FileFormatError, load_descriptor, load_tokens

    try:
        desc = load_descriptor(args.descriptor)
        tokens = load_tokens(args.tokens) if getattr(args, "tokens", None) else None
    except FileFormatError as exc:
        raise UsageError(str(exc)) from None
    return desc, tokens


async def connect_relay(args: argparse.Namespace, url: str | None = None, *,
                   reconnecting: bool = False) -> Any:
    """An endpoint connected to ``url`` (default ``--relay``) with the relay options; with
    ``reconnecting``, a started :class:`~kvcs.kvnet.reconnect.ReconnectingTarget` instead
    (a publisher whose relay restarts reconnects and announces again by itself)."""
    from ..endpoint import Endpoint
    from ..kvnet.reconnect import ReconnectingTarget
    from ..moqt.wire import AuthToken
    from ..transport import QuicSettings

    tokens: tuple[AuthToken, ...] = ()
    if args.token:
        tokens = (AuthToken(3, token_type=0, value=args.token.encode()),)
    try:
        settings = QuicSettings.for_path(mtu=args.mtu,
                                         preset="loopback" if args.loopback else "default")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    url = url or args.relay
    options: dict[str, Any] = dict(settings=settings, verify=not args.insecure,
                                   cafile=args.cafile, pin_sha256=args.pin,
                                   auth_tokens=tokens)
    try:
        if reconnecting:
            return await ReconnectingTarget.connect(url, **options)
        return await Endpoint.connect(url, **options)
    except (ConnectionError, ValueError, OSError, TimeoutError) as exc:
        hint = ""
        if "certificate" in str(exc) and not (args.cafile or args.pin or args.insecure):
            hint = ("; the relay's certificate is not trusted here: pass --pin <its SHA-256 "
                    "fingerprint, printed by `kvcs relay`> or --cafile <its certificate, e.g. "
                    "certs/dev-cert.pem>")
        raise UsageError(f"cannot connect to {url}: {exc}{hint}") from None


def setup_logging(args: argparse.Namespace) -> None:
    level = str(args.log_level).upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(level) in (logging.WARNING, logging.ERROR):
        # aioquic logs a failed handshake as a warning; the command reports it in one line
        logging.getLogger("quic").setLevel(logging.ERROR)


def progress(what: str, i: int, n: int, t0: float, nbytes: int | None = None) -> None:
    rate = ""
    if nbytes is not None:
        dt = max(time.perf_counter() - t0, 1e-6)
        rate = f", {nbytes / dt / 2**20:.1f} MiB/s"
    print(f"  {what} layer {i + 1}/{n} ({time.perf_counter() - t0:.2f} s{rate})", flush=True)


def check_out(path: str) -> None:
    """Refuse an ``--out`` that cannot be written before any transfer starts."""
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"--out {path}: directory {parent} does not exist")
    if out.is_dir():
        raise UsageError(f"--out {path}: is a directory")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--out {path}: directory {parent} is not writable")


def add_index_options(p: argparse.ArgumentParser, help_text: str) -> None:
    g = p.add_argument_group("KVSP Index")
    g.add_argument("--index", action="append", metavar="URL", help=help_text +
                   " (https://host:port, repeatable)")
    g.add_argument("--index-token", metavar="TOKEN", help="Bearer token for the index "
                   "(default: --http-token, else --token)")
    tls = g.add_mutually_exclusive_group()
    tls.add_argument("--index-cafile", metavar="PEM", help="trust this CA/certificate")
    tls.add_argument("--index-pin", metavar="SHA256", help="accept exactly the certificate "
                     "with this SHA-256 fingerprint (printed by `kvcs kvsp-serve`)")


def index_client(args: argparse.Namespace) -> Any:
    """The KvspClient of ``--index`` (None without it)."""
    if not getattr(args, "index", None):
        return None
    token = args.index_token or getattr(args, "http_token", None) or args.token
    return kvsp_client(args.index, token, args.index_cafile, args.index_pin, "--index")


def kvsp_client(urls: list[str], token: str | None, cafile: str | None, pin: str | None,
                 flag: str) -> Any:
    from ..kvnet.kvsp_http import KvspClient

    try:
        return KvspClient(urls, token, cafile=cafile, pin_sha256=pin)
    except FileNotFoundError as exc:
        raise UsageError(f"{flag}-cafile: {exc.strerror}: {exc.filename}") from None
    except (ValueError, OSError) as exc:  # ssl.SSLError is an OSError
        raise UsageError(f"{flag}: {exc}") from None
