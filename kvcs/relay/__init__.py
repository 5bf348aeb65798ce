"""The kvcs caching MOQT draft-22 relay: routing, cache, fan-out, auth and metrics.

Run it with ``kvcs relay`` (see :mod:`kvcs.cli` and ``docs/relay.md``) or embed it::

    relay = Relay(RelayConfig(listen="127.0.0.1:0", anonymous=True))
    await relay.start()
    ...
    await relay.stop()
"""

from __future__ import annotations

from ..auth import AuthError, Authorizer, Grant, parse_namespace
from .config import ConfigError, ListenError, RelayConfig, load_config_file
from .metrics import Metrics
from .relay import Relay

__all__ = [
    "AuthError",
    "Authorizer",
    "ConfigError",
    "Grant",
    "ListenError",
    "Metrics",
    "Relay",
    "RelayConfig",
    "load_config_file",
    "parse_namespace",
]
