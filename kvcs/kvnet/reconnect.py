"""A publish target that outlives its sessions: reconnect to the relay, re-announce.

A :class:`~kvcs.kvnet.publisher.KvPublisher` on an :class:`~kvcs.endpoint.Endpoint` is
bound to one QUIC connection: when the relay restarts or the path fails for longer than
the QUIC idle timeout, the session ends and the publication is gone from the relay.
A :class:`ReconnectingTarget` keeps the publisher's tracks in its own
:class:`~kvcs.moqt.origin.Origin`, which every session it opens serves; when a session
ends it connects again (bounded exponential backoff with jitter, each attempt logged at
INFO) and publishes every namespace again (PUBLISH_NAMESPACE). The relay then pulls what
it lacks from the tracks, which still hold every object published, whenever a consumer
asks: the publication is whole again without any action of the prefill worker::

    target = await ReconnectingTarget.connect("moqt://relay:4443/", cafile=...)
    pub = KvPublisher(target, scope, descriptor, tokens)
    ...                                    # put_layer / finish as with an Endpoint
    await target.aclose()

While no session is up, :meth:`ReconnectingTarget.publish_run` only stores objects and
:meth:`ReconnectingTarget.drain` returns at once (the prefill worker is never held back by
a relay that is away); :meth:`ReconnectingTarget.hand_over` waits for a session, within its
timeout. A dead relay is noticed when the QUIC idle timeout
(:attr:`~kvcs.transport.QuicSettings.idle_timeout`) expires, or at once when the relay
closes the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from ..backoff import Backoff
from ..endpoint import Endpoint, HandOverError, MoqtRequestError, open_session
from ..moqt.origin import Origin
from ..moqt.wire import AuthToken, Parameters, TrackNamespace
from ..publishing import OriginPublisher
from ..transport import QuicSettings

__all__ = ["ReconnectingTarget"]

log = logging.getLogger(__name__)

RECONNECT_BACKOFF = Backoff(initial=0.2, maximum=5.0)
"""Default waits before each reconnection attempt: 0.1-0.2 s, then doubling up to 2.5-5 s
(a restarted relay is back within a second or two; a relay that stays away costs one
attempt every few seconds)."""


class ReconnectingTarget(OriginPublisher):
    """A :class:`~kvcs.kvnet.publisher.PublishTarget` (and ``HandOverTarget``) that keeps
    a session to the relay at ``url`` up; see the module docstring.

    ``settings``, ``cafile``, ``pin_sha256``, ``verify``, ``auth_tokens`` are those of
    :meth:`Endpoint.connect <kvcs.endpoint.Endpoint.connect>`; ``connect_timeout`` bounds
    each attempt; ``backoff`` the waits between attempts (``rng`` seeds their jitter).
    """

    def __init__(self, url: str, *, settings: QuicSettings | None = None,
                 cafile: str | None = None, pin_sha256: str | bytes | None = None,
                 verify: bool = True, auth_tokens: tuple[AuthToken, ...] = (),
                 backoff: Backoff = RECONNECT_BACKOFF, connect_timeout: float = 5.0,
                 rng: random.Random | None = None) -> None:
        self.url = url
        self.settings = settings
        self.cafile = cafile
        self.pin_sha256 = pin_sha256
        self.verify = verify
        self.auth_tokens = auth_tokens
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self.rng = rng
        self.origin: Origin[Endpoint] = Origin()
        """The tracks, served by every session this target opens."""
        self.endpoint: Endpoint | None = None
        """The current session, None while reconnecting."""
        self.sessions = 0
        """Sessions established (1 + reconnections)."""
        self.attempts = 0
        """Reconnection attempts made (successful or not)."""
        self._announced: dict[TrackNamespace, Parameters | None] = {}
        self._connected: asyncio.Event | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False

    @classmethod
    async def connect(cls, url: str, **options: object) -> ReconnectingTarget:
        """A target connected to ``url`` (ConnectionError if the first attempt fails);
        ``options`` are those of the constructor."""
        target = cls(url, **options)  # type: ignore[arg-type]
        await target.start()
        return target

    async def start(self) -> None:
        """Open the first session (ConnectionError, OSError or TimeoutError if it cannot
        be opened: a wrong address shows at once); later sessions open by themselves."""
        if self._supervisor is not None:
            return
        self._connected = asyncio.Event()
        self._use(await self._open())
        self._supervisor = asyncio.create_task(self._supervise())

    @property
    def connected(self) -> bool:
        """True while a session is up."""
        return self.endpoint is not None and not self.endpoint.is_closed

    async def wait_connected(self, timeout: float | None = None) -> Endpoint:
        """The current session, once there is one (TimeoutError after ``timeout``)."""
        if self._connected is None:
            raise RuntimeError("ReconnectingTarget not started")
        async with asyncio.timeout(timeout):
            while True:
                ep = self.endpoint
                if ep is not None and not ep.is_closed:
                    return ep
                self._connected.clear()
                await self._connected.wait()

    async def aclose(self) -> None:
        """Stop reconnecting and close the current session."""
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        ep, self.endpoint = self.endpoint, None
        if ep is not None:
            ep.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ep.wait_closed(), 2)

    async def __aenter__(self) -> ReconnectingTarget:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ sessions

    async def _open(self) -> Endpoint:
        return await open_session(
            self.url, lambda conn: Endpoint(conn, origin=self.origin,
                                            auth_tokens=self.auth_tokens),
            settings=self.settings, verify=self.verify, cafile=self.cafile,
            pin_sha256=self.pin_sha256, auth_tokens=self.auth_tokens,
            timeout=self.connect_timeout)

    def _use(self, ep: Endpoint) -> None:
        self.endpoint = ep
        self.sessions += 1
        assert self._connected is not None
        self._connected.set()

    async def _supervise(self) -> None:
        """Wait for the session to end; reconnect and re-announce; again."""
        while not self._closing:
            ep = self.endpoint
            assert ep is not None
            code, reason = await ep.wait_closed()
            if self._closing:
                return
            self.endpoint = None
            log.warning("session to %s ended (%#x %s): reconnecting", self.url, code, reason)
            await self._reconnect()

    async def _reconnect(self) -> None:
        self._use(await self.backoff.retry(
            self._open_and_announce, what=f"reconnecting to {self.url}", rng=self.rng,
            retry_on=(ConnectionError, OSError, TimeoutError, MoqtRequestError)))
        log.info("reconnected to %s (session %d), %d namespace(s) announced again",
                 self.url, self.sessions, len(self._announced))

    async def _open_and_announce(self, _attempt: int) -> Endpoint:
        """One reconnection attempt: a new session with every namespace announced."""
        self.attempts += 1
        ep = await self._open()
        try:
            await self._announce_all(ep)
        except BaseException:
            ep.close()
            raise
        return ep

    async def _announce_all(self, ep: Endpoint) -> None:
        """PUBLISH_NAMESPACE every namespace announced so far (also those announced while
        this runs)."""
        while pending := [ns for ns in self._announced if ns not in ep.announced]:
            ns = pending[0]
            await asyncio.wait_for(ep.announce(ns, self._announced[ns]), self.connect_timeout)

    # ------------------------------------------------------------------ PublishTarget

    # create_track, publish, publish_run: OriginPublisher (the tracks are kept across
    # sessions; the current session's subscribers get new objects at once, those of
    # later sessions when they ask)

    async def announce(self, namespace: TrackNamespace, params: Parameters | None = None) -> None:
        """PUBLISH_NAMESPACE now (if a session is up) and on every later session; a
        refusal by the relay raises MoqtRequestError and the namespace is forgotten."""
        ns = tuple(namespace)
        self._announced[ns] = params
        ep = self.endpoint
        if ep is None or ep.is_closed:
            return  # the next session announces it
        try:
            await ep.announce(ns, params)
        except MoqtRequestError:
            self._announced.pop(ns, None)
            raise
        except ConnectionError:
            pass  # the session ended meanwhile: the next one announces it

    def withdraw(self, namespace: TrackNamespace) -> None:
        """Stop publishing a namespace (now and on later sessions)."""
        ns = tuple(namespace)
        self._announced.pop(ns, None)
        ep = self.endpoint
        if ep is not None and not ep.is_closed:
            ep.withdraw(ns)

    def forget(self, namespace: TrackNamespace) -> int:
        """Withdraw ``namespace`` and drop every track under it, so that a long-lived
        target publishing one cache after another holds only the current ones (do it once
        the relay holds the publication: ``PublisherOptions(hand_over_s=...)``). Returns
        the number of tracks dropped."""
        self.withdraw(namespace)
        return self.forget_tracks(namespace)

    async def drain(self, limit: int = 4 << 20) -> None:
        """Back-pressure on the current session; returns at once while there is none
        (or when it ends meanwhile)."""
        ep = self.endpoint
        if ep is None or ep.is_closed:
            return
        with contextlib.suppress(ConnectionError):
            await ep.drain(limit)

    async def hand_over(self, namespace: TrackNamespace, timeout: float | None = 60.0, *,
                        live: bool = False) -> None:
        """:meth:`Endpoint.hand_over <kvcs.endpoint.Endpoint.hand_over>` on the current
        session, waiting for one and starting again on the next when the session ends
        meanwhile; HandOverError after ``timeout`` seconds in all (None: no limit)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout

        def left() -> float | None:
            return None if deadline is None else max(deadline - loop.time(), 0.0)

        while True:
            try:
                ep = await self.wait_connected(left())
            except TimeoutError:
                raise HandOverError(f"no session to {self.url} within {timeout:g} s") from None
            try:
                await ep.hand_over(namespace, left(), live=live)
                return
            except HandOverError:
                if not ep.is_closed or (deadline is not None and loop.time() >= deadline):
                    raise
                log.info("session ended during the hand-over: again on the next one")
