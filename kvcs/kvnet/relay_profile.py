"""What the relay between a consumer and the publisher supports, and how the consumer
retrieves data tracks through it (``KvConsumer(relay_profile=...)``).

* :data:`KVCS_RELAY` (``"kvcs"``): a full draft-22 relay such as the kvcs relay. A completed
  track is FETCHed (several layers per FETCH), a live one SUBSCRIBEd with Next Object and a
  fill from the first wanted layer (with a fetch window: a fill of the first layers and
  FETCHes of the rest up to the Largest Object). The consumer still falls back where a
  request is refused (TRACK_STATUS -> SUBSCRIBE's Largest Object, multi-group FETCH -> one
  FETCH per layer).
* :data:`MOQ_DEV_RELAY` (``"moq-dev"``): the limits of moq-dev/moq. No TRACK_STATUS; one group
  per FETCH; a fill reaches only inside the current group (a wider one is accepted but
  silently delivers nothing); earlier groups are fetched upstream only while the relay holds
  a subscription. So every data track, live or completed, is SUBSCRIBEd with Next Object and
  a fill of the current group (Relative Start 1) while the earlier layers are FETCHed one by
  one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "KVCS_RELAY",
    "MOQ_DEV_RELAY",
    "RELAY_PROFILES",
    "RelayProfile",
    "TrackRetrieval",
]


class TrackRetrieval(Enum):
    """How the consumer retrieves the layers of one data track."""

    FETCH = "fetch"
    """FETCH the wanted layers (a completed track)."""
    SUBSCRIBE_FROM_START = "subscribe from start"
    """SUBSCRIBE with Next Object and a fill from the first wanted layer (with a fetch
    window: of the first layers, the others up to the Largest Object FETCHed): every
    layer exactly once."""
    FOLLOW_CURRENT_GROUP = "follow current group"
    """SUBSCRIBE with Next Object and a fill of the current group (Relative Start 1), and
    FETCH each earlier layer while the subscription runs."""


@dataclass(frozen=True)
class RelayProfile:
    """What a kind of relay supports (see the module docstring)."""

    name: str
    track_status: bool
    """It answers TRACK_STATUS (else the Largest Object comes from a SUBSCRIBE_OK)."""
    multi_group_fetch: bool
    """One FETCH may span several groups (else one FETCH per layer)."""
    fill_before_current_group: bool
    """A SUBSCRIBE's fill may start before the current group."""
    fetch_without_subscription: bool
    """It fetches earlier groups upstream without holding a subscription to the track."""
    namespace_sync: bool = False
    """It answers a REQUEST_UPDATE on a SUBSCRIBE_NAMESPACE after the NAMESPACE messages
    it held (discovery then knows a listing is whole in one round trip; else it waits
    ``discovery_timeout``)."""

    @classmethod
    def resolve(cls, value: RelayProfile | str) -> RelayProfile:
        """A profile given as itself or by name; ValueError for an unknown name."""
        if isinstance(value, RelayProfile):
            return value
        profile = RELAY_PROFILES.get(value)
        if profile is None:
            raise ValueError(
                f"relay_profile must be one of {tuple(RELAY_PROFILES)}, got {value!r}")
        return profile

    def track_retrieval(self, completed: bool) -> TrackRetrieval:
        """How to retrieve a data track of a completed (or live) segment."""
        if completed and self.fetch_without_subscription:
            return TrackRetrieval.FETCH
        if self.fill_before_current_group:
            return TrackRetrieval.SUBSCRIBE_FROM_START
        return TrackRetrieval.FOLLOW_CURRENT_GROUP

    def fetch_spans(self, layers: Iterable[int]) -> list[tuple[int, int]]:
        """The (first, last) layers of each FETCH for ``layers`` (ascending): runs of
        consecutive layers, or one layer each without multi-group FETCH."""
        spans: list[tuple[int, int]] = []
        for layer in layers:
            if spans and self.multi_group_fetch and spans[-1][1] == layer - 1:
                spans[-1] = (spans[-1][0], layer)
            else:
                spans.append((layer, layer))
        return spans


KVCS_RELAY = RelayProfile("kvcs", track_status=True, multi_group_fetch=True,
                          fill_before_current_group=True, fetch_without_subscription=True,
                          namespace_sync=True)
MOQ_DEV_RELAY = RelayProfile("moq-dev", track_status=False, multi_group_fetch=False,
                             fill_before_current_group=False, fetch_without_subscription=False)
#: The profiles by name (the values ``KvConsumer(relay_profile=...)`` accepts as strings).
RELAY_PROFILES: dict[str, RelayProfile] = {p.name: p for p in (KVCS_RELAY, MOQ_DEV_RELAY)}

