"""Requests stuffed with parameters cost the receiver almost nothing (issue 27): the limits
of kvcs.moqt.wire.params are checked while parsing, before the per-parameter work, and
token lookup costs one hash whatever the number of tokens configured.

CPU is measured with ``time.process_time`` around the decode/check path alone, in this
process (the least of several runs): before the limits a SUBSCRIBE stuffed with 16,200
tokens took ~32 ms to decode (a plain one 3 us) and up to 42 ms to check against a
100-token auth file."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pytest

from kvcs.admission import Admission
from kvcs.auth import Authorizer
from kvcs.moqt import wire
from kvcs.moqt.errors import ProtocolError, SessionCode
from kvcs.moqt.wire.params import PARAM_SUBGROUP_FILTER

from .pair import close_codes
from .test_hostile_flood import NS, request_stream, server

BUDGET_S = 1e-3
"""The issue's bound on what one stuffed request may cost the relay's CPU."""


def cpu(work: Callable[[], object], runs: int = 5) -> float:
    """Least CPU seconds of ``runs`` calls of ``work`` (exceptions are its result)."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        with contextlib.suppress(ProtocolError):
            work()
        best = min(best, time.process_time() - t0)
    return best


def stuffed(count: int | None = None, tokens: int = 16_200, value: bytes = b"") -> bytes:
    """A SUBSCRIBE with ``tokens`` AUTHORIZATION_TOKENs (16,200 fill its 64 KiB); ``count``
    rewrites its Number of Parameters (a liar announcing fewer)."""
    toks = tuple(wire.AuthToken(3, token_type=0, value=value) for _ in range(tokens))
    msg = wire.encode_message(wire.Subscribe(0, NS, b"t", wire.Parameters(auth_tokens=toks)))
    if count is None:
        return msg
    head = wire.encode_vi64(0) + wire.encode_namespace(NS) + wire.encode_vi64(1) + b"t"
    body = head + wire.encode_vi64(count) + msg[3 + len(head) + len(wire.encode_vi64(tokens)):]
    return wire.encode_vi64(wire.Subscribe.TYPE) + len(body).to_bytes(2, "big") + body


@pytest.mark.parametrize(("raw", "code"), [
    (stuffed(), SessionCode.PROTOCOL_VIOLATION),  # 16,200 parameters announced
    (stuffed(count=wire.MAX_PARAMETERS), SessionCode.UNAUTHORIZED),  # 17th token
    (stuffed(tokens=4, value=b"x" * 5000), SessionCode.UNAUTHORIZED),  # 20,000 bytes
], ids=["count", "tokens", "token-bytes"])
def test_a_stuffed_request_costs_under_a_millisecond_and_closes_the_session(
        raw: bytes, code: int) -> None:
    assert len(raw) > 16_000
    s = server()
    s.stream_data(request_stream(0), raw, False)
    assert close_codes(s.actions()) == [code]
    assert cpu(lambda: wire.ControlStreamParser().feed(raw)) < BUDGET_S
    assert cpu(lambda: server().stream_data(request_stream(0), raw, False)) < BUDGET_S


def test_the_most_tokens_a_request_may_carry_check_in_constant_time() -> None:
    """16 tokens (wire.MAX_TOKENS), none valid, against 100 and 10,000 configured tokens:
    one hash per token, not one comparison per configured token."""
    raw = stuffed(tokens=wire.MAX_TOKENS, value=b"guess-" + b"x" * 40)
    (msg,) = wire.ControlStreamParser().feed(raw)
    assert isinstance(msg, wire.Subscribe) and len(msg.params.auth_tokens) == wire.MAX_TOKENS
    costs = []
    for n in (100, 10_000):
        auth = Authorizer.from_mapping({"tokens": [
            {"token": f"tok-{i}-" + "y" * 40, "subscribe": [["kv"]]} for i in range(n)]})
        admission = Admission(auth)
        assert admission.check(None, msg, 0, 0) is not None  # refused
        costs.append(cpu(lambda a=admission: a.check(None, msg, 0, 0)))  # type: ignore[misc]
        good = wire.Subscribe(2, NS, b"t", wire.Parameters(auth_tokens=(
            wire.AuthToken(3, token_type=0, value=f"tok-{n - 1}-".encode() + b"y" * 40),)))
        assert admission.check(None, good, 0, 0) is None
    assert max(costs) < BUDGET_S
    assert costs[1] < 10 * costs[0] + 1e-4  # 100 times the tokens: not 100 times the time


def test_the_setup_cap_applies_to_setup_too() -> None:
    """17 tokens in SETUP: UNAUTHORIZED while parsing (SessionConfig.max_setup_tokens may
    lower the cap, not raise it past wire.MAX_TOKENS)."""
    opts = wire.SetupOptions(auth_tokens=tuple(
        wire.AuthToken(3, token_type=0, value=b"t%d" % i) for i in range(17)))
    with pytest.raises(ProtocolError) as err:
        wire.SetupOptions.decode(opts.encode())
    assert err.value.code == SessionCode.UNAUTHORIZED


def test_ranges_past_the_message_limit_are_skipped_and_make_the_filter_invalid() -> None:
    ranges = tuple((2 * i, 2 * i) for i in range(10_000))
    raw = wire.encode_message(wire.Subscribe(0, NS, b"t", wire.Parameters(range_filters=(
        wire.RangeFilter(PARAM_SUBGROUP_FILTER, 0, ranges),))))
    (msg,) = wire.ControlStreamParser().feed(raw)
    assert isinstance(msg, wire.Subscribe)
    (rf,) = msg.params.range_filters
    assert rf.overflow and len(rf.ranges) == wire.MAX_RANGES and not rf.is_valid()
    assert cpu(lambda: wire.ControlStreamParser().feed(raw)) < BUDGET_S
