"""Former home of the asyncio binding, now split by concern: :mod:`.connection` (the
connection core), :mod:`.webtransport` (WebTransport sessions), :mod:`.server`
(:func:`serve`, :class:`Server`) and :mod:`.client` (:func:`connect`).

Kept so that ``from kvcs.transport.binding import Server`` goes on working; import from
:mod:`kvcs.transport` instead.
"""

from .client import connect
from .connection import MoqtConnection
from .interfaces import ConnectionInfo, SansIOSession, SessionFactory, SessionHandler
from .server import Server, serve

__all__ = ["ConnectionInfo", "MoqtConnection", "SansIOSession", "Server", "SessionFactory",
           "SessionHandler", "connect", "serve"]
