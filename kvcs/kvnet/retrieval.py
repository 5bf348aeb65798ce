"""One retrieval of a layer range over consecutive segments of a publication: one
:class:`~kvcs.kvnet.moqt_source.SegmentRun` per segment, their layers joined in token
order, the manifest followed while a segment is live, waits bounded by the recompute
budget, interrupted transfers resumed elsewhere, then recovery
(:mod:`kvcs.kvnet.recovery`) of what is missing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..backoff import Backoff
from ..endpoint import Endpoint, MoqtRequestError
from ..errors import SessionError
from ..kv.assembly import KvLayer, LayerArrays
from ..kv.errors import KvcsError
from ..kv.manifest import Manifest, Segment
from .consumer_types import Publication, RecomputeRequired
from .manifest_track import ManifestTrack
from .moqt_source import Intake, Progress, SegmentRun
from .recovery import recover

if TYPE_CHECKING:
    from .consumer import KvConsumer

__all__ = ["RESUME_BACKOFF", "Retrieval"]

log = logging.getLogger(__name__)

RESUME_BACKOFF = Backoff(initial=0.05, maximum=1.0)
"""Waits before each turn of an interrupted transfer: from 25-50 ms up to 0.5-1 s, so that
a publisher or relay that is back within a second is used at once, and one that stays
away is asked about once a second until the budget ends."""


class Retrieval:
    """The I/O of one retrieval (see the module docstring). ``into``: the caller's arrays
    of each layer (all segments' rows), or None: new ones."""

    def __init__(self, consumer: KvConsumer, pub: Publication, manifest: Manifest,
                 plan: list[tuple[Segment, int]], layers: range, absolute: bool,
                 into: dict[int, LayerArrays] | None = None) -> None:
        self.consumer = consumer
        self.pub = pub
        self.manifest = manifest
        self.layers = layers
        self.absolute = absolute
        """Block indexes in RecomputeRequired are within the prefix (else the segment)."""
        self.into = into
        self.progress = Progress(consumer.stats)
        self.source: Endpoint = consumer.source(pub)
        """The endpoint the retrieval uses now."""
        self.runs: list[SegmentRun] = []
        row = 0
        for seg, n in plan:
            self.runs.append(SegmentRun(self, seg, n, row))
            row += n * consumer.descriptor.block_tokens
        window = consumer.fetch_window
        self.fetch_step: int | None = None
        """Layers per FETCH of a completed segment (None: one FETCH of all its layers per
        track): what a quarter of ``KvConsumer.fetch_window`` holds of one layer of every
        segment and track, at least one. With two FETCHes of each track open at once
        (:data:`~kvcs.kvnet.moqt_source.FETCHES_IN_FLIGHT`) and the next one sent only
        when the intake holds at most half the window, the intake never holds more than
        half the window plus what the open FETCHes bring: about the window."""
        if window is not None:
            layer = sum(r.layer_bytes() for r in self.runs)
            self.fetch_step = max(1, window // 4 // max(1, layer))
        self.intake = Intake(None if window is None else window // 2, consumer.stats,
                             None if window is None else max(1, window // 8))
        self.next = layers.start
        """The next layer to yield."""
        self.resumes = 0
        """Turns taken to go on with interrupted runs (successful or not)."""
        self._resume_delays = RESUME_BACKOFF.delays()
        self._tasks: list[asyncio.Task[None]] = []
        self._follower: asyncio.Task[None] | None = None
        self._own_tracks: list[ManifestTrack] = []

    @property
    def done(self) -> bool:
        return self.next >= self.layers.stop

    def wake(self) -> None:
        """Look again at what is held (e.g. a content key arrived)."""
        self.progress.ready.set()

    def ready(self) -> list[KvLayer]:
        """The next layers every segment has, joined (one segment: as assembled)."""
        for run in self.runs:
            for layer in run.assembler.pop_ready():
                run.popped[layer.index] = layer
        out: list[KvLayer] = []
        while not self.done and all(self.next in r.popped for r in self.runs):
            parts = [r.popped.pop(self.next) for r in self.runs]
            if self.into is not None:  # assembled in place: nothing to join
                out.append(KvLayer(self.next, *self.into[self.next],
                                   sum(p.blocks for p in parts)))
            elif len(parts) == 1:
                out.append(parts[0])
            else:
                out.append(KvLayer(self.next, np.concatenate([p.k for p in parts]),
                                   np.concatenate([p.v for p in parts]),
                                   sum(p.blocks for p in parts)))
            self.next += 1
        return out

    def _release_held(self) -> None:
        """Place the held objects whose content key has arrived, give up those whose wait
        ended (:meth:`LayerAssembler.release_held`)."""
        for r in self.runs:
            if r.assembler.release_held():
                self.progress.made()

    def _held_until(self) -> float | None:
        """When the first held object of any segment gives up (``time.monotonic``)."""
        return min((t for r in self.runs if (t := r.assembler.held_until) is not None),
                   default=None)

    def _live(self) -> bool:
        """Some segment of the retrieval is still produced (as far as the newest manifest
        version read says)."""
        for r in self.runs:
            seg = self.manifest.segment(r.seg.segment)
            if seg is None or not seg.complete:
                return True
        return False

    def _follow(self, track: ManifestTrack) -> None:
        self._follower = asyncio.create_task(self._follow_manifest(track))
        self._tasks.append(self._follower)

    async def _open_manifest(self, ep: Endpoint, timeout: float) -> ManifestTrack | None:
        """Subscribe to the manifest on ``ep`` (closed at the end of the retrieval) and use
        its current version; None if it cannot be read within ``timeout`` seconds."""
        try:
            track, m = await asyncio.wait_for(self.consumer.open_manifest(self.pub, ep),
                                              timeout)
        except (KvcsError, MoqtRequestError, ConnectionError, ValueError, TimeoutError):
            return None
        self._own_tracks.append(track)
        self._use_manifest(m)
        return track

    def _use_manifest(self, m: Manifest) -> None:
        self.manifest = m
        for r in self.runs:
            r.assembler.use_manifest(m)

    async def _resume(self, left: float) -> None:
        """Go on with the interrupted segment runs (see the consumer's module docstring),
        after a backoff, spending at most ``left`` seconds."""
        loop = self.progress.loop
        deadline = loop.time() + left
        await asyncio.sleep(min(next(self._resume_delays), left))
        ep = await self.consumer.pool.endpoint_to_resume(self.source, self.resumes,
                                                         deadline - loop.time())
        self.resumes += 1
        if ep is None:
            return  # nothing reachable now: the next turn tries again, within the budget
        self.source = ep
        self.consumer.stats.resumes += 1
        for r in self.runs:
            if r.interrupted:
                self._tasks += r.resume(ep)
        if self._live() and (self._follower is None or self._follower.done()):
            track = await self._open_manifest(ep, deadline - loop.time())
            if track is not None:
                self._follow(track)

    async def run(self, alternates: Sequence[Publication],
                  track: ManifestTrack | None) -> AsyncGenerator[KvLayer, None]:
        """Yield the layers in order; :class:`RecomputeRequired` for what stays missing."""
        budget = self.consumer.recompute_budget_s
        try:
            for r in self.runs:
                self._tasks += r.start(self.source)
            if self._live():
                if track is None:  # the caller gave a manifest: follow it ourselves
                    track = await self._open_manifest(self.source, budget)
                if track is not None:
                    self._follow(track)
            # transfer: wait while anything feeds or objects wait for their content key
            # (until add_content_key or their key_wait_s), at most ``budget`` without
            # progress; a run whose source was lost goes on elsewhere (_resume)
            settled: float | None = None
            while True:
                self._release_held()
                for layer in self.ready():
                    yield layer
                held_until = self._held_until()
                if self.done:
                    break
                left = self.progress.last + budget - self.progress.loop.time()
                if left <= 0 and self.intake.pending and settled != self.progress.last:
                    # what arrived in time counts from its arrival: judge it first (once)
                    settled = self.progress.last
                    await self.intake.settle()
                    continue
                if left <= 0:
                    log.warning("no progress for %.1f s (recompute budget): recovering", budget)
                    break
                if held_until is None and not any(r.feeding for r in self.runs):
                    if not any(r.interrupted for r in self.runs):
                        break
                    await self._resume(left)
                    continue
                if held_until is not None:
                    left = min(left, max(0.0, held_until - time.monotonic()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.progress.ready.wait(), left)
                self.progress.ready.clear()
            for layer in self.ready():
                yield layer
            if not self.done:
                # recovery has one budget from when the transfer's ran out (from the
                # arrival of the last progress), not from when this loop noticed
                start = min(time.monotonic(), self.progress.last + budget)
                async with contextlib.aclosing(
                        recover(self, alternates, start + budget)) as recovered:
                    async for layer in recovered:
                        yield layer
            if not self.done:
                raise self.recompute_required("objects missing or failed verification")
        finally:
            self.intake.close()
            for t in self._tasks:
                t.cancel()
            for t in self._tasks:
                with contextlib.suppress(BaseException):
                    await t
            for own in self._own_tracks:
                await own.close()

    async def _follow_manifest(self, track: ManifestTrack) -> None:
        """Newer manifest versions: their ``object_digests`` check and (signed) confirm
        layers, and a segment may have become complete."""
        try:
            while True:
                try:
                    blob = await track.next_version()  # decrypted when protected
                    if blob is None:
                        break
                    m = self.consumer.check_manifest(self.pub, blob, track.signed,
                                                     track.protected)
                except SessionError:  # a KvcsError too: the session or request went (below)
                    raise
                except (KvcsError, ValueError) as exc:
                    log.warning("discarding manifest version: %s", exc)
                    continue
                self._use_manifest(m)
                self.progress.made()
                self.progress.ready.set()  # newly listed layers may now be confirmed
        except (MoqtRequestError, ConnectionError) as exc:
            log.info("manifest follow ended: %s", exc)

    def recompute_required(self, reason: str) -> RecomputeRequired:
        """What is still missing, per layer not yielded, with what was verified of it."""
        missing: dict[int, list[int]] = {}
        partial: dict[int, KvLayer] = {}
        per_run = [(r, r.assembler.missing(), r.assembler.partial()) for r in self.runs]
        for layer in range(self.next, self.layers.stop):
            blocks: list[int] = []
            parts: list[KvLayer | None] = []
            for r, miss, part in per_run:
                offset = r.seg.first_block if self.absolute else 0
                got = r.popped.get(layer) or part.get(layer)
                blocks += [offset + b for b in miss.get(layer, ())]
                parts.append(got)
            if blocks:
                missing[layer] = blocks
            if any(p is not None for p in parts):
                partial[layer] = self._join(layer, parts)
        return RecomputeRequired(missing, self.next - self.layers.start, reason, partial)

    def _join(self, layer: int, parts: list[KvLayer | None]) -> KvLayer:
        """One layer of every segment's part (zeros where a segment has nothing)."""
        d = self.consumer.descriptor
        if self.into is not None:  # the parts are rows of the caller's arrays
            k, v = self.into[layer]
            for r, p in zip(self.runs, parts, strict=True):
                if p is None:
                    k[r.row:r.row + r.n * d.block_tokens] = 0
                    v[r.row:r.row + r.n * d.block_tokens] = 0
            return KvLayer(layer, k, v, sum(r.n for r in self.runs))
        if len(parts) == 1 and parts[0] is not None:
            return parts[0]
        ks, vs = [], []
        for r, p in zip(self.runs, parts, strict=True):
            rows = r.n * d.block_tokens
            ks.append(p.k if p is not None else np.zeros((rows, *d.k_shape()[1:]), d.dtype))
            vs.append(p.v if p is not None else np.zeros((rows, *d.v_shape()[1:]), d.dtype))
        return KvLayer(layer, np.concatenate(ks), np.concatenate(vs),
                       sum(r.n for r in self.runs))
