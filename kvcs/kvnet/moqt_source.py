"""MOQT (a relay, or the publisher itself) as a source of blocks: the transfer of one
segment's data tracks (SUBSCRIBE with a fill, FETCH of layer spans, or following the
current group, as the relay profile says), objects verified in batches on their way to
the segment's :class:`~kvcs.kv.assembly.LayerAssembler`, and FETCHes of missing blocks.

A :class:`SegmentRun` is one segment of a :class:`~kvcs.kvnet.retrieval.Retrieval`;
:class:`MoqtSource` is an endpoint and publication that recovery asks for what a run
misses (:class:`~kvcs.kvnet.http_source.HttpSource` is the other kind of source)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..endpoint import Endpoint, FetchResult, MoqtRequestError, ReceivedObject, Subscription
from ..kv.assembly import KvLayer, LayerArrays, LayerAssembler, Outcome, select_tracks
from ..kv.component import Component
from ..kv.manifest import Manifest, Segment
from ..kv.payload import HEADER_SIZE
from ..moqt.errors import PublishDoneCode, RequestErrorCode, SessionUsageError
from ..moqt.wire import (
    PARAM_OBJECTID_FILTER,
    Location,
    LocationFilter,
    ObjectStatus,
    Parameters,
    Properties,
    RangeFilter,
)
from .consumer_types import ConsumerStats, Publication
from .manifest_track import TRANSIENT
from .offload import sha256_digests
from .relay_profile import TrackRetrieval

if TYPE_CHECKING:
    from .retrieval import Retrieval

__all__ = ["FETCHES_IN_FLIGHT", "SOURCE_LOST", "Intake", "MoqtSource", "Progress",
           "SegmentRun"]

log = logging.getLogger(__name__)

FETCHES_IN_FLIGHT = 2
"""FETCHes of one track of a completed segment open at once: the next is sent while the
previous one's objects arrive, so the link does not wait a round trip per FETCH."""

#: PUBLISH_DONE codes that end a subscription because its source went away, not because
#: the track ended or was refused: the transfer goes on elsewhere.
SOURCE_LOST = frozenset({PublishDoneCode.INTERNAL_ERROR, PublishDoneCode.GOING_AWAY,
                         PublishDoneCode.EXCESSIVE_LOAD, PublishDoneCode.TOO_FAR_BEHIND})


class Progress:
    """Wake-ups and the time of the last progress of one retrieval (all its segments).

    The no-progress clock runs from the ARRIVAL of the newest object that was then
    verified and placed, not from when it was placed: on a loaded machine objects wait
    for their batch's SHA-256 and for the event loop (0.18 s and 2.86 s after the last
    byte measured on 2 shared cores), and a clock started then pushed the transfer's
    and recovery's deadlines past the budgets promised from the last byte (issue #27)."""

    def __init__(self, stats: ConsumerStats | None = None) -> None:
        self.ready = asyncio.Event()
        """Set when a layer may have become ready, a feeder ended or a manifest arrived."""
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        """When the newest progress arrived (``loop.time()``, i.e. ``time.monotonic()``)."""
        self.stats = stats

    def made(self, arrived: float | None = None) -> None:
        """Something was verified and placed (an object that arrived at ``arrived``,
        default now): the no-progress clock restarts from then."""
        at = self.loop.time() if arrived is None else arrived
        if at > self.last:
            self.last = at
            if self.stats is not None:
                self.stats.last_progress_at = at


Received = tuple["SegmentRun", Component, ReceivedObject, Properties, "Publication | None",
                 float]
"""A received object on its way to a segment's assembler: (run, kind, object, the track
properties it inherits a priority from, the publication when another one's, when it
arrived)."""

_Run = tuple["SegmentRun", Component, list[ReceivedObject], Properties, "Publication | None",
             float]
"""Received objects of one track that arrived together, as :data:`Received` but a list."""


class Intake:
    """The received objects of one retrieval on their way to the assemblers, in batches:
    the SHA-256 of each plaintext object's Data is computed for a whole batch at once (in
    the worker thread when the batch is large, :mod:`kvcs.kvnet.offload`), then each
    object is verified and placed on the event-loop thread, in arrival order, the objects
    of a track that arrived together in one call
    (:meth:`~kvcs.kv.assembly.LayerAssembler.accept_run`). A batch is what arrived while
    the previous one was hashed (at least one loop turn's)."""

    def __init__(self, low_water: int | None = None,
                 stats: ConsumerStats | None = None, batch_bytes: int | None = None) -> None:
        self._pending: list[tuple[_Run, int]] = []
        self._task: asyncio.Task[None] | None = None
        self.queued = 0
        """Objects queued so far."""
        self.done = 0
        """Objects verified (or refused) so far, in queueing order."""
        self.held = 0
        """Payload bytes of the objects queued and not yet verified and placed (those of a
        batch are given back once the whole batch is placed: it holds them until then)."""
        self.low_water = low_water
        """:meth:`room` waits while more than this many bytes are held (None: never)."""
        self.stats = stats
        self.batch_bytes = batch_bytes
        """Most bytes hashed and placed in one batch (None: all that waits). With a low
        water, smaller batches give bytes back sooner: the next FETCH goes out while the
        following batch is hashed, instead of the link idling through one batch of all
        that is held."""
        self._settled = asyncio.Event()
        self._room = asyncio.Event()

    @property
    def pending(self) -> int:
        """Objects queued and not yet verified."""
        return self.queued - self.done

    def put(self, item: Received) -> None:
        """Queue one object (others than normal ones are dropped: they carry no block)."""
        run, kind, obj, track_properties, pub, arrived = item
        if obj.status != ObjectStatus.NORMAL:
            return
        self._queue((run, kind, [obj], track_properties, pub, arrived), 1)

    def put_run(self, run: SegmentRun, kind: Component, objs: Sequence[ReceivedObject],
                track_properties: Properties, pub: Publication | None,
                arrived: float) -> None:
        """Queue objects of one track that arrived together, as :meth:`put` queues each."""
        normal = ObjectStatus.NORMAL
        if all(o.status == normal for o in objs):
            kept = objs if isinstance(objs, list) else list(objs)
        else:
            kept = [o for o in objs if o.status == normal]
        if kept:
            self._queue((run, kind, kept, track_properties, pub, arrived), len(kept))

    def _queue(self, entry: _Run, count: int) -> None:
        nbytes = sum([len(o.payload) for o in entry[2]])
        self._pending.append((entry, nbytes))
        self.queued += count
        self.held += nbytes
        stats = self.stats
        if stats is not None and self.held > stats.intake_peak_bytes:
            stats.intake_peak_bytes = self.held
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def room(self) -> None:
        """Wait until at most :attr:`low_water` bytes are held (at once if so, or if there
        is no low water). A completed segment's next FETCH waits for this
        (:meth:`SegmentRun._fetch_layers`): QUIC returns a stream's flow-control credit as
        the session reads the bytes, not as they are verified, so this is the only bound
        on what a fast relay leaves queued here."""
        while self.low_water is not None and self.held > self.low_water:
            self._room.clear()
            await self._room.wait()

    async def settle(self) -> None:
        """Wait until the objects queued so far (not those that arrive meanwhile) are
        verified and placed."""
        target = self.queued
        while self.done < target and self._task is not None:
            self._settled.clear()
            await self._settled.wait()

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._take_batch()
                # protected objects are hashed once decrypted, by the assembler
                digests = await sha256_digests(
                    [o.payload[HEADER_SIZE:] for (run, _, objs, *_), _ in batch
                     if run.assembler.secure is None for o in objs])
                at = 0
                placed = 0
                for (run, kind, objs, props, pub, arrived), nbytes in batch:
                    if run.assembler.secure is None:
                        known: Sequence[bytes | None] | None = digests[at:at + len(objs)]
                        at += len(objs)
                    else:
                        known = None
                    run.take_run(kind, objs, props, pub, known, arrived)
                    self.done += len(objs)
                    placed += nbytes
                del batch, digests, objs, known
                self.held -= placed
                self._settled.set()
                if self.low_water is not None and self.held <= self.low_water:
                    self._room.set()
        finally:
            self._task = None
            self._settled.set()
            self._room.set()

    def _take_batch(self) -> list[tuple[_Run, int]]:
        """The next batch: what waits, in arrival order, up to :attr:`batch_bytes`."""
        pending, limit = self._pending, self.batch_bytes
        if limit is None:
            self._pending = []
            return pending
        size = count = 0
        for _, nbytes in pending:
            count += 1
            size += nbytes
            if size >= limit:
                break
        batch = pending[:count]
        del pending[:count]
        return batch

    async def flush(self) -> None:
        """Wait until every object queued so far is verified and placed."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def close(self) -> None:
        """Drop what is queued (the retrieval has ended)."""
        self._pending.clear()
        self.held = 0
        self._room.set()
        if self._task is not None:
            self._task.cancel()


class SegmentRun:
    """The transfer of one segment of a :class:`~kvcs.kvnet.retrieval.Retrieval`: feeds
    every object of its selected tracks to a :class:`LayerAssembler`, and fetches its
    missing blocks when recovery asks (:meth:`fetch_missing`)."""

    def __init__(self, retrieval: Retrieval, seg: Segment, n: int, row: int) -> None:
        c = retrieval.consumer
        self.r = retrieval
        self.c = c
        self.seg = seg
        self.n = n
        self.row = row
        """Where the segment's tokens start in a layer of the retrieval."""
        self.assembler = LayerAssembler(
            c.descriptor, retrieval.layers, n, tracks=select_tracks(seg, c.codecs),
            first_block=seg.first_block, block_keys=c.keys,
            require_signed=c.require_signed, secure=c.secure, namespace=retrieval.pub.fields,
            key_wait_s=c.key_wait_s, stats=c.stats,
            arrays=None if retrieval.into is None else self._arrays)
        self.assembler.use_manifest(retrieval.manifest)
        self.feeding = 0
        """Feeders (one per selected track) still running."""
        self.interrupted = False
        """A feeder lost its source (session ended, relay or publisher gone): the run goes
        on elsewhere (:meth:`resume`)."""
        self.resumes = 0
        self.popped: dict[int, KvLayer] = {}
        """Layers assembled but not yet yielded (waiting for the other segments)."""

    @property
    def complete(self) -> bool:
        """The segment is complete (as far as the newest manifest version read says)."""
        seg = self.r.manifest.segment(self.seg.segment)
        return seg is not None and seg.complete

    def start(self, ep: Endpoint) -> list[asyncio.Task[None]]:
        """Start one feeder per selected track."""
        retrieval = self.c.relay_profile.track_retrieval(self.complete)
        tasks = [asyncio.create_task(self._feed(ep, kind, track.format(), retrieval))
                 for kind, track in self.assembler.tracks.items()]
        self.feeding += len(tasks)
        return tasks

    def _arrays(self, layer: int) -> LayerArrays:
        """This segment's rows of the caller's arrays of ``layer``."""
        assert self.r.into is not None
        k, v = self.r.into[layer]
        rows = slice(self.row, self.row + self.n * self.c.descriptor.block_tokens)
        return k[rows], v[rows]

    def resume(self, ep: Endpoint) -> list[asyncio.Task[None]]:
        """Go on on ``ep`` after the source was lost: the missing blocks of a completed
        segment are fetched; a live one is retrieved again (duplicates are dropped)."""
        self.interrupted = False
        self.resumes += 1
        missing = self.assembler.missing()
        if not missing:
            return []
        log.info("resuming segment %d (%d incomplete layer(s)) after losing its source",
                 self.seg.segment, len(missing))
        if not self.complete:
            return self.start(ep)
        layers = sorted(missing)
        blocks = sorted({b for bs in missing.values() for b in bs})
        tasks = [asyncio.create_task(self._feed(ep, kind, track.format(),
                                                TrackRetrieval.FETCH, layers, blocks))
                 for kind, track in self.assembler.tracks.items()]
        self.feeding += len(tasks)
        return tasks

    def _source_lost(self, sub: Subscription) -> None:
        """Note a subscription that ended without its track ending."""
        if sub.done is None or sub.done.status in SOURCE_LOST:
            self.interrupted = True

    def same_segment(self, m: Manifest) -> bool:
        """``m`` (an alternate publication's manifest) has this segment with the same blocks
        and our tracks, so its objects sit at the same Locations."""
        other = m.segment(self.seg.segment)
        return other is not None and other.first_block == self.seg.first_block and \
            other.block_keys_sha256 == self.seg.block_keys_sha256 and \
            all(t.format() in other.tracks for t in self.assembler.tracks.values())

    def take_run(self, kind: Component, objs: Sequence[ReceivedObject],
                 track_properties: Properties, pub: Publication | None,
                 data_sha256: Sequence[bytes | None] | None,
                 arrived: float | None = None) -> None:
        """Give received objects of one track that arrived together (of ``pub``, default
        this publication) to the assembler in one call
        (:meth:`~kvcs.kv.assembly.LayerAssembler.accept_run`; :class:`Intake` computed
        ``data_sha256``, the SHA-256 of each one's Data, if not None); note progress (as of
        ``arrived``, when they arrived), wake the loop when a layer completed or an object
        waits for its content key. ``track_properties`` (of the SUBSCRIBE_OK / FETCH_OK)
        give the priority an object inherits (protected objects authenticate it)."""
        outcomes = self.assembler.accept_run(
            kind, objs, data_sha256=data_sha256, track_properties=track_properties,
            namespace=None if pub is None or pub is self.r.pub else pub.fields)
        progress = self.r.progress
        if Outcome.PLACED in outcomes:
            progress.made(arrived)
        if Outcome.LAYER_COMPLETE in outcomes:
            progress.made(arrived)
            progress.ready.set()
        elif Outcome.HELD in outcomes:
            progress.ready.set()  # the loop's wait now ends at its key_wait_s

    # -- transfer --------------------------------------------------------------------

    def _fetch_params(self, ep: Endpoint, blocks: Sequence[int] | None = None,
                      ) -> tuple[RangeFilter, ...]:
        """OBJECTID_FILTER for the needed blocks, when the peer allows enough ranges."""
        wanted = sorted(set(blocks)) if blocks is not None else list(range(self.n))
        ranges: list[tuple[int, int | None]] = []
        for b in wanted:
            if ranges and ranges[-1][1] == b - 1:
                ranges[-1] = (ranges[-1][0], b)
            else:
                ranges.append((b, b))
        if ranges == [(0, self.seg.blocks - 1)]:
            return ()  # everything: no filter needed
        limit = ep.peer_max_filter_ranges
        if not limit:
            return ()
        if len(ranges) > limit:
            ranges = [(wanted[0], wanted[-1])]
        return (RangeFilter(PARAM_OBJECTID_FILTER, 0, tuple(ranges)),)

    async def _feed(self, ep: Endpoint, kind: Component, name: str,
                    retrieval: TrackRetrieval, layers: Sequence[int] | None = None,
                    blocks: Sequence[int] | None = None) -> None:
        pub = self.r.pub
        try:
            if retrieval is TrackRetrieval.FETCH:
                await self._fetch_layers(ep, pub, kind, name,
                                         self.assembler.layers if layers is None else layers,
                                         blocks, windowed=True)
            elif retrieval is TrackRetrieval.SUBSCRIBE_FROM_START:
                await self._subscribe_from_start(ep, kind, name)
            else:
                # the fill reaches only inside the current group: FETCH every layer before it
                layers = self.assembler.layers
                await self._subscribe_and_fetch(
                    ep, kind, name, LocationFilter.relative_start(1),
                    lambda largest: range(layers.start, min(largest.group, layers.stop)))
        except (MoqtRequestError, ConnectionError, SessionUsageError) as exc:
            log.warning("retrieval of %s failed: %s", name, exc)
            # the source went away (or again, once resumed); a refusal of the first
            # request is final (the publication is not there), unless this retrieval has
            # received objects already: then the publication was there and its publisher
            # lost its session mid-transfer (qh3 2.1's stream-reservation error closes
            # it; a ReconnectingTarget publishes again within a second or two), so the
            # run goes on within the no-progress budget
            if self.resumes or self.r.intake.queued or \
                    not isinstance(exc, MoqtRequestError) or exc.code in TRANSIENT:
                self.interrupted = True
        finally:
            self.feeding -= 1
            self.r.progress.ready.set()

    async def _subscribe_from_start(self, ep: Endpoint, kind: Component, name: str) -> None:
        """A live track behind a relay that fills from any Location: SUBSCRIBE Next Object
        with a fill from the first wanted layer (Absolute Start), every layer exactly once.
        When the wanted layers are more than one windowed FETCH holds
        (:attr:`Retrieval.fetch_step`), the fill reaches only that many (Absolute Group
        End) and the layers after them up to the Largest Object are FETCHed within the
        window while the subscription runs: a consumer that joins a mostly finished
        segment then holds no more than it would pulling the segment completed (a
        whole-track fill comes at the relay's full speed, 10 of 12 layers queued at once
        in tests/e2e/test_completed_pull_memory.py, whatever verification keeps up
        with)."""
        layers, step = self.assembler.layers, self.r.fetch_step
        if step is None or layers.start + step >= layers.stop:
            # the document's exactly-once pattern (Retrieval during Production)
            await self._subscribe_and_fetch(
                ep, kind, name, LocationFilter.absolute_start(layers.start, 0),
                lambda largest: ())
            return
        await self._subscribe_and_fetch(
            ep, kind, name, LocationFilter.absolute_group_end(layers.start, 0, step - 1),
            lambda largest: range(layers.start + step, min(largest.group + 1, layers.stop)))

    async def _subscribe_and_fetch(self, ep: Endpoint, kind: Component, name: str,
                                   fill: LocationFilter,
                                   fetched: Callable[[Location], Sequence[int]]) -> None:
        """SUBSCRIBE Next Object with a ``fill`` and FETCH (within the fetch window) the
        layers ``fetched`` names for the SUBSCRIBE_OK's Largest Object, while the
        subscription runs, none of them past that Largest Object: the subscription brings
        every Location after it, so ``fill`` and ``fetched`` must cover the wanted ones up
        to it (overlaps would be harmless: duplicates are dropped)."""
        pub = self.r.pub
        sub = await ep.subscribe(pub.fields, name.encode(),
                                 location_filter=LocationFilter.next_object(),
                                 fill=Parameters(location_filter=fill), priority=0)
        live = asyncio.create_task(self._take_all(sub, kind, sub.track_properties))
        try:
            largest = sub.largest
            if largest is not None:
                past = fetched(largest)
                if past:
                    await self._fetch_layers(ep, pub, kind, name, past, windowed=True,
                                             end=largest)
            await live
            self._source_lost(sub)
        finally:
            live.cancel()
            with contextlib.suppress(BaseException):
                await live
            if not sub.finished:
                with contextlib.suppress(ConnectionError, KeyError, ValueError):
                    await sub.cancel()

    def layer_bytes(self) -> int:
        """The bytes of one layer's objects of this segment in its selected tracks, as raw
        encoding has them (payload header and Data): what a FETCH of one layer brings.
        Other encodings (q8, zstd) bring fewer; a protected object adds its tag and Key
        ID."""
        k, v = self.c.descriptor.raw_bytes()
        size = {Component.K: k, Component.V: v, Component.KV: k + v}
        return self.n * sum(HEADER_SIZE + size[kind] for kind in self.assembler.tracks)

    async def _fetch_layers(self, ep: Endpoint, pub: Publication, kind: Component, name: str,
                            layers: Sequence[int], blocks: Sequence[int] | None = None,
                            *, windowed: bool = False, end: Location | None = None) -> None:
        """FETCH ``layers`` of a track (of ``blocks``, default all) and give every object to
        the assembler. ``windowed`` (a completed segment, its resumption and recovery):
        :attr:`Retrieval.fetch_step` layers per FETCH, at most :data:`FETCHES_IN_FLIGHT`
        of them open at once, each sent when the intake holds at most its low water
        (:meth:`Intake.room`), so that a relay sending at full speed never leaves more
        than about ``KvConsumer.fetch_window`` bytes waiting for verification. ``end``:
        nothing after this Location is fetched (what a subscription brings)."""
        rf = self._fetch_params(ep, blocks)
        spans = self.c.relay_profile.fetch_spans(layers)
        step = self.r.fetch_step if windowed else None
        if step is None:
            for a, b in spans:
                await self._fetch_span(ep, pub, kind, name, a, b, rf, end=end)
            return
        intake = self.r.intake
        opened: set[asyncio.Task[None]] = set()
        try:
            for a, b in spans:
                for first in range(a, b + 1, step):
                    while len(opened) >= FETCHES_IN_FLIGHT:
                        opened = await _one_ended(opened)
                    await intake.room()
                    opened.add(asyncio.create_task(self._fetch_span(
                        ep, pub, kind, name, first, min(first + step - 1, b), rf,
                        flush=False, end=end)))
            while opened:
                opened = await _one_ended(opened)
        finally:
            for t in opened:
                t.cancel()
            for t in opened:
                with contextlib.suppress(BaseException):
                    await t
        await intake.flush()

    async def _fetch_span(self, ep: Endpoint, pub: Publication, kind: Component, name: str,
                          a: int, b: int, rf: tuple[RangeFilter, ...],
                          flush: bool = True, end: Location | None = None) -> None:
        """FETCH layers ``a..b`` of a track: one FETCH, or one per layer from a relay that
        refuses multi-group FETCH."""
        try:
            await self._fetch(ep, pub, kind, name, a, b, rf, flush, end)
        except MoqtRequestError as exc:
            if b == a or exc.code not in (RequestErrorCode.NOT_SUPPORTED,
                                          RequestErrorCode.INVALID_RANGE,
                                          RequestErrorCode.INTERNAL_ERROR):
                raise
            # relays that refuse multi-group FETCH: one FETCH per layer
            for g in range(a, b + 1):
                await self._fetch(ep, pub, kind, name, g, g, rf, flush, end)

    async def _fetch(self, ep: Endpoint, pub: Publication, kind: Component, name: str,
                     first: int, last: int, rf: tuple[RangeFilter, ...],
                     flush: bool = True, end: Location | None = None) -> None:
        """FETCH layers ``first..last`` of a track (none of its objects after ``end``) and
        give every object to the assembler."""
        if end is not None and end.group == last:
            lf = LocationFilter.absolute_range(first, 0, last - first, end.object)
        else:
            lf = LocationFilter.absolute_group_end(first, 0, last - first)
        res = await ep.fetch(pub.fields, name.encode(), range_filters=rf, location_filter=lf)
        props = res.ok.track_properties if res.ok is not None else ()
        await self._take_all(res, kind, props, pub, flush)

    async def _take_all(self, stream: Subscription | FetchResult, kind: Component,
                        track_properties: Properties, pub: Publication | None = None,
                        flush: bool = True) -> None:
        """Give every object of a subscription or fetch to the retrieval's intake until
        it ends (each as it is parsed: a callback, no queue; those queued before through
        the iterator) and (``flush``) wait until they are all verified and placed."""
        put, put_run = self.r.intake.put, self.r.intake.put_run
        now = asyncio.get_running_loop().time
        # the objects parsed together (a read's run of this track) in one call each
        stream.deliver_runs_to(
            lambda objs: put_run(self, kind, objs, track_properties, pub, now()))
        async for obj in stream:
            put((self, kind, obj, track_properties, pub, now()))
        if flush:
            await self.r.intake.flush()

    async def fetch_missing(self, ep: Endpoint, pub: Publication,
                            missing: dict[int, list[int]], deadline: float) -> None:
        """FETCH the ``missing`` blocks of each selected track of ``pub`` (this publication
        or a deterministic alternate) from ``ep`` until ``deadline`` (``time.monotonic``)."""
        if ep.is_closed:
            return
        layers = sorted(missing)
        blocks = sorted({b for bs in missing.values() for b in bs})
        for kind, track in self.assembler.tracks.items():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            name = track.format()
            try:
                await asyncio.wait_for(
                    self._fetch_layers(ep, pub, kind, name, layers, blocks, windowed=True),
                    left)
            # SessionUsageError: the session closed after the is_closed check above (a
            # relay killed mid-recovery; make faults on a loaded host raised it out of
            # the retrieval instead of naming the missing blocks)
            except (MoqtRequestError, ConnectionError, TimeoutError, SessionUsageError) as exc:
                log.info("recovery fetch of %s failed: %s", name, exc or "timeout")


async def _one_ended(tasks: set[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
    """Wait until one of ``tasks`` (FETCHes) has ended; the others. The first failure of
    those that ended is raised (ending the feeder)."""
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    failed = [exc for t in done if (exc := t.exception()) is not None]
    if failed:
        tasks.clear()
        tasks.update(pending)  # the caller's set: it cancels them
        raise failed[0]
    return pending


class MoqtSource:
    """An endpoint and a publication recovery asks for a segment's missing blocks: the
    retrieval's own publication, or (``manifest`` given) a deterministic alternate whose
    objects sit at the same Locations."""

    def __init__(self, endpoint: Endpoint, pub: Publication,
                 manifest: Manifest | None = None) -> None:
        self.endpoint = endpoint
        self.pub = pub
        self.manifest = manifest

    def describe(self) -> str:
        return self.pub.namespace.publication_id.hex()[:8]

    async def recover(self, segment: SegmentRun, deadline: float) -> bool:
        """FETCH what ``segment`` misses; False if there was nothing to ask this source."""
        missing = segment.assembler.missing()
        if not missing or (self.manifest is not None and not segment.same_segment(self.manifest)):
            return False
        log.info("recovering %d incomplete layer(s) of segment %d from %s",
                 len(missing), segment.seg.segment, self.describe())
        await segment.fetch_missing(self.endpoint, self.pub, missing, deadline)
        return True
