"""Bodies of the import routes (msgspec; they drive the OpenAPI document). Credentials go in, never out."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec
from msgspec import Struct

from loraplex.platform.db.models import AdapterImport, as_utc


class ImportErrorOut(Struct, kw_only=True):
    code: str
    message: str


class ImportOut(Struct, kw_only=True):
    """An import's status: queued, downloading (`bytes_done` of `bytes_total`), validating, ready (`version`),
    failed (`error`). `resolved`: the commit (hf) or ETag (s3, https) the source resolved to."""

    id: str
    object: Literal["adapter.import"] = "adapter.import"
    name: str
    source: str
    status: Literal["queued", "downloading", "validating", "ready", "failed"]
    bytes_done: int
    bytes_total: int | None
    attempts: int
    resolved: str | None
    version: int | None
    accept_failed_check: bool  # the version is stored even if the check at publish fails (with a warning)
    error: ImportErrorOut | None
    created_at: datetime
    updated_at: datetime


class CredentialOut(Struct, kw_only=True):
    """Whether the tenant has set credentials of this kind (their values are never shown)."""

    object: Literal["source.credentials"] = "source.credentials"
    kind: str
    configured: bool


class CredentialList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[CredentialOut] = msgspec.field(default_factory=list)


def import_out(row: AdapterImport, public_id: str, shown_source: str) -> ImportOut:
    error = None
    if row.status == "failed" and row.error_code is not None:
        error = ImportErrorOut(code=row.error_code, message=row.error_message or "")
    return ImportOut(
        id=public_id,
        name=row.name,
        source=shown_source,
        status=row.status,  # type: ignore[arg-type]  # (one of the five: the runner writes no other)
        bytes_done=row.bytes_done or 0,
        bytes_total=row.bytes_total,
        attempts=row.attempts or 0,
        resolved=row.resolved,
        version=row.version,
        accept_failed_check=bool(row.accept_failed_check),
        error=error,
        created_at=as_utc(row.created_at),
        updated_at=as_utc(row.updated_at),
    )
