"""The lifecycle of one MOQT request, as an explicit state machine (digest 4.2, 4.5, 8.1-8.4).

Every request lives on its own bidirectional stream. Each of its two sides, the
*requester* (who sent the request-starting message) and the *responder*, has a
:class:`RequestState` that only the messages it sends change. :data:`TRANSITIONS` is the
one table of what each side may send in each of its states, per :class:`RequestKind`, and
which state follows. The same table judges both directions, like h11's ``_state.py``:

* a message the peer sends and the table refuses is a PROTOCOL_VIOLATION
  (:meth:`Request.received`);
* a message the application asks us to send and the table refuses is a
  :class:`~kvcs.moqt.errors.SessionUsageError` (:meth:`Request.sending`).

Because each side has its own state, messages that cross on the wire stay legal: a
REQUEST_UPDATE that the subscriber sent before it saw PUBLISH_DONE is still allowed (the
requester's state allows it); the session then drops it, since nobody will answer it.

How a side ends its half of the stream without its final message is
:meth:`Request.end_of_stream`'s business (digest 8.2).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Final

from .config import ITEM_COST, MESSAGE_COST
from .errors import SessionUsageError, violation
from .wire import (
    ControlStreamParser,
    Fetch,
    FetchOk,
    GoAway,
    Message,
    NamespaceDone,
    NamespaceMsg,
    Parameters,
    Properties,
    Publish,
    PublishDone,
    PublishNamespace,
    PublishSkipped,
    PublishStateNotify,
    RequestError,
    RequestOk,
    RequestUpdate,
    Subscribe,
    SubscribeNamespace,
    SubscribeOk,
    SubscribeTracks,
    TrackNamespace,
    TrackStatus,
)

RequestMessage = (
    Subscribe | Publish | Fetch | TrackStatus | PublishNamespace | SubscribeNamespace
    | SubscribeTracks
)
"""The seven request-starting messages."""


class RequestKind(IntEnum):
    """What a request stream carries, named (and numbered) after its first message."""

    SUBSCRIBE = Subscribe.TYPE
    PUBLISH = Publish.TYPE
    FETCH = Fetch.TYPE
    TRACK_STATUS = TrackStatus.TYPE
    PUBLISH_NAMESPACE = PublishNamespace.TYPE
    SUBSCRIBE_NAMESPACE = SubscribeNamespace.TYPE
    SUBSCRIBE_TRACKS = SubscribeTracks.TYPE


class Side(Enum):
    """The two ends of a request."""

    REQUESTER = "requester"
    RESPONDER = "responder"

    @property
    def other(self) -> Side:
        """The opposite side."""
        return Side.RESPONDER if self is Side.REQUESTER else Side.REQUESTER


class RequestState(Enum):
    """What one side of a request has sent so far."""

    REQUESTED = "requested"
    """Requester: the request went out; it may update it (and, for PUBLISH, publish)."""
    UNANSWERED = "unanswered"
    """Responder: nothing sent yet; its first message answers the request."""
    ACCEPTED = "accepted"
    """Responder: it sent the success response; the request is live."""
    DONE = "done"
    """It sent its last message (REQUEST_ERROR, TRACK_STATUS's REQUEST_OK, PUBLISH_DONE),
    ended its half of the stream early, or the request was cancelled."""


_REQUESTER, _RESPONDER = Side.REQUESTER, Side.RESPONDER
_REQUESTED, _UNANSWERED = RequestState.REQUESTED, RequestState.UNANSWERED
_ACCEPTED, _DONE = RequestState.ACCEPTED, RequestState.DONE
_K = RequestKind

TRANSITIONS: Final[dict[tuple[RequestKind, Side, RequestState],
                        dict[type[Message], RequestState]]] = {
    # SUBSCRIBE: the responder publishes; it answers SUBSCRIBE_OK, then notifies, answers
    # each REQUEST_UPDATE and ends with PUBLISH_DONE
    (_K.SUBSCRIBE, _REQUESTER, _REQUESTED): {RequestUpdate: _REQUESTED},
    (_K.SUBSCRIBE, _RESPONDER, _UNANSWERED): {SubscribeOk: _ACCEPTED, RequestError: _DONE},
    (_K.SUBSCRIBE, _RESPONDER, _ACCEPTED): {
        PublishStateNotify: _ACCEPTED, RequestOk: _ACCEPTED, RequestError: _ACCEPTED,
        PublishDone: _DONE,
    },
    # PUBLISH: the requester publishes (objects may flow before the answer); the responder
    # subscribes: it answers REQUEST_OK (PUBLISH_OK), then may update the subscription
    (_K.PUBLISH, _REQUESTER, _REQUESTED): {
        PublishStateNotify: _REQUESTED, RequestOk: _REQUESTED, RequestError: _REQUESTED,
        PublishDone: _DONE,
    },
    (_K.PUBLISH, _RESPONDER, _UNANSWERED): {RequestOk: _ACCEPTED, RequestError: _DONE},
    (_K.PUBLISH, _RESPONDER, _ACCEPTED): {RequestUpdate: _ACCEPTED},
    # FETCH: FETCH_OK, then answers to updates; the fetch stream carries the objects
    (_K.FETCH, _REQUESTER, _REQUESTED): {RequestUpdate: _REQUESTED},
    (_K.FETCH, _RESPONDER, _UNANSWERED): {FetchOk: _ACCEPTED, RequestError: _DONE},
    (_K.FETCH, _RESPONDER, _ACCEPTED): {RequestOk: _ACCEPTED, RequestError: _ACCEPTED},
    # TRACK_STATUS: one answer, no updates
    (_K.TRACK_STATUS, _REQUESTER, _REQUESTED): {},
    (_K.TRACK_STATUS, _RESPONDER, _UNANSWERED): {RequestOk: _DONE, RequestError: _DONE},
    # the namespace requests: REQUEST_OK, then answers to updates and, per kind, what the
    # subscription to namespaces or tracks announces
    (_K.PUBLISH_NAMESPACE, _REQUESTER, _REQUESTED): {RequestUpdate: _REQUESTED},
    (_K.PUBLISH_NAMESPACE, _RESPONDER, _UNANSWERED): {RequestOk: _ACCEPTED,
                                                       RequestError: _DONE},
    (_K.PUBLISH_NAMESPACE, _RESPONDER, _ACCEPTED): {RequestOk: _ACCEPTED,
                                                     RequestError: _ACCEPTED},
    (_K.SUBSCRIBE_NAMESPACE, _REQUESTER, _REQUESTED): {RequestUpdate: _REQUESTED},
    (_K.SUBSCRIBE_NAMESPACE, _RESPONDER, _UNANSWERED): {RequestOk: _ACCEPTED,
                                                         RequestError: _DONE},
    (_K.SUBSCRIBE_NAMESPACE, _RESPONDER, _ACCEPTED): {
        NamespaceMsg: _ACCEPTED, NamespaceDone: _ACCEPTED, RequestOk: _ACCEPTED,
        RequestError: _ACCEPTED,
    },
    (_K.SUBSCRIBE_TRACKS, _REQUESTER, _REQUESTED): {RequestUpdate: _REQUESTED},
    (_K.SUBSCRIBE_TRACKS, _RESPONDER, _UNANSWERED): {RequestOk: _ACCEPTED,
                                                      RequestError: _DONE},
    (_K.SUBSCRIBE_TRACKS, _RESPONDER, _ACCEPTED): {
        PublishSkipped: _ACCEPTED, RequestOk: _ACCEPTED, RequestError: _ACCEPTED,
    },
}
"""(kind, sending side, its state) -> {message it may send: its next state}.

A (kind, side, state) not listed allows nothing: in particular a side in DONE sends
nothing more. Not written in every row: GOAWAY (digest 4.4) is allowed to either side in
every live state and changes nothing (at most one per stream, which the session checks)."""

for _key, _allowed in TRANSITIONS.items():
    if _key[2] is not _DONE:
        _allowed[GoAway] = _key[2]
del _key, _allowed

_MESSAGE_NAMES: Final[dict[type[Message], str]] = {
    GoAway: "GOAWAY", RequestUpdate: "REQUEST_UPDATE", RequestOk: "REQUEST_OK",
    RequestError: "REQUEST_ERROR", SubscribeOk: "SUBSCRIBE_OK", FetchOk: "FETCH_OK",
    PublishDone: "PUBLISH_DONE", PublishStateNotify: "PUBLISH_STATE_NOTIFY",
    NamespaceMsg: "NAMESPACE", NamespaceDone: "NAMESPACE_DONE",
    PublishSkipped: "PUBLISH_SKIPPED",
}


def message_name(message_type: type[Message]) -> str:
    """The draft's name of a control message type (SUBSCRIBE_OK, ...)."""
    name = _MESSAGE_NAMES.get(message_type)
    if name is None:
        try:
            return RequestKind(message_type.TYPE).name
        except ValueError:
            return message_type.__name__
    return name


def next_state(kind: RequestKind, side: Side, state: RequestState,
               message_type: type[Message]) -> RequestState | None:
    """The state ``side`` moves to by sending ``message_type``; None if not allowed."""
    return TRANSITIONS.get((kind, side, state), {}).get(message_type)


def ever_allowed(kind: RequestKind, side: Side, message_type: type[Message]) -> bool:
    """True if ``side`` of a ``kind`` request may send ``message_type`` in some state."""
    return any(k == kind and s is side and message_type in allowed
               for (k, s, _), allowed in TRANSITIONS.items())


class Ending(Enum):
    """What it means when one side ends its half of a request stream (FIN)."""

    CLEAN = "clean"
    """Nothing to report: the side had sent its last message, the request was already
    over, a requester will send no more updates, or a FETCH's responder is done."""
    FAILED = "failed"
    """The responder ended before its final message: the request failed (digest 8.2)."""
    WITHDRAWN = "withdrawn"
    """The requester ended a request that lives while its stream is open: a PUBLISH
    without PUBLISH_DONE, or a namespace request."""


LIVES_WHILE_REQUESTER_OPEN: Final = frozenset({
    RequestKind.PUBLISH, RequestKind.PUBLISH_NAMESPACE, RequestKind.SUBSCRIBE_NAMESPACE,
    RequestKind.SUBSCRIBE_TRACKS,
})
SUBSCRIPTIONS: Final = frozenset({RequestKind.SUBSCRIBE, RequestKind.PUBLISH})


@dataclass(slots=True, eq=False)
class Request:
    """One request and its bidirectional stream, seen from our side."""

    request_id: int
    stream_id: int
    kind: RequestKind
    side: Side
    """Our side of the request."""
    message: RequestMessage
    """The request-starting message."""
    parser: ControlStreamParser = field(default_factory=ControlStreamParser)
    requester_state: RequestState = RequestState.REQUESTED
    responder_state: RequestState = RequestState.UNANSWERED
    send_closed: bool = False
    """Our half of the stream is finished (FIN) or reset."""
    receive_closed: bool = False
    """The peer's half of the stream is finished or reset."""
    goaway_received: bool = False
    subscriber_priority: int = 128
    descending: bool = False
    track_alias: int | None = None
    # publisher of a subscription or fetch: data streams opened (PUBLISH_DONE counts them)
    # and the ones still open
    streams_opened: int = 0
    open_streams: set[int] = field(default_factory=set)
    # receiver of a subscription or fetch: the PUBLISH_DONE whose counted streams have not
    # all ended yet, and how many data streams have ended
    publish_done: PublishDone | None = None
    streams_ended: int = 0
    received_after_done: tuple[int, float] = (-1, 0.0)
    """Bytes its open data streams had received, and when that count last moved, as the
    PUBLISH_DONE timer last saw them (``SessionConfig.publish_done_stall_s``)."""
    updates: deque[int] = field(default_factory=deque)
    """REQUEST_UPDATE IDs awaiting their answer, oldest first (whichever side sent them)."""
    update_ids: list[int] = field(default_factory=list)
    """Every REQUEST_UPDATE ID we sent for the request, answered or not: a fill stream's
    FETCH_HEADER may name one after its answer. (The peer's are forgotten once answered.)"""
    namespaces: set[TrackNamespace] = field(default_factory=set)
    """SUBSCRIBE_NAMESPACE requester: the namespaces announced and not withdrawn."""
    charged: int = 0
    """Bytes of state the peer made us keep for this request (its message if the peer
    sent it, its pending REQUEST_UPDATEs, the namespaces it announced), charged to the
    session's control budget; its parser's unfinished message is charged apart."""

    # ---------------------------------------------------------------- states

    def state_of(self, side: Side) -> RequestState:
        """The state of one side."""
        return self.requester_state if side is Side.REQUESTER else self.responder_state

    def _set_state(self, side: Side, state: RequestState) -> None:
        if side is Side.REQUESTER:
            self.requester_state = state
        else:
            self.responder_state = state

    @property
    def our_state(self) -> RequestState:
        """The state of our side."""
        return self.state_of(self.side)

    def received(self, message: Message) -> RequestState:
        """Apply a message the peer sent; returns the peer side's state before it.

        Raises ProtocolError (PROTOCOL_VIOLATION) if the table does not allow it."""
        sender = self.side.other
        before = self.state_of(sender)
        after = next_state(self.kind, sender, before, type(message))
        if after is None:
            raise violation(f"{message_name(type(message))} from the {sender.value} of "
                            f"{self.kind.name} {self.request_id} ({before.value})")
        self._set_state(sender, after)
        return before

    def check_send(self, message_type: type[Message]) -> RequestState:
        """Our state after sending ``message_type`` now (nothing changes yet).

        Raises SessionUsageError if our side may not send it now: wrong side or kind,
        wrong state, or our half of the stream already ended."""
        state = self.our_state
        after = next_state(self.kind, self.side, state, message_type)
        name = message_name(message_type)
        what = f"{self.kind.name} {self.request_id}"
        if after is None:
            if not ever_allowed(self.kind, self.side, message_type):
                raise SessionUsageError(f"the {self.side.value} of {what} never sends {name}")
            raise SessionUsageError(f"{name} not allowed: {what} is {state.value} on our side")
        if self.send_closed:
            raise SessionUsageError(f"{what}: we already ended our side of its stream")
        return after

    def sending(self, message_type: type[Message]) -> None:
        """Apply a message we are about to send (SessionUsageError: see
        :meth:`check_send`)."""
        self._set_state(self.side, self.check_send(message_type))

    def end(self) -> None:
        """The request is over for both sides (cancel, reset)."""
        self.requester_state = self.responder_state = RequestState.DONE

    def end_of_stream(self, side: Side) -> Ending:
        """``side`` finished its half of the stream (FIN): what that means, and that side
        is DONE unless it was a requester that merely sends no more updates."""
        state = self.state_of(side)
        if self.finished:
            ending = Ending.CLEAN
        elif side is Side.RESPONDER:
            done = self.kind is RequestKind.FETCH and state is RequestState.ACCEPTED
            ending = Ending.CLEAN if done else Ending.FAILED
        elif self.kind in LIVES_WHILE_REQUESTER_OPEN:
            ending = Ending.WITHDRAWN
        else:
            return Ending.CLEAN  # SUBSCRIBE/FETCH/TRACK_STATUS: no more REQUEST_UPDATEs
        self._set_state(side, RequestState.DONE)
        return ending

    # ---------------------------------------------------------------- derived facts

    @property
    def responded(self) -> bool:
        """The responder has answered (or ended)."""
        return self.responder_state is not RequestState.UNANSWERED

    @property
    def established(self) -> bool:
        """Accepted and live (digest 8.1: SUBSCRIBE_OK, or REQUEST_OK for the others)."""
        return self.responder_state is RequestState.ACCEPTED and not self.finished

    @property
    def finished(self) -> bool:
        """The request is over: a side sent its last message or ended, or it was
        cancelled."""
        return RequestState.DONE in (self.requester_state, self.responder_state)

    @property
    def publisher_side(self) -> Side | None:
        """The side that publishes objects: the SUBSCRIBE's responder, the PUBLISH's
        requester, the FETCH's responder; None for the other kinds."""
        if self.kind is RequestKind.PUBLISH:
            return Side.REQUESTER
        if self.kind in (RequestKind.SUBSCRIBE, RequestKind.FETCH):
            return Side.RESPONDER
        return None

    @property
    def we_subscribe(self) -> bool:
        """True if this is a subscription (SUBSCRIBE or PUBLISH) and we are its
        subscriber."""
        return self.kind in SUBSCRIPTIONS and self.publisher_side is not self.side

    @property
    def full_track_name(self) -> tuple[TrackNamespace, bytes] | None:
        """(namespace, name) for SUBSCRIBE, PUBLISH, FETCH and TRACK_STATUS; None for the
        namespace requests."""
        m = self.message
        if isinstance(m, PublishNamespace | SubscribeNamespace | SubscribeTracks):
            return None
        return tuple(m.namespace), bytes(m.name)

    @property
    def namespace(self) -> TrackNamespace:
        """The request's namespace or namespace prefix."""
        m = self.message
        if isinstance(m, PublishNamespace | SubscribeNamespace | SubscribeTracks):
            return m.namespace_prefix
        return m.namespace


def namespace_footprint(namespace: TrackNamespace) -> int:
    """Bytes of Python objects a decoded namespace takes (rounded up)."""
    return ITEM_COST + sum(ITEM_COST + len(f) for f in namespace)


def _properties_footprint(props: Properties) -> int:
    return sum(ITEM_COST + (len(v) if isinstance(v, bytes | bytearray) else 0)
               for _, v in props)


def _params_footprint(p: Parameters) -> int:
    size = 0
    for tok in p.auth_tokens:
        size += ITEM_COST + len(tok.value or b"")
    for rf in p.range_filters:
        size += ITEM_COST * (1 + len(rf.ranges))
    if p.fill is not None:
        size += MESSAGE_COST + _params_footprint(p.fill)
    if p.track_namespace_prefix is not None:
        size += namespace_footprint(p.track_namespace_prefix)
    return size


def message_footprint(msg: RequestMessage) -> int:
    """Bytes of Python objects a decoded request-starting message keeps, rounded up: its
    byte strings plus :data:`~kvcs.moqt.config.ITEM_COST` per namespace field, token,
    property and Range Filter range (measured: ``tests/session/test_hostile_flood.py``).
    A range costs ~130 bytes for its ~2 wire bytes, hence counting items, not bytes."""
    size = MESSAGE_COST + _params_footprint(msg.params)
    if isinstance(msg, PublishNamespace | SubscribeNamespace | SubscribeTracks):
        return size + namespace_footprint(msg.namespace_prefix)
    size += namespace_footprint(msg.namespace) + len(msg.name)
    if isinstance(msg, Publish):
        size += _properties_footprint(msg.track_properties)
    return size


class RequestRegistry:
    """The requests a session keeps state for: by Request ID, by stream, and by the ID of
    each of their REQUEST_UPDATEs."""

    def __init__(self) -> None:
        self._by_id: dict[int, Request] = {}
        self._by_stream: dict[int, Request] = {}
        self._by_update: dict[int, Request] = {}
        self.peer_requests = 0
        """Requests the peer made that we keep state for."""

    def add(self, req: Request) -> None:
        """Register a new request."""
        self._by_id[req.request_id] = req
        self._by_stream[req.stream_id] = req
        if req.side is Side.RESPONDER:
            self.peer_requests += 1

    def get(self, request_id: int) -> Request | None:
        """The request with this Request ID, or None."""
        return self._by_id.get(request_id)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._by_id

    def __iter__(self) -> Iterator[Request]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def on_stream(self, stream_id: int) -> Request | None:
        """The request whose stream is still open, or None."""
        return self._by_stream.get(stream_id)

    def find(self, request_id: int) -> Request | None:
        """The request with this Request ID, or the one a REQUEST_UPDATE with this ID
        belongs to (a fill stream's FETCH_HEADER names either)."""
        return self._by_id.get(request_id) or self._by_update.get(request_id)

    def add_update(self, update_id: int, req: Request) -> None:
        """We sent REQUEST_UPDATE ``update_id`` for ``req``: it awaits its answer, and a
        fill stream may name it."""
        req.updates.append(update_id)
        req.update_ids.append(update_id)
        self._by_update[update_id] = req

    @staticmethod
    def add_peer_update(update_id: int, req: Request) -> None:
        """The peer sent REQUEST_UPDATE ``update_id`` for ``req``: it awaits our answer
        (nothing of it is kept after that)."""
        req.updates.append(update_id)

    def answer_update(self, req: Request, update_id: int | None = None) -> int:
        """Settle an update of ``req``: ``update_id``, or the oldest one; returns its ID.

        Raises LookupError if it is not pending."""
        if update_id is None:
            if not req.updates:
                raise LookupError("no REQUEST_UPDATE awaits an answer")
            return req.updates.popleft()
        if update_id not in req.updates:
            raise LookupError(f"no REQUEST_UPDATE {update_id} awaits an answer")
        req.updates.remove(update_id)
        return update_id

    def awaiting_subscribe_ok(self) -> bool:
        """True while one of our SUBSCRIBEs has no answer yet (a data stream with an
        unknown Track Alias may belong to it)."""
        return any(r.kind is RequestKind.SUBSCRIBE and r.side is Side.REQUESTER
                   and r.responder_state is RequestState.UNANSWERED for r in self._by_id.values())

    def close_stream(self, req: Request) -> None:
        """Both halves of the request's stream ended: stop routing stream data to it."""
        self._by_stream.pop(req.stream_id, None)

    def forget(self, req: Request) -> None:
        """Drop every trace of a request."""
        self._by_stream.pop(req.stream_id, None)
        if self._by_id.pop(req.request_id, None) is not None and req.side is Side.RESPONDER:
            self.peer_requests -= 1
        for uid in req.update_ids:
            self._by_update.pop(uid, None)
