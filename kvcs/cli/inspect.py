"""``kvcs inspect``: list the publications of a scope and print each manifest, verified."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from .base import command
from .common import (
    KEYRING_HELP,
    add_relay_options,
    check_connection_options,
    connect_relay,
    load_inputs,
    load_keyring,
    print_trust,
    scope_file_keys,
    scope_key,
    setup_logging,
)


@command("inspect")
def _inspect_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help="list publications and print/verify manifests",
                       description="List KVCS publications under ('kvcs-1', ScopeID[, "
                                   "CompatID]) and print each manifest, verified.")
    add_relay_options(p, tokens=False)
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

    setup_logging(args)
    check_connection_options(args)
    scope = scope_key(args)
    desc = None
    if args.descriptor:
        desc, _ = load_inputs(args)
    keyring = load_keyring(args)
    secure = scope_file_keys(args)
    sid = scope_id(scope)
    hexf = args.hex_namespace
    fields = [sid] + ([desc.compat_id] if desc else [])
    prefix = (b"kvcs-1", *((f.hex().encode() if hexf else f) for f in fields))

    async def run() -> int:
        ep = await connect_relay(args)
        try:
            watch = await ep.subscribe_namespace(prefix)
            try:  # the relay confirms after the NAMESPACEs of all it holds: one round trip
                await asyncio.wait_for(watch.sync(), 5)
            except (MoqtRequestError, TimeoutError):
                await asyncio.sleep(0.3)  # a relay that does not: what came by then
            listed: dict[Any, None] = {}  # in the relay's order
            for added, ns in watch.received():
                if added:
                    listed[tuple(ns)] = None
                else:
                    listed.pop(tuple(ns), None)
            found = list(listed)
            await watch.cancel()
            print(f"{len(found)} publication(s) under scope {sid.hex()}")
            print_trust(secure is not None, keyring is not None)
            for ns in found:
                try:
                    kns = KvcsNamespace.from_fields(ns, hex_fields=hexf)
                except ValueError:
                    print(f"- (not a KVCS namespace) {ns!r}")
                    continue
                print(f"- publication {kns.publication_id.hex()} compat "
                      f"{kns.compat_id.hex()[:16]}... anchor {kns.anchor_key.hex()[:16]}...")
                try:
                    track, blob = await _read_manifest(ep, ns, secure)
                except (MoqtRequestError, ConnectionError, TimeoutError) as exc:
                    print(f"  no manifest: {exc or 'none within 5 s'}")
                    continue
                except KvcsError as exc:
                    print(f"  manifest unreadable: {exc}" + (
                        "; it is protected: give --scope-key <the scope file with its "
                        "content keys>" if secure is None and "protected" in str(exc)
                        else ""))
                    continue
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
                      + (", protected (Secure Objects)" if track.protected
                         else ", unprotected (plaintext)" if secure is not None else ""))
                for seg in m.segments:
                    print(f"    segment {seg.segment}: blocks {seg.first_block}.."
                          f"{seg.first_block + seg.blocks - 1}, complete={seg.complete}, "
                          f"tracks {', '.join(seg.tracks)}")
            return 0
        finally:
            ep.close()
            await ep.wait_closed()

    return asyncio.run(run())


async def _read_manifest(ep: Any, ns: Any, secure: Any) -> tuple[Any, bytes | None]:
    """The manifest track of ``ns`` and its newest version, read as it was published: with
    the content keys when it is protected, as plaintext when it is not (inspect shows
    both; `fetch --protect` accepts only protected ones). Raises what reading raises."""
    from ..kv.secure import SecureObjectError
    from ..kvnet.manifest_track import ManifestTrack

    for keys in (secure, None) if secure is not None else (None,):
        track = None
        try:
            async with asyncio.timeout(5):
                track = await ManifestTrack.open(ep, ns, require_signed=False, secure=keys)
                return track, await track.next_version()
        except SecureObjectError as exc:
            if keys is None or "no Key ID" not in str(exc):
                raise  # tampered, or protected under other keys
        finally:
            if track is not None:
                await track.close()
    raise AssertionError("unreachable: the plaintext attempt returns or raises")


def _cose_payload(blob: bytes) -> bytes:
    import cbor2

    top = cbor2.loads(blob)
    arr = top.value if isinstance(top, cbor2.CBORTag) else top
    return bytes(arr[2])
