"""Pinned endpoints: the adapter versions a pinned endpoint serves (its version and its canary's) stay in every
replica's host tier while it exists. SQL holds the truth (`endpoints.pinned`); a change is announced on the
registry cache's invalidation channel (Redis pub/sub between replicas; this replica hears its own at once), and
each replica then reads the whole pinned set again and hands it to its engine, which stops evicting those
versions and loads the missing ones (evicting an unpinned host entry when the tier is full). A replica also
reads the set as it starts, so one that missed a message catches up on restart.

The pinned set is bounded server-wide (`max_pinned_adapters`, distinct contents over all tenants, at most the
engine's `max_cpu_loras - 1`) so requests for every other adapter still find a host slot."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from sqlalchemy import or_, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from loraplex.engine import AsyncEngine
from loraplex.engine.threads import single_threaded_torch
from loraplex.platform.db.models import Adapter, Endpoint
from loraplex.platform.db.session import Database
from loraplex.platform.domain_errors import Conflict
from loraplex.platform.storage.blobstore import BlobStore
from loraplex.platform.storage.cache import RegistryCache

PINS_CHANGED = "endpoint-pins:changed"
_PIN_LOCK = 0x6C70_7870  # PostgreSQL advisory lock: pinning changes of all tenants take turns (the limit is global)
log = logging.getLogger("loraplex.platform")


async def pinned_adapters(session: AsyncSession) -> list[tuple[str, str]]:
    """(blob, content hash) of every live adapter version a pinned endpoint serves, oldest endpoint first, each
    content once (two versions or tenants with the same content share one host entry)."""
    rows = await session.execute(
        select(Adapter.blob, Adapter.sha256)
        .join(
            Endpoint,
            (Endpoint.tenant_id == Adapter.tenant_id)
            & (Endpoint.adapter_name == Adapter.name)
            & or_(Endpoint.adapter_version == Adapter.version, Endpoint.canary_version == Adapter.version),
        )
        .where(Endpoint.pinned.is_(True), Adapter.deleted_at.is_(None))
        .order_by(Endpoint.created_at, Endpoint.id, Adapter.version)
    )
    seen: dict[str, str] = {}
    for blob, content_hash in rows.all():
        seen.setdefault(content_hash, blob)
    return [(blob, content_hash) for content_hash, blob in seen.items()]


async def lock_pins(session: AsyncSession) -> None:
    """Serialize pinning changes across tenants until the transaction ends (SQLite serializes writers itself)."""
    if session.bind.dialect.name == "postgresql":
        await session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PIN_LOCK})


async def check_pin_limit(session: AsyncSession, limit: int) -> None:
    """Refuse (409 naming the limit) a change that leaves more pinned adapter contents than `limit`; call after
    the change is in the session (it is flushed by the query) and before the commit."""
    count = len(await pinned_adapters(session))
    if count > limit:
        raise Conflict(
            f"pinning would keep {count} adapter versions in the host tier; the server allows "
            f"max_pinned_adapters = {limit} (unpin another endpoint first)",
            param="pinned",
            code="pinned_adapters_limit",
        )


class Pinner:
    """This replica's side: keep the engine's pinned set equal to SQL's."""

    def __init__(self, engine: AsyncEngine, store: BlobStore, db: Database, cache: RegistryCache) -> None:
        self.engine = engine
        self.store = store
        self.db = db
        self.cache = cache
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        cache.on_invalidate(PINS_CHANGED, self._heard)

    async def announce(self) -> None:
        """Tell every replica (this one included) that the pinned set changed."""
        await self.cache.invalidate(PINS_CHANGED)

    def _heard(self, _rest: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._catch_up())

    async def _catch_up(self) -> None:
        while self._dirty:  # changes heard while refreshing are read by the next round
            self._dirty = False
            try:
                await self.refresh()
            except Exception as exc:  # the next announcement or a restart catches up
                log.warning("refreshing pinned adapters failed: %s", exc)

    async def refresh(self) -> list[str]:
        """Read the pinned set from SQL, give it to the engine and load the pinned versions it lacks."""
        async with self.db.session() as session:
            pinned = await pinned_adapters(session)
        self.engine.pin_adapters(content_hash for _blob, content_hash in pinned)
        host = set(self.engine.stats().lora.host_adapters)
        for blob, content_hash in pinned:
            if content_hash in host:
                continue
            try:
                path = await asyncio.to_thread(self.store.fetch, blob)
                await asyncio.to_thread(self._load, path)
            except Exception as exc:  # best effort: its first request loads it (and then it stays)
                log.warning("loading pinned adapter %s (blob %s) failed: %s", content_hash, blob, exc)
        return [content_hash for _blob, content_hash in pinned]

    def _load(self, path: Path) -> None:
        single_threaded_torch()
        self.engine.add_adapter(path)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
