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
    add_liveness_options(p, idle=CLIENT_IDLE_TIMEOUT)
    p.add_argument("--connect-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="give up on a relay that does not answer the handshake within this "
                        "long (default 5; a closed port on a reachable host is reported at "
                        "once)")
    p.add_argument("--log-level", default="warning", metavar="LEVEL")


CLIENT_IDLE_TIMEOUT = 6.0
"""Seconds of silence after which publish, fetch and inspect drop a relay session (QUIC
idle timeout). With keep-alive PINGs every third of it, a live relay never stays silent that
long; a relay that was killed and restarted is noticed after at most this long, and the
publisher reconnects and announces again (before: the library's 30 s, measured 40 s to
heal)."""


def add_liveness_options(p: argparse.ArgumentParser, *, idle: float | None) -> None:
    """``--idle-timeout`` and ``--keep-alive`` (``idle``: the default idle timeout shown in
    the help; None: the relay's)."""
    p.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                   default=idle, help="drop a connection silent this long (QUIC idle "
                   "timeout; the smaller of both ends' applies; default "
                   f"{idle if idle is not None else 30:g})")
    p.add_argument("--keep-alive", type=float, metavar="SECONDS",
                   help="PING a quiet peer after this long (0: never; default: a third of "
                        "the idle timeout on clients, never on a relay)")


def quic_settings(args: argparse.Namespace, preset: str = "default") -> Any:
    """The QuicSettings of the transport options (``--mtu``, ``--idle-timeout``,
    ``--keep-alive``); bad values are one-line usage errors."""
    import dataclasses

    from ..transport import QuicSettings

    idle, keep = getattr(args, "idle_timeout", None), getattr(args, "keep_alive", None)
    if idle is not None and idle <= 0:
        raise UsageError(f"--idle-timeout {idle:g}: must be positive (seconds)")
    if keep is not None and keep < 0:
        raise UsageError(f"--keep-alive {keep:g}: must be 0 (never) or positive (seconds)")
    if keep and idle is not None and keep >= idle:
        raise UsageError(f"--keep-alive {keep:g} must be shorter than --idle-timeout {idle:g}")
    try:
        settings = QuicSettings.for_path(mtu=args.mtu, preset=preset,
                                         library=getattr(args, "quic_backend", None))
        settings = settings.with_transport(
            congestion_control=getattr(args, "congestion_control", None))
        changes: dict[str, Any] = {}
        if idle is not None:
            changes["idle_timeout"] = idle
        if keep is not None:
            changes["keep_alive_s"] = keep
        return dataclasses.replace(settings, **changes) if changes else settings
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_relay_url(url: str, flag: str = "--relay") -> None:
    """Refuse a relay URL that cannot work before anything connects: a scheme other than
    moqt:// or https://, no host, or a moqt:// URL without a port (a relay has no usual
    port; `kvcs relay` listens on 4443)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("moqt", "https"):
        raise UsageError(f"{flag} {url}: use moqt://HOST:PORT/ (raw QUIC) or "
                         "https://HOST:PORT/ (WebTransport)")
    if not parts.hostname:
        raise UsageError(f"{flag} {url}: no host; use e.g. moqt://127.0.0.1:4443/")
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"{flag} {url}: bad port; use e.g. moqt://{parts.hostname}:4443/"
                         ) from None
    if port is None and parts.scheme == "moqt":
        raise UsageError(f"{flag} {url}: no port; give the relay's, e.g. "
                         f"moqt://{parts.hostname}:4443/ (the port `kvcs relay` prints)")


def check_cafile(path: str | None, flag: str = "--cafile") -> None:
    """Refuse a CA file that is missing or holds no certificate, before connecting."""
    import ssl

    if path is None:
        return
    try:
        ssl.create_default_context(cafile=path)
    except FileNotFoundError:
        raise UsageError(f"{flag} {path}: no such file; give the relay's certificate (e.g. "
                         "certs/dev-cert.pem where `kvcs relay` runs) or --pin its "
                         "fingerprint") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"{flag} {path}: not a PEM certificate ({why})") from None


def check_connection_options(args: argparse.Namespace) -> None:
    """Everything about the relay options that can be refused before connecting."""
    if getattr(args, "relay", None):
        check_relay_url(args.relay)
    check_cafile(getattr(args, "cafile", None))
    quic_settings(args)
    if args.connect_timeout <= 0:
        raise UsageError(f"--connect-timeout {args.connect_timeout:g}: must be positive")


def refused_hint(args: argparse.Namespace, exc: Exception) -> str | None:
    """The one line for a relay's UNAUTHORIZED answer (None for other refusals)."""
    from ..endpoint import MoqtRequestError
    from ..moqt.errors import RequestErrorCode

    if not isinstance(exc, MoqtRequestError) or exc.code != RequestErrorCode.UNAUTHORIZED:
        return None
    if not args.token:
        return (f"the relay refused without a token ({exc.reason or 'unauthorized'}): pass "
                "--token with a token of the relay's --auth file that grants this scope")
    return (f"the relay refused --token ({exc.reason or 'unauthorized'}): the token is "
            "unknown to the relay or does not grant this scope; check the relay's --auth file")


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


def _scope_file(args: argparse.Namespace) -> Any:
    """``--scope-key`` as a scope file (None: none given, or a plain scope key file)."""
    from ..kv.scopefile import ScopeFileError, load_scope_file

    if not args.scope_key:
        return None
    try:
        return load_scope_file(args.scope_key)
    except (ScopeFileError, OSError, ValueError):
        return None  # scope_key() reports what is wrong with it


def scope_producer_key(args: argparse.Namespace) -> Any:
    """The producer signing key the ``--scope-key`` scope file names (`kvcs keygen` makes
    one), or None; a named key that does not load is a one-line usage error."""
    from ..kv.scopefile import ScopeFileError

    scope = _scope_file(args)
    try:
        return scope.producer_key() if scope is not None else None
    except ScopeFileError as exc:
        raise UsageError(str(exc)) from None


def print_trust(protected: bool, signed: bool) -> None:
    """The trust level line of publish, fetch and inspect (docs/security.md)."""
    from ..kv.scopefile import trust_level

    print(f"trust: {trust_level(protected, signed)} (docs/security.md)", flush=True)


def load_keyring(args: argparse.Namespace) -> Any:
    """The ``--keyring``, else the keyring the ``--scope-key`` scope file names (None
    without either); a bad file is a one-line usage error."""
    from ..kv.cose import Keyring
    from ..kv.errors import KvcsError
    from ..kv.scopefile import ScopeFileError

    if not args.keyring:
        scope = _scope_file(args)
        try:
            return scope.keyring() if scope is not None else None
        except ScopeFileError as exc:
            raise UsageError(str(exc)) from None
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
    tokens: tuple[AuthToken, ...] = ()
    if args.token:
        tokens = (AuthToken(3, token_type=0, value=args.token.encode()),)
    check_connection_options(args)
    settings = quic_settings(args, "loopback" if args.loopback else "default")
    url = url or args.relay
    options: dict[str, Any] = dict(settings=settings, verify=not args.insecure,
                                   cafile=args.cafile, pin_sha256=args.pin,
                                   auth_tokens=tokens)
    try:
        if reconnecting:
            return await ReconnectingTarget.connect(url, connect_timeout=args.connect_timeout,
                                                    **options)
        return await Endpoint.connect(url, timeout=args.connect_timeout, **options)
    except ConnectionRefusedError:
        where = url.split("://", 1)[-1].split("/", 1)[0]
        raise UsageError(f"no relay is listening at {where} (UDP port closed): start one "
                         "with `kvcs relay`, or correct --relay") from None
    except (ConnectionError, ValueError, OSError, TimeoutError) as exc:
        hint = ""
        if "certificate" in str(exc) and not (args.cafile or args.pin or args.insecure):
            hint = ("; the relay's certificate is not trusted here: pass --pin <its SHA-256 "
                    "fingerprint, printed by `kvcs relay`> or --cafile <its certificate, e.g. "
                    "certs/dev-cert.pem>")
        elif "timeout" in str(exc):
            hint = (f" (no answer within {args.connect_timeout:g} s: is a relay running there, "
                    "and is its UDP port reachable from here?)")
        raise UsageError(f"cannot connect to {url}: {exc}{hint}") from None


def setup_logging(args: argparse.Namespace) -> None:
    level = str(args.log_level).upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(level) in (logging.WARNING, logging.ERROR):
        # aioquic logs a failed handshake as a warning, the consumer each publication it
        # refuses: the command reports them in one line
        for name in ("quic", "kvcs.kvnet.consumer"):
            logging.getLogger(name).setLevel(logging.ERROR)


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


def write_new_file(path: str, text: str) -> None:
    """Write ``text`` to ``path``, which must not exist (FileExistsError), through a
    temporary name: a failed write leaves nothing under ``path``."""
    out = Path(path)
    if out.exists():
        raise FileExistsError(path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.link(tmp, out)  # fails if ``path`` appeared meanwhile: never overwrites
    finally:
        tmp.unlink(missing_ok=True)
