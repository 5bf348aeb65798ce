"""The sans-IO MOQT draft-22 session.

One :class:`Session` per QUIC connection (or WebTransport session), in either role. It
consumes stream and datagram events (:meth:`stream_data`, :meth:`stream_reset`,
:meth:`stop_sending`, :meth:`datagram`) and API calls from the application (requests,
answers, objects), and produces

* actions for the I/O binding (:meth:`actions`: bytes to write per stream, resets,
  STOP_SENDING, datagrams, the session close), and
* events for the application (:meth:`next_event`).

The work is split in three parts behind this facade:

* :mod:`kvcs.moqt.control`: the SETUP exchange, GOAWAY and every request stream; whether a
  message is allowed is decided by the request state table of :mod:`kvcs.moqt.requests`;
* :mod:`kvcs.moqt.datastreams`: subgroup and fetch streams and datagrams, both directions;
* this class: routes input by stream, holds what arrives before the peer's SETUP, closes
  the session on a protocol error, and is the application's one entry point.

A peer's protocol error closes the session with the draft's code; a call the application
may not make raises :class:`~kvcs.moqt.errors.SessionUsageError`. It knows nothing about
tracks: serving objects from a store and relaying are applications of this class.

No sockets and no asyncio here: it is tested byte by byte.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import events as ev
from .actions import Action, CloseSession, StreamOpener
from .config import EARLY_ITEM_COST, MAX_SKIPPED_REQUEST_IDS, SessionConfig
from .control import SETUP_TYPE, ControlPlane
from .datastreams import DataStreams
from .errors import ProtocolError, SessionCode, StreamResetCode, violation
from .outbox import Outbox
from .requests import Request, RequestRegistry
from .wire import (
    Location,
    NeedMore,
    ObjectRecord,
    Parameters,
    Properties,
    Redirect,
    SetupOptions,
    TrackNamespace,
    decode_vi64,
)

__all__ = ["MAX_SKIPPED_REQUEST_IDS", "Session", "SessionConfig", "SessionUsage"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _EarlyStreamData:
    """Bytes (and maybe FIN) of a peer stream that arrived before the peer's SETUP. For a
    unidirectional stream the bytes wait in the stream's prefix and ``data`` is empty."""

    stream_id: int
    data: bytes
    end: bool


@dataclass(frozen=True, slots=True)
class _EarlyReset:
    """A peer stream reset before the peer's SETUP."""

    stream_id: int
    code: int


@dataclass(frozen=True, slots=True)
class _EarlyDatagram:
    """A datagram that arrived before the peer's SETUP."""

    data: bytes


_EarlyInput = _EarlyStreamData | _EarlyReset | _EarlyDatagram


@dataclass(frozen=True, slots=True)
class SessionUsage:
    """What one session holds right now (:attr:`Session.usage`); the limits are in
    :mod:`kvcs.moqt.config`."""

    requests: int
    """Requests with state, either role (:attr:`Session.open_requests`)."""
    peer_requests: int
    """Of those, the peer's (``max_requests``)."""
    draining_streams: int
    """Peer request streams refused or answered for good, remembered until the peer ends
    them."""
    data_streams: int
    """Data streams with state, both directions (incoming ones until they end, also when
    stopped)."""
    control_bytes: int
    """Charged to ``max_control_bytes``."""
    data_bytes: int
    """Charged to ``max_data_bytes``."""
    early_bytes: int
    """Charged to ``setup_buffer_limit`` (input kept before the peer's SETUP)."""
    waiting_requests: int = 0
    """New requests of the peer waiting, undecoded, for ``request_rate``."""


class Session:
    """A sans-IO MOQT draft-22 session. See the module docstring."""

    def __init__(self, config: SessionConfig, opener: StreamOpener) -> None:
        self.config = config
        self._out = Outbox()
        self._requests = RequestRegistry()
        self._data = DataStreams(self._out, opener, self._requests, config,
                                 self._data_stream_ended, self._track_malformed)
        self._ctl = ControlPlane(config, opener, self._out, self._requests, self._data,
                                 self._replay_early_input)
        self._control = self._ctl.control_stream  # use control_stream_id; kept for old tests
        self._early: list[_EarlyInput] = []  # peer input that arrived before its SETUP
        self._early_bytes = 0
        self._uni_prefix: dict[int, bytearray] = {}  # peer uni streams not handed on yet

    def _data_stream_ended(self, req: Request, sent: bool) -> None:
        self._ctl.data_stream_ended(req, sent)

    def _track_malformed(self, req: Request, reason: str) -> None:
        self._ctl.track_malformed(req, reason)

    # ------------------------------------------------------------------ plumbing

    def actions(self) -> list[Action]:
        """Return and clear the actions produced so far."""
        return self._out.take_actions()

    @property
    def pending_stream_bytes(self) -> int:
        """Stream data bytes written in actions not yet taken (:meth:`actions`): what the
        binding will hand to its send queue at its next flush."""
        return self._out.stream_bytes()

    @property
    def has_output(self) -> bool:
        """True if actions wait for the binding (something to send)."""
        return bool(self._out.actions)

    def next_event(self) -> ev.Event | None:
        """Return the next event for the application, or None."""
        events = self._out.events
        return events.popleft() if events else None

    def next_objects(self, request_id: int) -> list[ev.ObjectReceived]:
        """Pop the ObjectReceived events of ``request_id`` that come next, in order, up to
        the first other event: the rest of a run of one request's objects, for a caller
        that handles a run in one call (a relay's upstream subscription)."""
        events = self._out.events
        run: list[ev.ObjectReceived] = []
        while events:
            e = events[0]
            if type(e) is not ev.ObjectReceived or e.request_id != request_id:
                break
            run.append(events.popleft())  # type: ignore[arg-type]
        return run

    def events(self) -> Iterable[ev.Event]:
        """Drain all pending events."""
        events = self._out.events
        while events:
            yield events.popleft()

    @property
    def closed(self) -> tuple[int, str] | None:
        """(code, reason) once the session is closed by either side."""
        return self._out.closed

    @property
    def is_closed(self) -> bool:
        """True once the session has been closed by either side."""
        return self._out.closed is not None

    @property
    def peer_setup(self) -> SetupOptions | None:
        """The peer's Setup Options, once its SETUP arrived."""
        return self._ctl.peer_setup

    @property
    def control_stream_id(self) -> int:
        """Our control stream (unidirectional, starts with SETUP)."""
        return self._control

    def close(self, code: int = SessionCode.NO_ERROR, reason: str = "") -> None:
        """Close the session with a session termination code."""
        if self._out.closed is not None:
            return
        self._out.emit(CloseSession(int(code), reason))
        self._out.closed = (int(code), reason)
        self._out.event(ev.SessionClosed(int(code), reason, by_peer=False))
        self._drop_input()

    def connection_lost(self, code: int | None, reason: str) -> None:
        """The transport is gone (peer close, idle timeout, ...)."""
        if self._out.closed is not None:
            return
        self._out.closed = (code if code is not None else SessionCode.INTERNAL_ERROR, reason)
        self._out.event(ev.SessionClosed(self._out.closed[0], reason, by_peer=True))
        self._drop_input()

    def _drop_input(self) -> None:
        """Closed: no more input is read, so what was kept for input still to come (early
        input, unfinished messages and objects, held streams) is let go at once; the
        binding may keep the session object a while longer."""
        self._early.clear()
        self._early_bytes = 0
        self._uni_prefix.clear()
        self._ctl.drop_input()
        self._data.drop_input()

    def _fail(self, exc: ProtocolError) -> None:
        log.warning("closing MOQT session: %s", exc)
        self.close(exc.code, exc.reason[:1000])

    # ------------------------------------------------------------------ inputs

    def stream_data(self, stream_id: int, data: bytes | memoryview, end: bool) -> None:
        """Bytes (and possibly FIN) arrived on a stream."""
        if self._out.closed is not None:
            return
        try:
            if not self._data.feed(stream_id, data, end):  # the hot path: an open data stream
                self._route(stream_id, data, end)
        except ProtocolError as exc:
            self._fail(exc)

    def _route(self, sid: int, data: bytes | memoryview, end: bool) -> None:
        """Bytes on a stream that is not an open data stream."""
        if sid == self._ctl.peer_control_stream:
            self._ctl.control_data(data, end)
        elif sid & 2:  # unidirectional
            if self._ctl.is_local(sid):
                raise violation("data on our own unidirectional stream")
            self._new_uni_stream(sid, data, end)
        elif self._ctl.peer_setup is None and not self._ctl.is_local(sid):
            self._keep_early(_EarlyStreamData(sid, bytes(data), end), len(data))
        else:
            self._ctl.stream_data(sid, data, end)

    def _new_uni_stream(self, sid: int, data: bytes | memoryview, end: bool) -> None:
        """Route a peer's unidirectional stream by its type: the control stream, or a data
        stream (held until the peer's SETUP)."""
        prefix = self._uni_prefix.pop(sid, None)
        head: bytes | bytearray | memoryview = data if prefix is None else prefix + data
        try:
            stream_type, _ = decode_vi64(head, 0)
        except NeedMore:
            if end:
                raise violation("unidirectional stream ended inside its type") from None
            self._uni_prefix[sid] = bytearray(head)
            return
        if stream_type == SETUP_TYPE:
            self._ctl.open_peer_control(sid, head, end)
        elif self._ctl.peer_setup is None:
            self._uni_prefix[sid] = bytearray(head)
            self._keep_early(_EarlyStreamData(sid, b"", end), len(data))
        else:
            self._data.open(sid, head, end)

    def _keep_early(self, item: _EarlyInput, size: int) -> None:
        """Keep input until the peer's SETUP: ``size`` bytes of it plus the record."""
        self._early_bytes += size + EARLY_ITEM_COST
        if self._early_bytes > self.config.setup_buffer_limit:
            raise violation("too much data before SETUP")
        self._early.append(item)

    def _replay_early_input(self) -> None:
        """The peer's SETUP arrived: process what came before it, in order."""
        early, self._early = self._early, []
        self._early_bytes = 0
        for item in early:
            match item:
                case _EarlyStreamData():
                    if not self._data.feed(item.stream_id, item.data, item.end):
                        self._route(item.stream_id, item.data, item.end)
                case _EarlyReset():
                    self._stream_reset(item.stream_id, item.code)
                case _EarlyDatagram():
                    self._data.datagram(item.data)

    def stream_reset(self, stream_id: int, code: int) -> None:
        """The peer reset its send side of a stream (RESET_STREAM)."""
        if self._out.closed is not None:
            return
        try:
            self._stream_reset(stream_id, code)
        except ProtocolError as exc:
            self._fail(exc)

    def _stream_reset(self, sid: int, code: int) -> None:
        if sid == self._ctl.peer_control_stream:
            raise violation("control stream reset")
        if self._ctl.peer_setup is None and not self._ctl.is_local(sid):
            self._keep_early(_EarlyReset(sid, code), 0)  # after the stream's early bytes
        elif not sid & 2:
            self._ctl.stream_reset(sid, code)
        elif self._uni_prefix.pop(sid, None) is None:
            self._data.reset(sid, code)

    def resume_requests(self) -> None:
        """Decode the peer's waiting requests whose turn has come (after
        :class:`~kvcs.moqt.events.RequestsWaiting`; ``config.request_rate``)."""
        if self._out.closed is not None:
            return
        try:
            self._ctl.resume_requests()
        except ProtocolError as exc:
            self._fail(exc)

    def stop_sending(self, stream_id: int, code: int) -> None:
        """The peer asked us to stop sending on a stream (STOP_SENDING)."""
        if self._out.closed is not None:
            return
        if stream_id == self._control:
            self._fail(violation("STOP_SENDING on the control stream"))
        elif not self._data.reset_stream(stream_id, code):
            self._ctl.stop_sending(stream_id, code)

    def datagram(self, data: bytes | memoryview) -> None:
        """A QUIC DATAGRAM arrived."""
        if self._out.closed is not None:
            return
        try:
            if self._ctl.peer_setup is None:
                self._keep_early(_EarlyDatagram(bytes(data)), len(data))
            else:
                self._data.datagram(data)
        except ProtocolError as exc:
            self._fail(exc)

    # ------------------------------------------------------------------ API: requests

    def subscribe(self, namespace: TrackNamespace, name: bytes,
                  params: Parameters | None = None) -> int:
        """Send SUBSCRIBE; returns its Request ID."""
        return self._ctl.subscribe(namespace, name, params or Parameters())

    def fetch(self, namespace: TrackNamespace, name: bytes,
              params: Parameters | None = None) -> int:
        """Send FETCH; returns its Request ID."""
        return self._ctl.fetch(namespace, name, params or Parameters())

    def track_status(self, namespace: TrackNamespace, name: bytes,
                     params: Parameters | None = None) -> int:
        """Send TRACK_STATUS; returns its Request ID."""
        return self._ctl.track_status(namespace, name, params or Parameters())

    def publish_namespace(self, namespace: TrackNamespace,
                          params: Parameters | None = None) -> int:
        """Send PUBLISH_NAMESPACE; returns its Request ID. Withdraw with :meth:`cancel`."""
        return self._ctl.publish_namespace(namespace, params or Parameters())

    def subscribe_namespace(self, prefix: TrackNamespace,
                            params: Parameters | None = None) -> int:
        """Send SUBSCRIBE_NAMESPACE; returns its Request ID."""
        return self._ctl.subscribe_namespace(prefix, params or Parameters())

    def subscribe_tracks(self, prefix: TrackNamespace,
                         params: Parameters | None = None) -> int:
        """Send SUBSCRIBE_TRACKS; returns its Request ID."""
        return self._ctl.subscribe_tracks(prefix, params or Parameters())

    def publish(self, namespace: TrackNamespace, name: bytes, params: Parameters | None = None,
                track_properties: Properties = (), track_alias: int | None = None) -> int:
        """Send PUBLISH (we are the publisher); returns its Request ID."""
        return self._ctl.publish(namespace, name, params or Parameters(), track_properties,
                                 track_alias)

    def request_update(self, request_id: int, params: Parameters) -> int:
        """Send REQUEST_UPDATE for one of our requests (or a PUBLISH we accepted); returns
        the update's Request ID."""
        return self._ctl.request_update(request_id, params)

    def cancel(self, request_id: int, code: int = StreamResetCode.CANCELLED) -> None:
        """Cancel a request in either role: reset our side and STOP_SENDING theirs."""
        self._ctl.cancel(request_id, code)

    def finish_request(self, request_id: int) -> None:
        """FIN our side of a request stream (we will send nothing more on it)."""
        self._ctl.finish_request(request_id)

    def stop_waiting_for_streams(self, request_id: int) -> bool:
        """After :class:`~kvcs.moqt.events.StreamsOutstanding` and
        ``config.publish_done_wait_s``: end the subscription without its missing streams;
        True if a stream of it is still open (it goes on: ask again later)."""
        return self._ctl.stop_waiting_for_streams(request_id)

    def goaway(self, new_session_uri: bytes = b"", timeout_ms: int = 0) -> None:
        """Send GOAWAY on the control stream."""
        self._ctl.goaway(new_session_uri, timeout_ms)

    def has_request(self, request_id: int) -> bool:
        """True while the session keeps state for the request (until both sides ended it
        and, for a subscription we receive, the data streams PUBLISH_DONE counts ended)."""
        return request_id in self._requests

    @property
    def open_requests(self) -> int:
        """Requests the session keeps state for, in either role. A request is forgotten
        once it is over on both ends: FIN both ways after its final message (a FETCH:
        after its fetch stream ended), a cancel, or the subscription's last data stream."""
        return len(self._requests)

    @property
    def usage(self) -> SessionUsage:
        """What the session holds now: requests, streams, buffered bytes."""
        return SessionUsage(
            requests=len(self._requests),
            peer_requests=self._requests.peer_requests,
            draining_streams=self._ctl.draining_streams,
            data_streams=self._data.open_count,
            control_bytes=self._ctl.budget.used,
            data_bytes=self._data.budget.used,
            early_bytes=self._early_bytes,
            waiting_requests=len(self._ctl.gate) if self._ctl.gate is not None else 0,
        )

    def subscription_info(self, request_id: int) -> Request:
        """The state of a request (read-only use: priorities, alias, message, states)."""
        return self._ctl.request(request_id)

    # ------------------------------------------------------------------ API: answers

    def subscribe_ok(self, request_id: int, params: Parameters | None = None,
                     track_properties: Properties = (), track_alias: int | None = None) -> int:
        """Accept a SUBSCRIBE; returns the Track Alias chosen."""
        return self._ctl.subscribe_ok(request_id, params or Parameters(), track_properties,
                                      track_alias)

    def fetch_ok(self, request_id: int, end_location: Location, end_of_track: bool = False,
                 track_properties: Properties = ()) -> None:
        """Accept a FETCH."""
        self._ctl.fetch_ok(request_id, end_location, end_of_track, track_properties)

    def request_ok(self, request_id: int, params: Parameters | None = None,
                   track_properties: Properties = (), update_id: int | None = None) -> None:
        """Send REQUEST_OK: for PUBLISH, TRACK_STATUS, the namespace requests, or an update.

        TRACK_STATUS is finished (FIN) right after it.
        """
        self._ctl.request_ok(request_id, params or Parameters(), track_properties, update_id)

    def request_error(self, request_id: int, code: int, reason: str = "",
                      retry_interval: int = 0, update_id: int | None = None,
                      redirect: Redirect | None = None) -> None:
        """Reject a request (REQUEST_ERROR + FIN) or one REQUEST_UPDATE of it."""
        self._ctl.request_error(request_id, code, reason, retry_interval, update_id, redirect)

    def namespace(self, request_id: int, namespace: TrackNamespace) -> None:
        """Send NAMESPACE (suffix of ``namespace`` after the request's prefix)."""
        self._ctl.namespace(request_id, namespace)

    def namespace_done(self, request_id: int, namespace: TrackNamespace) -> None:
        """Send NAMESPACE_DONE for a namespace announced earlier."""
        self._ctl.namespace_done(request_id, namespace)

    def publish_skipped(self, request_id: int, namespace: TrackNamespace, name: bytes) -> None:
        """Send PUBLISH_SKIPPED on a SUBSCRIBE_TRACKS stream."""
        self._ctl.publish_skipped(request_id, namespace, name)

    def publish_state_notify(self, request_id: int, params: Parameters) -> None:
        """Send PUBLISH_STATE_NOTIFY on a subscription we serve."""
        self._ctl.publish_state_notify(request_id, params)

    def publish_done(self, request_id: int, status: int, reason: str = "") -> None:
        """End a subscription we serve: PUBLISH_DONE with the stream count, then FIN.

        Open data streams of the subscription are finished first (FIN), so the count is
        final. Does nothing if the request is unknown or already over.
        """
        self._ctl.publish_done(request_id, status, reason)

    # ------------------------------------------------------------------ API: data out

    def open_subgroup(self, request_id: int, group_id: int, subgroup_id: int = 0,
                      publisher_priority: int | None = None, *,
                      default_priority: int = 128, end_of_group: bool = False,
                      first_object: bool = True, has_properties: bool = False) -> int:
        """Open a subgroup stream for subscription ``request_id``; returns the stream ID.

        ``publisher_priority`` None omits the priority byte (the track default,
        ``default_priority``, applies).
        """
        req = self._ctl.publishing(request_id)
        return self._data.open_subgroup(req, group_id, subgroup_id, publisher_priority,
                                        default_priority, end_of_group, first_object,
                                        has_properties)

    def write_object(self, stream_id: int, object_id: int, payload: bytes | memoryview,
                     status: int = 0, properties: Properties | None = None,
                     end: bool = False) -> bool:
        """Write one object on a subgroup stream; False if the stream is gone."""
        if self._out.closed is not None:
            return False
        return self._data.write_object(stream_id, object_id, payload, status, properties, end)

    def write_objects(self, stream_id: int, objs: Sequence[ObjectRecord],
                      end: bool = False) -> bool:
        """Write objects (increasing Object IDs) on a subgroup stream in one write;
        ``end`` FINs the stream after them. False if the stream is gone."""
        if self._out.closed is not None:
            return False
        return self._data.write_objects(stream_id, objs, end)

    def open_fetch_stream(self, request_id: int, fill_id: int | None = None,
                          publisher_priority: int = 128, first_group: int = 0) -> int:
        """Open a fetch stream for FETCH ``request_id``, or a fill stream of subscription
        ``request_id`` (``fill_id`` = the SUBSCRIBE's or REQUEST_UPDATE's Request ID)."""
        req = self._ctl.publishing(request_id, fetch=fill_id is None)
        return self._data.open_fetch_stream(req, fill_id, publisher_priority, first_group)

    def write_fetch_object(self, stream_id: int, group_id: int, subgroup_id: int,
                           object_id: int, publisher_priority: int,
                           payload: bytes | memoryview, properties: Properties | None = None,
                           datagram: bool = False) -> bool:
        """Write one object on a fetch/fill stream; False if the stream is gone."""
        if self._out.closed is not None:
            return False
        return self._data.write_fetch_object(stream_id, group_id, subgroup_id, object_id,
                                             publisher_priority, payload, properties, datagram)

    def write_end_of_range(self, stream_id: int, kind: int, group_id: int,
                           object_id: int) -> bool:
        """Write an End of Range marker on a fetch/fill stream."""
        if self._out.closed is not None:
            return False
        return self._data.write_end_of_range(stream_id, kind, group_id, object_id)

    def end_data_stream(self, stream_id: int) -> None:
        """FIN a data stream we opened."""
        if self._out.closed is None:
            self._data.end_stream(stream_id)

    def reset_data_stream(self, stream_id: int, code: int) -> None:
        """Reset a data stream we opened (fill failure, cancel, malformed upstream)."""
        if self._out.closed is None:
            self._data.reset_stream(stream_id, code)

    def send_datagram(self, request_id: int, record: ObjectRecord,
                      end_of_group: bool = False) -> None:
        """Send one object as a datagram on subscription ``request_id``."""
        self._data.send_datagram(self._ctl.publishing(request_id), record, end_of_group)

    def data_stream_open(self, stream_id: int) -> bool:
        """True while a data stream we opened can still be written."""
        return self._data.is_open(stream_id)

    def reprioritize(self, stream_id: int, publisher_priority: int, group_id: int) -> None:
        """Give a fetch/fill stream the priority of the group it is now carrying."""
        self._data.reprioritize(stream_id, publisher_priority, group_id)

    def want_writable(self, stream_id: int) -> None:
        """Ask for a :class:`~kvcs.moqt.events.DataStreamWritable` event once the transport
        has taken the data queued on our stream (all of it, or down to its low-water
        mark, so that the writer can top the stream up before it runs dry)."""
        self._data.want_writable(stream_id)

    def stream_writable(self, stream_id: int) -> None:
        """Input from the binding: the queue of ``stream_id`` emptied or fell to the
        binding's low-water mark."""
        self._data.writable(stream_id)
