"""The ``kvcs`` command line: ``relay``, ``publish``, ``fetch``, ``inspect``,
``descriptor``, ``keygen`` and ``kvsp-serve``.

Each module registers its subcommands with :func:`~kvcs.cli.base.command`: a builder that
adds the subparser and sets ``func(args) -> int``. User mistakes exit with status 2 and one
line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from .base import COMMANDS, UsageError
from .relay import relay_config, start_kvsp_beside

_COMMAND_MODULES = ("keys", "descriptor", "publish", "fetch", "kvsp_serve", "inspect")
"""The modules of the subcommands, in help order (``relay`` comes first: imported above)."""

__all__ = ["UsageError", "build_parser", "main", "relay_config", "start_kvsp_beside"]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    from .. import __version__
    for name in _COMMAND_MODULES:  # importing a module registers its commands
        importlib.import_module(f"{__name__}.{name}")

    parser = argparse.ArgumentParser(prog="kvcs", description="Stream LLM KV caches over MOQT")
    parser.add_argument("--version", action="version", version=f"kvcs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for build in COMMANDS.values():
        build(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvcs`` script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "event_loop", None) or os.environ.get("KVCS_EVENT_LOOP"):
            from ..transport.eventloop import use_event_loop

            try:
                use_event_loop(getattr(args, "event_loop", None))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        return int(args.func(args) or 0)
    except UsageError as exc:
        return _fail(args, str(exc), 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (`kvcs ... | head`): say so once, and keep the
        # interpreter from printing a traceback while flushing stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _fail(args, "standard output closed before the command finished "
                           "(its reader exited); nothing more was written", 1)
    except Exception as exc:
        if not _network_error(exc):
            raise
        from .common import refused_hint

        hint = refused_hint(args, exc)
        if hint is not None:
            return _fail(args, hint, 2)
        return _fail(args, f"the relay session failed: {exc or type(exc).__name__}", 1)


def _fail(args: argparse.Namespace, message: str, status: int) -> int:
    """Print the one line of a failed command; its exit status."""
    with contextlib.suppress(OSError):  # stderr closed too: the status says it
        print(f"kvcs {args.command}: error: {message}", file=sys.stderr, flush=True)
    return status


def _network_error(exc: BaseException) -> bool:
    """A failure of the relay session or a request it refused (not a bug of ours)."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    if "kvcs.endpoint" not in sys.modules:  # not imported: no request was refused
        return False
    from ..endpoint import MoqtRequestError

    return isinstance(exc, MoqtRequestError)


if __name__ == "__main__":
    raise SystemExit(main())
