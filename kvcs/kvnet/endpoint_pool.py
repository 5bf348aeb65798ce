"""The consumer's MOQT endpoints: the ones it was given, the ones it opened for relays a
KVSP Index names, and the successors of those whose session ended (``connect``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence

from ..endpoint import Endpoint

__all__ = ["EndpointPool", "within"]

log = logging.getLogger(__name__)


class EndpointPool:
    """Where a consumer's requests go. ``connect`` opens an endpoint to a relay URL (one an
    index names, or the relay of an endpoint whose session ended); the pool owns and
    :meth:`aclose` closes the endpoints it opened. ``timeout``: the longest a connection
    attempt may take (the consumer's recompute budget)."""

    def __init__(self, endpoints: Sequence[Endpoint],
                 connect: Callable[[str], Awaitable[Endpoint]] | None,
                 timeout: float) -> None:
        self.endpoints = list(endpoints)
        """The endpoints in use, the primary one first (a reopened one replaces its
        predecessor in place)."""
        self.connect = connect
        self.timeout = timeout
        self._opened: dict[str, Endpoint] = {}
        self._reopened: dict[Endpoint, Endpoint] = {}  # an ended endpoint -> its successor

    def current(self, ep: Endpoint) -> Endpoint:
        """``ep``, or its successor if it was reopened."""
        while ep in self._reopened:
            ep = self._reopened[ep]
        return ep

    async def open(self, ep: Endpoint) -> Endpoint:
        """``ep`` (or its successor) while its session is up; else its relay reopened
        through ``connect``; ConnectionError when neither is possible."""
        ep = self.current(ep)
        if not ep.is_closed:
            return ep
        new = await self.reopen(ep, self.timeout)
        if new is None:
            info = ep.conn.info
            where = info.authority if info is not None else "the relay"
            raise ConnectionError(f"the session to {where} has ended"
                                  + ("" if self.connect else " (no connect= to reopen it)"))
        return new

    async def endpoint_to_resume(self, current: Endpoint, attempt: int,
                                 timeout: float) -> Endpoint | None:
        """Where an interrupted retrieval goes on: the open endpoints in turn, starting
        with ``current`` (``attempt`` counts the turns); when none is open, ``current``'s
        relay reconnected through ``connect`` (None: nothing reachable now)."""
        current = self.current(current)
        others = [e for e in self.endpoints if e is not current and not e.is_closed]
        candidates = others if current.is_closed else [current, *others]
        if candidates:
            return candidates[attempt % len(candidates)]
        return await self.reopen(current, timeout)

    async def reopen(self, ep: Endpoint, timeout: float) -> Endpoint | None:
        """A new endpoint to the relay of ``ep``, whose session ended (``connect``; None
        without it or when the relay cannot be reached within ``timeout``)."""
        info = ep.conn.info
        if self.connect is None or info is None or timeout <= 0:
            return None
        scheme = "https" if ep.conn.is_webtransport else "moqt"
        url = f"{scheme}://{info.authority}{info.path or '/'}"
        try:
            new = await within(self.connect(url), timeout)
        except (ConnectionError, OSError, ValueError, TimeoutError) as exc:
            log.info("cannot reconnect to %s: %s", url, exc or "timeout")
            return None
        log.info("reconnected to %s", url)
        self._reopened[ep] = new
        self.endpoints = [new if e is ep else e for e in self.endpoints]
        old = self._opened.get(url)
        if old is not None and old is not ep and not old.is_closed:
            old.close()
        self._opened[url] = new
        return new

    async def endpoint_for(self, relay_url: str) -> Endpoint | None:
        """An endpoint connected to ``relay_url``: one of ``endpoints`` with that authority,
        one opened before, or a new one from ``connect`` (None without it)."""
        target = urllib.parse.urlsplit(relay_url)
        for ep in (*self.endpoints, *self._opened.values()):
            info = ep.conn.info
            if info is not None and info.authority == target.netloc and \
                    not ep.conn.is_webtransport:
                return ep
        if self.connect is None:
            log.info("the index names relay %s; no endpoint is connected to it (connect=)",
                     relay_url)
            return None
        try:
            ep = await within(self.connect(relay_url), self.timeout)
        except (ConnectionError, OSError, ValueError, TimeoutError) as exc:
            log.warning("cannot connect to %s named by the index: %s", relay_url, exc)
            return None
        self._opened[relay_url] = ep
        return ep

    async def aclose(self) -> None:
        """Close the endpoints this pool opened."""
        opened, self._opened = list(self._opened.values()), {}
        for ep in opened:
            ep.close()
        for ep in opened:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ep.wait_closed(), 2)


async def within(connecting: Awaitable[Endpoint], timeout: float) -> Endpoint:
    """``connecting`` if it ends within ``timeout`` s, else TimeoutError at once: a
    connection attempt still cleaning up after its cancellation (a CONNECTION_CLOSE to
    send, up to 1 s measured) ends in the background, and an endpoint it opened after all
    is closed."""
    task = asyncio.ensure_future(connecting)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_close_late_endpoint)
    _abandoned.add(task)
    raise TimeoutError


_abandoned: set[asyncio.Future[Endpoint]] = set()
"""Connection attempts given up on, until they have ended (a reference keeps them alive)."""


def _close_late_endpoint(task: asyncio.Future[Endpoint]) -> None:
    _abandoned.discard(task)
    if not task.cancelled() and task.exception() is None:
        task.result().close()
