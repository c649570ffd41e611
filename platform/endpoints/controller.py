"""The calling tenant's endpoints: publish, list, get, change (a new revision), promote or roll back the
canary, delete. `model=<endpoint name>` in OpenAI requests then serves with the endpoint's defaults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from litestar import Controller, delete, get, patch, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody, Parameter

from loraplex.platform.auth import provide_principal
from loraplex.platform.container import Services
from loraplex.platform.endpoints.rollups import Point
from loraplex.platform.endpoints.schemas import (
    EndpointCreate,
    EndpointList,
    EndpointMetrics,
    EndpointOut,
    EndpointUpdate,
    MetricsPoint,
    VersionSeries,
)
from loraplex.platform.endpoints.service import EndpointRecord
from loraplex.platform.errors import error_responses
from loraplex.platform.tenants.service import Principal


def endpoint_out(r: EndpointRecord) -> EndpointOut:
    return EndpointOut(
        id=r.id,
        name=r.name,
        model=r.name,
        revision=r.revision,
        adapter=r.adapter,
        canary=r.canary,
        shadow=r.shadow,
        defaults=r.defaults,
        overridable=sorted(r.overridable),
        pinned=r.pinned,
        description=r.description,
        created_at=datetime.fromisoformat(r.created_at),
        updated_at=datetime.fromisoformat(r.updated_at),
    )


def version_series(points: list[Point]) -> list[VersionSeries]:
    """Rollup points (ordered by minute) grouped by adapter version, versions in ascending order."""
    by_version: dict[int, list[MetricsPoint]] = {}
    for p in points:
        t = p.tally
        by_version.setdefault(p.adapter_version, []).append(
            MetricsPoint(
                minute=p.minute,
                requests=t.requests,
                errors=t.errors,
                latency_ms_avg=t.latency_ms_sum / t.requests if t.requests else 0.0,
                latency_ms_max=t.latency_ms_max,
                prompt_tokens=t.prompt_tokens,
                completion_tokens=t.completion_tokens,
            )
        )
    return [VersionSeries(adapter_version=v, points=by_version[v]) for v in sorted(by_version)]


class EndpointController(Controller):
    path = "/v1/endpoints"
    tags = ["endpoints"]
    security = [{"BearerAuth": []}]
    dependencies = {"principal": Provide(provide_principal)}

    @post(
        "/",
        status_code=201,
        responses=error_responses(400, 401, 404, 409, 429),
        summary="Publish an endpoint: an adapter version (or the base model) with defaults and an optional canary",
    )
    async def create_endpoint(
        self, data: JSONBody[EndpointCreate], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> EndpointOut:
        return endpoint_out(await services.endpoints.create(principal, data))

    @get("/", responses=error_responses(401, 429), summary="List the caller's endpoints")
    async def list_endpoints(
        self, principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> EndpointList:
        return EndpointList(data=[endpoint_out(r) for r in await services.endpoints.list(principal)])

    @get("/{name:str}", responses=error_responses(400, 401, 404, 429), summary="Get one of the caller's endpoints")
    async def get_endpoint(
        self, name: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> EndpointOut:
        return endpoint_out(await services.endpoints.get(principal, name))

    @get(
        "/{name:str}/metrics",
        responses=error_responses(400, 401, 404, 429),
        summary="Per-minute calls, errors, latency and tokens of an endpoint by the adapter version that answered",
    )
    async def endpoint_metrics(
        self,
        name: FromPath[str],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
        minutes: Annotated[
            int, Parameter(ge=1, le=10080, description="how many minutes back, the current one included")
        ] = 60,
    ) -> EndpointMetrics:
        endpoint = await services.endpoints.get(principal, name)
        points = await services.rollups.series(principal.tenant_id, endpoint.name, minutes)
        now = datetime.fromtimestamp(services.rollups.clock() // 60 * 60, UTC)
        return EndpointMetrics(
            endpoint=endpoint.name,
            minutes=minutes,
            start=now - timedelta(minutes=minutes - 1),
            series=version_series(points),
        )

    @patch(
        "/{name:str}",
        responses=error_responses(400, 401, 404, 409, 429),
        summary="Change an endpoint (its adapter version, canary, defaults, overridable fields): a new revision",
    )
    async def update_endpoint(
        self,
        name: FromPath[str],
        data: JSONBody[EndpointUpdate],
        principal: NamedDependency[Principal],
        services: NamedDependency[Services],
    ) -> EndpointOut:
        return endpoint_out(await services.endpoints.update(principal, name, data))

    @post(
        "/{name:str}/promote",
        status_code=200,
        responses=error_responses(400, 401, 404, 409, 429),
        summary="Promote the canary: its version serves every caller",
    )
    async def promote(
        self, name: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> EndpointOut:
        return endpoint_out(await services.endpoints.promote(principal, name))

    @post(
        "/{name:str}/rollback",
        status_code=200,
        responses=error_responses(400, 401, 404, 409, 429),
        summary="Roll back the canary: the endpoint's main version serves every caller",
    )
    async def rollback(
        self, name: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> EndpointOut:
        return endpoint_out(await services.endpoints.rollback(principal, name))

    @delete("/{name:str}", status_code=200, responses=error_responses(400, 401, 404, 429), summary="Delete an endpoint")
    async def delete_endpoint(
        self, name: FromPath[str], principal: NamedDependency[Principal], services: NamedDependency[Services]
    ) -> EndpointOut:
        return endpoint_out(await services.endpoints.delete(principal, name))
