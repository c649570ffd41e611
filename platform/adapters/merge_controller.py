"""`POST /v1/adapters/{name}/merge`: a new version of `name` merged from the caller's adapters."""

from __future__ import annotations

from litestar import Controller, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody

from loraplex.platform.adapters.controller import adapter_out
from loraplex.platform.adapters.merge_service import MergeService
from loraplex.platform.adapters.schemas import AdapterOut, MergeIn
from loraplex.platform.auth import provide_principal
from loraplex.platform.container import Services
from loraplex.platform.errors import error_responses
from loraplex.platform.tenants.service import Principal


class MergeController(Controller):
    path = "/v1/adapters"
    tags = ["adapters"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @post(
        "/{name:str}/merge",
        status_code=201,
        responses=error_responses(400, 401, 403, 404, 409, 429),
        summary="Merge some of the caller's adapters (peft's add_weighted_adapter methods) into a new version of "
        "`name`, which records its sources",
    )
    async def merge(
        self,
        name: FromPath[str],
        data: JSONBody[MergeIn],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
    ) -> AdapterOut:
        with services.upload_slots.hold(principal):  # a merge costs what an upload does: it shares their limit
            record = await MergeService(services.adapters, services.store).merge(principal, name, data)
        return adapter_out(record, principal.tenant_name)
