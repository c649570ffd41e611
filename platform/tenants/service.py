"""Tenants, their API keys, admin keys, and authentication of bearer tokens."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from loraplex.platform.db.models import AdminKey, ApiKey, Tenant, utcnow
from loraplex.platform.db.session import Database
from loraplex.platform.domain_errors import Conflict, Invalid, NotFound
from loraplex.platform.storage.cache import RegistryCache
from loraplex.platform.tenants import keys

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NAME_RULE = "1-64 characters: letters, digits, '.', '_' or '-', starting with a letter or digit"


def check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise Invalid(f"invalid {what} {value!r}: use {NAME_RULE}", param="name")
    return value


@dataclass(frozen=True)
class Principal:
    """The tenant a request acts for (what a valid key resolves to)."""

    tenant_id: str
    tenant_name: str
    key_prefix: str
    max_adapters: int | None
    max_adapter_bytes: int | None
    rate_limit_per_minute: int | None
    # Share of the engine and serving limits (None: the server default; see platform/tenants/limits.py)
    weight: float | None = None
    priority: int | None = None
    max_concurrent_sequences: int | None = None
    tokens_per_minute: int | None = None
    max_queued_requests: int | None = None

    @classmethod
    def of_tenant(cls, tenant: Tenant, key_prefix: str) -> Principal:
        """The principal of ``tenant`` (its current quotas, share and limits), acting through ``key_prefix``."""
        return cls(
            str(tenant.id),
            tenant.name,
            key_prefix,
            tenant.max_adapters,
            tenant.max_adapter_bytes,
            tenant.rate_limit_per_minute,
            tenant.weight,
            tenant.priority,
            tenant.max_concurrent_sequences,
            tenant.tokens_per_minute,
            tenant.max_queued_requests,
        )


@dataclass(frozen=True)
class Quotas:
    max_adapters: int | None = None
    max_adapter_bytes: int | None = None
    rate_limit_per_minute: int | None = None
    weight: float | None = None
    priority: int | None = None
    max_concurrent_sequences: int | None = None
    tokens_per_minute: int | None = None
    max_queued_requests: int | None = None
    adapter_versions_kept: int | None = None  # how many versions of one adapter name are kept


MAX_WEIGHT = 1e6
MAX_PRIORITY = 1 << 31


def check_quotas(values: Mapping[str, Any]) -> None:
    """400 naming the field for a value the server cannot honour (None always means the server default)."""
    for field, value in values.items():
        if value is None:
            continue
        if field == "weight":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise Invalid(f"weight must be a finite number in (0, {MAX_WEIGHT:g}], got {value!r}", param=field)
            if not 0 < value <= MAX_WEIGHT:
                raise Invalid(f"weight must be in (0, {MAX_WEIGHT:g}], got {value!r}", param=field)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"{field} must be an integer, got {value!r}", param=field)
        elif field == "priority":
            if abs(value) > MAX_PRIORITY:
                raise Invalid(f"priority must be in [-2^31, 2^31], got {value}", param=field)
        elif value < 0:
            raise Invalid(f"{field} must be >= 0, got {value}", param=field)
        elif field == "adapter_versions_kept" and value < 1:
            raise Invalid(f"adapter_versions_kept must be >= 1 (the current version), got {value}", param=field)


class TenantService:
    def __init__(self, db: Database, cache: RegistryCache, admin_key: str | None = None) -> None:
        self.db = db
        self.cache = cache
        self.admin_key = admin_key

    # -- tenants -----------------------------------------------------------------------------

    async def create_tenant(self, name: str, quotas: Quotas) -> tuple[Tenant, ApiKey, str]:
        """Create a tenant and its first key; returns (tenant, key row, the key in clear)."""
        check_name(name, "tenant name")
        check_quotas(asdict(quotas))
        new = keys.generate_key()
        async with self.db.session() as session:
            tenant = Tenant(id=uuid.uuid4(), name=name, created_at=utcnow(), **asdict(quotas))
            key = ApiKey(
                id=uuid.uuid4(), tenant_id=tenant.id, prefix=new.prefix, key_hash=new.key_hash, created_at=utcnow()
            )
            try:
                session.add(tenant)
                await session.flush()  # the tenant row must exist before its key (no relationship() here)
                session.add(key)
                await session.commit()
            except IntegrityError:
                raise Conflict(f"tenant {name!r} already exists", param="name", code="tenant_exists") from None
        return tenant, key, new.secret_key

    async def list_tenants(self) -> list[Tenant]:
        async with self.db.session() as session:
            return list((await session.scalars(select(Tenant).order_by(Tenant.created_at))).all())

    async def get_tenant(self, name: str) -> Tenant:
        async with self.db.session() as session:
            tenant = await session.scalar(select(Tenant).where(Tenant.name == name))
        if tenant is None:
            raise NotFound(f"tenant {name!r} not found", code="tenant_not_found")
        return tenant

    async def update_tenant(self, name: str, changes: Mapping[str, Any]) -> Tenant:
        """Set some of a tenant's quotas, weight and limits (None: back to the server default). Its keys'
        cached principals are dropped on every replica, so the next request sees the new values."""
        unknown = set(changes) - {f.name for f in fields(Quotas)}
        if unknown:
            raise Invalid(f"unknown tenant field {sorted(unknown)[0]!r}", param=sorted(unknown)[0])
        check_quotas(changes)
        async with self.db.session() as session:
            tenant = await session.scalar(select(Tenant).where(Tenant.name == name))
            if tenant is None:
                raise NotFound(f"tenant {name!r} not found", code="tenant_not_found")
            for field, value in changes.items():
                setattr(tenant, field, value)
            await session.commit()
            prefixes = list(await session.scalars(select(ApiKey.prefix).where(ApiKey.tenant_id == tenant.id)))
        for prefix in prefixes:
            await self.cache.invalidate(_key_cache_key(prefix))
        return tenant

    # -- keys --------------------------------------------------------------------------------

    async def create_key(self, tenant_name: str) -> tuple[ApiKey, str]:
        tenant = await self.get_tenant(tenant_name)
        new = keys.generate_key()
        async with self.db.session() as session:
            key = ApiKey(
                id=uuid.uuid4(), tenant_id=tenant.id, prefix=new.prefix, key_hash=new.key_hash, created_at=utcnow()
            )
            session.add(key)
            await session.commit()
        return key, new.secret_key

    async def list_keys(self, tenant_name: str) -> list[ApiKey]:
        tenant = await self.get_tenant(tenant_name)
        async with self.db.session() as session:
            rows = await session.scalars(
                select(ApiKey).where(ApiKey.tenant_id == tenant.id).order_by(ApiKey.created_at)
            )
            return list(rows.all())

    async def revoke_key(self, tenant_name: str, key_id: str) -> ApiKey:
        """Revoke by key id or public prefix. Revoking the last live key is allowed (admin can add one)."""
        tenant = await self.get_tenant(tenant_name)
        async with self.db.session() as session:
            query = select(ApiKey).where(ApiKey.tenant_id == tenant.id)
            parsed = _as_uuid(key_id)
            query = query.where(ApiKey.id == parsed) if parsed else query.where(ApiKey.prefix == key_id)
            key = await session.scalar(query)
            if key is None:
                raise NotFound(f"key {key_id!r} not found for tenant {tenant_name!r}", code="key_not_found")
            if key.revoked_at is None:
                key.revoked_at = utcnow()
                await session.commit()
        await self.cache.invalidate(_key_cache_key(key.prefix))
        return key

    # -- authentication -----------------------------------------------------------------------

    async def authenticate(self, token: str) -> Principal | None:
        prefix = keys.split_key(token)
        if prefix is None:
            return None

        async def load() -> dict[str, Any] | None:
            async with self.db.session() as session:
                row = (
                    await session.execute(
                        select(ApiKey, Tenant)
                        .join(Tenant, Tenant.id == ApiKey.tenant_id)
                        .where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))
                    )
                ).first()
            if row is None:
                return None
            key, tenant = row
            return {
                "key_hash": key.key_hash,
                "principal": asdict(Principal.of_tenant(tenant, prefix)),
            }

        found = await self.cache.get_or_load(_key_cache_key(prefix), load)
        if found is None or not keys.matches(token, found["key_hash"]):
            return None
        return Principal(**found["principal"])

    async def is_admin(self, token: str) -> bool:
        if self.admin_key is not None and keys.matches(token, keys.hash_key(self.admin_key)):
            return True
        prefix = keys.split_key(token)
        if prefix is None:
            return False
        async with self.db.session() as session:
            stored = await session.scalar(select(AdminKey).where(AdminKey.prefix == prefix))
        return stored is not None and keys.matches(token, stored.key_hash)

    async def ensure_admin_key(self) -> str | None:
        """Generate and store an admin key when none is configured or stored; return it (shown once)."""
        if self.admin_key is not None:
            return None
        async with self.db.session() as session:
            if await session.scalar(select(func.count()).select_from(AdminKey)):
                return None
        return await self.create_admin_key()

    async def create_admin_key(self) -> str:
        new = keys.generate_key()
        async with self.db.session() as session:
            session.add(AdminKey(id=uuid.uuid4(), prefix=new.prefix, key_hash=new.key_hash, created_at=utcnow()))
            await session.commit()
        return new.secret_key


def _key_cache_key(prefix: str) -> str:
    return f"key:{prefix}"


def _as_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None
