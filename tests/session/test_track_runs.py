"""Track.extend: a run of objects stored in order, listeners told once per stretch."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvcs.moqt.track import CachedObject, ImmutabilityError, Track
from kvcs.moqt.wire import ObjectStatus


def _obj(g: int, o: int, status: int = ObjectStatus.NORMAL, data: bytes = b"x") -> CachedObject:
    return CachedObject(g, o, 0, 10, status, (), data if status == ObjectStatus.NORMAL else b"")


def _recording(track: Track) -> list[tuple[str, list[tuple[int, int]]]]:
    heard: list[tuple[str, list[tuple[int, int]]]] = []

    def listener(_t: Track, what: str, objs: Sequence[CachedObject]) -> None:
        heard.append((what, [(o.group_id, o.object_id) for o in objs]))

    track.listeners.append(listener)
    return heard


def test_extend_tells_one_run_per_stretch_then_closes_the_group() -> None:
    track = Track((b"ns",), b"t", origin=True)
    heard = _recording(track)
    run = [_obj(0, 0), _obj(0, 1), _obj(0, 2, ObjectStatus.END_OF_GROUP),
           _obj(1, 0), _obj(1, 1, ObjectStatus.END_OF_GROUP),
           _obj(1, 2, ObjectStatus.END_OF_TRACK)]
    assert track.extend(run) == 6
    assert heard == [("object", [(0, 0), (0, 1), (0, 2)]), ("group_closed", [(0, 0)]),
                     ("object", [(1, 0), (1, 1)]), ("group_closed", [(1, 0)]),
                     ("object", [(1, 2)]), ("ended", [])]
    assert track.count == 6 and track.end_of_track is not None
    assert track.group_closed(0) and track.group_closed(1)


def test_extend_skips_duplicates_and_stops_at_a_different_object() -> None:
    track = Track((b"ns",), b"t", origin=True)
    track.add(_obj(0, 0))
    heard = _recording(track)
    assert track.extend([_obj(0, 0), _obj(0, 1)]) == 1  # the identical one is skipped
    with pytest.raises(ImmutabilityError):
        track.extend([_obj(0, 2), _obj(0, 1, data=b"y"), _obj(0, 3)])
    # what was stored before the bad object is told (once), nothing after it
    assert heard == [("object", [(0, 1)]), ("object", [(0, 2)])]
    assert track.get(track.largest) is not None and track.largest == (0, 2)


def test_extend_tells_a_stretch_once_when_a_listener_fails() -> None:
    track = Track((b"ns",), b"t", origin=True)
    heard = _recording(track)

    def failing(_t: Track, what: str, _objs: Sequence[CachedObject]) -> None:
        if what == "object":
            raise RuntimeError("listener failed")

    track.listeners.append(failing)
    with pytest.raises(RuntimeError):
        track.extend([_obj(0, 0), _obj(0, 1, ObjectStatus.END_OF_GROUP), _obj(1, 0)])
    assert heard == [("object", [(0, 0), (0, 1)])]  # not again, and nothing after
