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
* the concurrent FETCHes of the session (EXCESSIVE_LOAD with a Retry Interval).
"""

from __future__ import annotations

from dataclasses import dataclass

from .auth import PUBLISH, SUBSCRIBE, Authorizer
from .moqt.errors import RequestErrorCode, SessionCode
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


__all__ = ["Admission", "Limits", "Refusal", "Request"]
