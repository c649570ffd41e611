"""Adapter registry: validate an upload with `loraplex.adapters`, store it atomically, version it,
enforce quotas, and resolve (tenant, model name) -> adapter record through the registry cache."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from loraplex.adapters import (
    CONFIG_NAME,
    PICKLE_SUFFIXES,
    WEIGHTS_NAME,
    AdapterError,
    AdapterInfo,
    AdapterLimits,
    BaseModelSpec,
    extract_archive,
    inspect_adapter,
)
from loraplex.engine.threads import single_threaded_torch
from loraplex.platform.db.models import Adapter, Tenant, as_utc, utcnow
from loraplex.platform.db.session import Database
from loraplex.platform.errors import ApiError, bad_request, engine_error, not_found
from loraplex.platform.multipart import UploadedForm
from loraplex.platform.services.blobstore import BlobStore
from loraplex.platform.services.cache import RegistryCache
from loraplex.platform.services.tenants import Principal, check_name


@dataclass(frozen=True)
class AdapterRecord:
    """What serving needs to know about one live adapter version (cached as JSON)."""

    id: str
    tenant_id: str
    name: str
    version: int
    sha256: str
    rank: int
    alpha: float
    target_modules: list[str]
    size_bytes: int
    blob: str
    created_at: str  # ISO 8601

    @classmethod
    def from_row(cls, row: Adapter) -> AdapterRecord:
        return cls(
            str(row.id),
            str(row.tenant_id),
            row.name,
            row.version,
            row.sha256,
            row.rank,
            row.alpha,
            list(row.target_modules),
            row.size_bytes,
            row.blob,
            as_utc(row.created_at).isoformat(),
        )

    @property
    def created(self) -> datetime:
        return datetime.fromisoformat(self.created_at)


@dataclass(frozen=True)
class QuotaDefaults:
    max_adapters: int
    max_adapter_bytes: int


def cache_key(tenant_id: str, name: str) -> str:
    return f"adapter:{tenant_id}:{name}"


# Invalidated when no live adapter has these weights any more (`RegistryCache.on_invalidate` watchers, e.g. the
# engine dropping its cached copies, see app.py); the rest of the key is the content hash.
RETIRED_CONTENT = "adapter-content-retired:"


class AdapterService:
    def __init__(
        self,
        db: Database,
        store: BlobStore,
        cache: RegistryCache,
        base: BaseModelSpec,
        *,
        base_model_name: str,
        max_lora_rank: int,
        limits: AdapterLimits,
        quotas: QuotaDefaults,
    ) -> None:
        self.db = db
        self.store = store
        self.cache = cache
        self.base = base
        self.base_model_name = base_model_name
        self.max_lora_rank = max_lora_rank
        self.limits = limits
        self.quotas = quotas

    # -- upload ------------------------------------------------------------------------------

    async def create(self, principal: Principal, form: UploadedForm, workdir: Path) -> AdapterRecord:
        """Validate the uploaded form (files already in `workdir`), store the blob, commit the row."""
        name = check_name(form.fields.get("name", ""), "adapter name") if "name" in form.fields else None
        if name is None:
            raise bad_request("missing form field 'name' (the model name clients will use)", param="name")
        if name == self.base_model_name:
            raise bad_request(f"adapter name {name!r} is the base model's name; choose another", param="name")
        info, files = await asyncio.to_thread(self._validated_files, form, workdir)
        blob = await asyncio.to_thread(self.store.put, files)
        try:
            record, replaced = await self._commit(principal, name, info, blob)
        except BaseException:
            await asyncio.to_thread(self.store.delete, blob)
            raise
        await self.cache.invalidate(cache_key(principal.tenant_id, name))
        if replaced is not None:
            blob, sha256 = replaced
            await asyncio.to_thread(self.store.delete, blob)
            await self._retire(sha256)
        return record

    def _validated_files(self, form: UploadedForm, workdir: Path) -> tuple[AdapterInfo, dict[str, Path]]:
        """Check the upload with loraplex.adapters; return what it learned and the two files to store.

        Runs in a worker thread: its torch work stays on that thread (engine.threads).
        """
        single_threaded_torch()
        parts = set(form.files)
        if parts == {"file"}:
            upload = form.files["file"]
            if upload.filename.lower().endswith(PICKLE_SUFFIXES):
                raise engine_error(
                    AdapterError(
                        f"{upload.filename!r} is a pickled checkpoint; pickled weights are never loaded: upload "
                        f"a .zip or .tar.gz of the adapter folder with {WEIGHTS_NAME}",
                        code="pickled_weights",
                    )
                )
            archive = upload.path.with_name("upload-" + (upload.filename or "adapter.zip"))
            upload.path.rename(archive)
            try:  # extracted once, into this upload's folder; then checked like a folder
                root = extract_archive(archive, workdir / "extracted", self.limits)
            except AdapterError as exc:
                raise engine_error(exc) from None
            archive.unlink()
            info = self._inspect(root)
        elif parts == {"adapter_config", "adapter_model"}:
            model_name = form.files["adapter_model"].filename.lower()
            if model_name.endswith(PICKLE_SUFFIXES):
                raise engine_error(
                    AdapterError(
                        f"adapter_model {form.files['adapter_model'].filename!r} is a pickled checkpoint; "
                        f"upload {WEIGHTS_NAME} (pickled weights are never loaded)",
                        code="pickled_weights",
                    )
                )
            root = workdir / "adapter"
            root.mkdir()
            form.files["adapter_config"].path.rename(root / CONFIG_NAME)
            form.files["adapter_model"].path.rename(root / WEIGHTS_NAME)
            info = self._inspect(root)
        else:
            raise bad_request(
                "upload either one 'file' (a .zip or .tar.gz of the PEFT adapter folder) or the "
                f"two files 'adapter_config' ({CONFIG_NAME}) and 'adapter_model' ({WEIGHTS_NAME}); "
                f"got {', '.join(sorted(parts)) or 'no file'}",
                param="file",
            )
        return info, {CONFIG_NAME: root / CONFIG_NAME, WEIGHTS_NAME: root / WEIGHTS_NAME}

    def _inspect(self, source: Path) -> AdapterInfo:
        try:
            return inspect_adapter(source, self.base, max_lora_rank=self.max_lora_rank, limits=self.limits)
        except AdapterError as exc:
            raise engine_error(exc) from None

    async def _commit(
        self, principal: Principal, name: str, info: AdapterInfo, blob: str
    ) -> tuple[AdapterRecord, tuple[str, str] | None]:
        """The new version's record, and the (blob, content hash) of the version it replaced, if any."""
        tenant_id = uuid.UUID(principal.tenant_id)
        async with self.db.session() as session:
            # Serialises concurrent uploads of one tenant on PostgreSQL (quota check + version number).
            tenant = await session.scalar(select(Tenant).where(Tenant.id == tenant_id).with_for_update())
            if tenant is None:
                raise not_found("tenant no longer exists", code="tenant_not_found")
            live = (
                await session.scalars(
                    select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.deleted_at.is_(None))
                )
            ).all()
            current = next((a for a in live if a.name == name), None)
            others = [a for a in live if a.name != name]
            self._check_quotas(tenant, others, info)
            last = await session.scalar(
                select(func.max(Adapter.version)).where(Adapter.tenant_id == tenant_id, Adapter.name == name)
            )
            if current is not None:
                current.deleted_at = utcnow()
                await session.flush()  # frees the live-name slot before the new row goes in
            row = Adapter(
                id=uuid.uuid4(),
                tenant_id=tenant_id,
                name=name,
                version=(last or 0) + 1,
                sha256=info.content_hash,
                rank=info.rank,
                alpha=float(info.alpha),
                target_modules=list(info.target_modules),
                size_bytes=info.size_bytes,
                blob=blob,
                created_at=utcnow(),
            )
            session.add(row)
            try:
                await session.commit()
            except IntegrityError:
                raise ApiError(
                    409, f"adapter {name!r} was uploaded concurrently; retry the upload", param="name", code="conflict"
                ) from None
        return AdapterRecord.from_row(row), ((current.blob, current.sha256) if current is not None else None)

    def _check_quotas(self, tenant: Tenant, others: list[Adapter], info: AdapterInfo) -> None:
        max_count = tenant.max_adapters if tenant.max_adapters is not None else self.quotas.max_adapters
        max_bytes = tenant.max_adapter_bytes if tenant.max_adapter_bytes is not None else self.quotas.max_adapter_bytes
        if len(others) + 1 > max_count:
            raise ApiError(
                403,
                f"adapter quota exceeded: tenant {tenant.name!r} may keep {max_count} adapters "
                f"and has {len(others)}; delete one first",
                code="adapter_quota_exceeded",
            )
        used = sum(a.size_bytes for a in others)
        if used + info.size_bytes > max_bytes:
            raise ApiError(
                403,
                f"storage quota exceeded: this adapter has {info.size_bytes} bytes of weights, "
                f"tenant {tenant.name!r} uses {used} of {max_bytes} bytes",
                code="storage_quota_exceeded",
            )

    # -- read / delete -----------------------------------------------------------------------

    async def list(self, principal: Principal) -> list[AdapterRecord]:
        return await self.list_of_tenant(principal.tenant_id)

    async def list_of_tenant(self, tenant_id: str) -> list[AdapterRecord]:
        async with self.db.session() as session:
            rows = await session.scalars(
                select(Adapter)
                .where(Adapter.tenant_id == uuid.UUID(tenant_id), Adapter.deleted_at.is_(None))
                .order_by(Adapter.name)
            )
            return [AdapterRecord.from_row(r) for r in rows.all()]

    async def resolve(self, tenant_id: str, name: str) -> AdapterRecord | None:
        """The live version of `name` for this tenant (cached), or None."""

        async def load() -> dict[str, object] | None:
            async with self.db.session() as session:
                row = await session.scalar(
                    select(Adapter).where(
                        Adapter.tenant_id == uuid.UUID(tenant_id), Adapter.name == name, Adapter.deleted_at.is_(None)
                    )
                )
            return asdict(AdapterRecord.from_row(row)) if row is not None else None

        found = await self.cache.get_or_load(cache_key(tenant_id, name), load)
        return AdapterRecord(**found) if found is not None else None

    async def get(self, principal: Principal, name: str) -> AdapterRecord:
        record = await self.resolve(principal.tenant_id, name)
        if record is None:
            raise not_found(f"adapter {name!r} not found", code="adapter_not_found")
        return record

    async def delete(self, principal: Principal, name: str) -> AdapterRecord:
        return await self.delete_of_tenant(principal.tenant_id, name)

    async def delete_of_tenant(self, tenant_id: str, name: str) -> AdapterRecord:
        async with self.db.session() as session:
            row = await session.scalar(
                select(Adapter).where(
                    Adapter.tenant_id == uuid.UUID(tenant_id),
                    Adapter.name == name,
                    Adapter.deleted_at.is_(None),
                )
            )
            if row is None:
                raise not_found(f"adapter {name!r} not found", code="adapter_not_found")
            await session.execute(update(Adapter).where(Adapter.id == row.id).values(deleted_at=utcnow()))
            await session.commit()
        await self.cache.invalidate(cache_key(tenant_id, name))
        await asyncio.to_thread(self.store.delete, row.blob)
        await self._retire(row.sha256)
        return AdapterRecord.from_row(row)

    async def _retire(self, sha256: str) -> None:
        """Tell every replica that no live adapter has these weights any more (unless one still does)."""
        async with self.db.session() as session:
            still_live = await session.scalar(
                select(func.count()).select_from(Adapter).where(Adapter.sha256 == sha256, Adapter.deleted_at.is_(None))
            )
        if not still_live:
            await self.cache.invalidate(RETIRED_CONTENT + sha256)
