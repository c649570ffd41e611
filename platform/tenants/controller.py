"""Admin routes for tenants, and key rotation (admin, or the tenant itself)."""

from __future__ import annotations

import msgspec
from litestar import Controller, delete, get, patch, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody

from loraplex.platform.auth import Caller, provide_caller, require_admin
from loraplex.platform.container import Services
from loraplex.platform.db.models import ApiKey, Tenant, as_utc
from loraplex.platform.domain_errors import NotFound
from loraplex.platform.errors import error_responses
from loraplex.platform.tenants.limits import tenant_quota
from loraplex.platform.tenants.schemas import (
    ApiKeyList,
    ApiKeyOut,
    NewApiKey,
    TenantCreate,
    TenantCreated,
    TenantList,
    TenantOut,
    TenantUpdate,
    TenantUsage,
)
from loraplex.platform.tenants.service import Quotas


def tenant_out(t: Tenant) -> TenantOut:
    return TenantOut(
        id=str(t.id),
        name=t.name,
        max_adapters=t.max_adapters,
        max_adapter_bytes=t.max_adapter_bytes,
        rate_limit_per_minute=t.rate_limit_per_minute,
        created_at=as_utc(t.created_at),
        weight=t.weight,
        priority=t.priority,
        max_concurrent_sequences=t.max_concurrent_sequences,
        tokens_per_minute=t.tokens_per_minute,
        max_queued_requests=t.max_queued_requests,
        adapter_versions_kept=t.adapter_versions_kept,
    )


def key_out(k: ApiKey) -> ApiKeyOut:
    return ApiKeyOut(
        id=str(k.id),
        prefix=k.prefix,
        created_at=as_utc(k.created_at),
        revoked_at=as_utc(k.revoked_at) if k.revoked_at else None,
    )


def new_key(k: ApiKey, secret: str) -> NewApiKey:
    return NewApiKey(id=str(k.id), prefix=k.prefix, key=secret, created_at=as_utc(k.created_at))


class TenantController(Controller):
    path = "/v1/tenants"
    tags = ["tenants"]
    security = [{"BearerAuth": []}]

    @post(
        "/",
        guards=[require_admin],
        responses=error_responses(400, 401, 403, 409),
        summary="Create a tenant (admin); returns its first API key once",
    )
    async def create_tenant(self, data: JSONBody[TenantCreate], services: NamedDependency[Services]) -> TenantCreated:
        quotas = {f: getattr(data, f) for f in data.__struct_fields__ if f != "name"}
        tenant, key, secret = await services.tenants.create_tenant(data.name, Quotas(**quotas))
        return TenantCreated(tenant=tenant_out(tenant), api_key=new_key(key, secret))

    @get("/", guards=[require_admin], responses=error_responses(401, 403), summary="List tenants (admin)")
    async def list_tenants(self, services: NamedDependency[Services]) -> TenantList:
        return TenantList(data=[tenant_out(t) for t in await services.tenants.list_tenants()])

    @get(
        "/{tenant:str}",
        guards=[require_admin],
        responses=error_responses(400, 401, 403, 404),
        summary="Get a tenant (admin)",
    )
    async def get_tenant(self, tenant: FromPath[str], services: NamedDependency[Services]) -> TenantOut:
        return tenant_out(await services.tenants.get_tenant(tenant))

    @patch(
        "/{tenant:str}",
        guards=[require_admin],
        responses=error_responses(400, 401, 403, 404),
        summary="Change a tenant's quotas, weight and serving limits (admin); null restores the server default",
    )
    async def update_tenant(
        self, tenant: FromPath[str], data: JSONBody[TenantUpdate], services: NamedDependency[Services]
    ) -> TenantOut:
        changes = {f: v for f in data.__struct_fields__ if (v := getattr(data, f)) is not msgspec.UNSET}
        return tenant_out(await services.tenants.update_tenant(tenant, changes))


class TenantUsageController(Controller):
    path = "/v1/tenants/{tenant:str}/usage"
    tags = ["tenants"]
    security = [{"BearerAuth": []}]
    dependencies = {"caller": Provide(provide_caller)}

    @get("/", responses=error_responses(400, 401, 404), summary="A tenant's use of its serving limits now")
    async def usage(
        self, tenant: FromPath[str], caller: NamedDependency[Caller], services: NamedDependency[Services]
    ) -> TenantUsage:
        _check_access(caller, tenant)
        row = await services.tenants.get_tenant(tenant)
        quota = tenant_quota(row, services.settings)
        use = await services.tenant_limits.usage(str(row.id))
        return TenantUsage(
            queued_requests=use.queued_requests,
            sequences=use.sequences,
            tokens_this_minute=use.tokens_this_minute,
            max_queued_requests=quota.max_queued_requests,
            max_concurrent_sequences=quota.max_concurrent_sequences,
            tokens_per_minute=quota.tokens_per_minute,
        )


def _check_access(caller: Caller, tenant: str) -> None:
    # Another tenant's name answers exactly like a missing one.
    if not caller.may_manage(tenant):
        raise NotFound(f"tenant {tenant!r} not found", code="tenant_not_found")


class ApiKeyController(Controller):
    path = "/v1/tenants/{tenant:str}/keys"
    tags = ["tenants"]
    security = [{"BearerAuth": []}]
    dependencies = {"caller": Provide(provide_caller)}

    @post(
        "/",
        responses=error_responses(400, 401, 404),
        summary="Create another API key (admin or the tenant itself); the key is shown once",
    )
    async def create_key(
        self, tenant: FromPath[str], caller: NamedDependency[Caller], services: NamedDependency[Services]
    ) -> NewApiKey:
        _check_access(caller, tenant)
        key, secret = await services.tenants.create_key(tenant)
        return new_key(key, secret)

    @get("/", responses=error_responses(400, 401, 404), summary="List a tenant's keys (prefixes only)")
    async def list_keys(
        self, tenant: FromPath[str], caller: NamedDependency[Caller], services: NamedDependency[Services]
    ) -> ApiKeyList:
        _check_access(caller, tenant)
        return ApiKeyList(data=[key_out(k) for k in await services.tenants.list_keys(tenant)])

    @delete(
        "/{key_id:str}",
        status_code=200,
        responses=error_responses(400, 401, 404),
        summary="Revoke a key by id or prefix",
    )
    async def revoke_key(
        self,
        tenant: FromPath[str],
        key_id: FromPath[str],
        caller: NamedDependency[Caller],
        services: NamedDependency[Services],
    ) -> ApiKeyOut:
        _check_access(caller, tenant)
        return key_out(await services.tenants.revoke_key(tenant, key_id))
