"""KVCS over the network (asyncio): the publisher and consumer on top of an
:class:`~kvcs.endpoint.Endpoint` (or, for a publisher that outlives its sessions, a
:class:`~kvcs.kvnet.reconnect.ReconnectingTarget`), and KVSP retrieval over HTTP (server
and client).

The pure KV object model they use (ids, codecs, payloads, manifests, containers) is
:mod:`kvcs.kv`, which never imports asyncio or sockets.
"""

from ..backoff import Backoff
from .consumer import KvConsumer, KvLayer, RecomputeRequired
from .publisher import KvPublisher, PublicationError, PublisherOptions
from .reconnect import ReconnectingTarget

__all__ = [
    "Backoff",
    "KvConsumer",
    "KvLayer",
    "KvPublisher",
    "PublicationError",
    "PublisherOptions",
    "RecomputeRequired",
    "ReconnectingTarget",
]
