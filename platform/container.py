"""Everything a request handler needs, built once per server process (see app.lifespan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loraplex.engine import AsyncEngine
from loraplex.platform.adapters.engine_refs import EngineAdapters
from loraplex.platform.adapters.service import AdapterService
from loraplex.platform.adapters.upload_slots import UploadSlots
from loraplex.platform.adapters.warm import Warmer
from loraplex.platform.db.session import Database
from loraplex.platform.endpoints.pins import Pinner
from loraplex.platform.endpoints.rollups import Rollups
from loraplex.platform.endpoints.service import EndpointService
from loraplex.platform.endpoints.shadow import ShadowTraffic
from loraplex.platform.generation.token_texts import TokenTexts
from loraplex.platform.metrics import Metrics
from loraplex.platform.model_resolution import ModelResolver
from loraplex.platform.settings import Settings
from loraplex.platform.storage.blobstore import BlobStore
from loraplex.platform.storage.cache import RegistryCache
from loraplex.platform.storage.redis_link import RedisLink
from loraplex.platform.tenants.limits import TenantLimits
from loraplex.platform.tenants.rate_limit import RateLimiter
from loraplex.platform.tenants.service import TenantService


@dataclass
class Services:
    settings: Settings
    db: Database
    redis: RedisLink | None
    cache: RegistryCache
    store: BlobStore
    tenants: TenantService
    rate_limiter: RateLimiter
    adapters: AdapterService
    endpoints: EndpointService
    models: ModelResolver  # what a request's `model` names (the one place that decides)
    warmer: Warmer
    pinner: Pinner
    engine: AsyncEngine
    engine_adapters: EngineAdapters
    metrics: Metrics
    token_texts: TokenTexts
    started: int  # unix time the server started (the base model's `created`)
    rollups: Rollups  # per-minute endpoint traffic in SQL (the console's plots)
    tenant_limits: TenantLimits = field(default_factory=TenantLimits)
    upload_slots: UploadSlots = field(default_factory=lambda: UploadSlots(4, 2))
    batch: Any = None  # platform.batch.api.BatchApi, started by the app's lifespan
    imports: Any = None  # platform.adapters.imports.service.ImportService (its runner started by the lifespan)
    import_credentials: Any = None  # platform.adapters.imports.credentials.CredentialStore
    shadow: ShadowTraffic = None  # type: ignore[assignment]  # built in __post_init__ unless given

    def __post_init__(self) -> None:
        if self.shadow is None:
            self.shadow = ShadowTraffic(self.metrics, self.settings.shadow_max_concurrent)

    async def close(self) -> None:
        await self.shadow.close()
        await self.warmer.close()
        await self.pinner.close()
        await self.rollups.close()
        await self.tenant_limits.close()
        await self.cache.close()
        if self.redis is not None:
            await self.redis.close()
        await self.db.close()
