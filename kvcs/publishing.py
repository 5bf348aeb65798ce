"""Where producers put their tracks: the publish target, one implementation over an origin.

A producer (:class:`~kvcs.kvnet.publisher.KvPublisher`, the manifest track, an
application) writes into an :class:`~kvcs.moqt.origin.Origin`; every session serving that
origin forwards what changed, and the origin's serving wakes exactly the sessions it wrote
to (:attr:`TrackServer.wake <kvcs.moqt.serving.TrackServer.wake>`). So a producer never
flushes sessions itself, and one :class:`OriginPublisher` implements the writing half of
the :class:`PublishTarget` protocol for all of :class:`~kvcs.endpoint.Endpoint` (one
session), :class:`~kvcs.hosting.TrackHost` (every accepted session) and
:class:`~kvcs.kvnet.reconnect.ReconnectingTarget` (one session at a time). They differ only
in how a namespace is made known (``announce``, ``withdraw``) and in back-pressure
(``drain``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from .moqt.origin import Origin
from .moqt.track import CachedObject, FullTrackName, Track
from .moqt.wire import ObjectStatus, Parameters, Properties, TrackNamespace


class PublishTarget(Protocol):
    """Where a publisher puts its tracks: an :class:`~kvcs.endpoint.Endpoint` connected to a
    relay, a :class:`~kvcs.hosting.TrackHost` serving consumers directly, or a
    :class:`~kvcs.kvnet.reconnect.ReconnectingTarget`.

    :meth:`publish_run` is the one way objects go in: a run of
    :class:`~kvcs.moqt.track.CachedObject` in order (one object is a run of one). A wrapper
    that rewrites, drops or records objects implements it and sees every object."""

    def create_track(self, namespace: TrackNamespace, name: bytes,
                     properties: Properties = ()) -> Track: ...

    def publish_run(self, track: Track, objects: Iterable[CachedObject]) -> None: ...

    async def announce(self, namespace: TrackNamespace,
                       params: Parameters | None = None) -> None: ...

    def withdraw(self, namespace: TrackNamespace) -> None: ...

    async def drain(self, limit: int = ...) -> None: ...


@runtime_checkable
class HandOverTarget(PublishTarget, Protocol):
    """A target that can make its peer, a relay, hold a publication complete so that the
    publisher may leave (:meth:`kvcs.endpoint.Endpoint.hand_over`; raises a
    ConnectionError when the relay does not confirm)."""

    async def hand_over(self, namespace: TrackNamespace, timeout: float | None = ..., *,
                        live: bool = ...) -> None: ...


def object_record(track: Track, group_id: int, object_id: int, payload: bytes | memoryview,
                  *, status: int = ObjectStatus.NORMAL, priority: int | None = None,
                  subgroup_id: int = 0, properties: Properties = ()) -> CachedObject:
    """One object of ``track`` as a run element (priority defaults to the track's)."""
    prio = track.default_priority if priority is None else priority
    return CachedObject(group_id, object_id, subgroup_id, prio, status, tuple(properties),
                        payload)


class OriginPublisher:
    """The writing half of a :class:`PublishTarget`: tracks in :attr:`origin`, objects
    added in order. Sessions serving the origin get what is added without being flushed
    by hand (the module docstring says why)."""

    origin: Origin[Any]
    """The origin producers write into (its sessions are the subclass's business)."""

    @property
    def tracks(self) -> dict[FullTrackName, Track]:
        """The tracks this target serves (its origin's)."""
        return self.origin.tracks

    def create_track(self, namespace: TrackNamespace, name: bytes,
                     properties: Properties = ()) -> Track:
        """Create (or return) a local track, served by every session serving the origin."""
        return self.origin.create_track(namespace, name, properties)

    def add_track(self, track: Track) -> None:
        """Serve an existing track (e.g. one shared by several origins)."""
        self.origin.add_track(track)

    def publish(self, track: Track, group_id: int, object_id: int, payload: bytes | memoryview,
                *, status: int = ObjectStatus.NORMAL, priority: int | None = None,
                subgroup_id: int = 0, properties: Properties = ()) -> None:
        """Add one object to a local track; live subscribers get it at the end of this
        event loop turn, with the objects published after it in the same turn as one run
        (:meth:`Origin.stage <kvcs.moqt.origin.Origin.stage>`; an object that ends its
        group or the track goes out at once, with those before it, and so does everything
        at a flush, close or drain). Stored at once: reads of the track,
        :meth:`publish_run` and FETCH see it."""
        origin = self.origin
        if origin.stage(track, CachedObject(  # object_record's, one call fewer
                group_id, object_id, subgroup_id,
                track.default_priority if priority is None else priority, status,
                tuple(properties), payload)):
            try:
                asyncio.get_running_loop().call_soon(origin.tell_staged)
            except RuntimeError:  # no event loop (a synchronous caller): tell it now
                origin.tell_staged()

    def publish_run(self, track: Track, objects: Iterable[CachedObject]) -> None:
        """Add objects to a local track in order (see :meth:`Track.extend
        <kvcs.moqt.track.Track.extend>`): live subscribers get them at once, with one
        forwarding call chain per run instead of one per object (a KV layer is one run)."""
        track.extend(objects)

    def forget_tracks(self, namespace: TrackNamespace) -> int:
        """Drop every track under ``namespace`` from the origin; returns how many."""
        return self.origin.drop_tracks(namespace)


__all__ = ["HandOverTarget", "OriginPublisher", "PublishTarget", "object_record"]
