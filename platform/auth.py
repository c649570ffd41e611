"""Bearer-key authentication: the `principal` dependency (a tenant key, rate limited), the admin guard,
and `caller` for routes open to both (a tenant managing its own keys)."""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from loraplex.platform.container import Services
from loraplex.platform.errors import ApiError
from loraplex.platform.tenants.service import Principal


def bearer_token(connection: ASGIConnection) -> str:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
    return token.strip()


def _invalid_key() -> ApiError:
    return ApiError(401, "invalid or revoked API key", code="invalid_api_key")


def services_of(connection: ASGIConnection) -> Services:
    return connection.app.state.services  # type: ignore[no-any-return]  # (Litestar's State holds Any)


async def provide_principal(request: Request) -> Principal:
    """The tenant the request acts for; counts the request against the tenant's rate limit."""
    services = services_of(request)
    token = bearer_token(request)
    principal = await services.tenants.authenticate(token)
    if principal is None:
        if await services.tenants.is_admin(token):
            raise ApiError(
                403,
                "the admin key cannot act as a tenant; use the tenant's key or the /v1/admin/... routes",
                code="admin_key_not_a_tenant",
            )
        raise _invalid_key()
    limit = (
        principal.rate_limit_per_minute
        if principal.rate_limit_per_minute is not None
        else services.settings.default_rate_limit_per_minute
    )
    decision = await services.rate_limiter.hit(principal.tenant_id, limit)
    if not decision.allowed:
        raise ApiError(
            429,
            f"rate limit exceeded: tenant {principal.tenant_name!r} may send {decision.limit} "
            f"requests per minute; retry in {decision.retry_after_s}s",
            code="rate_limit_exceeded",
            headers={
                "Retry-After": str(decision.retry_after_s),
                "X-RateLimit-Limit": str(decision.limit),
                "X-RateLimit-Remaining": "0",
            },
        )
    return principal


async def require_admin(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Guard for admin routes: an admin key passes; a tenant key is refused with 403."""
    token = bearer_token(connection)
    services = services_of(connection)
    if await services.tenants.is_admin(token):
        return
    if await services.tenants.authenticate(token) is not None:
        raise ApiError(403, "this route needs the admin key; tenant keys cannot use it", code="admin_required")
    raise _invalid_key()


@dataclass(frozen=True)
class Caller:
    is_admin: bool
    principal: Principal | None

    def may_manage(self, tenant_name: str) -> bool:
        return self.is_admin or (self.principal is not None and self.principal.tenant_name == tenant_name)


async def provide_caller(request: Request) -> Caller:
    token = bearer_token(request)
    services = services_of(request)
    if await services.tenants.is_admin(token):
        return Caller(True, None)
    principal = await services.tenants.authenticate(token)
    if principal is None:
        raise _invalid_key()
    return Caller(False, principal)
