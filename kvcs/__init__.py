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
* errors: :class:`KvcsError` (every KV-level error; :class:`VerificationError` for bytes
  that fail a check, :class:`PublicationError`), :class:`MoqtRequestError` (a refused
  request, with the draft's code), :class:`SessionClosedError`, :class:`ProtocolError` (a
  peer broke MOQT), :class:`ConfigError` (a bad setting or file).

Importing kvcs loads no QUIC library, torch or HTTP client; the subpackages (``kvcs.moqt``
sans-IO codec and session, ``kvcs.kv`` pure KV model, ``kvcs.transport``, ``kvcs.relay``,
``kvcs.kvnet``, ``kvcs.integrations.hf``) hold the rest. docs/architecture.md draws them.
"""

from importlib.metadata import PackageNotFoundError, version

from .endpoint import Endpoint, MoqtRequestError, SessionClosedError
from .errors import ConfigError
from .hosting import TrackHost
from .kv import CompatDescriptor, Keyring, KvcsError, ScopeKey, VerificationError
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

try:
    __version__ = version("kvcs")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

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
    "TrackHost",
    "VerificationError",
    "__version__",
]
