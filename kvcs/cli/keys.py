"""``kvcs keygen``: create a scope file, rotate its content key, add a producer signing key.

A new scope file comes with a producer signing key beside it (``SCOPE.producer.pem`` and
its public ``SCOPE.producer.keyring.json``, named in the scope file) unless
``--no-signing-key``: publish signs with it and fetch requires its signatures by default,
so a relay cannot forge what it forwards (docs/security.md, "trust levels").

Files are written with mode 0600 and never replaced without ``--force``; ``--rotate``
rewrites the scope file atomically with the old keys kept. Key material is never printed.
The scope file format is in :mod:`kvcs.kv.scopefile` and docs/secure-objects.md.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .base import UsageError, command

_SUITES = "aes-128-gcm (default), aes-256-gcm, aes-128-ctr-hmac-80, aes-128-ctr-hmac-64"


@command("keygen")
def _keygen_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "keygen", help="create or rotate the keys of a scope (scope file)",
        description="Create a scope file (new KVSP scope key and content key 1 for MOQT "
                    "Secure Objects), add a rotated content key to it, or add a producer "
                    "signing key for manifest.cose. See docs/secure-objects.md.")
    p.add_argument("scope_file", metavar="SCOPE_FILE", help="scope file to create or update")
    p.add_argument("--rotate", action="store_true",
                   help="add a new content key (next Key ID) to an existing scope file and "
                        "make it current; the old keys stay for decryption")
    p.add_argument("--suite", metavar="SUITE",
                   help=f"cipher suite of the new content key: {_SUITES}; --rotate keeps "
                        "the current key's suite by default")
    p.add_argument("--scope-key", metavar="FILE",
                   help="create the scope file around this existing scope key (a scope.key "
                        "file) instead of a new one, so identifiers stay the same")
    sign = p.add_mutually_exclusive_group()
    sign.add_argument("--signing-key", metavar="PEM",
                      help="write the producer signing key pair here: the private key to "
                           "PEM and its public keyring to PEM's name with .keyring.json, and "
                           "name both in the scope file (a new scope file gets one beside "
                           "it by default: SCOPE.producer.pem)")
    sign.add_argument("--no-signing-key", action="store_true",
                      help="make a new scope file without a producer signing key (consumers "
                           "then trust the relays not to forge objects: docs/security.md)")
    p.add_argument("--kid", default="producer", help="key id of --signing-key "
                   "(default: producer)")
    p.add_argument("--alg", choices=["EdDSA", "ES256"], default="EdDSA",
                   help="algorithm of --signing-key (default: EdDSA)")
    p.add_argument("--force", action="store_true",
                   help="replace existing files (a new scope: new scope key and content key)")
    p.set_defaults(func=run_keygen)
    return p


def _load_existing(path: Path) -> Any:
    from ..kv.scopefile import ScopeFileError, load_scope_file

    try:
        scope = load_scope_file(path)
    except ScopeFileError as exc:
        raise UsageError(str(exc)) from None
    if path.read_bytes().lstrip()[:1] != b"{":
        raise UsageError(f"{path} is a plain scope key file; create a scope file from it "
                         f"with: kvcs keygen NEW_FILE --scope-key {path}")
    return scope


def _check_writable(paths: list[Path], force: bool) -> None:
    for p in paths:
        if p.exists() and not force:
            raise UsageError(f"{p} exists; use --force to replace it")
        if not p.parent.is_dir():
            raise UsageError(f"{p.parent} is not a directory")


def _write(path: Path, data: bytes, *, overwrite: bool) -> None:
    from ..kv.scopefile import write_secret_file

    try:
        write_secret_file(path, data, overwrite=overwrite)
    except FileExistsError:
        raise UsageError(f"{path} exists; use --force to replace it") from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def _new_scope(args: argparse.Namespace, suite: Any) -> Any:
    from ..kv.errors import DescriptorError
    from ..kv.ids import ScopeKey
    from ..kv.scopefile import ScopeFile

    scope_key = None
    if args.scope_key:
        try:
            scope_key = ScopeKey.from_file(args.scope_key)
        except (DescriptorError, ValueError, OSError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise UsageError(f"--scope-key {args.scope_key}: {reason}") from None
    return ScopeFile.new(scope_key, suite) if suite else ScopeFile.new(scope_key)


def _signing_key(args: argparse.Namespace, scope_path: Path) -> tuple[Any, Path, Path, Any]:
    """Generate the producer key; return it, its PEM and keyring paths and the scope
    file's reference to them (paths relative to the scope file)."""
    from ..kv.cose import ProducerKey
    from ..kv.scopefile import ProducerRef

    pem = Path(args.signing_key)
    keyring = pem.with_name(pem.stem + ".keyring.json")
    try:
        key = ProducerKey.generate(args.kid, args.alg)
    except ValueError as exc:
        raise UsageError(f"--kid: {exc}") from None
    base = scope_path.parent.resolve()
    ref = ProducerRef(args.kid, os.path.relpath(pem.resolve(), base),
                      os.path.relpath(keyring.resolve(), base))
    return key, pem, keyring, ref


def run_keygen(args: argparse.Namespace) -> int:
    """``kvcs keygen``: see the module docstring."""
    import json

    from ..kv.ids import scope_id
    from ..kv.secure import CipherSuite

    path = Path(args.scope_file)
    try:
        suite = CipherSuite.parse(args.suite) if args.suite else None
    except ValueError as exc:
        raise UsageError(f"--suite: {exc}") from None
    exists = path.exists()
    if args.rotate and not exists:
        raise UsageError(f"{path} does not exist; create it first (without --rotate)")
    if args.rotate and (args.scope_key or args.force):
        raise UsageError("--rotate keeps the scope; --scope-key and --force make a new one")
    if exists and not (args.rotate or args.force or args.signing_key):
        raise UsageError(f"{path} exists; --rotate adds a content key, --force replaces it "
                         "with a new scope")
    lines: list[str] = []
    if exists and not args.force:
        scope = _load_existing(path)
        if args.rotate:
            scope = scope.rotated(suite)
            key = scope.current_content_key()
            lines.append(f"{path}: added content key {key.key_id} ({key.suite.name}), now "
                         f"current; Key IDs {', '.join(str(k.key_id) for k in scope.content_keys)}")
    else:
        scope = _new_scope(args, suite)
        key = scope.current_content_key()
        lines.append(f"wrote {path}: scope id {scope_id(scope.scope_key).hex()}, content key "
                     f"{key.key_id} ({key.suite.name}, current)")
    if not args.signing_key and not args.no_signing_key and not (exists and not args.force):
        args.signing_key = str(path.with_name(path.stem + ".producer.pem"))
    signing = _signing_key(args, path) if args.signing_key else None
    if signing is not None:
        producer, pem, keyring, ref = signing
        _check_writable([pem, keyring], args.force)
        if scope.producer is not None and scope.producer.kid != args.kid:
            lines.append(f"{path}: replaces signing key {scope.producer.kid!r}")
        scope = scope.with_producer(ref)
        _write(pem, producer.private_pem(), overwrite=args.force)
        public = {"keys": [{"kid": args.kid, "alg": producer.alg,
                            "pem": producer.public_pem().decode("ascii")}]}
        _write(keyring, (json.dumps(public, indent=2) + "\n").encode(), overwrite=args.force)
        lines.append(f"wrote {pem} ({producer.alg} signing key {args.kid!r}) and {keyring} "
                     "(its public key, for kvcs fetch --keyring)")
        if exists and not (args.rotate or args.force):
            lines.append(f"{path}: names the signing key")
    _write(path, scope.to_json(), overwrite=exists)
    for line in lines:
        print(line)
    return 0
