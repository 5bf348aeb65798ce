"""``kvcs fetch``: discover the longest published prefix of a prompt, verify it and write
the layers."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from .base import UsageError, command
from .common import (
    KEYRING_HELP,
    add_index_options,
    add_relay_options,
    check_connection_options,
    check_out,
    connect_relay,
    content_keys,
    index_client,
    kvsp_client,
    load_inputs,
    load_keyring,
    print_trust,
    progress,
    scope_key,
    setup_logging,
)


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


@command("fetch")
def _fetch_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("fetch", help="find and retrieve a KV cache into an .npz file",
                       description="Discover the publication of the longest reusable prefix "
                                   "of the tokens, verify every object and write the layers.")
    add_relay_options(p, relay=False)
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
    add_index_options(p, "find publications through this KVSP Index (a lookup of the prompt's "
                   "Block Keys; no prefix is revealed to relays)")
    p.add_argument("--discovery", choices=["namespace", "index", "index-first", "prefix"],
                   help="namespace (default without --index): one request lists the "
                        "scope's publications at the relay, matched here (one round trip "
                        "whatever the prompt's length); index: ask --index only; "
                        "index-first (default with --index): both, the index's first; "
                        "prefix: probe successively shorter prefixes (one request each)")
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


def refusal_hint(reason: str, args: argparse.Namespace) -> str:
    """Why a publication was refused, in words, and what to do (``reason``: the consumer's)."""
    if "no Key ID" in reason or "neither Immutable Properties" in reason:
        return ("it is not protected (plaintext), and --protect accepts only protected "
                "publications: fetch it without --protect (on relays you trust), or have it "
                "published with `kvcs publish --protect`")
    if "is protected" in reason and "no content keys" in reason:
        return ("it is protected and no content keys are held here: fetch it with "
                "--protect --scope-key <the scope file with its content keys, made by "
                "`kvcs keygen`>")
    if "no signed manifest" in reason:
        why = "--keyring" if args.keyring else "the scope file's producer key"
        return (f"it is not signed, and {why} requires a signed manifest: have it published "
                "with the producer's signing key (`kvcs publish --scope-key <that scope "
                "file>` signs with it, or --producer-key)")
    return reason


def run_fetch(args: argparse.Namespace) -> int:
    """``kvcs fetch``."""
    from ..kv.errors import KvcsError
    from ..kv.files import FileFormatError, save_kv
    from ..kvnet.consumer import KvConsumer, RecomputeRequired

    setup_logging(args)
    check_connection_options(args)
    desc, tokens = load_inputs(args)
    scope = scope_key(args)
    layers = _parse_layers(args.layers, desc.layers)
    check_out(args.out)
    if args.blocks is not None and args.blocks < 1:
        raise UsageError("--blocks must be at least 1")
    if args.recompute_budget <= 0:
        raise UsageError("--recompute-budget must be positive")
    codecs = _codecs(args.codec)
    keyring = load_keyring(args)
    if args.require_signed and keyring is None:
        raise UsageError("--require-signed needs --keyring")
    secure = content_keys(args)
    if not args.relay and not args.http and not args.index:
        raise UsageError("give --relay, --http, --index or a combination")
    if args.discovery in ("index", "index-first") and not args.index:
        raise UsageError(f"--discovery {args.discovery} needs --index")
    client = _http_client(args)
    index = index_client(args)

    async def run() -> int:
        ep = None
        if args.relay:
            try:
                ep = await connect_relay(args)
            except UsageError as exc:
                if client is None and index is None:
                    raise
                print(f"{exc}; going on without it", file=sys.stderr, flush=True)

        async def connect(url: str) -> Any:  # a relay the index names
            try:
                return await connect_relay(args, url)
            except UsageError as exc:  # not a mistake of this user: that relay is away
                raise ConnectionError(str(exc)) from None

        # a keyring implies --require-signed
        c = KvConsumer([ep] if ep is not None else [], scope, desc, tokens,
                       keyring=keyring, require_signed=keyring is not None,
                       hex_namespace=args.hex_namespace, http=client, index=index,
                       discovery=args.discovery, connect=connect, codec=codecs,
                       recompute_budget_s=args.recompute_budget, secure=secure)
        print_trust(secure is not None, c.require_signed)
        try:
            pub = await c.discover()
            if pub is None and client is None:
                if c.discarded:
                    reason = str(c.discarded[0][1])
                    print(f"kvcs fetch: {len(c.discarded)} publication(s) found but refused: "
                          f"{refusal_hint(reason, args)}", file=sys.stderr)
                else:
                    print("no publication covers any prefix of these tokens", file=sys.stderr)
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
                    progress("verified", layer.index - layers.start, len(layers), t0,
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
    return kvsp_client(args.http, args.http_token, args.http_cafile, args.http_pin, "--http")
