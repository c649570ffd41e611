"""Warm adapters: publishing an adapter version (an upload) or an endpoint loads its weights into host memory on
every replica that has a free host slot (`max_cpu_loras`), so the first request after publish copies them into
a device slot instead of reading the store. The news travels on the registry cache's invalidation channel
(Redis pub/sub between replicas; this replica hears its own at once): `adapter-warm:<blob>:<content hash>`.

Warming never evicts (the engine keeps a full host tier as it is) and is best effort: a replica that misses the
message, or has no room, reads the adapter on its first request as before."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

from loraplex.engine import AsyncEngine
from loraplex.engine.threads import single_threaded_torch
from loraplex.platform.adapters.service import RETIRED_CONTENT, AdapterRecord
from loraplex.platform.storage.blobstore import BlobStore
from loraplex.platform.storage.cache import RegistryCache

WARM_ADAPTER = "adapter-warm:"
log = logging.getLogger("loraplex.platform")


class Warmer:
    def __init__(self, engine: AsyncEngine, store: BlobStore, cache: RegistryCache, *, enabled: bool = True) -> None:
        self.engine = engine
        self.store = store
        self.cache = cache
        self.enabled = enabled
        self._running: dict[str, asyncio.Task[None]] = {}
        self._retired: set[str] = set()  # retired while being warmed: dropped again once loaded
        cache.on_invalidate(WARM_ADAPTER, self._heard)
        cache.on_invalidate(RETIRED_CONTENT, self._on_retired)

    async def publish(self, records: Iterable[AdapterRecord]) -> None:
        """Ask every replica (this one included) to load these versions into host memory."""
        if not self.enabled:
            return
        for record in records:
            await self.cache.invalidate(f"{WARM_ADAPTER}{record.blob}:{record.sha256}")

    def _heard(self, rest: str) -> None:
        blob, _, content_hash = rest.partition(":")
        if not self.enabled or not content_hash or content_hash in self._running:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._retired.discard(content_hash)
        task = loop.create_task(self._warm(blob, content_hash))
        self._running[content_hash] = task
        task.add_done_callback(lambda _: self._running.pop(content_hash, None))

    async def _warm(self, blob: str, content_hash: str) -> None:
        if content_hash in self.engine.stats().lora.host_adapters:
            return
        try:
            path = await asyncio.to_thread(self.store.fetch, blob)
            await asyncio.to_thread(self._load, path)
        except Exception as exc:  # best effort: the first request loads it instead
            log.warning("warming adapter %s (blob %s) failed: %s", content_hash, blob, exc)
        if content_hash in self._retired:  # deleted while it was loading: the engine must not keep it
            self._retired.discard(content_hash)
            self.engine.remove_adapter(content_hash)

    def _on_retired(self, content_hash: str) -> None:
        if content_hash in self._running:
            self._retired.add(content_hash)

    def _load(self, path: Path) -> None:
        single_threaded_torch()
        self.engine.add_adapter(path)

    async def close(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
