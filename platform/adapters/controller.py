"""Adapter upload, listing, lookup and deletion for the calling tenant."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass

from litestar import Controller, Request, Response, delete, get, post, put
from litestar.di import NamedDependency, Provide
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import OpenAPIFormat, OpenAPIMediaType, OpenAPIType, Operation, RequestBody, Schema
from litestar.params import FromPath, JSONBody

from loraplex.platform.adapters.imports.controller import is_json, start_import
from loraplex.platform.adapters.imports.schemas import ImportOut
from loraplex.platform.adapters.schemas import AdapterList, AdapterOut, AdapterVersions, SetCurrent
from loraplex.platform.adapters.service import AdapterRecord
from loraplex.platform.auth import provide_principal
from loraplex.platform.container import Services
from loraplex.platform.errors import error_responses
from loraplex.platform.model_ids import adapter_id
from loraplex.platform.multipart import receive_form
from loraplex.platform.tenants.service import Principal

FORM_FIELDS = {"name", "accept_failed_check"}
FORM_FILES = {"file", "adapter_config", "adapter_model"}


def adapter_out(r: AdapterRecord, tenant: str) -> AdapterOut:
    return AdapterOut(
        id=r.id,
        name=r.name,
        model=adapter_id(tenant, r.name),
        version=r.version,
        sha256=r.sha256,
        rank=r.rank,
        alpha=r.alpha,
        target_modules=list(r.target_modules),
        size_bytes=r.size_bytes,
        created_at=r.created,
        status="ready" if r.broken_reason is None else "broken",
        broken_reason=r.broken_reason,
        origin=r.origin,
        publish_check=r.publish_check,
    )


@dataclass
class UploadOperation(Operation):
    """The upload body is read as a stream (so the size limit applies while it arrives); this puts the
    multipart form it expects into the OpenAPI document."""

    def __post_init__(self) -> None:
        # The handler returns AdapterOut (201, an upload) or a Response[ImportOut] (202, an import): Litestar writes
        # the 201 as oneOf the two, the second empty; the 201 is the adapter, the 202 its own entry (responses=).
        created = self.responses.get("201") if self.responses else None
        content = getattr(created, "content", None) or {}
        for media in content.values():
            one_of = getattr(media.schema, "one_of", None)
            if one_of:
                media.schema = one_of[0]
        binary = Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY)
        self.request_body = RequestBody(
            required=True,
            description="name + file, or name + adapter_config + adapter_model; or, as JSON, an import by reference "
            "(202: its status resource, GET /v1/adapters/{name}/imports/{id})",
            content={
                "application/json": OpenAPIMediaType(
                    schema=Schema(
                        type=OpenAPIType.OBJECT,
                        required=["name", "source"],
                        properties={
                            "name": Schema(type=OpenAPIType.STRING, description="model name clients will use"),
                            "source": Schema(
                                type=OpenAPIType.STRING,
                                description="s3://bucket/prefix, https://host/adapter.zip|.tar.gz or "
                                "hf://org/repo[@revision]",
                            ),
                            "sha256": Schema(
                                type=OpenAPIType.STRING,
                                description="the archive's SHA-256 (required for https:// sources); for an hf:// or "
                                "s3:// folder, the weights file's (optional)",
                            ),
                            "accept_failed_check": Schema(
                                type=OpenAPIType.BOOLEAN,
                                description="true: store the version even if the check at publish fails (warning)",
                            ),
                        },
                    )
                ),
                "multipart/form-data": OpenAPIMediaType(
                    schema=Schema(
                        type=OpenAPIType.OBJECT,
                        required=["name"],
                        properties={
                            "name": Schema(type=OpenAPIType.STRING, description="model name clients will use"),
                            "file": Schema(
                                type=OpenAPIType.STRING,
                                format=OpenAPIFormat.BINARY,
                                description=".zip or .tar.gz of the PEFT adapter folder",
                            ),
                            "adapter_config": binary,
                            "adapter_model": binary,
                            "accept_failed_check": Schema(
                                type=OpenAPIType.BOOLEAN,
                                description="true: store the version even if the check at publish fails (warning)",
                            ),
                        },
                    )
                ),
            },
        )


class AdapterController(Controller):
    path = "/v1/adapters"
    tags = ["adapters"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @post(
        "/",
        status_code=201,
        request_max_body_size=None,
        operation_class=UploadOperation,
        responses={
            202: ResponseSpec(
                data_container=ImportOut,
                description="Import by reference accepted (JSON body)",
                generate_examples=False,
            ),
            **error_responses(400, 401, 403, 409, 413, 415, 429),  # 429: rate or concurrent-upload limit
        },
        summary="Upload a PEFT LoRA adapter (a new version if the name exists), or import one by reference (JSON)",
    )
    async def upload(
        self, request: Request, principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> AdapterOut | Response[ImportOut]:
        if is_json(request):
            return await start_import(request, principal, services)
        with services.upload_slots.hold(principal):  # 429 past max_concurrent_uploads(_per_tenant)
            workdir = services.store.new_tmp_dir()
            try:
                form = await receive_form(
                    request, workdir, services.settings.max_upload_bytes, fields=FORM_FIELDS, files=FORM_FILES
                )
                record = await services.adapters.create(principal, form, workdir)
            finally:
                await asyncio.to_thread(shutil.rmtree, workdir, True)
        return adapter_out(record, principal.tenant_name)

    @get("/", responses=error_responses(401, 429), summary="List the caller's adapters")
    async def list_adapters(
        self, principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> AdapterList:
        return AdapterList(
            data=[adapter_out(r, principal.tenant_name) for r in await services.adapters.list(principal)]
        )

    @get(
        "/{name:str}",
        responses=error_responses(400, 401, 404, 429),
        summary="Get one of the caller's adapters: `name` (its current version) or `name@N` (version N)",
    )
    async def get_adapter(
        self, name: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> AdapterOut:
        return adapter_out(await services.adapters.get(principal, name), principal.tenant_name)

    @delete(
        "/{name:str}",
        status_code=200,
        responses=error_responses(400, 401, 404, 409, 429),
        summary="Delete one of the caller's adapters: `name` (every version) or `name@N` (version N); 409 while "
        "an endpoint serves it",
    )
    async def delete_adapter(
        self, name: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> AdapterOut:
        return adapter_out(await services.adapters.delete(principal, name), principal.tenant_name)

    @get(
        "/{name:str}/versions",
        responses=error_responses(400, 401, 404, 429),
        summary="Every kept version of one of the caller's adapters, and which one is current",
    )
    async def list_versions(
        self, name: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> AdapterVersions:
        records, current = await services.adapters.versions(principal, name)
        return AdapterVersions(
            name=name, current=current, data=[adapter_out(r, principal.tenant_name) for r in records]
        )

    @put(
        "/{name:str}/current",
        responses=error_responses(400, 401, 404, 429),
        summary="Mark the version `name` alone resolves to (roll back or forward in one call; null: the newest)",
    )
    async def set_current(
        self,
        name: FromPath[str],
        data: JSONBody[SetCurrent],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
    ) -> AdapterOut:
        return adapter_out(await services.adapters.set_current(principal, name, data.version), principal.tenant_name)
