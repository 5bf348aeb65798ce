"""End of Track ahead of its group's objects (found through 1% loss on aioquic): a relay
subscribing mid-group gets the group's last objects (End of Group, End of Track) on live
streams and the earlier ones on the fill stream, which may come later. The relay's copy of
the track must not count the missing objects as known absent: it closed the group at End
of Track, so its own fill to the next relay ended early and that relay declared the track
complete without 15 of its objects (tests/faults/test_network.py, one run in 3-8)."""

from __future__ import annotations

from kvcs.moqt.track import CachedObject, Location, Track
from kvcs.moqt.wire import ObjectStatus


def _obj(g: int, o: int, status: int = ObjectStatus.NORMAL) -> CachedObject:
    return CachedObject(g, o, 0, 0, status, (), b"" if status else b"x%d" % o)


def test_end_of_track_before_the_rest_of_its_group() -> None:
    t = Track((b"ns",), b"t", origin=False)
    t.add(_obj(0, 0))
    t.add(_obj(0, 3, ObjectStatus.END_OF_GROUP))
    t.add(_obj(1, 0))
    t.add(_obj(1, 2, ObjectStatus.END_OF_GROUP))
    t.add(_obj(1, 3, ObjectStatus.END_OF_TRACK))  # live, ahead of 0/1, 0/2 and 1/1
    assert t.end_of_track == Location(1, 3)
    assert not t.group_closed(1) and not t.is_settled(Location(1, 1))
    assert not t.known_until_end()
    for g, o in ((0, 1), (0, 2)):
        t.add(_obj(g, o))
    assert t.group_closed(0) and not t.known_until_end()
    t.add(_obj(1, 1))  # the fill brings the last one: the group closes, the track is known
    assert t.group_closed(1) and t.known_until_end()


def test_origin_track_closes_at_end_of_track() -> None:
    """An origin track is written in order: End of Track closes its group at once."""
    t = Track((b"ns",), b"t", origin=True)
    t.add(_obj(0, 0))
    t.add(_obj(0, 1, ObjectStatus.END_OF_TRACK))
    assert t.group_closed(0) and t.known_until_end()
