"""Discovery: which publications cover a prefix of the consumer's prompt (kvcs-draft
"Discovering Publications").

* a namespace listing (the default, ``discovery="namespace"``): ONE SUBSCRIBE_NAMESPACE on
  ("kvcs-1", ScopeID, CompatID) and a REQUEST_UPDATE that changes nothing in the same
  flight, whose REQUEST_OK follows every NAMESPACE the peer held: the listed Anchor Keys
  are matched against the prompt's Block Keys here, so a hit or a miss costs one round
  trip whatever the prompt's length, and the relay learns no prefix;
* prefix probing (``discovery="prefix"``, only when asked for): SUBSCRIBE_NAMESPACE on
  ("kvcs-1", ScopeID, CompatID, AnchorKey) for the longest prefix, then successively
  shorter ones (one request, and up to ``answer_wait`` seconds, per prefix length);
* the KVSP Index (``discovery="index"``): one lookup of the prompt's Block Keys, whose
  ``moqt://`` replica records name publications (also those of a longer prefix than the
  prompt) without revealing prefixes to relays;
* a standing listing (:class:`NamespaceIndex`), for a serving engine that looks up every
  request of a scope (the vLLM connector): the same namespace listing, confirmed whole the
  same way, then kept open and followed, so that each later lookup is a table lookup and a
  miss costs no round trip.

Which publication is usable (its manifest checks) is the consumer's question.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from ..endpoint import Endpoint, MoqtRequestError, NamespaceWatch
from ..kv.errors import KvcsError
from ..kv.ids import KvcsNamespace
from ..kv.index import parse_publication_uri
from ..moqt.errors import RequestErrorCode
from .consumer_types import ConsumerStats, Publication
from .endpoint_pool import EndpointPool

if TYPE_CHECKING:
    from .kvsp_http import KvspClient

__all__ = ["SETTLE_S", "Discovery", "NamespaceIndex", "listed_publication", "scope_prefix"]

log = logging.getLogger(__name__)


def scope_prefix(scope_id: bytes, compat_id: bytes, hex_namespace: bool = False
                 ) -> tuple[bytes, ...]:
    """The namespace prefix of every publication of a scope and CompatID."""
    fields = (scope_id, compat_id)
    if hex_namespace:
        return (b"kvcs-1", *(f.hex().encode() for f in fields))
    return (b"kvcs-1", *fields)


def listed_publication(ns: Sequence[bytes], scope_id: bytes, compat_id: bytes,
                       hex_namespace: bool = False) -> KvcsNamespace | None:
    """The publication a listed namespace names, if it is one of this scope and CompatID
    (None: not a publication's namespace, or another scope's or CompatID's)."""
    try:
        kns = KvcsNamespace.from_fields(ns, hex_fields=hex_namespace)
    except ValueError:
        return None
    if kns.scope_id != scope_id or kns.compat_id != compat_id:
        return None
    return kns


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

    async def lookup(self, mode: str, max_blocks: int | None, endpoint: Endpoint | None, *,
                     fence: bool = True) -> list[Publication]:
        """The publications covering a prefix of the prompt, the longest first, from one
        lookup as ``mode`` (``KvConsumer.discovery``) says: ``endpoint`` (default the
        pool's first) is asked alone when given; ``"index-first"`` asks the index and the
        relay at once, the index's publications first; ``"prefix"`` probes (:meth:`probe`).
        ``fence``: the relay confirms listings (:meth:`listed_publications`)."""
        use_index = endpoint is None and mode in ("index", "index-first")
        use_moqt = endpoint is not None or (bool(self.pool.endpoints) and mode != "index")
        if mode == "prefix":
            return await self.probe(max_blocks, endpoint) if use_moqt else []
        lookups = []
        if use_index:
            lookups.append(self.index_publications(max_blocks))
        if use_moqt:
            ep = await self.pool.open(endpoint or self.pool.endpoints[0])
            lookups.append(self.listed_publications(ep, max_blocks, fence=fence))
        found = await asyncio.gather(*lookups)
        pubs: list[Publication] = []
        for some in found:
            pubs += [p for p in some if p not in pubs]
        return pubs

    async def probe(self, max_blocks: int | None, endpoint: Endpoint | None, *,
                    usable: Callable[[list[Publication]], Awaitable[Publication | None]]
                    | None = None) -> list[Publication]:
        """Prefix probing, from the longest prefix down, within ``budget`` in all: the
        publications of the longest prefix that has any; with ``usable`` (which returns
        the first usable one of a list, or None), the first usable publication of the
        longest prefix that has one (a list of one, or empty)."""
        ep = await self.pool.open(endpoint or self.pool.endpoints[0])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.budget
        n = min(len(self.keys), max_blocks or len(self.keys))
        while n >= 1:
            if loop.time() > deadline:
                log.warning("prefix probing stopped at the recompute budget (%.1f s), "
                            "%d prefix length(s) not probed", self.budget, n)
                break
            pubs = await self.publications_at(ep, n)
            if usable is not None:
                pub = await usable(pubs)
                if pub is not None:
                    return [pub]
            elif pubs:
                return pubs
            n -= 1
        return []

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

    def scope_prefix(self) -> tuple[bytes, ...]:
        """The namespace prefix of every publication of this scope and CompatID."""
        return scope_prefix(self.scope_id, self.compat_id, self.hex_namespace)

    async def listed_publications(self, ep: Endpoint, max_blocks: int | None = None,
                                  *, fence: bool = True) -> list[Publication]:
        """The publications ``ep`` knows of any prefix of the prompt, the longest first,
        in one round trip whatever the prompt's length: ONE SUBSCRIBE_NAMESPACE on
        ("kvcs-1", ScopeID, CompatID) and, in the same flight, a REQUEST_UPDATE that
        changes nothing (:meth:`NamespaceWatch.sync <kvcs.endpoint.NamespaceWatch.sync>`);
        the peer answers the update after the NAMESPACE messages of everything it held
        when it read it (one stream, in order), so its REQUEST_OK says the list is whole.
        Each listed Anchor Key is matched against the prompt's Block Keys here; what the
        peer lists is never more than publications of this scope and CompatID.

        Without ``fence`` (a peer that does not take REQUEST_UPDATE on namespace
        subscriptions), the list is what arrived within ``answer_wait`` seconds."""
        n_max = min(len(self.keys), max_blocks or len(self.keys))
        where = {key: i for i, key in enumerate(self.keys[:n_max])}
        self.stats.discovery_requests += 1
        try:
            watch = await asyncio.wait_for(ep.subscribe_namespace(self.scope_prefix()),
                                           self.budget)
        except MoqtRequestError as exc:
            if exc.code == RequestErrorCode.UNAUTHORIZED:
                raise
            log.info("namespace listing refused: %s", exc)
            return []
        except TimeoutError:
            log.warning("SUBSCRIBE_NAMESPACE unanswered for %.1f s", self.budget)
            return []
        try:
            if fence:
                # a kvcs peer answers in one round trip; one that ignores the update is
                # taken at what it sent within a second (never longer than the budget)
                try:
                    await asyncio.wait_for(watch.sync(),
                                           min(self.budget, max(1.0, self.answer_wait)))
                except (TimeoutError, MoqtRequestError) as exc:
                    log.info("namespace listing not confirmed whole (%s): using what "
                             "arrived", exc or "no answer")
            else:
                await asyncio.sleep(self.answer_wait)
            listed: dict[tuple[bytes, ...], None] = {}  # in arrival order: first-found first
            for added, ns in watch.received():
                if added:
                    listed[tuple(ns)] = None
                else:
                    listed.pop(tuple(ns), None)
        finally:
            await watch.cancel()
        pubs: list[Publication] = []
        for ns in listed:
            kns = listed_publication(ns, self.scope_id, self.compat_id, self.hex_namespace)
            i = None if kns is None else where.get(kns.anchor_key)
            if kns is not None and i is not None:
                pubs.append(Publication(kns, tuple(ns), i + 1, ep))
        pubs.sort(key=lambda p: -p.prefix_blocks)
        return pubs

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


SETTLE_S = 0.05
"""What :meth:`NamespaceIndex.open` waits for the NAMESPACE messages of what is published
already when the peer does not take the REQUEST_UPDATE that confirms the list is whole (a
kvcs relay does, and a relay below another one answers it once its upstream did)."""


class NamespaceIndex:
    """The publications of one scope and CompatID on one endpoint, kept current by ONE
    standing SUBSCRIBE_NAMESPACE on ("kvcs-1", ScopeID, CompatID) (:func:`scope_prefix`):
    opened like :meth:`Discovery.listed_publications` (the list confirmed whole in one round
    trip), then followed. Every publication's Anchor Key is the Block Key of its last block,
    so a prompt's longest published prefix is the highest index at which one of its Block
    Keys is an Anchor Key here: each lookup after the opening is a table lookup, and a miss
    costs no round trip. Only publications of this scope and CompatID are taken."""

    def __init__(self, endpoint: Endpoint, scope_id: bytes, compat_id: bytes, *,
                 hex_namespace: bool = False) -> None:
        self.endpoint = endpoint
        self.scope_id = scope_id
        self.compat_id = compat_id
        self.hex_namespace = hex_namespace
        self.prefix = scope_prefix(scope_id, compat_id, hex_namespace)
        self.anchors: dict[bytes, tuple[bytes, ...]] = {}
        """Anchor Key -> the namespace of the latest publication listed with it."""
        self._task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """Opened, and still followed (False once the session or the subscription ended:
        open a new index)."""
        return (self._task is not None and not self._task.done()
                and not self.endpoint.is_closed)

    async def open(self, timeout: float) -> None:
        """Subscribe and take what the peer lists now (within ``timeout``)."""
        watch = await asyncio.wait_for(self.endpoint.subscribe_namespace(self.prefix), timeout)
        try:  # one round trip: the relay answers after the NAMESPACEs of all it knows
            await asyncio.wait_for(watch.sync(), timeout)
        except (TimeoutError, MoqtRequestError) as exc:
            log.info("namespace list not confirmed whole (%s)", exc or "no answer")
            await asyncio.sleep(SETTLE_S)
        for ns in list(watch.current):
            self.take(True, ns)
        # the changes queued so far (the same namespaces) and every later one
        self._task = asyncio.ensure_future(self._follow(watch))

    async def _follow(self, watch: NamespaceWatch) -> None:
        try:
            async for change in watch:
                self.take(*change)
        except Exception as exc:  # the session ended: the owner opens a new index
            log.info("namespace watch ended: %s", exc)

    def take(self, added: bool, ns: Sequence[bytes]) -> None:
        """One listing change (a NAMESPACE, or a NAMESPACE_DONE when not ``added``)."""
        kns = listed_publication(ns, self.scope_id, self.compat_id, self.hex_namespace)
        if kns is None:
            return
        if added:
            self.anchors[kns.anchor_key] = tuple(ns)
        elif self.anchors.get(kns.anchor_key) == tuple(ns):
            del self.anchors[kns.anchor_key]

    def longest(self, keys: Sequence[bytes]) -> Publication | None:
        """The publication of the longest listed prefix of a prompt's Block Keys ``keys``
        (None: none)."""
        for i in range(len(keys) - 1, -1, -1):
            fields = self.anchors.get(keys[i])
            if fields is not None:
                kns = KvcsNamespace.from_fields(fields, hex_fields=self.hex_namespace)
                return Publication(kns, fields, i + 1, self.endpoint)
        return None
