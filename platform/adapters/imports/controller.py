"""The import routes: the status of one import, and the tenant's source credentials (set or delete; never read).
Starting an import is `POST /v1/adapters` with a JSON body (adapters/controller.py hands it to `start_import`)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, Response, delete, get, put
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath

from loraplex.adapters.json_depth import deepest_member
from loraplex.platform.adapters.imports.schemas import CredentialList, CredentialOut, ImportOut, import_out
from loraplex.platform.adapters.imports.service import public_id
from loraplex.platform.adapters.imports.sources import parse_source
from loraplex.platform.auth import provide_principal
from loraplex.platform.container import Services
from loraplex.platform.db.models import AdapterImport
from loraplex.platform.domain_errors import Invalid, TooLarge
from loraplex.platform.errors import error_responses
from loraplex.platform.json_body import too_deep
from loraplex.platform.tenants.service import Principal


def show(row: AdapterImport) -> ImportOut:
    return import_out(row, public_id(row.id), parse_source(row.source, row.sha256).shown)


def is_json(request: Request) -> bool:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower() == "application/json"


async def _json_body(request: Request, limit: int, max_depth: int) -> Any:
    """The body read up to `limit` bytes (the upload route has no body limit of its own), depth-checked, decoded."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise TooLarge(f"an import request is over {limit} bytes", code="request_too_large")
    deep, field = deepest_member(bytes(raw), max_depth)
    if deep:
        raise too_deep("the JSON body", max_depth, param=field)
    try:
        return msgspec.json.decode(bytes(raw))
    except msgspec.DecodeError as exc:
        raise Invalid(f"the body is not valid JSON: {exc}", code="invalid_json") from None


async def start_import(request: Request, principal: Principal, services: Services) -> Response[ImportOut]:
    """`POST /v1/adapters` with a JSON body: 202 and the queued import (its URL in Location)."""
    settings = services.settings
    body = await _json_body(request, settings.max_request_bytes, settings.max_json_depth)
    if not isinstance(body, dict):
        raise Invalid(
            "an import request is a JSON object {name, source, sha256, accept_failed_check}", code="invalid_request"
        )
    row = await services.imports.create(principal, body)
    location = f"/v1/adapters/{row.name}/imports/{public_id(row.id)}"
    return Response(show(row), status_code=202, headers={"Location": location})


class ImportController(Controller):
    path = "/v1/adapters"
    tags = ["adapters"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @get(
        "/{name:str}/imports/{import_id:str}",
        responses=error_responses(400, 401, 404, 429),
        summary="The status of an import: queued, downloading (bytes done), validating, ready (version), failed",
    )
    async def get_import(
        self,
        name: FromPath[str],
        import_id: FromPath[str],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
    ) -> ImportOut:
        return show(await services.imports.get(principal, name, import_id))


class CredentialController(Controller):
    path = "/v1/credentials"
    tags = ["adapters"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @get("/", responses=error_responses(401, 429), summary="Which import credentials the caller has set")
    async def list_credentials(
        self, principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> CredentialList:
        kinds = await services.import_credentials.kinds(principal.tenant_id)
        return CredentialList(data=[CredentialOut(kind=k, configured=True) for k in kinds])

    @put(
        "/{kind:str}",
        responses=error_responses(400, 401, 404, 429),
        summary="Set the caller's credentials for imports from s3 ({access_key_id, secret_access_key, "
        "session_token?, region?}) or hf ({token}); stored encrypted, never returned",
    )
    async def put_credentials(
        self,
        kind: FromPath[str],
        request: Request,
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
    ) -> CredentialOut:
        body: Any = await request.json()
        if not isinstance(body, dict):
            raise Invalid("credentials are a JSON object", code="invalid_request")
        await services.import_credentials.put(principal.tenant_id, kind, body)
        return CredentialOut(kind=kind, configured=True)

    @delete("/{kind:str}", status_code=200, responses=error_responses(400, 401, 404, 429), summary="Forget credentials")
    async def delete_credentials(
        self, kind: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> CredentialOut:
        await services.import_credentials.delete(principal.tenant_id, kind)
        return CredentialOut(kind=kind, configured=False)
