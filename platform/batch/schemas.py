"""Bodies of the Files and Batch routes, in OpenAI's shapes."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
ENDPOINTS = (CHAT, COMPLETIONS)
MetadataValue = Annotated[str, Meta(max_length=512)]


class FileObject(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    status_details: str | None = None


class FileList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[FileObject] = msgspec.field(default_factory=list)
    has_more: bool = False


class FileDeleted(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Annotated[dict[Annotated[str, Meta(max_length=64)], MetadataValue], Meta(max_length=16)] | None = None


class RequestCounts(Struct, kw_only=True):
    total: int
    completed: int
    failed: int


class BatchObject(Struct, kw_only=True):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: None = None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None


class BatchList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[BatchObject] = msgspec.field(default_factory=list)
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
