"""The relay's disk tier: completed tracks kept in files, so a restarted relay serves them.

``kvcs relay --store DIR --store-bytes N``. One file per complete track (its namespace's
cached tracks all complete: a completed publication), written once, atomically (temporary
name, fsync, rename, fsync of the directory), holding what the cache holds: Track
Properties (MAX_CACHE_DURATION included), Largest Object, End of Track, and every object
with its header fields, payload bytes as received and arrival time (wall clock, so that
age keeps counting across a restart).

Integrity. The relay never reads payloads (they may be protected, and it does not import
the KV layer), so it cannot check an object against its publication's manifest. Beside
each object's bytes it writes their SHA-256, and on load it checks every object against
it (and the header against its own SHA-256): a torn or corrupt file is logged, deleted and
never served. The consumer still verifies every object against the manifest end to end;
the digest only proves that the disk returned what the relay cached.

Budget. ``--store-bytes`` bounds the files' total size; saving past it evicts the least
recently used publications first (a file's modification time is its last use: a load
touches it, so the order survives restarts). A publication leaves the store whole: a
namespace with a track missing could not be advertised as completed.

File layout: ``KVCSTRK1`` | header length (8 bytes, big endian) | SHA-256 of the header |
header (JSON) | payloads, in header order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..auth import render_namespace
from ..errors import KvcsError
from ..moqt.track import CachedObject, FullTrackName, Track
from ..moqt.wire import Location, Properties, TrackNamespace, namespace_has_prefix

log = logging.getLogger(__name__)

MAGIC = b"KVCSTRK1"
SUFFIX = ".kvtrack"
_PREAMBLE = len(MAGIC) + 8 + 32


class StoreError(KvcsError, ValueError):
    """A stored file is torn or corrupt."""


@dataclass
class SavePlan:
    """A track about to be written: its file, header and object snapshot."""

    key: FullTrackName
    path: Path
    header: dict[str, Any]
    objects: list[CachedObject]


@dataclass
class StoredTrack:
    """What the store knows of one file without reading its payloads."""

    key: FullTrackName
    path: Path
    size: int
    last_used: float
    newest: float
    """Wall-clock arrival of the newest object (age of the whole file)."""
    max_age_s: float | None


def _key_file(key: FullTrackName) -> str:
    h = hashlib.sha256()
    for field in key[0]:
        h.update(len(field).to_bytes(4, "big") + field)
    h.update(b"\xff" + key[1])
    return h.hexdigest()[:40] + SUFFIX


def _props_out(props: Properties) -> list[list[Any]]:
    return [[k, v.hex() if isinstance(v, bytes | bytearray) else v,
             isinstance(v, bytes | bytearray)] for k, v in props]


def _props_in(raw: Any) -> Properties:
    return tuple((int(k), bytes.fromhex(v) if is_bytes else int(v)) for k, v, is_bytes in raw)


def _loc(raw: Any) -> Location | None:
    return None if raw is None else Location(int(raw[0]), int(raw[1]))


class Store:
    """Complete tracks on disk under ``directory``, at most ``budget`` bytes of files."""

    def __init__(self, directory: str | Path, budget: int,
                 wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self.dir = Path(directory)
        self.budget = budget
        self._wall = wall
        self._mono = mono
        self.entries: dict[FullTrackName, StoredTrack] = {}
        self.skipped = 0
        """Files found torn or corrupt (logged, deleted, never served)."""
        self.evicted = 0
        """Tracks removed for space."""

    @property
    def bytes(self) -> int:
        """Total size of the stored files."""
        return sum(e.size for e in self.entries.values())

    # ------------------------------------------------------------------ index

    def scan(self) -> None:
        """Index the directory (headers only); creates it if needed. Leftover temporary
        files of an interrupted save are deleted; torn or corrupt files are skipped."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.dir.iterdir()):
            if path.name.startswith(".") and ".tmp" in path.name:
                path.unlink(missing_ok=True)  # a save that never reached its rename
                continue
            if path.suffix != SUFFIX:
                continue
            try:
                header, _ = self._read_header(path)
                self._index(path, header)
            except (OSError, StoreError, ValueError, KeyError, IndexError, TypeError) as exc:
                self._skip(path, exc)
        log.info("store %s: %d tracks, %d bytes", self.dir, len(self.entries), self.bytes)

    def _skip(self, path: Path, exc: Exception) -> None:
        self.skipped += 1
        log.error("store: skipping %s: %s", path, exc)
        path.unlink(missing_ok=True)
        for key, e in list(self.entries.items()):
            if e.path == path:
                del self.entries[key]

    def _read_header(self, path: Path) -> tuple[dict[str, Any], int]:
        with path.open("rb") as f:
            pre = f.read(_PREAMBLE)
            if len(pre) != _PREAMBLE or not pre.startswith(MAGIC):
                raise StoreError("not a stored track (bad preamble)")
            hlen = int.from_bytes(pre[len(MAGIC):len(MAGIC) + 8], "big")
            raw = f.read(hlen)
        if len(raw) != hlen or hashlib.sha256(raw).digest() != pre[len(MAGIC) + 8:]:
            raise StoreError("header torn or corrupt")
        try:
            header = json.loads(raw)
        except ValueError as exc:
            raise StoreError(f"header: {exc}") from None
        need = _PREAMBLE + hlen + sum(int(o[6]) for o in header["objects"])
        if path.stat().st_size != need:
            raise StoreError(f"torn: {path.stat().st_size} bytes, expected {need}")
        return header, _PREAMBLE + hlen

    def _index(self, path: Path, header: dict[str, Any]) -> StoredTrack:
        key = (tuple(bytes.fromhex(f) for f in header["namespace"]),
               bytes.fromhex(header["name"]))
        props = _props_in(header["properties"])
        probe = Track(key[0], key[1], props)
        dur = probe.max_cache_duration_ms
        newest = max((float(o[8]) for o in header["objects"]), default=header["saved"])
        entry = StoredTrack(key, path, path.stat().st_size, path.stat().st_mtime, newest,
                            None if dur is None else dur / 1000.0)
        self.entries[key] = entry
        return entry

    def has(self, key: FullTrackName) -> bool:
        """True if track ``key`` is stored."""
        return key in self.entries

    def namespaces(self) -> list[TrackNamespace]:
        """The namespaces of the stored tracks, once each."""
        return list(dict.fromkeys(k[0] for k in self.entries))

    def holds(self, prefix: TrackNamespace) -> bool:
        """True if some stored track's namespace starts with ``prefix``."""
        return any(namespace_has_prefix(k[0], prefix) for k in self.entries)

    # ------------------------------------------------------------------ saving

    def save(self, track: Track) -> bool:
        """Write the complete ``track`` now (:meth:`plan`, :meth:`write`, :meth:`commit`);
        False if it cannot fit the budget."""
        plan = self.plan(track)
        if plan is None:
            return False
        self.write(plan)
        self.commit(plan)
        return True

    def plan(self, track: Track) -> SavePlan | None:
        """On the event loop: snapshot ``track``'s objects, make room (LRU eviction) and
        return what :meth:`write` (thread-safe: it touches no index) puts on disk; None
        if the track is larger than the whole budget."""
        objs = list(track.objects(Location(0, 0)))
        wall, mono = self._wall(), self._mono()
        size = sum(len(o.payload) for o in objs)
        header = {
            "namespace": [f.hex() for f in track.namespace], "name": track.name.hex(),
            "properties": _props_out(track.properties),
            "largest": None if track.largest is None else list(track.largest),
            "end_of_track": None if track.end_of_track is None else list(track.end_of_track),
            "saved": wall,
            "objects": [[o.group_id, o.object_id, o.subgroup_id, o.publisher_priority,
                         o.status, _props_out(o.properties), len(o.payload), "",
                         wall - (mono - o.arrived) if o.arrived else wall] for o in objs],
        }
        key = track.full_name
        total = _PREAMBLE + len(json.dumps(header)) + 64 * len(objs) + size
        if total > self.budget:
            log.warning("store: track %r (%d bytes) is larger than the store budget",
                        track.name, total)
            return None
        self.remove(key, "replaced")
        self._make_room(total, keep=key[0])
        return SavePlan(key, self.dir / _key_file(key), header, objs)

    @staticmethod
    def write(plan: SavePlan) -> None:
        """Write the file atomically: temporary name, fsync, rename, fsync the directory
        (a crash leaves the old state or the new one, never a torn file under the name)."""
        for row, o in zip(plan.header["objects"], plan.objects, strict=True):
            row[7] = hashlib.sha256(o.payload).hexdigest()
        raw = json.dumps(plan.header, separators=(",", ":")).encode()
        path = plan.path
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with tmp.open("wb") as f:
            f.write(MAGIC + len(raw).to_bytes(8, "big") + hashlib.sha256(raw).digest())
            f.write(raw)
            for o in plan.objects:
                f.write(o.payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def commit(self, plan: SavePlan) -> None:
        """On the event loop, after :meth:`write`: index the new file."""
        self._index(plan.path, plan.header)
        key = plan.key
        self.used(key)
        log.info("store: saved %s/%r (%d objects, %d bytes)", render_namespace(key[0]),
                 key[1], len(plan.objects), self.entries[key].size)

    def _make_room(self, need: int, keep: TrackNamespace) -> None:
        """Evict least recently used publications (whole namespaces, not ``keep``) until
        ``need`` more bytes fit."""
        while self.bytes + need > self.budget:
            victims = [e for e in self.entries.values() if e.key[0] != keep]
            if not victims:
                return
            ns = min(victims, key=lambda e: e.last_used).key[0]
            for key in [k for k in self.entries if k[0] == ns]:
                self.remove(key, "bytes")
                self.evicted += 1

    def remove(self, key: FullTrackName, reason: str) -> None:
        """Delete a stored track."""
        entry = self.entries.pop(key, None)
        if entry is not None:
            entry.path.unlink(missing_ok=True)
            log.info("store: removed %s/%r (%s)", render_namespace(key[0]), key[1], reason)

    def expire(self) -> list[FullTrackName]:
        """Delete the tracks whose every object is older than MAX_CACHE_DURATION; returns
        their names."""
        now = self._wall()
        gone = [k for k, e in self.entries.items()
                if e.max_age_s is not None and now - e.newest > e.max_age_s]
        for key in gone:
            self.remove(key, "age")
        return gone

    # ------------------------------------------------------------------ loading

    def load(self, key: FullTrackName) -> Track | None:
        """Read and verify a stored track (:meth:`read`), or None (logged, file deleted)
        if it is torn, corrupt or gone."""
        try:
            track = self.read(key)
        except (OSError, StoreError) as exc:
            self.discard(key, exc)
            return None
        self.used(key)
        return track

    def used(self, key: FullTrackName) -> None:
        """Mark a stored track as just used (LRU; kept across restarts as the mtime)."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.last_used = now = self._wall()
            with contextlib.suppress(OSError):
                os.utime(entry.path, (now, now))

    def discard(self, key: FullTrackName, exc: Exception) -> None:
        """A stored track turned out torn or corrupt: log it and delete its file."""
        entry = self.entries.get(key)
        if entry is not None:
            self._skip(entry.path, exc)

    def read(self, key: FullTrackName) -> Track:
        """Read a stored track and verify every object against its SHA-256 (thread-safe:
        it touches no index); raises :class:`StoreError` (or OSError). The track comes
        back complete, each object with its arrival time, so MAX_CACHE_DURATION counts
        from when it first arrived (objects past it are dropped at once, as the cache
        would have)."""
        entry = self.entries.get(key)
        if entry is None:
            raise StoreError("not stored")
        try:
            return self._read(entry)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise StoreError(f"malformed: {exc}") from None

    def _read(self, entry: StoredTrack) -> Track:
        header, offset = self._read_header(entry.path)
        wall, mono = self._wall(), self._mono()
        track = Track(tuple(bytes.fromhex(f) for f in header["namespace"]),
                      bytes.fromhex(header["name"]), _props_in(header["properties"]),
                      clock=self._mono)
        with entry.path.open("rb") as f:
            f.seek(offset)
            for g, o, sub, prio, status, props, n, digest, arrived in header["objects"]:
                payload = f.read(n)
                if len(payload) != n or hashlib.sha256(payload).hexdigest() != digest:
                    raise StoreError(f"object {g}/{o}: digest mismatch")
                track.add(CachedObject(g, o, sub, prio, status, _props_in(props), payload,
                                       arrived=mono - (wall - float(arrived))))
        largest = _loc(header["largest"])
        if largest is not None and (track.largest is None or largest > track.largest):
            track.largest = largest
        track.finish(_loc(header["end_of_track"]))
        track.expire()
        return track
