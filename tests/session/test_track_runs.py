"""Track.extend and Track.stage: runs of objects stored in order, listeners told once per
stretch (stage: once per run a producer publishes object by object)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from kvcs.moqt.origin import Origin
from kvcs.moqt.track import STAGED_RUN_BYTES, CachedObject, ImmutabilityError, Track
from kvcs.moqt.wire import ObjectStatus
from kvcs.publishing import OriginPublisher


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


# ------------------------------------------------------------------ Track.stage


def test_stage_stores_at_once_and_tells_one_run_later() -> None:
    track = Track((b"ns",), b"t", origin=True)
    heard = _recording(track)
    assert track.stage(_obj(0, 0)) is True  # a new run: the caller schedules tell_staged
    assert track.stage(_obj(0, 1)) is False
    # stored and counted before anyone is told: reads and FETCH see it
    assert track.get(track.largest) is not None and track.largest == (0, 1)
    assert track.count == 2 and heard == []
    track.tell_staged()
    track.tell_staged()  # nothing left: not told twice
    assert heard == [("object", [(0, 0), (0, 1)])]


def test_stage_tells_the_run_at_once_with_an_end_marker() -> None:
    track = Track((b"ns",), b"t", origin=True)
    heard = _recording(track)
    track.stage(_obj(0, 0))
    assert track.stage(_obj(0, 1, ObjectStatus.END_OF_GROUP)) is False
    assert heard == [("object", [(0, 0), (0, 1)]), ("group_closed", [(0, 0)])]
    track.stage(_obj(1, 0))
    track.stage(_obj(1, 1, ObjectStatus.END_OF_TRACK))
    assert heard[2:] == [("object", [(1, 0), (1, 1)]), ("group_closed", [(1, 0)]),
                         ("ended", [])]


def test_stage_tells_a_run_that_reaches_its_byte_bound() -> None:
    track = Track((b"ns",), b"t", origin=True)
    heard = _recording(track)
    half = bytes(STAGED_RUN_BYTES // 2)
    assert track.stage(_obj(0, 0, data=half)) is True
    assert track.stage(_obj(0, 1, data=half)) is False  # the bound: told now
    assert heard == [("object", [(0, 0), (0, 1)])]
    assert track.stage(_obj(0, 2)) is True  # the next run starts


def test_staged_objects_are_told_before_anything_else() -> None:
    track = Track((b"ns",), b"t", origin=True)
    heard = _recording(track)
    track.stage(_obj(0, 0))
    track.add(_obj(0, 1))
    track.stage(_obj(0, 2))
    track.extend([_obj(0, 3), _obj(0, 4)])
    track.stage(_obj(0, 5))
    track.close_group(0)
    assert heard == [("object", [(0, 0)]), ("object", [(0, 1)]), ("object", [(0, 2)]),
                     ("object", [(0, 3), (0, 4)]), ("object", [(0, 5)]),
                     ("group_closed", [(0, 0)])]


def test_stage_rejects_a_different_object_and_keeps_the_run() -> None:
    track = Track((b"ns",), b"t", origin=True)
    heard = _recording(track)
    track.stage(_obj(0, 0))
    assert track.stage(_obj(0, 0)) is False  # identical: skipped
    with pytest.raises(ImmutabilityError):
        track.stage(_obj(0, 0, data=b"y"))
    track.tell_staged()
    assert heard == [("object", [(0, 0)])]


def test_a_dropped_track_forgets_what_it_staged() -> None:
    track = Track((b"ns",), b"t", origin=True)
    heard = _recording(track)
    track.stage(_obj(0, 0))
    track.drop()
    track.tell_staged()
    assert heard == [("gone", [])]


def test_publish_tells_what_one_loop_turn_published_as_one_run() -> None:
    track = Track((b"ns",), b"t", origin=True)
    heard = _recording(track)
    target = _Target()

    async def main() -> None:
        for o in range(3):
            target.publish(track, 0, o, b"x")
        assert heard == [] and track.count == 3  # stored, told at the end of the turn
        await asyncio.sleep(0)
        assert heard == [("object", [(0, 0), (0, 1), (0, 2)])]
        target.publish(track, 0, 3, b"", status=ObjectStatus.END_OF_GROUP)  # at once
        assert heard[1:] == [("object", [(0, 3)]), ("group_closed", [(0, 0)])]

    asyncio.run(main())
    target.publish(track, 1, 0, b"x")  # no event loop: told at once
    assert heard[3:] == [("object", [(1, 0)])]


def test_an_origin_tells_every_track_it_staged_and_asks_to_be_called_once() -> None:
    origin: Origin[object] = Origin()
    a, b = origin.create_track((b"ns",), b"a"), origin.create_track((b"ns",), b"b")
    heard_a, heard_b = _recording(a), _recording(b)
    assert origin.stage(a, _obj(0, 0)) is True  # the first: schedule tell_staged
    assert origin.stage(b, _obj(0, 0)) is False  # already scheduled
    assert origin.stage(a, _obj(0, 1)) is False
    assert heard_a == heard_b == []
    origin.tell_staged()
    assert heard_a == [("object", [(0, 0), (0, 1)])] and heard_b == [("object", [(0, 0)])]
    assert origin.stage(b, _obj(0, 1)) is True  # told: the next one schedules again


class _Target(OriginPublisher):
    def __init__(self) -> None:
        self.origin = Origin()
