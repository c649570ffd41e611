"""The batch runner: one asyncio task per server process that claims lines of in_progress batches, runs them
(at most `batch_max_in_flight` at once), commits the results of the lines that finished since its last wake in
one transaction, then finalizes batches whose lines all ended (writes the output and error files). One
transaction per wake, not one per line: on a small machine every millisecond the event loop spends is taken
from the engine's threads.

Claims are leases in SQL: a line's `lease_owner` / `lease_until` (renewed while it runs). On PostgreSQL the
claim is `SELECT ... FOR UPDATE SKIP LOCKED`, so two replicas never take the same line; on SQLite there is one
replica. A replica killed mid-line leaves the lease to expire (`batch_lease_ttl_s`), then any replica runs that
line again; a line with a stored result (`status_code`) is never claimed again, so nothing that finished runs
twice. A finished line keeps its lease until its result is committed (a replica killed in between runs it
again, as if it were still running). A stopped replica commits what finished and hands its unfinished lines
back at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import anyio
from sqlalchemy import and_, bindparam, exists, or_, select, true, update

from loraplex.platform.background import stop_task
from loraplex.platform.batch.execute import LineResult, principal_of, run_line
from loraplex.platform.batch.files import OUTPUT, FileService
from loraplex.platform.batch.output import JsonlWriter, output_line
from loraplex.platform.container import Services
from loraplex.platform.db.models import Batch, BatchLine, Tenant, utcnow
from loraplex.platform.tenants.service import Principal

log = logging.getLogger("loraplex.platform.batch")
POLL_S = 0.5  # how often an idle runner looks for new work (a batch created here wakes it at once)

# One executemany for every result a wake commits (Core, so each row's parameters are its own).
_STORE = (
    update(BatchLine.__table__)
    .where(BatchLine.id == bindparam("b_line_id"), BatchLine.status_code.is_(None))
    .values(
        status_code=bindparam("b_status_code"),
        request_id=bindparam("b_request_id"),
        response=bindparam("b_response"),
        finished_at=bindparam("b_finished_at"),
        lease_owner=None,
        lease_until=None,
    )
)


@dataclass
class _Running:
    batch_id: uuid.UUID
    task: asyncio.Task[None]


@dataclass(frozen=True)
class _Finished:
    """A line's result waiting for the next commit (the line keeps its lease until then)."""

    result: LineResult
    finished_at: datetime


class BatchRunner:
    def __init__(self, services: Services, files: FileService) -> None:
        self.services = services
        self.files = files
        self.db = services.db
        self.settings = services.settings
        self.owner = f"{socket.gethostname()[:24]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.ttl = timedelta(seconds=self.settings.batch_lease_ttl_s)
        self._running: dict[uuid.UUID, _Running] = {}  # line id -> its task
        self._finished: dict[uuid.UUID, _Finished] = {}  # line id -> its result, not committed yet
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._renewed = utcnow()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="batch-runner")

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        """Stop claiming, abort the lines in flight and hand them back (their leases cleared); the results of
        lines that finished are committed first."""
        if self._task is not None:
            await stop_task(self._task)
        lines, tasks = list(self._running), [r.task for r in self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._store_finished()
        with contextlib.suppress(Exception):
            await self._release(lines + list(self._finished))
        self._running.clear()
        self._finished.clear()

    # ------------------------------------------------------------------------------------- loop

    async def _loop(self) -> None:
        while True:
            try:
                await self._cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch runner cycle failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            self._wake.clear()

    async def _cycle(self) -> None:
        if self._finished:
            await self._store_finished()
        now = utcnow()
        if self._held() and now - self._renewed >= self.ttl / 3:
            await self._renew(now)
        if self._running:
            await self._stop_cancelled()
        await self._finalize_ready(now)
        free = self.settings.batch_max_in_flight - len(self._running) - len(self._finished)
        if free > 0:
            await self._claim(now, free)

    def _held(self) -> list[uuid.UUID]:
        """The lines this replica holds a lease on: running, or finished with the result not committed yet."""
        return [*self._running, *self._finished]

    async def _renew(self, now: datetime) -> None:
        async with self.db.session() as session:
            await session.execute(
                update(BatchLine)
                .where(BatchLine.id.in_(self._held()), BatchLine.lease_owner == self.owner)
                .values(lease_until=now + self.ttl)
            )
            await session.commit()
        self._renewed = now

    async def _stop_cancelled(self) -> None:
        """Abort the lines of batches no longer in progress (cancelled), and hand them back."""
        batch_ids = {r.batch_id for r in self._running.values()}
        async with self.db.session() as session:
            stopped = set(
                (
                    await session.scalars(
                        select(Batch.id).where(Batch.id.in_(batch_ids), Batch.status != "in_progress")
                    )
                ).all()
            )
        if not stopped:
            return
        lines = [lid for lid, r in self._running.items() if r.batch_id in stopped]
        tasks = [self._running[lid].task for lid in lines]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._release(lines)

    async def _release(self, line_ids: list[uuid.UUID]) -> None:
        if not line_ids:
            return
        async with self.db.session() as session:
            await session.execute(
                update(BatchLine)
                .where(BatchLine.id.in_(line_ids), BatchLine.lease_owner == self.owner, BatchLine.status_code.is_(None))
                .values(lease_owner=None, lease_until=None)
            )
            await session.commit()

    # ------------------------------------------------------------------------------------ claims

    async def _claim(self, now: datetime, limit: int) -> None:
        free_lease = or_(BatchLine.lease_until.is_(None), BatchLine.lease_until < now)
        async with self.db.session() as session:
            claimed = (
                await session.execute(
                    select(BatchLine.id, BatchLine.batch_id, BatchLine.body, Batch.endpoint, Batch.tenant_id)
                    .join(Batch, Batch.id == BatchLine.batch_id)
                    .where(
                        Batch.status == "in_progress",
                        Batch.expires_at > now,
                        BatchLine.status_code.is_(None),
                        free_lease,
                        BatchLine.id.not_in(self._held()) if self._running or self._finished else true(),
                    )
                    .order_by(Batch.created_at, Batch.id, BatchLine.line_no)
                    .limit(limit)
                    .with_for_update(skip_locked=True, of=BatchLine)
                )
            ).all()
            if not claimed:
                return
            await session.execute(
                update(BatchLine)
                .where(BatchLine.id.in_([c.id for c in claimed]))
                .values(lease_owner=self.owner, lease_until=now + self.ttl, attempts=BatchLine.attempts + 1)
            )
            tenants = {
                t.id: t
                for t in (
                    await session.scalars(select(Tenant).where(Tenant.id.in_({c.tenant_id for c in claimed})))
                ).all()
            }
            await session.commit()
        for c in claimed:
            principal = principal_of(tenants[c.tenant_id])
            task = asyncio.create_task(self._run_line(c.id, c.endpoint, c.body, principal))
            self._running[c.id] = _Running(c.batch_id, task)

    async def _run_line(self, line_id: uuid.UUID, endpoint: str, body: dict, principal: Principal) -> None:
        """Run one line and leave its result for the runner's next commit (which this wakes)."""
        try:
            result = await run_line(self.services, principal, endpoint, body)
            self._finished[line_id] = _Finished(result, utcnow())
        finally:
            self._running.pop(line_id, None)
            self._wake.set()

    async def _store_finished(self) -> None:
        """Commit the results of the lines that finished since the last commit, all in one transaction; the
        first result stored wins (a line is never answered twice). Shielded: a result is not lost to a
        cancellation half-way; on a failure the results stay for the next cycle."""
        done = dict(self._finished)
        if not done:
            return
        rows = [
            {
                "b_line_id": line_id,
                "b_status_code": f.result.status_code,
                "b_request_id": f.result.request_id[:64],
                "b_response": f.result.body,
                "b_finished_at": f.finished_at,
            }
            for line_id, f in done.items()
        ]
        with anyio.CancelScope(shield=True):
            async with self.db.session() as session:
                await (await session.connection()).execute(_STORE, rows)
                await session.commit()
        for line_id in done:
            self._finished.pop(line_id, None)

    # -------------------------------------------------------------------------------- finalizing

    async def _finalize_ready(self, now: datetime) -> None:
        """Take and finalize every batch that is ready: in progress with no line left to run (or past its
        window), cancelling with no line running anywhere, or finalizing under an expired lease."""
        pending = exists().where(BatchLine.batch_id == Batch.id, BatchLine.status_code.is_(None))
        running = exists().where(
            BatchLine.batch_id == Batch.id, BatchLine.status_code.is_(None), BatchLine.lease_until >= now
        )
        lease_free = or_(Batch.lease_until.is_(None), Batch.lease_until < now)
        async with self.db.session() as session:
            ready = (
                await session.execute(
                    select(Batch.id, Batch.status).where(
                        or_(
                            and_(Batch.status == "in_progress", or_(~pending, Batch.expires_at <= now)),
                            and_(Batch.status == "cancelling", ~running),
                            and_(Batch.status == "finalizing", lease_free),
                        )
                    )
                )
            ).all()
        for batch_id, status in ready:
            if await self._take(batch_id, status, now):
                await self._finalize(batch_id)

    async def _take(self, batch_id: uuid.UUID, seen: str, now: datetime) -> bool:
        values: dict[str, object] = {"status": "finalizing", "lease_owner": self.owner, "lease_until": now + self.ttl}
        if seen != "finalizing":
            values["finalizing_at"] = now
        async with self.db.session() as session:
            result = await session.execute(
                update(Batch)
                .where(
                    Batch.id == batch_id,
                    Batch.status == seen,
                    or_(Batch.lease_until.is_(None), Batch.lease_until < now),
                )
                .values(**values)
            )
            await session.commit()
        return result.rowcount == 1  # type: ignore[attr-defined]  # (an UPDATE's CursorResult: see jobs.py)

    async def _finalize(self, batch_id: uuid.UUID) -> None:
        async with self.db.session() as session:
            batch = await session.get(Batch, batch_id)
            lines = (
                await session.scalars(
                    select(BatchLine).where(BatchLine.batch_id == batch_id).order_by(BatchLine.line_no)
                )
            ).all()
        if batch is None:
            return
        unrun = any(line.status_code is None for line in lines)
        final = "cancelled" if batch.cancelling_at is not None else ("expired" if unrun else "completed")
        folder = self.files.store.scratch.mkdtemp("batch-out-")
        try:
            out, err = JsonlWriter(folder / "output.jsonl"), JsonlWriter(folder / "error.jsonl")
            try:
                for line in lines:
                    ok, entry = output_line(line, final)
                    (out if ok else err).write(entry)
            finally:
                out.close()
                err.close()
            tenant = str(batch.tenant_id)
            name = f"batch_{batch.id.hex}"
            stored = {}
            for kind, writer in (("output", out), ("error", err)):
                if writer.lines:
                    row = await self.files.store_file(
                        tenant, f"{name}_{kind}.jsonl", OUTPUT, writer.path, writer.size, writer.lines
                    )
                    stored[kind] = row.id
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        now = utcnow()
        async with self.db.session() as session:
            await session.execute(
                update(Batch)
                .where(Batch.id == batch_id, Batch.lease_owner == self.owner)
                .values(
                    status=final,
                    output_file_id=stored.get("output"),
                    error_file_id=stored.get("error"),
                    lease_owner=None,
                    lease_until=None,
                    **{f"{final}_at": now},
                )
            )
            await session.commit()
        log.info("batch %s %s: %d lines", batch_id.hex, final, len(lines))
