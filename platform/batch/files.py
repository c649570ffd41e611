"""Tenant-owned batch files: a SQL row each (`batch_files`) and the bytes as one blob in the blob store.
Another tenant's file is answered exactly like a missing one (404)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from sqlalchemy import select

from loraplex.platform.batch import ids
from loraplex.platform.batch.jsonl import InputLine, read_lines
from loraplex.platform.batch.schemas import FileObject
from loraplex.platform.db.models import BatchFile, as_utc
from loraplex.platform.db.session import Database
from loraplex.platform.domain_errors import NotFound
from loraplex.platform.storage.blobstore import BlobStore

CONTENT = "content.jsonl"
INPUT, OUTPUT = "batch", "batch_output"


def file_not_found(file_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"No such file: {file_id}", param=param, code="file_not_found")


def file_object(row: BatchFile) -> FileObject:
    return FileObject(
        id=ids.public(ids.FILE, row.id),
        bytes=row.size_bytes,
        created_at=int(as_utc(row.created_at).timestamp()),
        filename=row.filename,
        purpose=row.purpose,
    )


class FileService:
    def __init__(
        self, db: Database, store: BlobStore, max_json_depth: int, max_lines: int, max_line_bytes: int | None = None
    ) -> None:
        self.db = db
        self.store = store
        self.max_json_depth = max_json_depth
        self.max_lines = max_lines
        self.max_line_bytes = max_line_bytes  # a line is a request: the HTTP routes' body limit

    async def create_input(self, tenant_id: str, filename: str, path: Path, size: int) -> BatchFile:
        """Check a received JSONL file line by line, then store it (purpose `batch`)."""
        lines = await asyncio.to_thread(read_lines, path, self.max_json_depth, self.max_lines, self.max_line_bytes)
        return await self.store_file(tenant_id, filename or "batch.jsonl", INPUT, path, size, len(lines))

    async def store_file(
        self, tenant_id: str, filename: str, purpose: str, path: Path, size: int, lines: int
    ) -> BatchFile:
        blob = await asyncio.to_thread(self.store.put, {CONTENT: path})
        row = BatchFile(
            tenant_id=uuid.UUID(tenant_id),
            filename=filename[:255],
            purpose=purpose,
            size_bytes=size,
            lines=lines,
            blob=blob,
        )
        try:
            async with self.db.session() as session:
                session.add(row)
                await session.commit()
        except BaseException:
            await asyncio.to_thread(self.store.delete, blob)
            raise
        return row

    async def get(self, tenant_id: str, file_id: str, param: str | None = None) -> BatchFile:
        key = ids.parse(ids.FILE, file_id)
        row = None
        if key is not None:
            async with self.db.session() as session:
                row = await session.get(BatchFile, key)
        if row is None or row.tenant_id != uuid.UUID(tenant_id):
            raise file_not_found(file_id, param)
        return row

    async def list(self, tenant_id: str, purpose: str | None = None) -> list[BatchFile]:
        query = select(BatchFile).where(BatchFile.tenant_id == uuid.UUID(tenant_id))
        if purpose is not None:
            query = query.where(BatchFile.purpose == purpose)
        async with self.db.session() as session:
            return list((await session.scalars(query.order_by(BatchFile.created_at.desc()))).all())

    def content_path(self, row: BatchFile) -> Path:
        return self.store.fetch(row.blob) / CONTENT  # blocking: object storage may download it

    async def input_lines(self, row: BatchFile) -> list[InputLine]:
        return await asyncio.to_thread(
            read_lines, self.content_path(row), self.max_json_depth, self.max_lines, self.max_line_bytes
        )

    async def delete(self, tenant_id: str, file_id: str) -> None:
        row = await self.get(tenant_id, file_id)
        async with self.db.session() as session:
            await session.delete(await session.merge(row))
            await session.commit()
        await asyncio.to_thread(self.store.delete, row.blob)
