"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import hmac

import msgspec
from litestar import Controller, Request, Response, get
from litestar.di import NamedDependency
from msgspec import Struct

from loraplex.platform.container import Services
from loraplex.platform.errors import ApiError, error_responses
from loraplex.platform.metrics import CONTENT_TYPE


class Health(Struct, kw_only=True):
    status: str
    detail: dict[str, str] = msgspec.field(default_factory=dict)


BLOB_CHECK_TIMEOUT_S = 5.0  # a blob store that does not answer in this long is reported unavailable


class HealthController(Controller):
    tags = ["operations"]

    @get("/health", summary="Liveness: the process and its engine thread are up")
    async def health(self, services: NamedDependency[Services]) -> Response[Health]:
        alive = services.engine.is_alive()
        return Response(Health(status="ok" if alive else "engine_dead"), status_code=200 if alive else 503)

    @get(
        "/ready",
        summary="Readiness: model loaded, database reachable (Redis and the blob store are reported), not draining",
    )
    async def ready(self, request: Request, services: NamedDependency[Services]) -> Response[Health]:
        if request.app.state.drain.draining:  # shutting down: the load balancer should stop sending here
            return Response(Health(status="not_ready", detail={"drain": "draining"}), status_code=503)
        detail: dict[str, str] = {"engine": "ok" if services.engine.is_alive() else "dead"}
        try:
            await services.db.ping()
            detail["database"] = "ok"
        except Exception as exc:  # the database is required: not ready without it
            detail["database"] = f"{type(exc).__name__}: {exc}"
        if services.redis is not None:
            detail["redis"] = "ok" if await services.redis.ping() else "unavailable (serving from the database)"
        try:  # optional like Redis: the base model is still served without it; adapter uploads and loads get 503s
            await asyncio.wait_for(asyncio.to_thread(services.store.check), BLOB_CHECK_TIMEOUT_S)
            detail["blob_store"] = "ok"
        except Exception as exc:
            detail["blob_store"] = f"unavailable ({type(exc).__name__}): adapter uploads and loads answer 503"
        ready = detail["engine"] == "ok" and detail["database"] == "ok"
        return Response(
            Health(status="ready" if ready else "not_ready", detail=detail), status_code=200 if ready else 503
        )

    @get(
        "/metrics",
        summary="Prometheus metrics (with the metrics_token setting: 'Authorization: Bearer <metrics_token>')",
        media_type=CONTENT_TYPE,
        responses=error_responses(401),
    )
    async def metrics(self, request: Request, services: NamedDependency[Services]) -> Response[bytes]:
        check_metrics_token(request, services.settings.metrics_token)
        return Response(services.metrics.exposition(), media_type=CONTENT_TYPE)


def check_metrics_token(request: Request, token: str | None) -> None:
    """Without a configured token /metrics is open; with one, only 'Bearer <token>' may scrape."""
    if token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise ApiError(
            401,
            "/metrics needs the metrics token (the metrics_token setting): send 'Authorization: Bearer <token>'",
            code="invalid_metrics_token",
        )
