"""A consumer's subscription to a publication's manifest track (kvcs-draft "Retrieval
during Production").

The consumer subscribes first to ``manifest.cose`` and, only when the publisher reports
that this track does not exist (REQUEST_ERROR DOES_NOT_EXIST) and producer authenticity is
not required, to ``manifest``; any other refusal is an error, never a downgrade. The
subscription uses a LOCATION_FILTER Next Object with a FILL_PARAMETERS LOCATION_FILTER
Relative Start 1: the current version arrives on the fill, later versions (segments
added, completion, object digests) on the subscription. Verifying the bytes of a version
is the caller's job.
"""

from __future__ import annotations

import contextlib
import logging

from ..endpoint import Endpoint, MoqtRequestError, Subscription
from ..kv.errors import SignatureError
from ..kv.tracks import TrackName
from ..moqt.errors import RequestErrorCode
from ..moqt.wire import LocationFilter, ObjectStatus, Parameters, TrackNamespace

__all__ = ["ManifestTrack"]

log = logging.getLogger(__name__)

SIGNED = TrackName.manifest(cose=True).to_bytes()
UNSIGNED = TrackName.manifest(cose=False).to_bytes()


class ManifestTrack:
    """The versions of one publication's manifest, newest last. Open with :meth:`open`."""

    def __init__(self, subscription: Subscription, name: bytes) -> None:
        self.subscription = subscription
        self.name = name
        """``manifest.cose`` or ``manifest``."""
        self.version = -1
        """Group ID of the newest version returned (-1: none yet)."""

    @property
    def signed(self) -> bool:
        """True for ``manifest.cose``."""
        return self.name == SIGNED

    @classmethod
    async def open(cls, endpoint: Endpoint, namespace: TrackNamespace, *,
                   require_signed: bool) -> ManifestTrack:
        """Subscribe to the manifest track of ``namespace`` (see the module docstring).

        Raises MoqtRequestError for a refusal, and SignatureError when authenticity is
        required and the publication has no ``manifest.cose``."""
        try:
            return cls(await cls._subscribe(endpoint, namespace, SIGNED), SIGNED)
        except MoqtRequestError as exc:
            if exc.code != RequestErrorCode.DOES_NOT_EXIST:
                raise
            if require_signed:
                raise SignatureError("the publication has no signed manifest "
                                     "(manifest.cose does not exist)") from None
        return cls(await cls._subscribe(endpoint, namespace, UNSIGNED), UNSIGNED)

    @staticmethod
    async def _subscribe(endpoint: Endpoint, namespace: TrackNamespace,
                         name: bytes) -> Subscription:
        return await endpoint.subscribe(
            namespace, name, location_filter=LocationFilter.next_object(),
            fill=Parameters(location_filter=LocationFilter.relative_start(1)), priority=0)

    async def next_version(self) -> bytes | None:
        """The payload of the next version newer than the last one returned (versions the
        fill delivers after a newer live one are skipped); None when the track ended."""
        async for obj in self.subscription:
            if obj.status != ObjectStatus.NORMAL or obj.group_id <= self.version:
                continue
            self.version = obj.group_id
            return bytes(obj.payload)
        return None

    async def close(self) -> None:
        """Cancel the subscription (if it is still open)."""
        if not self.subscription.finished:
            with contextlib.suppress(ConnectionError, KeyError, ValueError):
                await self.subscription.cancel()
