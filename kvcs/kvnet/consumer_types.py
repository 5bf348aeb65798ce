"""What the consumer's parts hand each other and its caller: a discovered
:class:`Publication`, the :class:`RecomputeRequired` outcome and :class:`ConsumerStats`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..endpoint import Endpoint
from ..kv.assembly import AssemblyStats, KvLayer
from ..kv.errors import KvcsError
from ..kv.ids import KvcsNamespace

__all__ = ["ConsumerStats", "Publication", "RecomputeRequired"]


class RecomputeRequired(KvcsError):
    """Some blocks could not be obtained and verified within the budget.

    ``missing`` maps layer -> sorted block indexes to recompute (within the segment for
    :meth:`KvConsumer.layers`, within the covered prefix for
    :meth:`KvConsumer.prefix_layers`); ``yielded`` is how many layers were delivered before
    this was raised; ``partial`` holds, for the layers not delivered that have any, the
    verified blocks (a :class:`KvLayer` whose rows of missing blocks are zero), so that only
    the missing blocks need recomputing.
    """

    def __init__(self, missing: dict[int, list[int]], yielded: int, reason: str,
                 partial: dict[int, KvLayer] | None = None) -> None:
        layers = sorted(missing)
        super().__init__(f"{reason}: {len(layers)} layer(s) incomplete, first {layers[:1]}")
        self.missing = missing
        self.yielded = yielded
        self.reason = reason
        self.partial: dict[int, KvLayer] = partial or {}


@dataclass(frozen=True)
class Publication:
    """A publication found by discovery: its namespace and how many blocks of the prompt it
    covers (the reusable prefix).

    ``endpoint`` is where it was found (None: the consumer's primary endpoint); retrieval
    starts there. ``index_blocks`` is non-zero for a publication of a longer prefix than
    the prompt found through a KVSP Index: the consumer cannot compute its Block Keys, so
    that its first ``index_blocks`` blocks are the prompt's rests on the index's replica
    records (never accepted with ``require_signed``)."""

    namespace: KvcsNamespace
    fields: tuple[bytes, ...]
    prefix_blocks: int
    endpoint: Endpoint | None = field(default=None, compare=False)
    index_blocks: int = 0


@dataclass
class ConsumerStats(AssemblyStats):
    """What the consumer saw (for logs, tests and benchmarks): the assembly counters
    (objects, bytes, rejected, duplicates, excess, http_blocks, held) and its own."""

    retries: int = 0
    resumes: int = 0
    """Interrupted transfers that went on (a subscription or fetch lost its source)."""
    first_layer_at: float | None = None
    started_at: float = 0.0
    finished_at: float | None = None
    manifest_versions: int = 0
    """Manifest versions read (the first one and every newer one followed)."""
    last_progress_at: float | None = None
    """When the newest object that was verified and placed arrived (``time.monotonic()``):
    the recompute budget runs from there."""
    intake_peak_bytes: int = 0
    """The most payload bytes of received objects held at once waiting for verification
    and placement (about ``KvConsumer.fetch_window`` at most, plus what a live segment's
    publisher sends meanwhile)."""
    discovery_requests: int = 0
    """MOQT requests and KVSP Index lookups sent by discovery (one per lookup by default;
    one per prefix length probed with ``discovery="prefix"``)."""
