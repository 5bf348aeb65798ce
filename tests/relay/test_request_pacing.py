"""The request pacer of a relay or TrackHost (kvcs.admission.RequestPacer), on a clock the
test moves: a bounded rate over all sessions, the least served session first."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kvcs.admission import RequestPacer
from kvcs.moqt.ratelimit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def tokens(self, n: int, rate: float = 100) -> None:
        """Move on by the time ``n`` tokens take to come (and a hair more)."""
        self.now += n / rate + 1e-6


@pytest.fixture
async def paced() -> AsyncIterator[tuple[RequestPacer, Clock, list[tuple[str, int]]]]:
    clock = Clock()
    pacer = RequestPacer(rate=100, burst=4, clock=clock)
    handled: list[tuple[str, int]] = []
    try:
        yield pacer, clock, handled
    finally:
        pacer.close()


def _submit(pacer: RequestPacer, handled: list[tuple[str, int]], session: str,
            *rids: int) -> None:
    for rid in rids:
        pacer.submit(session, rid, lambda s=session, r=rid: handled.append((s, r)))


def _run_due(pacer: RequestPacer, clock: Clock) -> None:
    for handle in pacer.due(clock.now):
        handle()


def test_token_bucket() -> None:
    clock = Clock()
    bucket = TokenBucket(10, 2, clock)
    assert bucket.take() and bucket.take() and not bucket.take()
    assert bucket.wait(clock.now) == pytest.approx(0.1)
    clock.tokens(1, rate=10)
    assert bucket.take() and not bucket.take()
    clock.now += 10  # saves up to the burst only
    assert [bucket.take() for _ in range(3)] == [True, True, False]


async def test_requests_within_the_burst_are_handled_at_once(paced) -> None:  # type: ignore[no-untyped-def]
    pacer, clock, handled = paced
    _submit(pacer, handled, "a", 1, 2, 3, 4, 5, 6)
    assert handled == [("a", 1), ("a", 2), ("a", 3), ("a", 4)]
    assert pacer.waiting == 2 and pacer.delayed == 2
    assert pacer.next_due(clock.now) == pytest.approx(clock.now + 0.01)
    clock.tokens(2)  # two tokens at 100 a second: both, in order
    _run_due(pacer, clock)
    assert handled[4:] == [("a", 5), ("a", 6)] and pacer.waiting == 0


async def test_the_least_served_session_goes_first(paced) -> None:  # type: ignore[no-untyped-def]
    pacer, clock, handled = paced
    _submit(pacer, handled, "flood", *range(100))
    assert len(handled) == 4
    _submit(pacer, handled, "good", 1000)
    clock.tokens(1)  # one token: the session served least this second goes first
    _run_due(pacer, clock)
    assert handled[-1] == ("good", 1000)
    clock.tokens(4)  # the flooder's next ones, several per turn (answers share datagrams)
    _run_due(pacer, clock)
    assert handled[-4:] == [("flood", rid) for rid in range(4, 8)]
    assert pacer.waiting_for("flood") == 92


async def test_waiting_requests_are_withdrawn_and_forgotten(paced) -> None:  # type: ignore[no-untyped-def]
    pacer, clock, handled = paced
    _submit(pacer, handled, "a", *range(8))
    _submit(pacer, handled, "b", 100, 101)
    assert pacer.withdraw("a", 5) and not pacer.withdraw("a", 5)
    assert not pacer.withdraw("a", 1)  # already handled
    pacer.forget("b")
    assert pacer.waiting == 3
    clock.now += 1
    _run_due(pacer, clock)
    assert [r for s, r in handled] == [0, 1, 2, 3, 4, 6, 7]
    assert pacer.waiting == 0 and pacer.next_due(clock.now) is None
