"""Endpoints: a tenant's named deployment of one adapter version (or the base model) with defaults, and
optionally a canary version of the same adapter for a share of the callers. Every change is a new revision.

Names share one namespace with the tenant's adapters (an endpoint may not take an adapter's name, nor an
adapter an endpoint's), so `model=<name>` never means two things. Changes lock the tenant's row, as uploads
and deletions of adapter versions do, so a version an endpoint serves cannot be deleted under it."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import msgspec
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from loraplex.platform.adapters.service import AdapterService, parse_ref
from loraplex.platform.db.models import Adapter, Endpoint, Tenant, as_utc, utcnow
from loraplex.platform.db.session import Database
from loraplex.platform.domain_errors import Conflict, Invalid, NotFound
from loraplex.platform.endpoints.pins import check_pin_limit, lock_pins
from loraplex.platform.endpoints.schemas import Canary, EndpointCreate, EndpointDefaults, EndpointUpdate, Shadow
from loraplex.platform.storage.cache import RegistryCache
from loraplex.platform.tenants.service import Principal, check_name

# Compiles an endpoint's response_format at publish (a refusal raises the 400 there); see app.py.
Compile = Callable[[EndpointDefaults], Awaitable[None]]


@dataclass(frozen=True)
class EndpointRecord:
    """What serving needs to know about one endpoint (cached as JSON)."""

    id: str
    tenant_id: str
    name: str
    revision: int
    adapter_name: str | None
    adapter_version: int | None
    canary_version: int | None
    canary_weight: float | None
    config: dict[str, Any]  # {"defaults": EndpointDefaults as JSON, "overridable": [...], "shadow": {...}}
    created_at: str
    updated_at: str
    pinned: bool = False
    description: str | None = None  # (a record cached by an older replica has none)

    @classmethod
    def from_row(cls, row: Endpoint) -> EndpointRecord:
        return cls(
            str(row.id),
            str(row.tenant_id),
            row.name,
            row.revision,
            row.adapter_name,
            row.adapter_version,
            row.canary_version,
            row.canary_weight,
            dict(row.config),
            as_utc(row.created_at).isoformat(),
            as_utc(row.updated_at).isoformat(),
            bool(row.pinned),
            row.description,
        )

    @property
    def defaults(self) -> EndpointDefaults:
        return msgspec.convert(self.config.get("defaults") or {}, EndpointDefaults)

    @property
    def overridable(self) -> frozenset[str]:
        return frozenset(self.config.get("overridable") or ())

    @property
    def adapter(self) -> str | None:
        return f"{self.adapter_name}@{self.adapter_version}" if self.adapter_name else None

    @property
    def canary(self) -> Canary | None:
        if self.canary_version is None or self.canary_weight is None:
            return None
        return Canary(version=self.canary_version, weight=self.canary_weight)

    @property
    def shadow(self) -> Shadow | None:
        found = self.config.get("shadow")
        return msgspec.convert(found, Shadow) if found else None


def endpoint_cache_key(tenant_id: str, name: str) -> str:
    return f"endpoint:{tenant_id}:{name}"


def _config(defaults: EndpointDefaults, overridable: list[str], shadow: Shadow | None) -> dict[str, Any]:
    config = {"defaults": msgspec.to_builtins(defaults), "overridable": sorted(set(overridable))}
    if shadow is not None:
        config["shadow"] = msgspec.to_builtins(shadow)
    return config


class EndpointService:
    def __init__(
        self,
        db: Database,
        cache: RegistryCache,
        adapters: AdapterService,
        compile_defaults: Compile,
        *,
        max_pinned_adapters: int = 0,
        on_pins_changed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.db = db
        self.cache = cache
        self.adapters = adapters
        self.compile_defaults = compile_defaults
        self.max_pinned_adapters = max_pinned_adapters
        self.on_pins_changed = on_pins_changed  # Pinner.announce: every replica re-reads the pinned set

    async def create(self, principal: Principal, body: EndpointCreate) -> EndpointRecord:
        name = check_name(body.name, "endpoint name")
        if name == self.adapters.base_model_name:
            raise Invalid(f"endpoint name {name!r} is the base model's name; choose another", param="name")
        await self.compile_defaults(body.defaults)  # a refused schema is a 400 before anything is written
        tenant_id = uuid.UUID(principal.tenant_id)
        async with self.db.session() as session:
            await _lock_tenant(session, tenant_id)
            adapter_named = select(Adapter.id).where(
                Adapter.tenant_id == tenant_id, Adapter.name == name, Adapter.deleted_at.is_(None)
            )
            if await session.scalar(adapter_named.limit(1)):
                raise Conflict(f"{name!r} is the name of one of your adapters", param="name", code="conflict")
            adapter_name, version = await self._adapter_version(session, principal, body.adapter)
            await self._check_canary(session, tenant_id, adapter_name, version, body.canary)
            await self._check_shadow(session, tenant_id, adapter_name, version, body.shadow)
            now = utcnow()
            row = Endpoint(
                id=uuid.uuid4(),
                tenant_id=tenant_id,
                name=name,
                revision=1,
                adapter_name=adapter_name,
                adapter_version=version,
                canary_version=body.canary.version if body.canary else None,
                canary_weight=body.canary.weight if body.canary else None,
                config=_config(body.defaults, list(body.overridable), body.shadow),
                created_at=now,
                updated_at=now,
                pinned=body.pinned,
                description=body.description,
            )
            session.add(row)
            if body.pinned:
                await self._check_pins(session, row)
            try:
                await session.commit()
            except IntegrityError:
                raise Conflict(f"endpoint {name!r} already exists", param="name", code="endpoint_exists") from None
        await self.cache.invalidate(endpoint_cache_key(principal.tenant_id, name))
        record = EndpointRecord.from_row(row)
        await self._publish(record)
        if record.pinned:
            await self._pins_changed()
        return record

    async def _check_pins(self, session: AsyncSession, row: Endpoint) -> None:
        """A pinned endpoint serves an adapter, and under the pin lock the pinned set with this change must fit
        `max_pinned_adapters` (else 409)."""
        if row.adapter_name is None:
            raise Invalid("the endpoint serves the base model: it has no adapter to pin", param="pinned")
        await lock_pins(session)
        await check_pin_limit(session, self.max_pinned_adapters)

    async def _pins_changed(self) -> None:
        if self.on_pins_changed is not None:
            await self.on_pins_changed()

    async def _publish(self, record: EndpointRecord) -> None:
        """Warm the adapter versions the endpoint serves on every replica (AdapterService.on_publish)."""
        if self.adapters.on_publish is None or record.adapter_name is None:
            return
        shadow = record.shadow
        versions = [record.adapter_version, record.canary_version, shadow.version if shadow else None]
        found = [await self.adapters.resolve(record.tenant_id, f"{record.adapter_name}@{v}") for v in versions if v]
        await self.adapters.on_publish([r for r in found if r is not None])

    async def update(self, principal: Principal, name: str, body: EndpointUpdate) -> EndpointRecord:
        """Change some fields (a new revision). Setting `adapter` to another adapter drops the canary and the shadow
        (unless the same call sets them); each must be another live version of the endpoint's adapter."""
        if body.defaults is not msgspec.UNSET:
            await self.compile_defaults(body.defaults)

        def change(row: Endpoint) -> None:
            if body.defaults is not msgspec.UNSET or body.overridable is not msgspec.UNSET:
                old = EndpointRecord.from_row(row)
                defaults = old.defaults if body.defaults is msgspec.UNSET else body.defaults
                overridable = list(old.overridable if body.overridable is msgspec.UNSET else body.overridable)
                row.config = _config(defaults, overridable, old.shadow)
            if body.pinned is not msgspec.UNSET:
                row.pinned = body.pinned
            if body.description is not msgspec.UNSET:
                row.description = body.description

        return await self._change(principal, name, change, adapter=body.adapter, canary=body.canary, shadow=body.shadow)

    async def promote(self, principal: Principal, name: str) -> EndpointRecord:
        """The canary version becomes the one every caller gets."""

        def change(row: Endpoint) -> None:
            if row.canary_version is None:
                raise Conflict(f"endpoint {name!r} has no canary to promote", code="no_canary")
            row.adapter_version, row.canary_version, row.canary_weight = row.canary_version, None, None

        return await self._change(principal, name, change)

    async def rollback(self, principal: Principal, name: str) -> EndpointRecord:
        """Every caller back on the endpoint's main version; the canary is dropped."""

        def change(row: Endpoint) -> None:
            if row.canary_version is None:
                raise Conflict(f"endpoint {name!r} has no canary to roll back", code="no_canary")
            row.canary_version, row.canary_weight = None, None

        return await self._change(principal, name, change)

    async def _change(
        self,
        principal: Principal,
        name: str,
        change: Callable[[Endpoint], None],
        *,
        adapter: str | msgspec.UnsetType | None = msgspec.UNSET,
        canary: Canary | msgspec.UnsetType | None = msgspec.UNSET,
        shadow: Shadow | msgspec.UnsetType | None = msgspec.UNSET,
    ) -> EndpointRecord:
        tenant_id = uuid.UUID(principal.tenant_id)
        async with self.db.session() as session:
            await _lock_tenant(session, tenant_id)
            row = await self._row(session, tenant_id, name)
            was_pinned = row.pinned
            change(row)
            if adapter is not msgspec.UNSET:
                before = row.adapter_name
                row.adapter_name, row.adapter_version = await self._adapter_version(session, principal, adapter)
                if row.adapter_name != before and canary is msgspec.UNSET:  # a canary is a version of the same adapter
                    row.canary_version, row.canary_weight = None, None
                if row.adapter_name != before and shadow is msgspec.UNSET:  # so is a shadow
                    shadow = None
            if canary is not msgspec.UNSET:
                row.canary_version = canary.version if canary else None
                row.canary_weight = canary.weight if canary else None
            if adapter is not msgspec.UNSET or canary is not msgspec.UNSET:
                current = Canary(version=row.canary_version, weight=row.canary_weight) if row.canary_version else None
                await self._check_canary(session, tenant_id, row.adapter_name, row.adapter_version, current)
            if shadow is not msgspec.UNSET:
                old = EndpointRecord.from_row(row)
                row.config = _config(old.defaults, list(old.overridable), shadow)
            if adapter is not msgspec.UNSET or shadow is not msgspec.UNSET:
                current_shadow = EndpointRecord.from_row(row).shadow
                await self._check_shadow(session, tenant_id, row.adapter_name, row.adapter_version, current_shadow)
            if row.pinned:  # pinning, or a pinned endpoint's versions changing (the new ones are pinned)
                await self._check_pins(session, row)
            row.revision += 1
            row.updated_at = utcnow()
            await session.commit()
        await self.cache.invalidate(endpoint_cache_key(principal.tenant_id, name))
        record = EndpointRecord.from_row(row)
        await self._publish(record)
        if was_pinned or record.pinned:
            await self._pins_changed()
        return record

    async def delete(self, principal: Principal, name: str) -> EndpointRecord:
        tenant_id = uuid.UUID(principal.tenant_id)
        async with self.db.session() as session:
            await _lock_tenant(session, tenant_id)
            row = await self._row(session, tenant_id, name)
            await session.delete(row)
            await session.commit()
        await self.cache.invalidate(endpoint_cache_key(principal.tenant_id, name))
        record = EndpointRecord.from_row(row)
        if record.pinned:
            await self._pins_changed()
        return record

    async def list(self, principal: Principal) -> list[EndpointRecord]:
        async with self.db.session() as session:
            rows = await session.scalars(
                select(Endpoint).where(Endpoint.tenant_id == uuid.UUID(principal.tenant_id)).order_by(Endpoint.name)
            )
            return [EndpointRecord.from_row(r) for r in rows.all()]

    async def get(self, principal: Principal, name: str) -> EndpointRecord:
        record = await self.resolve(principal.tenant_id, name)
        if record is None:
            raise NotFound(f"endpoint {name!r} not found", code="endpoint_not_found")
        return record

    async def resolve(self, tenant_id: str, name: str) -> EndpointRecord | None:
        """The tenant's endpoint called `name` (cached), or None (also for another tenant's)."""
        if parse_ref(name) != (name, None):
            return None

        async def load() -> dict[str, object] | None:
            async with self.db.session() as session:
                row = await session.scalar(
                    select(Endpoint).where(Endpoint.tenant_id == uuid.UUID(tenant_id), Endpoint.name == name)
                )
            return asdict(EndpointRecord.from_row(row)) if row is not None else None

        found = await self.cache.get_or_load(endpoint_cache_key(tenant_id, name), load)
        return EndpointRecord(**found) if found is not None else None

    async def _row(self, session: AsyncSession, tenant_id: uuid.UUID, name: str) -> Endpoint:
        row = await session.scalar(select(Endpoint).where(Endpoint.tenant_id == tenant_id, Endpoint.name == name))
        if row is None:
            raise NotFound(f"endpoint {name!r} not found", code="endpoint_not_found")
        return row

    async def _adapter_version(
        self, session: AsyncSession, principal: Principal, adapter: str | None
    ) -> tuple[str | None, int | None]:
        """(name, version) the endpoint serves: `name@N` as given, `name` pinned to its current version now."""
        if adapter is None:
            return None, None
        record = await self.adapters.resolve(principal.tenant_id, adapter)
        if record is None:
            raise NotFound(f"adapter {adapter!r} not found", param="adapter", code="adapter_not_found")
        return record.name, record.version

    async def _check_canary(
        self,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        adapter_name: str | None,
        version: int | None,
        canary: Canary | None,
    ) -> None:
        """A canary is another live version of the endpoint's adapter; both must still be live (read under the
        tenant lock, so a concurrent deletion cannot remove one between this check and the commit)."""
        live = select(Adapter.id).where(
            Adapter.tenant_id == tenant_id, Adapter.name == adapter_name, Adapter.deleted_at.is_(None)
        )
        if adapter_name is not None and await session.scalar(live.where(Adapter.version == version)) is None:
            raise NotFound(f"adapter {adapter_name}@{version} not found", param="adapter", code="adapter_not_found")
        if canary is not None:
            await _check_other_version(session, tenant_id, adapter_name, version, canary.version, "canary")

    async def _check_shadow(
        self,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        adapter_name: str | None,
        version: int | None,
        shadow: Shadow | None,
    ) -> None:
        """A shadow is another live version of the endpoint's adapter (deleting it later is allowed: its copies
        then fail, counted in /metrics, and the callers never notice)."""
        if shadow is not None:
            await _check_other_version(session, tenant_id, adapter_name, version, shadow.version, "shadow")


async def _check_other_version(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    adapter_name: str | None,
    version: int | None,
    other: int,
    role: str,
) -> None:
    """A canary's or shadow's version (`role`) is another live version of the endpoint's adapter."""
    if adapter_name is None:
        raise Invalid(f"a {role} needs an adapter: it is another version of the endpoint's adapter", param=role)
    if other == version:
        raise Invalid(f"the {role} is the endpoint's own version {adapter_name}@{version}", param=f"{role}.version")
    live = select(Adapter.id).where(
        Adapter.tenant_id == tenant_id,
        Adapter.name == adapter_name,
        Adapter.version == other,
        Adapter.deleted_at.is_(None),
    )
    if await session.scalar(live) is None:
        raise NotFound(f"adapter {adapter_name}@{other} not found", param=f"{role}.version", code="adapter_not_found")


async def _lock_tenant(session: AsyncSession, tenant_id: uuid.UUID) -> None:
    if await session.scalar(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update()) is None:
        raise NotFound("tenant no longer exists", code="tenant_not_found")
