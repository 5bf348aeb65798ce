"""The sans-IO origin model: tracks and the namespace table (no sockets)."""

from __future__ import annotations

from kvcs.moqt.origin import NamespaceNotice, Origin

A = (b"kv", b"a")
B = (b"kv", b"b", b"c")
OTHER = (b"kvx",)


def notices(*items: tuple[str, int, tuple[bytes, ...], bool]) -> list[NamespaceNotice[str]]:
    return [NamespaceNotice(s, rid, ns, active) for s, rid, ns, active in items]


def test_tracks_are_created_once_and_found() -> None:
    o: Origin[str] = Origin()
    t = o.create_track([b"kv", b"a"], b"k", ((0x0E, 7),))
    assert t.origin and t.properties == ((0x0E, 7),)
    assert o.create_track(A, b"k") is t
    assert o.track(A, b"k") is t and o.track(A, b"v") is None
    shared = Origin[str]()
    shared.add_track(t)
    assert shared.track(A, b"k") is t and list(shared.tracks) == [(A, b"k")]


def test_watch_gets_existing_namespaces_under_its_prefix() -> None:
    o: Origin[str] = Origin()
    assert o.publish(A) == [] and o.publish(OTHER) == []
    assert o.watch("s1", 4, (b"kv",)) == notices(("s1", 4, A, True))
    assert o.watch("s2", 6, ()) == notices(("s2", 6, A, True), ("s2", 6, OTHER, True))
    assert o.watches("s1") == {4: (b"kv",)} and o.watches("nobody") == {}


def test_publish_and_withdraw_notify_matching_watchers_field_wise() -> None:
    o: Origin[str] = Origin()
    o.watch("s1", 2, (b"kv",))
    o.watch("s2", 2, (b"kv", b"b"))
    assert o.publish(B) == notices(("s1", 2, B, True), ("s2", 2, B, True))
    assert o.publish(OTHER) == []  # b"kvx" is not under b"kv" (field-wise match)
    assert o.publish(A) == notices(("s1", 2, A, True))
    assert o.namespaces == [B, OTHER, A]
    assert o.withdraw(B) == notices(("s1", 2, B, False), ("s2", 2, B, False))
    assert o.withdraw(B) == []  # not published any more
    assert o.namespaces == [OTHER, A]


def test_several_publications_of_one_namespace_notify_once() -> None:
    o: Origin[str] = Origin()
    o.watch("w", 0, ())
    assert o.publish(A, "pub1", 2) == notices(("w", 0, A, True))
    assert o.publish(A, "pub2", 4) == []
    assert o.publish(A, "pub1", 2) == []  # the same publication again
    assert o.withdraw(A, "pub1", 2) == []
    assert o.withdraw(A, "pub1", 2) == []
    assert o.withdraw(A, "pub2", 4) == notices(("w", 0, A, False))


def test_application_publications_of_several_namespaces() -> None:
    o: Origin[str] = Origin()
    o.publish(A)
    o.publish(B)
    assert o.publications(None) == [(0, A), (0, B)]
    o.watch("w", 0, (b"kv",))
    assert o.withdraw(A) == notices(("w", 0, A, False))
    assert o.namespaces == [B]


def test_withdraw_all_of_a_session() -> None:
    o: Origin[str] = Origin()
    o.watch("w", 8, ())
    o.publish(A, "pub", 2)
    o.publish(B, "pub", 4)
    o.publish(B, "other", 2)
    assert o.publications("pub") == [(2, A), (4, B)]
    assert o.publishers(B) == ["pub", "other"]
    assert o.withdraw_all("pub", 4) == []  # "other" still publishes B
    assert o.publications("pub") == [(2, A)] and o.publishers(B) == ["other"]
    assert o.withdraw_all("pub") == notices(("w", 8, A, False))
    assert o.publications("pub") == [] and o.namespaces == [B]
    assert o.withdraw_all("other", 2) == notices(("w", 8, B, False))


def test_unwatch_returns_the_prefix_and_stops_notices() -> None:
    o: Origin[str] = Origin()
    o.watch("s1", 2, (b"kv",))
    o.watch("s2", 2, (b"kv",))
    assert o.is_watched((b"kv",)) and not o.is_watched(())
    assert o.unwatch("s1", 2) == (b"kv",)
    assert o.unwatch("s1", 2) is None
    assert o.is_watched((b"kv",))
    assert o.publish(A) == notices(("s2", 2, A, True))
    assert o.unwatch("s2", 2) == (b"kv",)
    assert not o.is_watched((b"kv",))
    assert o.withdraw(A) == []


def test_publisher_is_the_longest_prefix_latest_first() -> None:
    o: Origin[str] = Origin()
    assert o.publisher(B) is None
    o.publish((b"kv",), "short", 2)
    o.publish((b"kv", b"b"), "long1", 2)
    o.publish((b"kv", b"b"), "long2", 2)
    o.publish((*B, b"d"), "longer", 2)  # not a prefix of B
    o.publish((b"kv",))  # the application's own: never a route
    assert o.publisher(B) == "long2"
    assert o.publisher(B, accept=lambda s: s != "long2") == "long1"
    assert o.publisher(B, accept=lambda s: s == "short") == "short"
    assert o.publisher(B, accept=lambda s: False) is None
    assert o.publisher(A) == "short"
    o.publish((), "root", 2)
    assert o.publisher(OTHER) == "root"
