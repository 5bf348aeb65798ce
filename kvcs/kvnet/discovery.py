"""Discovery: which publications cover a prefix of the consumer's prompt (kvcs-draft
"Discovering Publications").

* prefix probing (``discovery="prefix"``): SUBSCRIBE_NAMESPACE on ("kvcs-1", ScopeID,
  CompatID, AnchorKey) for the longest prefix, then successively shorter ones;
* the KVSP Index (``discovery="index"``): one lookup of the prompt's Block Keys, whose
  ``moqt://`` replica records name publications (also those of a longer prefix than the
  prompt) without revealing prefixes to relays.

Which publication is usable (its manifest checks) is the consumer's question.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..endpoint import Endpoint, MoqtRequestError
from ..kv.errors import KvcsError
from ..kv.ids import KvcsNamespace
from ..kv.index import parse_publication_uri
from ..moqt.errors import RequestErrorCode
from .consumer_types import ConsumerStats, Publication
from .endpoint_pool import EndpointPool

if TYPE_CHECKING:
    from .kvsp_http import KvspClient

__all__ = ["Discovery"]

log = logging.getLogger(__name__)


class Discovery:
    """Finds the publications of one prompt's prefixes: its Block Keys ``keys`` in scope
    ``scope_id`` and CompatID ``compat_id`` (namespace fields hex-encoded with
    ``hex_namespace``). Each lookup is bounded by ``budget`` seconds; ``answer_wait`` is
    how long a probe waits for the first NAMESPACE after the REQUEST_OK."""

    def __init__(self, keys: Sequence[bytes], scope_id: bytes, compat_id: bytes, *,
                 hex_namespace: bool, budget: float, answer_wait: float,
                 pool: EndpointPool, index: KvspClient | None, stats: ConsumerStats) -> None:
        self.keys = list(keys)
        self.scope_id = scope_id
        self.compat_id = compat_id
        self.hex_namespace = hex_namespace
        self.budget = budget
        self.answer_wait = answer_wait
        self.pool = pool
        self.index = index
        self.stats = stats

    def prefix(self, n: int) -> tuple[bytes, ...]:
        """The namespace prefix of the publications of the prompt's first ``n`` blocks."""
        fields = (self.scope_id, self.compat_id, self.keys[n - 1])
        if self.hex_namespace:
            return (b"kvcs-1", *(f.hex().encode() for f in fields))
        return (b"kvcs-1", *fields)

    async def publications_at(self, ep: Endpoint, n: int) -> list[Publication]:
        """The publications of exactly the prompt's first ``n`` blocks that ``ep`` knows
        (one probe)."""
        prefix = self.prefix(n)
        self.stats.discovery_requests += 1
        try:
            watch = await asyncio.wait_for(ep.subscribe_namespace(prefix), self.budget)
        except MoqtRequestError as exc:
            if exc.code == RequestErrorCode.UNAUTHORIZED:
                raise
            return []
        except TimeoutError:
            log.warning("SUBSCRIBE_NAMESPACE unanswered for %.1f s", self.budget)
            return []
        out: list[Publication] = []
        try:
            # NAMESPACE messages follow the REQUEST_OK on the same stream: wait briefly
            wait = self.answer_wait
            while (change := await watch.next(wait)) is not None:
                added, ns = change
                wait = 0.01  # after the first answer, only collect what is already there
                if not added:
                    continue
                try:
                    kns = KvcsNamespace.from_fields(ns, hex_fields=self.hex_namespace)
                except ValueError:
                    continue
                out.append(Publication(kns, tuple(ns), n, ep))
        finally:
            await watch.cancel()
        return out

    async def index_publications(self, max_blocks: int | None) -> list[Publication]:
        """The publications the KVSP Index names for this prompt's Block Keys, those
        covering the most blocks first. A publication covers blocks 0..n-1 when the index
        names it for each of them; its namespace must be of this scope and CompatID."""
        assert self.index is not None
        keys = self.keys[:max_blocks] if max_blocks else self.keys
        if not keys:
            return []
        self.stats.discovery_requests += 1
        try:
            found = await asyncio.wait_for(
                self.index.lookup(self.scope_id, self.compat_id, keys), self.budget)
        except (KvcsError, TimeoutError) as exc:
            log.warning("KVSP Index lookup failed: %s", exc or "timeout")
            return []
        named: dict[tuple[str, tuple[bytes, ...]], set[int]] = {}
        for i, key in enumerate(keys):
            for uri in found.get(key, ()):
                if not uri.startswith("moqt://"):
                    continue
                try:
                    relay, fields = parse_publication_uri(uri)
                    kns = KvcsNamespace.from_fields(fields, hex_fields=self.hex_namespace)
                except ValueError as exc:
                    log.info("ignoring holder URI %s: %s", uri[:80], exc)
                    continue
                if kns.scope_id == self.scope_id and kns.compat_id == self.compat_id:
                    named.setdefault((relay, fields), set()).add(i)
        pubs: list[Publication] = []
        for (relay, fields), blocks in named.items():
            n = 0
            while n in blocks:
                n += 1
            if n == 0:
                continue
            ep = await self.pool.endpoint_for(relay)
            if ep is None:
                continue
            kns = KvcsNamespace.from_fields(fields, hex_fields=self.hex_namespace)
            if kns.anchor_key in keys[:n]:  # segment 0 within the prompt: hash-checked
                pubs.append(Publication(kns, fields, keys.index(kns.anchor_key) + 1, ep))
            else:  # a longer prefix: coverage rests on the index
                pubs.append(Publication(kns, fields, n, ep, index_blocks=n))
        pubs.sort(key=lambda p: -p.prefix_blocks)
        return pubs
