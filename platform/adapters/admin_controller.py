"""Admin routes over any tenant's adapters: list them, and delete one (audited: every deletion is logged
with the admin key's prefix, the tenant and the adapter)."""

from __future__ import annotations

import logging

from litestar import Controller, Request, delete, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from loraplex.platform.adapters.controller import adapter_out
from loraplex.platform.adapters.schemas import AdapterList, AdapterOut
from loraplex.platform.auth import bearer_token, require_admin
from loraplex.platform.container import Services
from loraplex.platform.errors import error_responses
from loraplex.platform.tenants import keys

audit = logging.getLogger("loraplex.platform.audit")


def admin_prefix(request: Request) -> str:
    """The public part of the admin key used (never the secret), for the audit log."""
    token = bearer_token(request)
    prefix = keys.split_key(token)
    return f"{keys.KEY_PREFIX}{prefix}" if prefix else "(configured admin key)"


class AdminAdapterController(Controller):
    path = "/v1/admin/tenants/{tenant:str}/adapters"
    tags = ["admin"]
    security = [{"BearerAuth": []}]
    guards = [require_admin]

    @get("/", responses=error_responses(400, 401, 403, 404), summary="List a tenant's adapters (admin)")
    async def list_adapters(self, tenant: FromPath[str], services: NamedDependency[Services]) -> AdapterList:
        row = await services.tenants.get_tenant(tenant)
        return AdapterList(data=[adapter_out(r, row.name) for r in await services.adapters.list_of_tenant(str(row.id))])

    @delete(
        "/{name:str}",
        status_code=200,
        responses=error_responses(400, 401, 403, 404),
        summary="Delete a tenant's adapter (admin, audited)",
    )
    async def delete_adapter(
        self, request: Request, tenant: FromPath[str], name: FromPath[str], services: NamedDependency[Services]
    ) -> AdapterOut:
        row = await services.tenants.get_tenant(tenant)
        record = await services.adapters.delete_of_tenant(str(row.id), name)
        audit.info(
            "admin key %s deleted adapter %r (version %d, sha256 %s) of tenant %r",
            admin_prefix(request),
            name,
            record.version,
            record.sha256,
            tenant,
        )
        return adapter_out(record, row.name)
