"""KVSP HTTP as a source of blocks (KVSP profile section 8): containers fetched from the
HTTP holders (``KvConsumer(http=...)``) and from the ``https://`` holders their lookup
answers and the KVSP Index name, each verified and placed by a segment's
:class:`~kvcs.kv.assembly.LayerAssembler` (layer digests, CompatID, Block Key, token start
and the listed ``object_digests``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..kv.assembly import LayerAssembler
from ..kv.container import max_container_size
from ..kv.errors import KvcsError
from ..kv.ids import CompatDescriptor

if TYPE_CHECKING:
    from .kvsp_http import KvspClient
    from .moqt_source import SegmentRun

__all__ = ["HttpSource"]

log = logging.getLogger(__name__)


class HttpSource:
    """Blocks of one scope and CompatID over KVSP HTTP: ``http`` (holders asked first, by
    Block Key) and ``index`` (asked which ``https://`` holders have what is still
    missing); either may be None."""

    def __init__(self, http: KvspClient | None, index: KvspClient | None, scope_id: bytes,
                 compat_id: bytes, descriptor: CompatDescriptor) -> None:
        self.http = http
        self.index = index
        self.scope_id = scope_id
        self.compat_id = compat_id
        self.descriptor = descriptor

    @property
    def available(self) -> bool:
        """Some holder or index is configured."""
        return self.http is not None or self.index is not None

    def describe(self) -> str:
        return "KVSP HTTP"

    async def recover(self, segment: SegmentRun, deadline: float) -> bool:
        """Fetch the containers of the segment's missing blocks; its assembler places them
        in the layers that miss them (KVCS "Verification and Recovery"). False if the
        segment misses nothing."""
        asm = segment.assembler
        missing = asm.missing()
        blocks = asm.container_blocks(missing)
        if not blocks:
            return False
        log.info("recovering %d block(s) of %d layer(s) of segment %d over KVSP HTTP",
                 len(blocks), len(missing), segment.seg.segment)
        await self.fetch(asm, blocks, deadline)
        return True

    async def fetch(self, assembler: LayerAssembler, blocks: Sequence[int],
                    deadline: float) -> None:
        """Fetch the containers of ``blocks`` (within the assembler's segment) from the
        KVSP holders (``http``, ``http.concurrency`` at a time), then the ones still
        missing from the ``https://`` holders that the holders' and the index's lookup
        answers name, until ``deadline`` (``time.monotonic``); the assembler verifies and
        places each."""
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            await asyncio.wait_for(self._fetch_all(assembler, blocks), left)
        except TimeoutError:
            log.warning("KVSP retrieval stopped at the recompute budget")

    async def _fetch_all(self, assembler: LayerAssembler, blocks: Sequence[int]) -> None:
        http = self.http
        limit = max_container_size(self.descriptor)
        failed: list[int] = []
        missing: list[int] = []

        async def one(block: int, sem: asyncio.Semaphore) -> None:
            assert http is not None
            index = assembler.first_block + block
            async with sem:
                try:
                    data = await http.get_block(self.scope_id, self.compat_id,
                                                assembler.block_key(block), max_bytes=limit)
                except KvcsError as exc:  # the first failure loud, the others (alike) quiet
                    failed.append(index)
                    log.log(logging.WARNING if len(failed) == 1 else logging.INFO,
                            "KVSP retrieval of block %d failed: %s", index, exc)
                    data = None
            if data is None or not assembler.accept_container(block, data):
                missing.append(block)

        if http is not None:
            sem = asyncio.Semaphore(http.concurrency)
            await asyncio.gather(*(one(b, sem) for b in blocks))
        else:
            missing = list(blocks)
        if missing:
            await self._follow(assembler, sorted(missing), limit)

    async def _follow(self, assembler: LayerAssembler, blocks: list[int], limit: int) -> None:
        """Ask the holders and the index which ``https://`` holders have ``blocks`` and
        fetch each from the first one that delivers a container that verifies."""
        clients = [c for c in (self.http, self.index) if c is not None]
        if self.index is self.http:
            clients = clients[:1]
        keys = {assembler.block_key(b): b for b in blocks}
        for client in clients:
            if not keys:
                return
            try:
                found = await client.lookup(self.scope_id, self.compat_id, list(keys))
            except KvcsError as exc:
                log.info("KVSP lookup failed: %s", exc)
                continue
            tried = tuple(u + "/" for u in (self.http.urls if self.http else ()))
            sem = asyncio.Semaphore(client.concurrency)

            async def follow(key: bytes, urls: list[str], client: KvspClient = client,
                             sem: asyncio.Semaphore = sem) -> None:
                for url in urls:
                    async with sem:
                        try:
                            data = await client.get_url(url, max_bytes=limit)
                        except KvcsError as exc:
                            log.info("KVSP holder %s failed: %s", url[:80], exc)
                            continue
                    if data is not None and assembler.accept_container(keys[key], data):
                        del keys[key]
                        return

            await asyncio.gather(*(
                follow(key, [u for u in found.get(key, ())
                             if u.startswith("https://") and not u.startswith(tried)])
                for key in list(keys)))
