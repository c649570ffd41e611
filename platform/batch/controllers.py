"""Routes of OpenAI's Files (purpose `batch`) and Batch APIs, for the calling tenant only: another tenant's
file, batch or output is a 404, like a missing one."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from typing import Annotated

from litestar import Controller, Request, delete, get, post
from litestar.di import NamedDependency, Provide
from litestar.openapi.spec import OpenAPIFormat, OpenAPIMediaType, OpenAPIType, Operation, RequestBody, Schema
from litestar.params import FromPath, FromQuery, JSONBody, Parameter
from litestar.response import File

from loraplex.platform.auth import provide_principal
from loraplex.platform.batch.api import BatchApi
from loraplex.platform.batch.files import INPUT, file_object
from loraplex.platform.batch.jobs import batch_object
from loraplex.platform.batch.schemas import BatchCreate, BatchList, BatchObject, FileDeleted, FileList, FileObject
from loraplex.platform.container import Services
from loraplex.platform.errors import bad_request, error_responses
from loraplex.platform.multipart import receive_form
from loraplex.platform.tenants.service import Principal

Limit = Annotated[int, Parameter(ge=1, le=100)]


def _api(services: Services) -> BatchApi:
    return services.batch  # type: ignore[no-any-return]  # (built after the container: typed Any there)


@dataclass
class FileUploadOperation(Operation):
    """The upload is read as a stream (the size limit applies while it arrives); this documents its form."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            required=True,
            content={
                "multipart/form-data": OpenAPIMediaType(
                    schema=Schema(
                        type=OpenAPIType.OBJECT,
                        required=["file", "purpose"],
                        properties={
                            "file": Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY, description="JSONL"),
                            "purpose": Schema(type=OpenAPIType.STRING, enum=[INPUT]),
                        },
                    )
                )
            },
        )


class FileController(Controller):
    path = "/v1/files"
    tags = ["batch"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @post(
        "/",
        status_code=200,
        request_max_body_size=None,
        operation_class=FileUploadOperation,
        responses=error_responses(400, 401, 413, 415, 429),
        summary="Upload a batch input file (JSONL, purpose batch), checked line by line",
    )
    async def upload(
        self, request: Request, principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> FileObject:
        api = _api(services)
        workdir = services.store.new_tmp_dir()
        try:
            form = await receive_form(
                request, workdir, services.settings.max_batch_file_bytes, fields={"purpose"}, files={"file"}
            )
            purpose = form.fields.get("purpose")
            if purpose != INPUT:
                raise bad_request(f"purpose must be {INPUT!r} (the only purpose served), got {purpose!r}", "purpose")
            upload = form.files.get("file")
            if upload is None:
                raise bad_request("the form needs a file part", "file")
            row = await api.files.create_input(principal.tenant_id, upload.filename, upload.path, upload.size)
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)
        return file_object(row)

    @get("/", responses=error_responses(400, 401, 429), summary="The caller's files")
    async def list_files(
        self,
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
        purpose: FromQuery[str | None] = None,
    ) -> FileList:
        rows = await _api(services).files.list(principal.tenant_id, purpose)
        return FileList(data=[file_object(r) for r in rows])

    @get("/{file_id:str}", responses=error_responses(400, 401, 404, 429), summary="One of the caller's files")
    async def get_file(
        self, file_id: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> FileObject:
        return file_object(await _api(services).files.get(principal.tenant_id, file_id))

    @get(
        "/{file_id:str}/content",
        responses=error_responses(400, 401, 404, 429),
        summary="The bytes of one of the caller's files",
        media_type="application/octet-stream",
    )
    async def file_content(
        self, file_id: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> File:
        api = _api(services)
        row = await api.files.get(principal.tenant_id, file_id)
        return File(
            path=await asyncio.to_thread(api.files.content_path, row),
            filename=row.filename,
            media_type="application/jsonl",
            content_disposition_type="attachment",
        )

    @delete("/{file_id:str}", status_code=200, responses=error_responses(400, 401, 404, 429), summary="Delete a file")
    async def delete_file(
        self, file_id: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> FileDeleted:
        await _api(services).files.delete(principal.tenant_id, file_id)
        return FileDeleted(id=file_id)


class BatchController(Controller):
    path = "/v1/batches"
    tags = ["batch"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @post(
        "/",
        status_code=200,
        responses=error_responses(400, 401, 404, 429),
        summary="Create a batch from an uploaded file; it runs in the background, after interactive requests",
    )
    async def create_batch(
        self,
        data: JSONBody[BatchCreate],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
    ) -> BatchObject:
        api = _api(services)
        row = await api.jobs.create(principal.tenant_id, data)
        api.runner.wake()
        [out] = await api.jobs.objects([row])
        return out

    @get("/", responses=error_responses(400, 401, 404, 429), summary="The caller's batches, newest first")
    async def list_batches(
        self,
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
        limit: Limit = 20,
        after: FromQuery[str | None] = None,
    ) -> BatchList:
        api = _api(services)
        rows = await api.jobs.list(principal.tenant_id, limit + 1, after)
        data = await api.jobs.objects(rows[:limit])
        return BatchList(
            data=data,
            first_id=data[0].id if data else None,
            last_id=data[-1].id if data else None,
            has_more=len(rows) > limit,
        )

    @get("/{batch_id:str}", responses=error_responses(400, 401, 404, 429), summary="One of the caller's batches")
    async def get_batch(
        self, batch_id: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> BatchObject:
        return await _api(services).jobs.get_object(principal.tenant_id, batch_id)

    @post(
        "/{batch_id:str}/cancel",
        status_code=200,
        responses=error_responses(400, 401, 404, 429),
        summary="Cancel a batch: lines not yet finished stop; the output holds those that finished",
    )
    async def cancel_batch(
        self, batch_id: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> BatchObject:
        api = _api(services)
        row = await api.jobs.cancel(principal.tenant_id, batch_id)
        api.runner.wake()
        return batch_object(row, (await api.jobs.counts([row]))[row.id])
