"""Recovery of what a retrieval still misses after its transfer (KVCS "Verification and
Recovery"): the blocks are asked of each source in turn until the deadline, the
retrieval's publication on its other endpoints and then its own, the deterministic
alternates (when both manifests say ``deterministic``), then KVSP HTTP. Every source
answers the same question (:class:`Source`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Protocol

from ..endpoint import Endpoint, MoqtRequestError
from ..kv.assembly import KvLayer
from ..kv.errors import KvcsError
from ..kv.manifest import Manifest
from .consumer_types import Publication
from .moqt_source import MoqtSource, SegmentRun

if TYPE_CHECKING:
    from .retrieval import Retrieval

__all__ = ["Source", "recover"]

log = logging.getLogger(__name__)


class Source(Protocol):
    """Somewhere the missing blocks of a segment can come from."""

    def describe(self) -> str:
        """A few words for logs."""

    async def recover(self, segment: SegmentRun, deadline: float) -> bool:
        """Deliver what ``segment`` misses to its assembler until ``deadline``
        (``time.monotonic``); False if there was nothing to ask this source."""


async def recover(retrieval: Retrieval, alternates: Sequence[Publication],
                  deadline: float) -> AsyncGenerator[KvLayer, None]:
    """Retry the retrieval's missing blocks from the other sources until ``deadline``
    (``time.monotonic``), yielding the layers that become ready."""
    c = retrieval.consumer
    eps = [e for e in c.endpoints if e is not retrieval.source] + [retrieval.source]
    candidates: list[tuple[Endpoint, Publication]] = [(e, retrieval.pub) for e in eps]
    if retrieval.manifest.deterministic:
        candidates += [(e, p) for p in alternates for e in eps]
    for ep, pub in candidates:
        if retrieval.done or time.monotonic() > deadline:
            break
        alt: Manifest | None = None
        if pub is not retrieval.pub:
            alt = await _deterministic(retrieval, ep, pub, deadline)
            if alt is None:
                continue
        c.stats.retries += 1
        moqt = MoqtSource(ep, pub, alt)
        for run in retrieval.runs:
            await moqt.recover(run, deadline)
        for layer in retrieval.ready():
            yield layer
    http = c.http_source
    if not retrieval.done and http.available and time.monotonic() < deadline:
        for run in retrieval.runs:
            if await http.recover(run, deadline):
                c.stats.retries += 1
        for layer in retrieval.ready():
            yield layer


async def _deterministic(retrieval: Retrieval, ep: Endpoint, pub: Publication,
                         deadline: float) -> Manifest | None:
    """The manifest of an alternate publication whose objects may be combined with ours
    (both manifests say ``deterministic``), else None."""
    try:
        m = await asyncio.wait_for(retrieval.consumer.manifest(pub, ep),
                                   max(0.0, deadline - time.monotonic()))
    except (KvcsError, MoqtRequestError, ConnectionError, TimeoutError) as exc:
        log.info("alternate publication unusable: %s", exc or "timeout")
        return None
    return m if m.deterministic and retrieval.manifest.deterministic else None
