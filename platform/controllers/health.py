"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.di import NamedDependency

from loraplex.platform.metrics import CONTENT_TYPE
from loraplex.platform.schemas import Health
from loraplex.platform.services.container import Services


class HealthController(Controller):
    tags = ["operations"]

    @get("/health", summary="Liveness: the process and its engine thread are up")
    async def health(self, services: NamedDependency[Services]) -> Response[Health]:
        alive = services.engine.is_alive()
        return Response(Health(status="ok" if alive else "engine_dead"), status_code=200 if alive else 503)

    @get("/ready", summary="Readiness: model loaded, database reachable (Redis is optional)")
    async def ready(self, services: NamedDependency[Services]) -> Response[Health]:
        detail: dict[str, str] = {"engine": "ok" if services.engine.is_alive() else "dead"}
        try:
            await services.db.ping()
            detail["database"] = "ok"
        except Exception as exc:  # the database is required: not ready without it
            detail["database"] = f"{type(exc).__name__}: {exc}"
        if services.redis is not None:
            detail["redis"] = "ok" if await services.redis.ping() else "unavailable (serving from the database)"
        ready = detail["engine"] == "ok" and detail["database"] == "ok"
        return Response(
            Health(status="ready" if ready else "not_ready", detail=detail), status_code=200 if ready else 503
        )

    @get("/metrics", summary="Prometheus metrics", media_type=CONTENT_TYPE)
    async def metrics(self, services: NamedDependency[Services]) -> Response[bytes]:
        return Response(services.metrics.exposition(), media_type=CONTENT_TYPE)
