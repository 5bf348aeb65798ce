"""kvcs: stream the KV caches of language models over MOQT (draft-ietf-moq-transport-22).

The public API::

    from kvcs import Endpoint, KvPublisher, KvConsumer, CompatDescriptor, ScopeKey

* networking: :class:`Endpoint` (one MOQT session), :class:`TrackHost` (serve tracks to
  every session of a server), :class:`Relay` and :class:`RelayConfig` (the caching relay),
  :class:`QuicSettings` (datagram sizes, QUIC library, keep-alive);
* KV caches: :class:`KvPublisher` and :class:`PublisherOptions` (a prefill worker),
  :class:`KvConsumer` (a decode worker) and :class:`RecomputeRequired` (what it could not
  get in time), :class:`ReconnectingTarget` (a publish target that reconnects by itself);
  identity: :class:`CompatDescriptor`, :class:`ScopeKey`, :class:`Keyring`;
* errors: :class:`KvcsError` is the root of every kvcs error; the families to catch are
  :class:`ConfigError` (a bad setting or file), :class:`VerificationError` (bytes that fail
  a check), :class:`ProtocolError` (a peer broke MOQT) and :class:`SessionError` (a session
  or request failed: :class:`MoqtRequestError` with the draft's code,
  :class:`SessionClosedError`); also :class:`PublicationError`, :class:`RecomputeRequired`.

Importing kvcs loads each name's module when the name is first used, and no QUIC library,
torch, ml_dtypes or HTTP client until they are needed; the subpackages (``kvcs.moqt``
sans-IO codec and session, ``kvcs.kv`` pure KV model, ``kvcs.transport``, ``kvcs.relay``,
``kvcs.kvnet``, ``kvcs.integrations.hf``) hold the rest. docs/architecture.md draws them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .endpoint import Endpoint, MoqtRequestError, SessionClosedError
    from .errors import ConfigError, KvcsError, SessionError
    from .hosting import TrackHost
    from .kv import CompatDescriptor, Keyring, ScopeKey, VerificationError
    from .kvnet import (
        KvConsumer,
        KvPublisher,
        PublicationError,
        PublisherOptions,
        RecomputeRequired,
        ReconnectingTarget,
    )
    from .moqt.errors import ProtocolError
    from .relay import Relay, RelayConfig
    from .transport import QuicSettings

# Each name is imported from its module when first used (PEP 562): `import kvcs` alone loads
# nothing else, so `kvcs --help` or a process using one layer does not pay for numpy, asyncio
# and every layer (~0.3 s of CPU on the 2-core machine) before it needs them.
_HOMES = {
    "Endpoint": ".endpoint", "MoqtRequestError": ".endpoint", "SessionClosedError": ".endpoint",
    "ConfigError": ".errors", "KvcsError": ".errors", "SessionError": ".errors",
    "TrackHost": ".hosting",
    "CompatDescriptor": ".kv", "Keyring": ".kv", "ScopeKey": ".kv",
    "VerificationError": ".kv",
    "KvConsumer": ".kvnet", "KvPublisher": ".kvnet", "PublicationError": ".kvnet",
    "PublisherOptions": ".kvnet", "RecomputeRequired": ".kvnet", "ReconnectingTarget": ".kvnet",
    "ProtocolError": ".moqt.errors",
    "Relay": ".relay", "RelayConfig": ".relay",
    "QuicSettings": ".transport",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home, __name__), name)
        globals()[name] = value  # the next lookup is a plain module attribute
        return value
    if name == "__version__":  # importlib.metadata is ~18 ms: read the version when asked
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("kvcs")
        except PackageNotFoundError:  # running from a source tree that is not installed
            return "0+unknown"
    raise AttributeError(f"module 'kvcs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CompatDescriptor",
    "ConfigError",
    "Endpoint",
    "Keyring",
    "KvConsumer",
    "KvPublisher",
    "KvcsError",
    "MoqtRequestError",
    "ProtocolError",
    "PublicationError",
    "PublisherOptions",
    "QuicSettings",
    "RecomputeRequired",
    "ReconnectingTarget",
    "Relay",
    "RelayConfig",
    "ScopeKey",
    "SessionClosedError",
    "SessionError",
    "TrackHost",
    "VerificationError",
    "__version__",
]
