"""The kvcs caching MOQT draft-22 relay: routing, cache, fan-out, auth and metrics.

Run it with ``kvcs relay`` (see :mod:`kvcs.cli` and ``docs/relay.md``) or embed it::

    relay = Relay(RelayConfig(listen="127.0.0.1:0", anonymous=True))
    await relay.start()
    ...
    await relay.stop()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..auth import AuthError, Authorizer, Grant, parse_namespace
from .cache import Cache
from .config import ConfigError, ListenError, RelayConfig, load_config_file
from .metrics import Metrics

if TYPE_CHECKING:
    from .relay import Relay


def __getattr__(name: str) -> Any:
    # Relay imports kvcs.transport, which binds the QUIC library: import it on first use,
    # so that ``kvcs relay`` can read its configuration and choose the library first.
    if name == "Relay":
        from .relay import Relay

        return Relay
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "AuthError",
    "Authorizer",
    "Cache",
    "ConfigError",
    "Grant",
    "ListenError",
    "Metrics",
    "Relay",
    "RelayConfig",
    "load_config_file",
    "parse_namespace",
]
