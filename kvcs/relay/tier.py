"""The disk tier in a running relay: when to save, load and forget stored tracks.

:class:`~kvcs.relay.store.Store` does the file work; this module decides:

* **Start.** The directory is indexed (headers only) and every stored namespace is
  published in the relay's own name, as a completed publication whose publisher left
  (docs/relay.md, Publish and go): SUBSCRIBE_NAMESPACE sees it, requests are answered.
* **Save.** At each sweep, every complete cached track whose namespace's cached tracks are
  all complete (a completed publication) and that is not stored yet is written, one
  track at a time, in a thread (a 128 MiB track must not stop the event loop).
* **Load.** A request for a track neither cached nor fed that the store holds waits while
  the file is read and verified in a thread, then is routed again: the track is in the
  cache, complete, and is served without asking anyone upstream.
* **Forget.** Age (MAX_CACHE_DURATION, counted from the objects' first arrival) deletes
  files; a kept namespace no longer held anywhere is withdrawn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from ..moqt import events as ev
from ..moqt.track import FullTrackName, Track
from .store import Store, StoreError

if TYPE_CHECKING:
    from .relay import Relay
    from .session import RelaySession

log = logging.getLogger(__name__)


class DiskTier:
    """The store of one relay (``--store``); see the module docstring."""

    def __init__(self, relay: Relay, store: Store) -> None:
        self.relay = relay
        self.store = store
        self._saving: asyncio.Task[None] | None = None
        self._loads: dict[FullTrackName, list[tuple[RelaySession, ev.RequestReceived]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._unwritable: set[FullTrackName] = set()
        """Tracks whose file could not be written (disk full...): not tried every sweep."""
        self._rerouting: set[FullTrackName] = set()
        """Tracks whose waiting requests are being routed again after a load: if the
        cache could not keep the track (larger than its budget), they go on without the
        store instead of loading it again."""
        self.loaded = 0
        """Tracks read back from disk (kvcs_relay_store_loads_total)."""
        self.saved = 0
        """Tracks written (kvcs_relay_store_saves_total)."""
        m = relay.metrics
        m.gauge("kvcs_relay_store_bytes", lambda: self.store.bytes)
        m.gauge("kvcs_relay_store_tracks", lambda: len(self.store.entries))
        m.gauge("kvcs_relay_store_saves_total", lambda: self.saved)
        m.gauge("kvcs_relay_store_loads_total", lambda: self.loaded)
        m.gauge("kvcs_relay_store_skipped_total", lambda: self.store.skipped)
        m.gauge("kvcs_relay_store_evictions_total", lambda: self.store.evicted)

    def start(self) -> None:
        """Index the directory and keep every stored namespace published."""
        self.store.scan()
        for ns in self.store.namespaces():
            self.relay.namespaces.keep_stored(ns)

    async def aclose(self) -> None:
        """Finish the save under way and save what is complete now (a graceful stop keeps
        everything completed); pending loads are abandoned."""
        for task in list(self._tasks):
            task.cancel()
        for _ in range(len(self._candidates()) + 1):
            if self._saving is not None:
                with contextlib.suppress(Exception):
                    await self._saving
            if not self._save_next():
                break

    # ------------------------------------------------------------------ saving

    def sweep(self) -> None:
        """Age out stored tracks, then start saving the next completed one."""
        for key in self.store.expire():
            if not self.store.holds(key[0]) and self.relay.origin.get(key) is None:
                self.relay.namespaces.release_kept(key[0])
        self._save_next()

    def _candidates(self) -> list[Track]:
        by_ns: dict[tuple[bytes, ...], list[Track]] = {}
        for t in self.relay.origin.tracks.values():
            by_ns.setdefault(t.namespace, []).append(t)
        out = []
        for tracks in by_ns.values():
            if all(t.complete for t in tracks):
                out += [t for t in tracks if t.count and not t.origin
                        and not self.store.has(t.full_name)
                        and t.full_name not in self._unwritable]
        return out

    def _save_next(self) -> bool:
        """Start writing one completed track; False if none is waiting or one is being
        written."""
        if self._saving is not None and not self._saving.done():
            return False
        todo = self._candidates()
        if not todo:
            return False
        plan = self.store.plan(todo[0])
        if plan is None:
            return False

        async def save() -> None:
            try:
                await asyncio.to_thread(Store.write, plan)
            except OSError as exc:
                log.error("store: cannot write %s: %s (not retried)", plan.path, exc)
                self._unwritable.add(plan.key)
                return
            self.store.commit(plan)
            self.saved += 1

        self._saving = asyncio.ensure_future(save())
        return True

    # ------------------------------------------------------------------ loading

    def route(self, peer: RelaySession, e: ev.RequestReceived, key: FullTrackName) -> bool:
        """Take request ``e`` if the store holds ``key``: it is routed again once the
        track is loaded. False if the store does not hold it."""
        if not self.store.has(key) or key in self._rerouting:
            return False
        waiting = self._loads.get(key)
        if waiting is not None:
            waiting.append((peer, e))
            return True
        self._loads[key] = [(peer, e)]
        task = asyncio.ensure_future(self._load(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def cancelled(self, peer: RelaySession, request_id: int) -> bool:
        """Forget a request waiting for a load; False if it is none."""
        for waiting in self._loads.values():
            for item in waiting:
                if item[0] is peer and item[1].request_id == request_id:
                    waiting.remove(item)
                    return True
        return False

    async def _load(self, key: FullTrackName) -> None:
        try:
            track: Track | None = await asyncio.to_thread(self.store.read, key)
        except (OSError, StoreError) as exc:
            self.store.discard(key, exc)
            track = None
        waiting = self._loads.pop(key, [])
        if track is not None:
            self.store.used(key)
            self.loaded += 1
            log.info("store: loaded %r (%d objects, %d bytes)", track.name, track.count,
                     track.bytes)
            if self.relay.origin.get(key) is None:
                self.relay.origin.add_track(track)
                self.relay.origin.added(0)
        elif not self.store.holds(key[0]) and not self.relay.origin.under(key[0]):
            self.relay.namespaces.release_kept(key[0])
        self._rerouting.add(key)
        try:
            for peer, e in waiting:
                if not peer.is_closed:
                    self.relay.route_again(peer, e)
        finally:
            self._rerouting.discard(key)
