"""KVCS over the network (asyncio): the publisher and consumer on top of an
:class:`~kvcs.endpoint.Endpoint`, and KVSP retrieval over HTTP (server and client).

The pure KV object model they use (ids, codecs, payloads, manifests, containers) is
:mod:`kvcs.kv`, which never imports asyncio or sockets.
"""

from .consumer import KvConsumer, KvLayer, RecomputeRequired
from .publisher import KvPublisher, PublicationError, PublisherOptions

__all__ = [
    "KvConsumer",
    "KvLayer",
    "KvPublisher",
    "PublicationError",
    "PublisherOptions",
    "RecomputeRequired",
]
