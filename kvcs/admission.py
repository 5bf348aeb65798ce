"""Admission of a peer's requests: authorization tokens and per-session limits.

What the relay and a publisher that serves consumers directly
(:class:`~kvcs.hosting.TrackHost`) check before they answer a request, in one place:

* the tokens: AUTHORIZATION_TOKEN values in SETUP and in the request, USE_VALUE only (we
  advertise MAX_AUTH_TOKEN_CACHE_SIZE 0: REGISTER in SETUP counts as USE_VALUE; REGISTER
  in a request closes the session with AUTH_TOKEN_CACHE_OVERFLOW, USE_ALIAS/DELETE with
  UNKNOWN_AUTH_TOKEN_ALIAS),
* the open requests of the session (REQUEST_ERROR EXCESSIVE_LOAD with a Retry Interval),
* the right the request needs on its namespace (:class:`~kvcs.auth.Authorizer`: publish
  for PUBLISH_NAMESPACE and PUBLISH, subscribe for the others; UNAUTHORIZED),
* the concurrent FETCHes of the session (EXCESSIVE_LOAD with a Retry Interval),

and *when* they answer it: :class:`RequestPacer` hands the requests of all sessions to
their handlers at a bounded rate, round robin over the sessions that have some waiting.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from .auth import PUBLISH, SUBSCRIBE, Authorizer
from .moqt.errors import RequestErrorCode, SessionCode
from .moqt.ratelimit import TokenBucket
from .moqt.wire import (
    Fetch,
    Parameters,
    Publish,
    PublishNamespace,
    SetupOptions,
    Subscribe,
    SubscribeNamespace,
    SubscribeTracks,
    TrackStatus,
)

Request = (Subscribe | Fetch | TrackStatus | PublishNamespace | SubscribeNamespace
           | SubscribeTracks | Publish)
"""The messages that start a request (:class:`~kvcs.moqt.events.RequestReceived`)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-session limits on a peer's requests."""

    max_requests: int = 1024
    """Open requests (subscriptions, fetches, namespace requests) per session."""
    max_fetches: int = 16
    """Concurrent FETCHes per session."""
    retry_ms: int = 1000
    """Retry Interval sent with EXCESSIVE_LOAD."""
    request_rate: float = 1000.0
    """Requests per second handled over all sessions of the server (relay or TrackHost);
    :class:`RequestPacer` (0: no pacing)."""
    request_burst: int = 256
    """Requests handled at once before the rate applies."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is not admitted: a REQUEST_ERROR ``code`` (with ``retry_ms``), or, if
    ``close_session``, a session error ``code``."""

    code: int
    reason: str
    retry_ms: int = 0
    close_session: bool = False


class Admission:
    """Checks a peer's requests against an :class:`Authorizer` and :class:`Limits`."""

    def __init__(self, authorizer: Authorizer, limits: Limits | None = None) -> None:
        self.authorizer = authorizer
        self.limits = limits or Limits()
        lim = self.limits
        self.pacer = (RequestPacer(lim.request_rate, lim.request_burst)
                      if lim.request_rate > 0 else None)
        """Paces the requests of every session admitted here (None: no pacing)."""

    @staticmethod
    def tokens(setup: SetupOptions | None, params: Parameters) -> list[bytes] | Refusal:
        """Token values of a request and of the peer's SETUP, or the session error that
        an unsupported token alias calls for."""
        out: list[bytes] = []
        for tok in setup.auth_tokens if setup else ():
            if tok.alias_type in (1, 3) and tok.value is not None:
                out.append(bytes(tok.value))  # REGISTER over our cache size 0 = USE_VALUE
        for tok in params.auth_tokens:
            if tok.alias_type == 3 and tok.value is not None:
                out.append(bytes(tok.value))
            elif tok.alias_type == 1:  # MAX_AUTH_TOKEN_CACHE_SIZE 0
                return Refusal(SessionCode.AUTH_TOKEN_CACHE_OVERFLOW,
                               "authorization token alias not supported", close_session=True)
            else:
                return Refusal(SessionCode.UNKNOWN_AUTH_TOKEN_ALIAS,
                               "authorization token alias not supported", close_session=True)
        return out

    def check(self, setup: SetupOptions | None, message: Request, open_requests: int,
              open_fetches: int) -> Refusal | None:
        """None if ``message`` (a request of a peer whose SETUP was ``setup`` and that has
        ``open_requests`` requests and ``open_fetches`` FETCHes open already) may be
        served, else why not."""
        tokens = self.tokens(setup, message.params)
        if isinstance(tokens, Refusal):
            return tokens
        lim = self.limits
        if open_requests >= lim.max_requests:
            return Refusal(RequestErrorCode.EXCESSIVE_LOAD, "too many open requests",
                           lim.retry_ms)
        if isinstance(message, PublishNamespace | Publish):
            right, what, namespace = PUBLISH, "to publish this namespace", message.namespace
        elif isinstance(message, SubscribeNamespace | SubscribeTracks):
            right, what = SUBSCRIBE, "for this namespace prefix"
            namespace = message.namespace_prefix
        else:
            right, what, namespace = SUBSCRIBE, "for this namespace", message.namespace
        if not self.authorizer.allowed(tokens, right, tuple(namespace)):
            return Refusal(RequestErrorCode.UNAUTHORIZED, f"not authorized {what}")
        if isinstance(message, Fetch) and open_fetches >= lim.max_fetches:
            return Refusal(RequestErrorCode.EXCESSIVE_LOAD, "too many concurrent fetches",
                           lim.retry_ms)
        return None


class RequestPacer:
    """Fair, bounded handling of the peers' requests of one server (stream-credit pacing).

    Requests are handled at once while a token bucket (``rate`` per second, ``burst``
    deep) has tokens. Past that, each session's requests wait, in order, in a queue of its
    own, and each token goes to the waiting session that has had the fewest requests
    handled in the current second (ties: the one waiting longest): a session that floods
    the server waits behind its own requests, while one that asks now and then is served
    next. A waiting request is not answered, so its stream stays open: the QUIC stream
    limit (100 bidirectional streams on qh3, ``max_streams_bidi`` on aioquic) then stops a
    flooder from sending more, and the cost of parsing, routing and answering requests
    (~0.25 ms each in a kvcs relay, QUIC included: 3,000 refusals a second took three
    quarters of its event loop) stays within ``rate``. What waits is bounded by those
    stream limits, per session.

    :meth:`submit` takes a zero-argument ``handle`` per request; the pacer calls it when the
    request's turn comes (from the event loop: ``asyncio.get_running_loop().call_later``).
    """

    WINDOW = 1.0
    """Seconds over which the requests handled per session are counted."""
    TICK = 0.01
    """Seconds between two turns at least: the answers of a turn leave together (a UDP
    send costs ~130 us in the development VM, more than handling a refusal)."""
    TURN_LIMIT = 32
    """Requests handled at most per turn, so that a burst of tokens does not hold the
    event loop (~0.25 ms each): the rest waits for the next tick."""
    QUANTUM = 4
    """Requests of one session handled per turn when it has that many waiting (their
    answers share datagrams)."""

    def __init__(self, rate: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._bucket = TokenBucket(rate, burst, clock)
        self._clock = clock
        self._queues: dict[Hashable, deque[tuple[int, Callable[[], None]]]] = {}
        self._turns: list[tuple[int, int, Hashable]] = []  # (handled, since, session)
        self._handled: dict[Hashable, int] = {}  # requests handled in the window
        self._window_end = clock() + self.WINDOW
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self.delayed = 0
        """Requests that had to wait their turn so far."""

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return sum(len(q) for q in self._queues.values())

    def waiting_for(self, session: Hashable) -> int:
        """Requests of ``session`` waiting for their turn."""
        queue = self._queues.get(session)
        return len(queue) if queue else 0

    def submit(self, session: Hashable, request_id: int, handle: Callable[[], None]) -> None:
        """Handle request ``request_id`` of ``session`` now if the rate allows and nothing
        waits, else when its turn comes."""
        now = self._clock()
        if not self._queues and self._bucket.take(now):
            self._count(session, now)
            handle()
            return
        queue = self._queues.get(session)
        if queue is None:
            queue = self._queues[session] = deque()
            self._enter(session)
        queue.append((request_id, handle))
        self.delayed += 1
        self._arm()

    def withdraw(self, session: Hashable, request_id: int) -> bool:
        """Forget a waiting request (its peer cancelled it); False if it is not waiting."""
        queue = self._queues.get(session)
        if not queue:
            return False
        for i, (rid, _) in enumerate(queue):
            if rid == request_id:
                del queue[i]
                if not queue:
                    self._leave(session)
                return True
        return False

    def forget(self, session: Hashable) -> None:
        """Drop what ``session`` has waiting and its count (it ended)."""
        self._handled.pop(session, None)
        self._leave(session)

    def _leave(self, session: Hashable) -> None:
        if self._queues.pop(session, None) is not None:
            self._turns = [t for t in self._turns if t[2] != session]
            heapq.heapify(self._turns)

    def due(self, now: float) -> list[Callable[[], None]]:
        """Take the waiting requests whose turn has come by ``now`` (one token each, the
        least served session first); the caller calls them in order."""
        out: list[Callable[[], None]] = []
        take = self._bucket.take
        while self._turns and len(out) < self.TURN_LIMIT and take(now):
            self._roll(now)
            _, since, session = heapq.heappop(self._turns)
            queue = self._queues[session]
            for n in range(self.QUANTUM):
                if n and not (queue and take(now)):
                    break
                out.append(queue.popleft()[1])
                self._count(session, now)
            if queue:
                heapq.heappush(self._turns, (self._handled[session], since, session))
            else:
                del self._queues[session]
        return out

    def next_due(self, now: float) -> float | None:
        """When the next waiting request's turn comes (None: nothing waits)."""
        if not self._turns:
            return None
        return now + self._bucket.wait(now)

    def _enter(self, session: Hashable) -> None:
        self._seq += 1
        heapq.heappush(self._turns, (self._handled.get(session, 0), self._seq, session))

    def _count(self, session: Hashable, now: float) -> None:
        self._roll(now)
        self._handled[session] = self._handled.get(session, 0) + 1

    def _roll(self, now: float) -> None:
        """A new window: every session starts from zero again (turns keep their order)."""
        if now < self._window_end:
            return
        self._window_end = now + self.WINDOW
        self._handled.clear()
        self._turns = [(0, since, session) for _, since, session in self._turns]
        heapq.heapify(self._turns)

    def _arm(self) -> None:
        if self._timer is not None:
            return
        now = self._clock()
        at = self.next_due(now)
        if at is not None:
            self._timer = asyncio.get_running_loop().call_later(
                max(at - now, self.TICK), self._run)

    def _run(self) -> None:
        self._timer = None
        for handle in self.due(self._clock()):
            handle()
        self._arm()

    def close(self) -> None:
        """Stop: nothing waiting is handled any more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queues.clear()
        self._turns.clear()
        self._handled.clear()


__all__ = ["Admission", "Limits", "Refusal", "Request", "RequestPacer"]
