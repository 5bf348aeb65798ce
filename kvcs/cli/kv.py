"""``kvcs publish``, ``kvcs fetch``, ``kvcs inspect`` and ``kvcs kvsp-serve``: the KVCS
commands of the CLI.

They connect to a relay (``--relay moqt://host:port/`` or ``https://...`` for
WebTransport), identify the cache from a Compatibility Descriptor, token IDs and a scope
key, and show progress per layer. ``publish --store`` also writes KVSP containers that
``kvsp-serve`` serves over HTTPS; ``fetch --http`` falls back to them. User mistakes exit
with status 2 and one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from .base import UsageError, add_quic_options, command, stop_on_signals

log = logging.getLogger("kvcs")

KEYRING_HELP = ("producer public keys: a directory of <kid>.pem files (the key ID is the file "
                "name without .pem), a JSON keyring {\"keys\": [{\"kid\": ..., \"pem\": "
                "...}]}, or one PEM file (key ID: its name without .pem)")


def _common(p: argparse.ArgumentParser, *, tokens: bool = True, relay: bool = True) -> None:
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


def _scope(args: argparse.Namespace) -> Any:
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


def _content_keys(args: argparse.Namespace) -> Any:
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


def _scope_file_keys(args: argparse.Namespace) -> Any:
    """The content keys of ``--scope-key`` when it is a scope file that holds some (None
    otherwise): ``inspect`` reads protected manifests with them."""
    from ..kv.scopefile import ScopeFileError, load_scope_file

    if not args.scope_key:
        return None
    try:
        scope = load_scope_file(args.scope_key)
    except (ScopeFileError, OSError, ValueError):
        return None  # a plain scope.key file: _scope() reads it
    return scope.secure_objects() if scope.content_keys else None


def _keyring(args: argparse.Namespace) -> Any:
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


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    from ..kv.files import FileFormatError, load_descriptor, load_tokens

    try:
        desc = load_descriptor(args.descriptor)
        tokens = load_tokens(args.tokens) if getattr(args, "tokens", None) else None
    except FileFormatError as exc:
        raise UsageError(str(exc)) from None
    return desc, tokens


async def _connect(args: argparse.Namespace, url: str | None = None, *,
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


def _setup_logging(args: argparse.Namespace) -> None:
    level = str(args.log_level).upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(level) in (logging.WARNING, logging.ERROR):
        # aioquic logs a failed handshake as a warning; the command reports it in one line
        logging.getLogger("quic").setLevel(logging.ERROR)


def _progress(what: str, i: int, n: int, t0: float, nbytes: int | None = None) -> None:
    rate = ""
    if nbytes is not None:
        dt = max(time.perf_counter() - t0, 1e-6)
        rate = f", {nbytes / dt / 2**20:.1f} MiB/s"
    print(f"  {what} layer {i + 1}/{n} ({time.perf_counter() - t0:.2f} s{rate})", flush=True)


# ---------------------------------------------------------------------------- descriptor

DESCRIPTOR_TEMPLATE = {
    "kvsp": 1,
    "model": "my-org/my-model",
    "revision": "weights-revision-or-hash",
    "tokenizer": "tokenizer-id-or-hash",
    "layers": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "dtype": "bfloat16",
    "block_tokens": 16,
    "layout": "tnd",
    "rope": "post",
}
"""What ``kvcs descriptor`` prints: every required member of the KVSP Compatibility
Descriptor (docs/kvsp-profile.md) with an example value (a Llama-style 32-layer model)."""


@command("descriptor")
def _descriptor_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "descriptor", help="print a Compatibility Descriptor template, or check one",
        description="Without options: print a valid KVSP Compatibility Descriptor template "
                    "(JSON) to edit. The required members are kvsp (1), model, revision, "
                    "tokenizer (strings), layers, kv_heads, head_dim, block_tokens "
                    "(integers), dtype (float32, float16, bfloat16, float8_e4m3fn, "
                    "float8_e5m2), layout (tnd) and rope (post, pre or none); optional "
                    "v_head_dim and extra (an object). No floats: write them as strings. "
                    "See docs/kvsp-profile.md.")
    p.add_argument("--check", metavar="FILE", help="validate FILE and print its "
                   "Compatibility ID")
    p.add_argument("--from-model", metavar="DIR",
                   help="derive the descriptor of a local transformers model directory "
                        "(config.json + weights; needs the [hf] extra); the revision is the "
                        "SHA-256 of its weight files unless --revision is given")
    p.add_argument("--model-id", metavar="NAME", help="with --from-model: the model name "
                   "(default: from the config, else the directory name)")
    p.add_argument("--revision", metavar="REV", help="with --from-model: the weights "
                   "revision (e.g. a hub commit)")
    p.add_argument("--block-tokens", type=int, default=16, metavar="B",
                   help="with --from-model: tokens per block (default 16)")
    p.add_argument("--out", metavar="FILE", help="write the template to FILE instead of "
                   "printing it (never overwrites)")
    p.set_defaults(func=run_descriptor)
    return p


def run_descriptor(args: argparse.Namespace) -> int:
    """``kvcs descriptor``."""
    from ..kv.files import FileFormatError, load_descriptor

    if args.check:
        try:
            desc = load_descriptor(args.check)
        except FileFormatError as exc:
            raise UsageError(str(exc)) from None
        print(f"{args.check}: valid; Compatibility ID {desc.compat_id.hex()}")
        print(f"  {desc.layers} layers, {desc.kv_heads} KV heads x {desc.head_dim} dims, "
              f"{desc.dtype_name}, {desc.block_tokens} tokens per block, model "
              f"{desc.members['model']!r}")
        return 0
    members: dict[str, Any] = DESCRIPTOR_TEMPLATE
    if args.from_model:
        members = _descriptor_from_model(args).to_dict()
    text = json.dumps(members, indent=2) + "\n"
    if args.out:
        try:
            with open(args.out, "x") as f:
                f.write(text)
        except FileExistsError:
            raise UsageError(f"--out {args.out}: exists (not overwritten)") from None
        except OSError as exc:
            raise UsageError(f"--out {args.out}: {exc.strerror or exc}") from None
        print(f"wrote the descriptor of {args.from_model} to {args.out}" if args.from_model
              else f"wrote a descriptor template to {args.out}: edit model, revision, "
                   "tokenizer and the geometry to match your model", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _descriptor_from_model(args: argparse.Namespace) -> Any:
    """``descriptor --from-model``: the [hf] integration reads the model directory."""
    try:
        from ..integrations.hf import descriptor_for_directory
    except ImportError as exc:
        raise UsageError(f"--from-model needs the hf extra (pip install 'kvcs[hf]'): "
                         f"{exc}") from None
    if not Path(args.from_model).is_dir():
        raise UsageError(f"--from-model {args.from_model}: not a directory")
    try:
        return descriptor_for_directory(args.from_model, model_id=args.model_id,
                                        revision=args.revision,
                                        block_tokens=args.block_tokens)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--from-model {args.from_model}: {exc}") from None


# ---------------------------------------------------------------------------- sample


@command("sample")
def _sample_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "sample", help="write a random KV cache and prompt matching a descriptor (to try "
                       "the commands)",
        description="Write random token IDs (--tokens-out, .npy) and a random K/V cache of "
                    "them (--kv-out: arrays 'k' and 'v' [layers, tokens, kv_heads, head_dim] "
                    "in the descriptor's dtype), the inputs `kvcs publish` takes. Not a "
                    "model's cache: for trying relay, publish, inspect and fetch.")
    p.add_argument("--descriptor", required=True, metavar="JSON",
                   help="Compatibility Descriptor file (`kvcs descriptor --out`)")
    p.add_argument("--tokens", type=int, default=1024, metavar="N",
                   help="prompt length (default 1024)")
    p.add_argument("--tokens-out", required=True, metavar="FILE", help="token IDs (.npy)")
    p.add_argument("--kv-out", required=True, metavar="FILE", help="K/V arrays (.npz)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_sample)
    return p


def run_sample(args: argparse.Namespace) -> int:
    """``kvcs sample``."""
    import numpy as np

    from ..kv.files import FileFormatError, load_descriptor, save_stacked_kv

    try:
        desc = load_descriptor(args.descriptor)
    except FileFormatError as exc:
        raise UsageError(str(exc)) from None
    if args.tokens < 1:
        raise UsageError("--tokens must be at least 1")
    for out in (args.tokens_out, args.kv_out):
        _check_out(out)
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, 32000, args.tokens, dtype=np.int64)
    shape = (desc.layers, args.tokens, desc.kv_heads, desc.head_dim)
    k = rng.standard_normal(shape, dtype=np.float32).astype(desc.dtype)
    v = rng.standard_normal((*shape[:3], desc.v_shape()[2]), dtype=np.float32).astype(desc.dtype)
    try:
        np.save(args.tokens_out, tokens)
        save_stacked_kv(args.kv_out, k, v)
    except (OSError, FileFormatError) as exc:
        raise UsageError(str(exc)) from None
    mib = (k.nbytes + v.nbytes) / 2**20
    print(f"wrote {args.tokens} token IDs to {args.tokens_out} and a {desc.layers}-layer "
          f"K/V cache of them ({mib:.1f} MiB) to {args.kv_out}")
    return 0


# ---------------------------------------------------------------------------- publish


@command("publish")
def _publish_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("publish", help="publish a KV cache from a file into a relay",
                       description="Publish K/V arrays (.npz or .safetensors with 'k'/'v' "
                                   "[layers, tokens, heads, dim] or 'k.N'/'v.N') as a KVCS "
                                   "publication, layer by layer.")
    _common(p)
    p.add_argument("--kv", required=True, metavar="FILE",
                   help=".npz or .safetensors with arrays 'k' and 'v' [layers, tokens, "
                        "kv_heads, head_dim], or per-layer 'k.N' and 'v.N' [tokens, kv_heads, "
                        "head_dim] as `kvcs fetch --out` writes them")
    p.add_argument("--joint-codec", choices=["q8", "zstd"],
                   help="also offer a kv.<codec> track")
    p.add_argument("--producer-key", metavar="PEM", help="sign manifests (manifest.cose)")
    p.add_argument("--kid", default="producer",
                   help="key ID of --producer-key, written into each signed manifest; "
                        "consumers need the public key under the same ID in their --keyring "
                        "(default: producer)")
    p.add_argument("--retention", type=float, default=3600.0, metavar="SECONDS",
                   help="MAX_CACHE_DURATION of the tracks (default 3600)")
    p.add_argument("--linger", type=float, default=None, metavar="SECONDS",
                   help="stay connected this long once published (default: leave as soon "
                        "as the relay holds the whole publication; with --no-hand-over: "
                        "until Ctrl-C)")
    p.add_argument("--no-hand-over", action="store_true",
                   help="do not wait for the relay to hold every track: stay connected "
                        "(--linger, or until Ctrl-C) so that it can pull them on demand")
    p.add_argument("--hand-over-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long the relay may take to pull every track before `kvcs "
                        "publish` gives up with status 1 (default 300)")
    p.add_argument("--store", metavar="DIR",
                   help="also write one KVSP container per complete block into DIR, for "
                        "`kvcs kvsp-serve` (HTTP fallback); they expire with --retention")
    _index_args(p, "register the publication (its moqt:// URI at --relay) for its Block Keys "
                   "with this KVSP Index (`kvcs kvsp-serve`), for --retention seconds")
    p.add_argument("--protect", action="store_true", help=PROTECT_HELP)
    p.add_argument("--protect-in-band", action="store_true",
                   help="--protect with the Key ID carried in the payload, for relays that "
                        "drop object properties or rewrite priorities (moq-dev/moq)")
    p.set_defaults(func=run_publish)
    return p


def run_publish(args: argparse.Namespace) -> int:
    """``kvcs publish``."""
    from ..kv.cose import ProducerKey
    from ..kv.files import FileFormatError, load_kv
    from ..kv.store import BlockStore, store_cache
    from ..kvnet.publisher import KvPublisher, PublicationError, PublisherOptions

    _setup_logging(args)
    desc, tokens = _load(args)
    scope = _scope(args)
    args.protect = args.protect or args.protect_in_band
    secure = _content_keys(args)
    try:
        ks, vs = load_kv(args.kv, desc)
    except FileFormatError as exc:
        raise UsageError(str(exc)) from None
    covered = len(tokens) // desc.block_tokens * desc.block_tokens
    short = min(int(k.shape[0]) for k in ks + vs)
    if short < covered:
        raise UsageError(f"--kv {args.kv} holds {short} tokens per layer, but --tokens "
                         f"{args.tokens} has {len(tokens)} ({covered // desc.block_tokens} "
                         f"complete blocks of {desc.block_tokens}): give the cache of these "
                         "tokens, or the tokens it was computed from")
    index = _index_client(args)
    if index is not None and not args.relay.startswith("moqt://"):
        raise UsageError("--index registers a moqt:// URI: give a moqt:// --relay")
    if args.store:
        try:
            keys = store_cache(BlockStore(args.store), desc, scope, tokens, ks, vs,
                               retention_s=args.retention)
        except OSError as exc:
            raise UsageError(f"--store {args.store}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise UsageError(f"--store: {exc}") from None
        print(f"stored {len(keys)} KVSP container(s) in {args.store}", flush=True)
    key = None
    if args.producer_key:
        try:
            key = ProducerKey.load(args.producer_key, args.kid)
        except (OSError, ValueError) as exc:
            raise UsageError(f"producer key: {exc}") from None

    hand_over = None if args.no_hand_over else args.hand_over_timeout
    if hand_over is not None and hand_over <= 0:
        raise UsageError("--hand-over-timeout must be positive")

    async def run() -> int:
        target = await _connect(args, reconnecting=True)
        try:
            opts = PublisherOptions(joint_codec=args.joint_codec, retention_s=args.retention,
                                    producer_key=key, hex_namespace=args.hex_namespace,
                                    hand_over_s=hand_over, secure=secure,
                                    secure_in_band=args.protect_in_band)
            try:
                pub = KvPublisher(target, scope, desc, tokens, opts)
            except PublicationError as exc:
                raise UsageError(str(exc)) from None
            await pub.start()
            print(f"publication {pub.publication_id.hex()} ({pub.blocks()} blocks, "
                  f"{desc.layers} layers)", flush=True)
            if index is not None:
                await _register(index, args, pub, tokens)
            t0 = time.perf_counter()
            for i in range(desc.layers):
                try:
                    await pub.put_layer(i, ks[i], vs[i])
                except PublicationError as exc:
                    raise UsageError(str(exc)) from None
                _progress("published", i, desc.layers, t0)
            try:
                await pub.finish()
            except PublicationError as exc:
                print(f"kvcs publish: {exc}; publish again, or with --no-hand-over to serve "
                      "the tracks yourself", file=sys.stderr, flush=True)
                return 1
            print("publication complete", flush=True)
            if hand_over is not None:
                print(f"the relay holds the whole publication (for {args.retention:g} s); "
                      "leaving", flush=True)
            if args.linger is None and hand_over is None:
                print("serving the tracks; Ctrl-C to stop", flush=True)
                await asyncio.Event().wait()  # reconnects to a restarted relay meanwhile
            elif args.linger:
                await asyncio.sleep(args.linger)
            return 0
        finally:
            await target.aclose()
            if index is not None:
                await index.aclose()

    return asyncio.run(run())


def _index_args(p: argparse.ArgumentParser, help_text: str) -> None:
    g = p.add_argument_group("KVSP Index")
    g.add_argument("--index", action="append", metavar="URL", help=help_text +
                   " (https://host:port, repeatable)")
    g.add_argument("--index-token", metavar="TOKEN", help="Bearer token for the index "
                   "(default: --http-token, else --token)")
    tls = g.add_mutually_exclusive_group()
    tls.add_argument("--index-cafile", metavar="PEM", help="trust this CA/certificate")
    tls.add_argument("--index-pin", metavar="SHA256", help="accept exactly the certificate "
                     "with this SHA-256 fingerprint (printed by `kvcs kvsp-serve`)")


def _index_client(args: argparse.Namespace) -> Any:
    """The KvspClient of ``--index`` (None without it)."""
    if not getattr(args, "index", None):
        return None
    token = args.index_token or getattr(args, "http_token", None) or args.token
    return _kvsp_client(args.index, token, args.index_cafile, args.index_pin, "--index")


async def _register(index: Any, args: argparse.Namespace, pub: Any, tokens: Any) -> None:
    """Register a publication's moqt:// URI with the KVSP Index for its Block Keys."""
    from ..kv.errors import KvcsError
    from ..kv.ids import block_keys
    from ..kv.index import publication_uri

    keys = block_keys(pub.scope, pub.compat_id, tokens, pub.descriptor.block_tokens)
    uri = publication_uri(args.relay, pub.fields)
    try:
        await index.register(pub.namespace.scope_id, pub.compat_id, keys, uri,
                             ttl=args.retention)
    except KvcsError as exc:
        raise UsageError(f"--index: {exc}") from None
    print(f"registered with the KVSP Index for {len(keys)} Block Keys: {uri}", flush=True)


# ---------------------------------------------------------------------------- fetch


def _parse_layers(text: str | None, total: int) -> range:
    if not text:
        return range(total)
    try:
        a_s, _, b_s = text.partition(":")
        a = int(a_s) if a_s else 0
        b = int(b_s) if b_s else total
    except ValueError:
        raise UsageError(f"--layers {text!r}: use A:B (layers A..B-1)") from None
    if a >= b:
        raise UsageError(f"--layers {text!r} selects no layer: use A:B with A < B "
                         f"(layers A..B-1, within 0:{total})")
    if not 0 <= a < b <= total:
        raise UsageError(f"--layers {text!r}: outside 0:{total} (the descriptor has "
                         f"{total} layers)")
    return range(a, b)


def _check_out(path: str) -> None:
    """Refuse an ``--out`` that cannot be written before any transfer starts."""
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"--out {path}: directory {parent} does not exist")
    if out.is_dir():
        raise UsageError(f"--out {path}: is a directory")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--out {path}: directory {parent} is not writable")


@command("fetch")
def _fetch_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("fetch", help="find and retrieve a KV cache into an .npz file",
                       description="Discover the publication of the longest reusable prefix "
                                   "of the tokens, verify every object and write the layers.")
    _common(p, relay=False)
    p.add_argument("--out", required=True, metavar="FILE",
                   help="output .npz or .safetensors: per-layer arrays 'k.N' and 'v.N' "
                        "[tokens, kv_heads, head_dim] (in .npz, bfloat16 and float8 as "
                        "unsigned integers of the same width); `kvcs publish --kv` reads it")
    p.add_argument("--layers", metavar="A:B", help="layers A..B-1 (default: all)")
    p.add_argument("--blocks", type=int, metavar="N", help="only the first N blocks")
    p.add_argument("--codec", action="append", metavar="NAME",
                   help="codec preference, repeatable or comma-separated (e.g. q8,raw; "
                        "default raw): the first one the publication offers and this build "
                        "implements is used")
    p.add_argument("--recompute-budget", type=float, default=10.0, metavar="SECONDS",
                   help="give up on blocks after this long without progress, and bound "
                        "recovery by it (the time recomputing would take; default 10)")
    p.add_argument("--keyring", metavar="FILE", help=KEYRING_HELP)
    p.add_argument("--require-signed", action="store_true",
                   help="refuse publications without a valid manifest.cose (the default "
                        "with --keyring)")
    p.add_argument("--protect", action="store_true",
                   help="accept only protected publications, and only objects that decrypt "
                        "with the content keys of --scope-key (a scope file made by `kvcs "
                        "keygen`); needed to read what `kvcs publish --protect` publishes")
    h = p.add_argument_group("KVSP HTTP fallback (needs --relay, --http or both)")
    h.add_argument("--http", action="append", metavar="URL",
                   help="https://host:port of a KVSP holder (`kvcs kvsp-serve`), repeatable: "
                        "blocks missing over MOQT are fetched there, and everything is when "
                        "no relay is reachable or no publication is found")
    h.add_argument("--http-token", metavar="TOKEN", help="Bearer token for the holders")
    htls = h.add_mutually_exclusive_group()
    htls.add_argument("--http-cafile", metavar="PEM", help="trust this CA/certificate")
    htls.add_argument("--http-pin", metavar="SHA256", help="accept exactly the certificate "
                      "with this SHA-256 fingerprint (printed by `kvcs kvsp-serve`)")
    _index_args(p, "find publications through this KVSP Index (a lookup of the prompt's "
                   "Block Keys; no prefix is revealed to relays)")
    p.add_argument("--discovery", choices=["prefix", "index", "index-first"],
                   help="prefix: probe successively shorter prefixes at the relay; index: "
                        "ask --index only; index-first (default with --index): the index, "
                        "then prefixes")
    p.set_defaults(func=run_fetch)
    return p


def _codecs(values: list[str] | None) -> list[str]:
    """``--codec`` values (repeated and/or comma-separated) as a preference order."""
    from ..kv.tracks import TrackName

    names = [c.strip() for v in values or ["raw"] for c in v.split(",") if c.strip()]
    for name in names:
        try:
            TrackName.data("k", name, 0)
        except ValueError as exc:
            raise UsageError(f"--codec: {exc}") from None
    return names


def run_fetch(args: argparse.Namespace) -> int:
    """``kvcs fetch``."""
    from ..kv.errors import KvcsError
    from ..kv.files import FileFormatError, save_kv
    from ..kvnet.consumer import KvConsumer, RecomputeRequired

    _setup_logging(args)
    desc, tokens = _load(args)
    scope = _scope(args)
    layers = _parse_layers(args.layers, desc.layers)
    _check_out(args.out)
    if args.blocks is not None and args.blocks < 1:
        raise UsageError("--blocks must be at least 1")
    if args.recompute_budget <= 0:
        raise UsageError("--recompute-budget must be positive")
    codecs = _codecs(args.codec)
    keyring = _keyring(args)
    if args.require_signed and keyring is None:
        raise UsageError("--require-signed needs --keyring")
    secure = _content_keys(args)
    if not args.relay and not args.http and not args.index:
        raise UsageError("give --relay, --http, --index or a combination")
    if args.discovery in ("index", "index-first") and not args.index:
        raise UsageError(f"--discovery {args.discovery} needs --index")
    client = _http_client(args)
    index = _index_client(args)

    async def run() -> int:
        ep = None
        if args.relay:
            try:
                ep = await _connect(args)
            except UsageError as exc:
                if client is None and index is None:
                    raise
                print(f"{exc}; going on without it", file=sys.stderr, flush=True)

        async def connect(url: str) -> Any:  # a relay the index names
            try:
                return await _connect(args, url)
            except UsageError as exc:  # not a mistake of this user: that relay is away
                raise ConnectionError(str(exc)) from None

        # a keyring implies --require-signed
        c = KvConsumer([ep] if ep is not None else [], scope, desc, tokens,
                       keyring=keyring, require_signed=keyring is not None,
                       hex_namespace=args.hex_namespace, http=client, index=index,
                       discovery=args.discovery, connect=connect, codec=codecs,
                       recompute_budget_s=args.recompute_budget, secure=secure)
        try:
            pub = await c.discover()
            if pub is None and client is None:
                refused = f" (refused: {c.discarded[0][1]})" if c.discarded else ""
                print(f"no publication covers any prefix of these tokens{refused}",
                      file=sys.stderr)
                return 1
            if pub is None:
                if c.require_signed:
                    print("no MOQT publication found, and HTTP-only retrieval cannot satisfy "
                          "--keyring / --require-signed (no signed manifest)", file=sys.stderr)
                    return 1
                print(f"no MOQT publication found; retrieving {len(c.keys)} blocks over KVSP "
                      f"HTTP from {', '.join(client.urls)}", flush=True)
                source = c.http_layers(layers, args.blocks)
            else:
                plan = c.prefix_plan(pub, c.manifests[pub.fields], args.blocks)
                print(f"found publication {pub.namespace.publication_id.hex()} covering "
                      f"{sum(n for _, n in plan)} of {len(c.keys)} blocks in "
                      f"{len(plan)} segment(s)", flush=True)
                source = c.prefix_layers(pub, layers, args.blocks)
            got = []
            t0 = time.perf_counter()
            try:
                async for layer in source:
                    got.append((layer.index, layer.k, layer.v))
                    _progress("verified", layer.index - layers.start, len(layers), t0,
                              c.stats.bytes)
            except RecomputeRequired as exc:
                print(f"incomplete: {exc}; blocks to recompute: "
                      f"{json.dumps(exc.missing)}", file=sys.stderr)
                return 3
            except KvcsError as exc:
                print(f"publication rejected: {exc}", file=sys.stderr)
                return 3
            try:
                save_kv(args.out, got)
            except FileFormatError as exc:
                raise UsageError(str(exc)) from None
            if c.stats.http_blocks:
                print(f"{c.stats.http_blocks} block(s) retrieved over KVSP HTTP", flush=True)
            print(f"wrote {len(got)} layers x {got[0][1].shape[0] if got else 0} tokens to "
                  f"{args.out}", flush=True)
            return 0
        finally:
            await c.aclose()
            if ep is not None:
                ep.close()
                await ep.wait_closed()
            for http in (client, index):
                if http is not None:
                    await http.aclose()

    return asyncio.run(run())


def _http_client(args: argparse.Namespace) -> Any:
    """The KvspClient of ``fetch --http`` (None without it)."""
    if not args.http:
        return None
    return _kvsp_client(args.http, args.http_token, args.http_cafile, args.http_pin, "--http")


def _kvsp_client(urls: list[str], token: str | None, cafile: str | None, pin: str | None,
                 flag: str) -> Any:
    from ..kvnet.kvsp_http import KvspClient

    try:
        return KvspClient(urls, token, cafile=cafile, pin_sha256=pin)
    except FileNotFoundError as exc:
        raise UsageError(f"{flag}-cafile: {exc.strerror}: {exc.filename}") from None
    except (ValueError, OSError) as exc:  # ssl.SSLError is an OSError
        raise UsageError(f"{flag}: {exc}") from None


# ---------------------------------------------------------------------------- kvsp-serve


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

    _setup_logging(args)
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


# ---------------------------------------------------------------------------- inspect


@command("inspect")
def _inspect_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help="list publications and print/verify manifests",
                       description="List KVCS publications under ('kvcs-1', ScopeID[, "
                                   "CompatID]) and print each manifest, verified.")
    _common(p, tokens=False)
    p.add_argument("--keyring", metavar="FILE", help=KEYRING_HELP)
    p.set_defaults(func=run_inspect)
    return p


def run_inspect(args: argparse.Namespace) -> int:
    """``kvcs inspect``."""
    from ..endpoint import MoqtRequestError
    from ..kv.cose import verify_manifest
    from ..kv.errors import KvcsError
    from ..kv.ids import KvcsNamespace, scope_id
    from ..kv.manifest import Manifest, check_namespace
    from ..kvnet.manifest_track import ManifestTrack

    _setup_logging(args)
    scope = _scope(args)
    desc = None
    if args.descriptor:
        desc, _ = _load(args)
    keyring = _keyring(args)
    secure = _scope_file_keys(args)
    sid = scope_id(scope)
    hexf = args.hex_namespace
    fields = [sid] + ([desc.compat_id] if desc else [])
    prefix = (b"kvcs-1", *((f.hex().encode() if hexf else f) for f in fields))

    async def run() -> int:
        ep = await _connect(args)
        try:
            watch = await ep.subscribe_namespace(prefix)
            found = []
            while (change := await watch.next(0.3)) is not None:
                if change[0]:
                    found.append(change[1])
            await watch.cancel()
            print(f"{len(found)} publication(s) under scope {sid.hex()}")
            for ns in found:
                try:
                    kns = KvcsNamespace.from_fields(ns, hex_fields=hexf)
                except ValueError:
                    print(f"- (not a KVCS namespace) {ns!r}")
                    continue
                print(f"- publication {kns.publication_id.hex()} compat "
                      f"{kns.compat_id.hex()[:16]}... anchor {kns.anchor_key.hex()[:16]}...")
                track = None
                try:
                    async with asyncio.timeout(5):
                        track = await ManifestTrack.open(ep, ns, require_signed=False,
                                                         secure=secure)
                        blob = await track.next_version()
                except (MoqtRequestError, ConnectionError, TimeoutError) as exc:
                    print(f"  no manifest: {exc or 'none within 5 s'}")
                    continue
                except KvcsError as exc:  # protected: the manifest is encrypted
                    print(f"  manifest unreadable: {exc}")
                    continue
                finally:
                    if track is not None:
                        await track.close()
                if blob is None:
                    print("  no manifest: the track ended without a version")
                    continue
                name, g = track.name.decode(), track.version
                try:
                    if track.signed:
                        if keyring is None:
                            print(f"  {name} v{g}: signed (no --keyring given; "
                                  "signature not verified)")
                            blob = _cose_payload(blob)
                        else:
                            blob = verify_manifest(blob, keyring)
                            print(f"  {name} v{g}: signature OK")
                    m = Manifest.parse(blob)
                    check_namespace(m, kns.compat_id)
                except KvcsError as exc:
                    print(f"  {name} v{g}: INVALID: {exc}")
                    continue
                print(f"  {name} v{g}: {m.layers} layers, {m.block_tokens} "
                      f"tokens/block, model {m.compat.get('model')!r}, "
                      f"deterministic={m.deterministic}"
                      + (", protected (Secure Objects)" if track.protected else ""))
                for seg in m.segments:
                    print(f"    segment {seg.segment}: blocks {seg.first_block}.."
                          f"{seg.first_block + seg.blocks - 1}, complete={seg.complete}, "
                          f"tracks {', '.join(seg.tracks)}")
            return 0
        finally:
            ep.close()
            await ep.wait_closed()

    return asyncio.run(run())


def _cose_payload(blob: bytes) -> bytes:
    import cbor2

    top = cbor2.loads(blob)
    arr = top.value if isinstance(top, cbor2.CBORTag) else top
    return bytes(arr[2])
