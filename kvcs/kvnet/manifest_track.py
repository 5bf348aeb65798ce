"""A consumer's subscription to a publication's manifest track (kvcs-draft "Retrieval
during Production").

The consumer subscribes first to ``manifest.cose`` and, only when the publisher reports
that this track does not exist (REQUEST_ERROR DOES_NOT_EXIST) and producer authenticity is
not required, to ``manifest``; any other refusal is an error, never a downgrade. A
transient refusal (INTERNAL_ERROR, TIMEOUT, GOING_AWAY, EXCESSIVE_LOAD: e.g. a relay whose
publisher session is just closing) is no answer: the subscription is tried again, after
the refusal's retry interval or a backoff from 50 ms to 1 s, until the caller's deadline.
The
subscription uses a LOCATION_FILTER Next Object with a FILL_PARAMETERS LOCATION_FILTER
Relative Start 1: the current version arrives on the fill, later versions (segments
added, completion, object digests) on the subscription.

With the scope's content keys (``secure``) every version must decrypt as a MOQT Secure
Object (:func:`~kvcs.kv.secure.open_object`), and without them a protected version is
refused, so a relay cannot hand a protected publication's consumer a plaintext manifest.
Verifying the (decrypted) bytes of a version, signature and ``protection`` member
included, is the caller's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..backoff import Backoff
from ..endpoint import Endpoint, MoqtRequestError, Subscription
from ..kv.errors import SignatureError
from ..kv.secure import SecureObjects, effective_priority, open_object
from ..kv.tracks import TrackName
from ..moqt.errors import RequestErrorCode
from ..moqt.wire import LocationFilter, ObjectStatus, Parameters, TrackNamespace

__all__ = ["ManifestTrack"]

log = logging.getLogger(__name__)

SIGNED = TrackName.manifest(cose=True).to_bytes()
UNSIGNED = TrackName.manifest(cose=False).to_bytes()
#: Refusals that say nothing about the track: asked again until the deadline.
TRANSIENT = frozenset({RequestErrorCode.INTERNAL_ERROR, RequestErrorCode.TIMEOUT,
                       RequestErrorCode.GOING_AWAY, RequestErrorCode.EXCESSIVE_LOAD})
#: Waits between two subscriptions refused for now (no Retry Interval given).
REFUSED_BACKOFF = Backoff(initial=0.05, maximum=1.0, jitter=0.0)


class ManifestTrack:
    """The versions of one publication's manifest, newest last. Open with :meth:`open`."""

    def __init__(self, subscription: Subscription, name: bytes, namespace: TrackNamespace,
                 secure: SecureObjects | None = None) -> None:
        self.subscription = subscription
        self.name = name
        """``manifest.cose`` or ``manifest``."""
        self.namespace = tuple(namespace)
        self.secure = secure
        """The content keys every version is decrypted with (None: versions in the clear)."""
        self.version = -1
        """Group ID of the newest version returned (-1: none yet)."""

    @property
    def signed(self) -> bool:
        """True for ``manifest.cose``."""
        return self.name == SIGNED

    @property
    def protected(self) -> bool:
        """True when every version returned was a Secure Object that decrypted."""
        return self.secure is not None

    @classmethod
    async def open(cls, endpoint: Endpoint, namespace: TrackNamespace, *,
                   require_signed: bool, retry_until: float | None = None,
                   secure: SecureObjects | None = None) -> ManifestTrack:
        """Subscribe to the manifest track of ``namespace`` (see the module docstring);
        transient refusals are retried until ``retry_until`` (event-loop time; None: no
        retry and no time limit). ``secure``: the content keys of a protected publication.

        Raises MoqtRequestError for a refusal (also for a transient one still standing at
        ``retry_until``), TimeoutError when no answer came by ``retry_until``, and
        SignatureError when authenticity is required and the publication has no
        ``manifest.cose``."""
        try:
            sub = await cls._subscribe(endpoint, namespace, SIGNED, retry_until)
            return cls(sub, SIGNED, namespace, secure)
        except MoqtRequestError as exc:
            if exc.code != RequestErrorCode.DOES_NOT_EXIST:
                raise
            if require_signed:
                raise SignatureError("the publication has no signed manifest "
                                     "(manifest.cose does not exist)") from None
        sub = await cls._subscribe(endpoint, namespace, UNSIGNED, retry_until)
        return cls(sub, UNSIGNED, namespace, secure)

    @staticmethod
    async def _subscribe(endpoint: Endpoint, namespace: TrackNamespace, name: bytes,
                         retry_until: float | None) -> Subscription:
        loop = asyncio.get_running_loop()
        delays = REFUSED_BACKOFF.delays()
        refused: MoqtRequestError | None = None
        while True:
            try:
                # each attempt ends at retry_until: a refusal asked again answers with
                # that refusal when the time is up, whenever the last answer is due
                async with asyncio.timeout_at(retry_until):
                    return await endpoint.subscribe(
                        namespace, name, location_filter=LocationFilter.next_object(),
                        fill=Parameters(location_filter=LocationFilter.relative_start(1)),
                        priority=0)
            except TimeoutError:
                if refused is not None:
                    raise refused from None
                raise
            except MoqtRequestError as exc:
                delay = next(delays)
                wait = exc.retry_interval / 1000 if exc.retry_interval else delay
                if exc.code not in TRANSIENT or retry_until is None or \
                        loop.time() + wait >= retry_until:
                    raise
                refused = exc
                log.info("%s refused for now (%s): asking again in %.2f s",
                         name.decode(), exc, wait)
                await asyncio.sleep(wait)

    async def next_version(self) -> bytes | None:
        """The payload of the next version newer than the last one returned (versions the
        fill delivers after a newer live one are skipped), decrypted when protected; None
        when the track ended. A version that does not open (tampered, plaintext to a
        consumer with keys, protected to one without) raises SecureObjectError; the next
        call goes on with newer versions."""
        async for obj in self.subscription:
            if obj.status != ObjectStatus.NORMAL or obj.group_id <= self.version:
                continue
            self.version = obj.group_id
            return bytes(open_object(
                self.secure, self.namespace, self.name, obj.group_id, obj.object_id,
                obj.payload, properties=obj.properties, publisher_priority=effective_priority(
                    obj.publisher_priority, self.subscription.track_properties)))
        return None

    async def close(self) -> None:
        """Cancel the subscription (if it is still open)."""
        if not self.subscription.finished:
            with contextlib.suppress(ConnectionError, KeyError, ValueError):
                await self.subscription.cancel()
