"""The Litestar application: `create_app(settings)`; its lifespan builds the services and the engine."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme

from loraplex.adapters import AdapterLimits
from loraplex.platform.adapters.admin_controller import AdminAdapterController
from loraplex.platform.adapters.controller import AdapterController
from loraplex.platform.adapters.engine_refs import EngineAdapters
from loraplex.platform.adapters.imports.controller import CredentialController, ImportController
from loraplex.platform.adapters.imports.wiring import start_imports
from loraplex.platform.adapters.merge_controller import MergeController
from loraplex.platform.adapters.publish_check import build_publish_check
from loraplex.platform.adapters.service import DELETED_BLOB, RETIRED_CONTENT, AdapterService, QuotaDefaults
from loraplex.platform.adapters.upload_slots import UploadSlots
from loraplex.platform.adapters.warm import Warmer
from loraplex.platform.batch.api import BatchApi
from loraplex.platform.batch.controllers import BatchController, FileController
from loraplex.platform.console import console_router
from loraplex.platform.container import Services
from loraplex.platform.db.migrate import upgrade
from loraplex.platform.db.session import Database
from loraplex.platform.drain import Drain
from loraplex.platform.endpoints.controller import EndpointController
from loraplex.platform.endpoints.defaults import compile_defaults
from loraplex.platform.endpoints.pins import Pinner
from loraplex.platform.endpoints.rollups import Rollups
from loraplex.platform.endpoints.service import EndpointService
from loraplex.platform.errors import EXCEPTION_HANDLERS
from loraplex.platform.generation.token_texts import TokenTexts
from loraplex.platform.health import HealthController
from loraplex.platform.json_body import depth_limited_request
from loraplex.platform.metrics import Metrics
from loraplex.platform.model_resolution import ModelResolver
from loraplex.platform.openai.controller import OpenAIController
from loraplex.platform.openai.tokenize import TokenizeController
from loraplex.platform.settings import Settings
from loraplex.platform.storage.blobstore import BlobStore
from loraplex.platform.storage.cache import RegistryCache
from loraplex.platform.storage.redis_link import RedisLink
from loraplex.platform.storage.s3_blobstore import S3BlobStore
from loraplex.platform.tenants.controller import ApiKeyController, TenantController, TenantUsageController
from loraplex.platform.tenants.limits import TenantLimits
from loraplex.platform.tenants.rate_limit import RateLimiter
from loraplex.platform.tenants.service import TenantService

if TYPE_CHECKING:
    from loraplex.engine import AsyncEngine

log = logging.getLogger("loraplex.platform")


def _version() -> str:
    try:
        return version("loraplex")
    except PackageNotFoundError:
        return "0.0.0"


async def build_services(settings: Settings, engine: AsyncEngine | None = None) -> tuple[Services, str | None]:
    """Migrate the registry, connect the database and Redis, load the engine (unless given).

    Returns the services and a newly generated admin key (None if one was configured or stored)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    url = settings.resolved_database_url
    await upgrade(url, settings.database_schema)
    db = Database(url, settings.database_schema)
    redis = RedisLink(settings.redis_url) if settings.redis_url else None
    cache = RegistryCache(settings.cache_ttl_s, redis)
    owns_engine = engine is None
    try:
        await cache.start()
        store = (
            S3BlobStore(settings.adapter_dir, settings.blob_url)
            if settings.blob_url
            else BlobStore(settings.adapter_dir)
        )
        cache.on_invalidate(DELETED_BLOB, store.evict)
        await asyncio.to_thread(store.sweep_tmp)
        if engine is None:
            from loraplex.engine import AsyncEngine
            from loraplex.engine.warmup import warm_up

            engine = await asyncio.to_thread(AsyncEngine, settings.build_engine_args())
            await warm_up(engine, settings.warmup_s)  # before the server listens: /ready says yes only after
        max_pinned = settings.max_pinned_adapters
        if max_pinned is None:
            max_pinned = min(2, engine.args.max_cpu_loras - 1)
        elif max_pinned > engine.args.max_cpu_loras - 1:
            raise ValueError(
                f"max_pinned_adapters ({max_pinned}) must be at most the engine's max_cpu_loras - 1 "
                f"({engine.args.max_cpu_loras - 1}): requests for unpinned adapters need a host slot"
            )
        # a deleted or replaced adapter's weights leave the engine's host and device caches (on every replica)
        cache.on_invalidate(RETIRED_CONTENT, engine.remove_adapter)
        tenants = TenantService(db, cache, settings.admin_key)
        new_admin_key = await tenants.ensure_admin_key()
        adapters = AdapterService(
            db,
            store,
            cache,
            engine.base_spec,
            base_model_name=engine.model_name,
            max_lora_rank=engine.args.max_lora_rank,
            limits=AdapterLimits(max_archive_bytes=settings.max_upload_bytes, max_json_depth=settings.max_json_depth),
            quotas=QuotaDefaults(
                settings.default_max_adapters,
                settings.default_max_adapter_bytes,
                settings.default_adapter_versions_kept,
            ),
            base_weights=engine.base_weights,
        )
        warmer = Warmer(engine, store, cache, enabled=settings.warm_adapters)
        adapters.on_publish = warmer.publish
        if settings.publish_check:  # every new version runs through the engine and peft first (see publish_check.py)
            adapters.publish_check = build_publish_check(engine, store.new_tmp_dir, settings)
        pinner = Pinner(engine, store, db, cache)
        endpoints = EndpointService(
            db,
            cache,
            adapters,
            functools.partial(compile_defaults, engine, max_json_depth=settings.max_json_depth),
            max_pinned_adapters=max_pinned,
            on_pins_changed=pinner.announce,
        )
        await pinner.refresh()  # pins made while this replica was down
        engine_adapters = EngineAdapters(store, adapters.mark_broken)
        services = Services(
            settings=settings,
            db=db,
            redis=redis,
            cache=cache,
            store=store,
            tenants=tenants,
            rate_limiter=RateLimiter(redis),
            adapters=adapters,
            endpoints=endpoints,
            warmer=warmer,
            pinner=pinner,
            models=ModelResolver(engine.model_name, adapters, endpoints),
            engine=engine,
            engine_adapters=engine_adapters,
            metrics=Metrics(
                engine.stats,
                engine_adapters.names,
                block_size=engine.args.block_size,
                tenant_labels=settings.metrics_tenant_labels,
            ),
            token_texts=TokenTexts(engine.tokenizer),
            upload_slots=UploadSlots(settings.max_concurrent_uploads, settings.max_concurrent_uploads_per_tenant),
            started=int(time.time()),
            rollups=Rollups(
                db,
                retention_s=settings.endpoint_rollup_retention_days * 86400,
                flush_s=settings.endpoint_rollup_flush_s,
            ),
            tenant_limits=TenantLimits(redis, ttl_s=settings.tenant_lease_ttl_s),
        )
        await services.tenant_limits.start()
        services.rollups.start()
    except BaseException:
        if owns_engine and engine is not None:
            await asyncio.to_thread(engine.shutdown)
        await cache.close()
        if redis is not None:
            await redis.close()
        await db.close()
        raise
    return services, new_admin_key


def create_app(settings: Settings, engine: AsyncEngine | None = None) -> Litestar:
    """The ASGI app. With `engine` given, the app uses it and leaves its shutdown to the caller."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        services, new_admin_key = await build_services(settings, engine)
        if new_admin_key is not None:
            print(f"loraplex: generated admin key (shown only this once; stored hashed): {new_admin_key}", flush=True)
        app.state.services = services
        services.batch = BatchApi.start(services)
        import_runner = start_imports(services)
        try:
            yield
        finally:
            await import_runner.close()
            await services.batch.close()
            await services.close()
            if engine is None:
                await asyncio.to_thread(services.engine.shutdown)

    def provide_services(state: State) -> Services:
        return state.services  # type: ignore[no-any-return]  # (Litestar's State holds Any)

    drain = Drain(settings.drain_retry_after_s)
    app = Litestar(
        route_handlers=[
            HealthController,
            TenantController,
            ApiKeyController,
            TenantUsageController,
            AdapterController,
            AdminAdapterController,
            MergeController,
            ImportController,
            CredentialController,
            EndpointController,
            OpenAIController,
            TokenizeController,
            FileController,
            BatchController,
            console_router(),
        ],
        lifespan=[lifespan],
        middleware=[drain.middleware],
        dependencies={"services": Provide(provide_services, sync_to_thread=False)},
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]  # (handlers of subclasses: Litestar's alias)
        request_max_body_size=settings.max_request_bytes,
        # (a Request subclass made at run time: Litestar's parameter is typed type[Request[Any, Any, Any]])
        request_class=depth_limited_request(settings.max_json_depth, settings.unknown_fields),  # type: ignore[arg-type]
        openapi_config=OpenAPIConfig(
            title="loraplex",
            version=_version(),
            # the document only: Litestar's HTML viewers load their scripts from public CDNs, unpinned and without a
            # Content-Security-Policy; a tenant's tools (or a local viewer) read /schema/openapi.json instead
            render_plugins=[JsonRenderPlugin()],
            description="Multi-tenant LoRA serving with an OpenAI-compatible API.",
            components=Components(
                security_schemes={
                    "BearerAuth": SecurityScheme(
                        type="http", scheme="bearer", description="a tenant API key, or the admin key for admin routes"
                    )
                }
            ),
        ),
        logging_config=None,
    )
    app.state.drain = drain  # the server begins it on SIGTERM; /ready reads it
    return app
