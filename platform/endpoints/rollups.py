"""Per-minute traffic of each endpoint version, kept in SQL (table `endpoint_rollups`) so the web console can
plot a canary against its main version without Prometheus.

Every endpoint call is tallied in memory (`Rollups.record`, no I/O on the request path); a background task
adds the tallies to their rows every `flush_s` seconds (an upsert: several replicas add into the same row) and
deletes rows older than the retention. Production scrapes `/metrics` instead (loraplex_endpoint_* series);
these rollups are the embedded default's history and cost one small write per endpoint version a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, case, delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from loraplex.platform.db.models import EndpointRollup, as_utc
from loraplex.platform.db.session import Database

log = logging.getLogger("loraplex.platform")
_PRUNE_EVERY_S = 60.0


@dataclass(frozen=True)
class RollupKey:
    """One endpoint version of one tenant (adapter_version 0: the base model)."""

    tenant_id: str
    endpoint: str
    adapter_version: int


@dataclass
class Tally:
    """What one endpoint version did in one minute."""

    requests: int = 0
    errors: int = 0
    latency_ms_sum: float = 0.0
    latency_ms_max: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: Tally) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.latency_ms_sum += other.latency_ms_sum
        self.latency_ms_max = max(self.latency_ms_max, other.latency_ms_max)
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


@dataclass(frozen=True)
class Point:
    """One minute of one version, as the metrics route returns it."""

    minute: datetime
    adapter_version: int
    tally: Tally


@dataclass
class Rollups:
    """The in-memory accumulator of this replica and its flushes into SQL."""

    db: Database
    retention_s: float
    flush_s: float
    clock: Callable[[], float] = time.time
    _pending: dict[tuple[RollupKey, int], Tally] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _pruned_at: float = 0.0

    def record(
        self,
        key: RollupKey,
        *,
        error: bool,
        latency_s: float,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """Count one finished (or refused: `error`) endpoint call in the current minute (no I/O)."""
        minute = int(self.clock() // 60) * 60
        ms = max(latency_s, 0.0) * 1000.0
        self._pending.setdefault((key, minute), Tally()).add(
            Tally(1, int(error), ms, ms, prompt_tokens, completion_tokens)
        )

    async def flush(self) -> int:
        """Add the pending tallies to their rows (created when missing); returns the rows written. On a database
        error the tallies go back into the accumulator for the next flush; a row the database refuses for its
        content (an integrity error: its tenant no longer exists) is dropped, so it never holds up the others."""
        pending, self._pending = self._pending, {}
        if not pending:
            return 0
        rows = [
            dict(
                tenant_id=uuid.UUID(key.tenant_id),
                endpoint=key.endpoint,
                adapter_version=key.adapter_version,
                minute=datetime.fromtimestamp(minute, UTC),
                requests=t.requests,
                errors=t.errors,
                latency_ms_sum=t.latency_ms_sum,
                latency_ms_max=t.latency_ms_max,
                prompt_tokens=t.prompt_tokens,
                completion_tokens=t.completion_tokens,
            )
            for (key, minute), t in pending.items()
        ]
        try:
            try:
                await self._write(rows)
            except IntegrityError:  # a row no upsert can write (its tenant gone): write the others, drop it
                rows = [row for row in rows if await self._write_one(row)]
        except Exception:
            for slot, tally in pending.items():
                self._pending.setdefault(slot, Tally()).add(tally)
            raise
        return len(rows)

    async def _write(self, rows: list[dict[str, Any]]) -> None:
        async with self.db.session() as session:
            await session.execute(self._upsert(), rows)
            await session.commit()

    async def _write_one(self, row: dict[str, Any]) -> bool:
        try:
            await self._write([row])
        except IntegrityError as exc:
            log.warning("endpoint rollup of %s/%s dropped: %s", row["tenant_id"], row["endpoint"], exc.orig)
            return False
        return True

    def _upsert(self) -> Any:
        insert = pg_insert if self.db.dialect == "postgresql" else sqlite_insert
        stmt = insert(EndpointRollup)
        new = stmt.excluded
        col = EndpointRollup
        return stmt.on_conflict_do_update(
            index_elements=["tenant_id", "endpoint", "adapter_version", "minute"],
            set_={
                "requests": col.requests + new.requests,
                "errors": col.errors + new.errors,
                "latency_ms_sum": col.latency_ms_sum + new.latency_ms_sum,
                "latency_ms_max": case(
                    (new.latency_ms_max > col.latency_ms_max, new.latency_ms_max), else_=col.latency_ms_max
                ),
                "prompt_tokens": col.prompt_tokens + new.prompt_tokens,
                "completion_tokens": col.completion_tokens + new.completion_tokens,
            },
        )

    async def prune(self) -> int:
        """Delete the rows older than the retention; returns how many."""
        cutoff = datetime.fromtimestamp(self.clock() - self.retention_s, UTC)
        async with self.db.session() as session:
            result = await session.execute(delete(EndpointRollup).where(EndpointRollup.minute < cutoff))
            await session.commit()
        self._pruned_at = self.clock()
        return int(result.rowcount or 0)  # type: ignore[attr-defined]  # (a CursorResult for DELETE)

    async def series(self, tenant_id: str, endpoint: str, minutes: int) -> list[Point]:
        """The last `minutes` minutes (the current one included) of one endpoint, per version and minute: the
        stored rows plus this replica's tallies not flushed yet. Minutes without traffic are absent."""
        now_minute = int(self.clock() // 60) * 60
        since = now_minute - (minutes - 1) * 60
        tid = uuid.UUID(tenant_id)
        merged: dict[tuple[int, int], Tally] = {}
        async with self.db.session() as session:
            rows = await session.scalars(
                select(EndpointRollup).where(
                    and_(
                        EndpointRollup.tenant_id == tid,
                        EndpointRollup.endpoint == endpoint,
                        EndpointRollup.minute >= datetime.fromtimestamp(since, UTC),
                    )
                )
            )
            for r in rows:
                slot = (r.adapter_version, int(as_utc(r.minute).timestamp()))
                merged.setdefault(slot, Tally()).add(
                    Tally(
                        r.requests,
                        r.errors,
                        r.latency_ms_sum,
                        r.latency_ms_max,
                        r.prompt_tokens,
                        r.completion_tokens,
                    )
                )
        for (key, minute), tally in list(self._pending.items()):
            if key.tenant_id == tenant_id and key.endpoint == endpoint and minute >= since:
                merged.setdefault((key.adapter_version, minute), Tally()).add(tally)
        return [
            Point(datetime.fromtimestamp(minute, UTC), version, tally)
            for (version, minute), tally in sorted(merged.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        ]

    def start(self) -> None:
        """Flush every `flush_s` seconds and prune every minute, in a background task (until `close`)."""
        self._task = asyncio.create_task(self._run(), name="endpoint-rollups")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            try:
                await self.flush()
                if self.clock() - self._pruned_at >= _PRUNE_EVERY_S:
                    await self.prune()
            except Exception as exc:  # the next round retries; traffic is never held up by its history
                log.warning("endpoint rollups not written: %s", exc)

    async def close(self) -> None:
        """Stop the background task and write what is pending (at shutdown)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.flush()
        except Exception as exc:
            log.warning("endpoint rollups lost at shutdown: %s", exc)
