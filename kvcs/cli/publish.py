"""``kvcs publish``: a K/V cache from a file into a relay, layer by layer."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from .base import UsageError, command
from .common import (
    PROTECT_HELP,
    add_index_options,
    add_relay_options,
    check_connection_options,
    connect_relay,
    content_keys,
    index_client,
    load_inputs,
    print_trust,
    progress,
    scope_key,
    scope_producer_key,
    setup_logging,
)

MAX_RETENTION_S = 365 * 86400.0
"""Largest ``--retention``: a year (MAX_CACHE_DURATION is in milliseconds)."""


@command("publish")
def _publish_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("publish", help="publish a KV cache from a file into a relay",
                       description="Publish K/V arrays (.npz or .safetensors with 'k'/'v' "
                                   "[layers, tokens, heads, dim] or 'k.N'/'v.N') as a KVCS "
                                   "publication, layer by layer.")
    add_relay_options(p)
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
    add_index_options(p, "register the publication (its moqt:// URI at --relay) for its Block Keys "
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

    setup_logging(args)
    check_connection_options(args)
    if not 0 < args.retention <= MAX_RETENTION_S:
        raise UsageError(f"--retention {args.retention:g}: give the seconds relays keep the "
                         f"publication, more than 0 and at most {MAX_RETENTION_S:g}")
    if args.linger is not None and args.linger < 0:
        raise UsageError(f"--linger {args.linger:g}: must be 0 or more seconds")
    desc, tokens = load_inputs(args)
    scope = scope_key(args)
    args.protect = args.protect or args.protect_in_band
    secure = content_keys(args)
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
    index = index_client(args)
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
    else:  # the one `kvcs keygen` made beside the scope file
        key = scope_producer_key(args)

    hand_over = None if args.no_hand_over else args.hand_over_timeout
    if hand_over is not None and hand_over <= 0:
        raise UsageError("--hand-over-timeout must be positive")

    async def run() -> int:
        target = await connect_relay(args, reconnecting=True)
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
            print_trust(secure is not None, key is not None)
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
                progress("published", i, desc.layers, t0)
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
