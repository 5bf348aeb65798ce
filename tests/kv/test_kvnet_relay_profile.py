"""Relay profiles: how a consumer retrieves data tracks through each kind of relay."""

from __future__ import annotations

import pytest

from kvcs.kvnet.relay_profile import (
    KVCS_RELAY,
    MOQ_DEV_RELAY,
    RELAY_PROFILES,
    RelayProfile,
    TrackRetrieval,
)


def test_names_resolve_to_the_profiles() -> None:
    assert tuple(RELAY_PROFILES) == ("kvcs", "moq-dev")
    assert RelayProfile.resolve("kvcs") is KVCS_RELAY
    assert RelayProfile.resolve("moq-dev") is MOQ_DEV_RELAY
    custom = RelayProfile("mine", track_status=False, multi_group_fetch=True,
                          fill_before_current_group=True, fetch_without_subscription=True)
    assert RelayProfile.resolve(custom) is custom
    with pytest.raises(ValueError, match=r"one of \('kvcs', 'moq-dev'\), got 'moq'"):
        RelayProfile.resolve("moq")


def test_track_retrieval() -> None:
    assert KVCS_RELAY.track_retrieval(completed=True) is TrackRetrieval.FETCH
    assert KVCS_RELAY.track_retrieval(completed=False) is TrackRetrieval.SUBSCRIBE_FROM_START
    # moq-dev/moq fetches upstream only under a subscription and fills the current group
    for completed in (True, False):
        assert MOQ_DEV_RELAY.track_retrieval(completed) is TrackRetrieval.FOLLOW_CURRENT_GROUP


def test_fetch_spans() -> None:
    layers = [0, 1, 2, 5, 7, 8]
    assert KVCS_RELAY.fetch_spans(layers) == [(0, 2), (5, 5), (7, 8)]
    assert MOQ_DEV_RELAY.fetch_spans(layers) == [(g, g) for g in layers]
    assert KVCS_RELAY.fetch_spans([]) == []
    assert KVCS_RELAY.fetch_spans(range(3, 6)) == [(3, 5)]
