"""Batch jobs: creation (the input file's lines copied into `batch_lines`), lookup, listing, cancellation.
Running them is the runner's job (runner.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, case, func, insert, select, update

from loraplex.platform.batch import ids
from loraplex.platform.batch.files import INPUT, FileService
from loraplex.platform.batch.jsonl import line_error
from loraplex.platform.batch.schemas import ENDPOINTS, BatchCreate, BatchObject, RequestCounts
from loraplex.platform.db.models import Batch, BatchLine, as_utc, utcnow
from loraplex.platform.db.session import Database
from loraplex.platform.domain_errors import Invalid, NotFound

WINDOWS = {"24h": timedelta(hours=24)}
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")


def _lines_counted(ended: ColumnElement[bool]) -> ColumnElement[int]:
    """How many lines of the selected batch have a stored result meeting `ended` (an index-only count)."""
    return select(func.count()).where(BatchLine.batch_id == Batch.id, ended).correlate(Batch).scalar_subquery()


_COMPLETED = _lines_counted((BatchLine.status_code >= 200) & (BatchLine.status_code < 300))
_FAILED = _lines_counted(BatchLine.status_code >= 300)


def batch_not_found(batch_id: str) -> NotFound:
    return NotFound(f"No such batch: {batch_id}", code="batch_not_found")


def _ts(value: datetime | None) -> int | None:
    return None if value is None else int(as_utc(value).timestamp())


def batch_object(row: Batch, counts: RequestCounts) -> BatchObject:
    return BatchObject(
        id=ids.public(ids.BATCH, row.id),
        endpoint=row.endpoint,
        input_file_id=ids.public(ids.FILE, row.input_file_id),
        completion_window=row.completion_window,
        status=row.status,
        output_file_id=None if row.output_file_id is None else ids.public(ids.FILE, row.output_file_id),
        error_file_id=None if row.error_file_id is None else ids.public(ids.FILE, row.error_file_id),
        created_at=_ts(row.created_at) or 0,
        in_progress_at=_ts(row.in_progress_at),
        expires_at=_ts(row.expires_at),
        finalizing_at=_ts(row.finalizing_at),
        completed_at=_ts(row.completed_at),
        failed_at=_ts(row.failed_at),
        expired_at=_ts(row.expired_at),
        cancelling_at=_ts(row.cancelling_at),
        cancelled_at=_ts(row.cancelled_at),
        request_counts=counts,
        metadata=row.batch_metadata,
    )


class BatchService:
    def __init__(self, db: Database, files: FileService) -> None:
        self.db = db
        self.files = files

    async def create(self, tenant_id: str, req: BatchCreate) -> Batch:
        if req.endpoint not in ENDPOINTS:
            raise Invalid(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {req.endpoint!r}", param="endpoint")
        if req.completion_window not in WINDOWS:
            raise Invalid(
                f"completion_window must be one of {', '.join(WINDOWS)}, got {req.completion_window!r}",
                param="completion_window",
            )
        source = await self.files.get(tenant_id, req.input_file_id, param="input_file_id")
        if source.purpose != INPUT:
            raise Invalid(
                f"file {req.input_file_id} has purpose {source.purpose!r}; a batch reads a file of purpose 'batch'",
                param="input_file_id",
            )
        lines = await self.files.input_lines(source)
        for line in lines:
            if line.url != req.endpoint:
                error = line_error(line.line_no, f"url {line.url} differs from the batch's endpoint {req.endpoint}")
                raise Invalid(error.message, param="input_file_id", code=error.code)
        now = utcnow()
        batch = Batch(
            id=uuid.uuid4(),
            tenant_id=uuid.UUID(tenant_id),
            endpoint=req.endpoint,
            input_file_id=source.id,
            completion_window=req.completion_window,
            status="in_progress",  # the lines were validated above: "validating" is never observable
            batch_metadata=req.metadata,
            total=len(lines),
            created_at=now,
            in_progress_at=now,
            expires_at=now + WINDOWS[req.completion_window],
        )
        async with self.db.session() as session:
            session.add(batch)
            await session.flush()
            rows = [
                {
                    "id": uuid.uuid4(),
                    "batch_id": batch.id,
                    "line_no": line.line_no,
                    "custom_id": line.custom_id,
                    "body": line.body,
                    "attempts": 0,
                }
                for line in lines
            ]
            for start in range(0, len(rows), 1000):
                await session.execute(insert(BatchLine), rows[start : start + 1000])
            await session.commit()
        return batch

    async def get(self, tenant_id: str, batch_id: str) -> Batch:
        key = ids.parse(ids.BATCH, batch_id)
        row = None
        if key is not None:
            async with self.db.session() as session:
                row = await session.get(Batch, key)
        if row is None or row.tenant_id != uuid.UUID(tenant_id):
            raise batch_not_found(batch_id)
        return row

    async def get_object(self, tenant_id: str, batch_id: str) -> BatchObject:
        """One batch as the API shows it, its request counts read in the same query (what a client polls)."""
        key = ids.parse(ids.BATCH, batch_id)
        found = None
        if key is not None:
            async with self.db.session() as session:
                found = (await session.execute(select(Batch, _COMPLETED, _FAILED).where(Batch.id == key))).first()
        if found is None or found[0].tenant_id != uuid.UUID(tenant_id):
            raise batch_not_found(batch_id)
        row, completed, failed = found
        return batch_object(row, RequestCounts(total=row.total, completed=int(completed), failed=int(failed)))

    async def list(self, tenant_id: str, limit: int, after: str | None) -> list[Batch]:
        query = select(Batch).where(Batch.tenant_id == uuid.UUID(tenant_id))
        if after is not None:
            anchor = await self.get(tenant_id, after)
            query = query.where(
                (Batch.created_at < anchor.created_at)
                | ((Batch.created_at == anchor.created_at) & (Batch.id < anchor.id))
            )
        async with self.db.session() as session:
            rows = await session.scalars(query.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit))
            return list(rows.all())

    async def cancel(self, tenant_id: str, batch_id: str) -> Batch:
        """in_progress -> cancelling (the runners stop its lines, then it finalizes as cancelled); a batch that
        already ended is a 400 naming its status; cancelling twice is the same as once."""
        row = await self.get(tenant_id, batch_id)
        async with self.db.session() as session:
            result = await session.execute(
                update(Batch)
                .where(Batch.id == row.id, Batch.status.in_(("validating", "in_progress")))
                .values(status="cancelling", cancelling_at=utcnow())
            )
            await session.commit()
        row = await self.get(tenant_id, batch_id)
        # (an UPDATE's result is a CursorResult, which has rowcount; SQLAlchemy types execute() as Result)
        if result.rowcount == 0 and row.status not in ("cancelling", "cancelled"):  # type: ignore[attr-defined]
            raise Invalid(f"batch {batch_id} is {row.status} and cannot be cancelled", code="batch_not_cancellable")
        return row

    async def counts(self, batches: Iterable[Batch]) -> dict[uuid.UUID, RequestCounts]:
        """request_counts of each batch, from its lines' stored results (2xx completed, others failed)."""
        rows = list(batches)
        if not rows:
            return {}
        ok = case(((BatchLine.status_code >= 200) & (BatchLine.status_code < 300), 1), else_=0)
        bad = case(((BatchLine.status_code.is_not(None)) & (BatchLine.status_code >= 300), 1), else_=0)
        async with self.db.session() as session:
            found = await session.execute(
                select(BatchLine.batch_id, func.sum(ok), func.sum(bad))
                .where(BatchLine.batch_id.in_([r.id for r in rows]))
                .group_by(BatchLine.batch_id)
            )
            done = {bid: (int(c or 0), int(f or 0)) for bid, c, f in found.all()}
        counts = {}
        for r in rows:
            completed, failed = done.get(r.id, (0, 0))
            counts[r.id] = RequestCounts(total=r.total, completed=completed, failed=failed)
        return counts

    async def objects(self, rows: list[Batch]) -> list[BatchObject]:
        counts = await self.counts(rows)
        return [batch_object(r, counts[r.id]) for r in rows]
