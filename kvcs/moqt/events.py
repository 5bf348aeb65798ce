"""Events the sans-IO MOQT session reports to its application.

The application (publisher, consumer, relay) drains :meth:`Session.next_event` after
feeding input and reacts by calling session methods (answering requests, sending objects).
Events are small frozen dataclasses; payloads are zero-copy views of received bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import wire
from .requests import RequestMessage


@dataclass(frozen=True, slots=True)
class SessionEstablished:
    """The peer's SETUP arrived; ``options`` are its Setup Options."""

    options: wire.SetupOptions


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """The session ended (by us, by the peer, or because the connection was lost)."""

    code: int
    reason: str
    by_peer: bool


@dataclass(frozen=True, slots=True)
class GoAwayReceived:
    """The peer asked us to migrate (control stream: whole session; else one request)."""

    new_session_uri: bytes
    timeout_ms: int
    request_id: int | None = None


# -- requests from the peer (we are the responder) ------------------------------------


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """The peer started a request; answer it with the matching session method.

    ``message`` is one of Subscribe, Fetch, TrackStatus, PublishNamespace,
    SubscribeNamespace, SubscribeTracks or Publish.
    """

    request_id: int
    message: RequestMessage


@dataclass(frozen=True, slots=True)
class UpdateReceived:
    """REQUEST_UPDATE ``update_id`` for the request ``request_id``; answer it once."""

    request_id: int
    update_id: int
    params: wire.Parameters


@dataclass(frozen=True, slots=True)
class RequestCancelled:
    """The peer cancelled request ``request_id`` (stream reset / STOP_SENDING) or ended it."""

    request_id: int
    code: int | None


# -- answers to our requests ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubscribeAccepted:
    """SUBSCRIBE_OK for our SUBSCRIBE ``request_id``."""

    request_id: int
    message: wire.SubscribeOk


@dataclass(frozen=True, slots=True)
class FetchAccepted:
    """FETCH_OK for our FETCH ``request_id``."""

    request_id: int
    message: wire.FetchOk


@dataclass(frozen=True, slots=True)
class RequestAccepted:
    """REQUEST_OK for our request (``update_id`` set when it answers a REQUEST_UPDATE)."""

    request_id: int
    message: wire.RequestOk
    update_id: int | None = None


@dataclass(frozen=True, slots=True)
class RequestRejected:
    """REQUEST_ERROR for our request (``update_id`` set when it answers a REQUEST_UPDATE)."""

    request_id: int
    message: wire.RequestError
    update_id: int | None = None


@dataclass(frozen=True, slots=True)
class PublishStateNotified:
    """PUBLISH_STATE_NOTIFY on subscription ``request_id``."""

    request_id: int
    message: wire.PublishStateNotify


@dataclass(frozen=True, slots=True)
class NamespaceAnnounced:
    """NAMESPACE on our SUBSCRIBE_NAMESPACE: ``namespace`` = prefix + suffix."""

    request_id: int
    namespace: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class NamespaceWithdrawn:
    """NAMESPACE_DONE on our SUBSCRIBE_NAMESPACE (or the stream ended)."""

    request_id: int
    namespace: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class PublishSkippedReceived:
    """PUBLISH_SKIPPED on our SUBSCRIBE_TRACKS."""

    request_id: int
    namespace: tuple[bytes, ...]
    name: bytes


@dataclass(frozen=True, slots=True)
class SubscriptionEnded:
    """PUBLISH_DONE arrived and all the streams it counted have ended, or the wait for
    them expired (:class:`StreamsOutstanding`)."""

    request_id: int
    message: wire.PublishDone
    streams_missing: int = 0
    """Streams PUBLISH_DONE counts that never came (the wait expired): what they carried
    is unknown, so the subscription cannot vouch for every object up to its end."""


@dataclass(frozen=True, slots=True)
class StreamsOutstanding:
    """PUBLISH_DONE arrived but ``missing`` of the streams it counts have not been seen:
    the subscription ends when they have, or when the binding calls
    :meth:`Session.stop_waiting_for_streams` after ``SessionConfig.publish_done_wait_s``
    (digest 4.11: a stream reset before its header can never be attributed)."""

    request_id: int
    missing: int


@dataclass(frozen=True, slots=True)
class RequestsWaiting:
    """``count`` new requests of the peer wait, undecoded, for the session's request rate
    (``SessionConfig.request_rate``): the binding calls :meth:`Session.resume_requests
    <kvcs.moqt.session.Session.resume_requests>` in ``delay`` seconds."""

    count: int
    delay: float


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """Our request's stream ended or was reset without the response the draft requires."""

    request_id: int
    code: int | None
    reason: str


# -- data -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectReceived:
    """One complete object for request ``request_id`` (subscription or fetch).

    ``fill_id`` is the Request ID in the FETCH_HEADER of a fill stream (the SUBSCRIBE's or a
    REQUEST_UPDATE's); None for subscription-delivered objects and plain fetch objects.
    """

    request_id: int
    record: wire.ObjectRecord
    stream_id: int
    fill_id: int | None = None

    @property
    def location(self) -> wire.Location:
        """The object's Location."""
        return wire.Location(self.record.group_id, self.record.object_id)


@dataclass(frozen=True, slots=True)
class RangeMarkerReceived:
    """An End of Range record on a fetch or fill stream."""

    request_id: int
    marker: wire.EndOfRange
    stream_id: int
    fill_id: int | None = None


@dataclass(frozen=True, slots=True)
class DataStreamEnded:
    """A data stream of ``request_id`` ended: ``reset_code`` None means a clean FIN."""

    request_id: int
    stream_id: int
    kind: str
    reset_code: int | None
    fill_id: int | None = None


@dataclass(frozen=True, slots=True)
class DataStreamWritable:
    """A data stream we send on has drained (asked for with ``Session.want_writable``)."""

    request_id: int
    stream_id: int


Event = (
    SessionEstablished
    | SessionClosed
    | GoAwayReceived
    | RequestReceived
    | UpdateReceived
    | RequestCancelled
    | SubscribeAccepted
    | FetchAccepted
    | RequestAccepted
    | RequestRejected
    | PublishStateNotified
    | NamespaceAnnounced
    | NamespaceWithdrawn
    | PublishSkippedReceived
    | SubscriptionEnded
    | StreamsOutstanding
    | RequestsWaiting
    | RequestFailed
    | ObjectReceived
    | RangeMarkerReceived
    | DataStreamEnded
    | DataStreamWritable
)
