"""Adapter registry: validate an upload with `loraplex.adapters`, store it atomically, version it,
enforce quotas, and resolve (tenant, model name) -> adapter record through the registry cache."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import Select, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

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
from loraplex.adapters.stacking import BaseWeights
from loraplex.engine.threads import single_threaded_torch
from loraplex.platform.db.models import Adapter, AdapterCurrent, Endpoint, Tenant, as_utc, utcnow
from loraplex.platform.db.session import Database
from loraplex.platform.domain_errors import Conflict, Forbidden, Invalid, NotFound, refused
from loraplex.platform.multipart import UploadedForm
from loraplex.platform.storage.blobstore import BlobStore
from loraplex.platform.storage.cache import RegistryCache
from loraplex.platform.tenants.service import NAME_RE, Principal, check_name


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
    broken_reason: str | None = None  # why its stored files last failed to load (None: they loaded, or not tried)
    origin: dict[str, object] | None = None  # how it came: upload, import, merge (with its sources)
    publish_check: dict[str, object] | None = None  # the check at publish's figures (None: not checked)

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
            row.broken_reason,
            row.origin,
            row.publish_check,
        )

    @property
    def created(self) -> datetime:
        return datetime.fromisoformat(self.created_at)


@dataclass(frozen=True)
class QuotaDefaults:
    max_adapters: int
    max_adapter_bytes: int
    adapter_versions_kept: int = 5


def cache_key(tenant_id: str, name: str) -> str:
    return f"adapter:{tenant_id}:{name}"


# Invalidated when no live adapter has these weights any more (`RegistryCache.on_invalidate` watchers, e.g. the
# engine dropping its cached copies, see app.py); the rest of the key is the content hash.
RETIRED_CONTENT = "adapter-content-retired:"
# Invalidated when a blob is deleted: replicas drop their local copy (BlobStore.evict); the rest is the blob.
DELETED_BLOB = "blob-deleted:"


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
        base_weights: BaseWeights | None = None,
    ) -> None:
        self.db = db
        self.store = store
        self.cache = cache
        self.base = base
        self.base_model_name = base_model_name
        self.max_lora_rank = max_lora_rank
        self.limits = limits
        self.quotas = quotas
        # The engine's base weights: a DoRA adapter's factors need them, and one over the bound is refused at upload
        # (scale_too_large) rather than stored and failing when the engine reads it. None: not checked here.
        self.base_weights = base_weights
        # Called with each newly published version (set by the app: adapters/warm.py loads it on every replica).
        self.on_publish: Callable[[list[AdapterRecord]], Awaitable[None]] | None = None
        # Run on every new version's files before it is stored (upload, import, merge): raises to refuse the
        # version, else returns what the version records as `publish_check` (set by the app).
        # Its last argument: the request accepted a failed check (stored with a warning instead of refused).
        self.publish_check: (
            Callable[[Principal, str, AdapterInfo, dict[str, Path], bool], Awaitable[dict[str, object] | None]] | None
        ) = None

    # -- upload ------------------------------------------------------------------------------

    async def create(self, principal: Principal, form: UploadedForm, workdir: Path) -> AdapterRecord:
        """Validate the uploaded form (files already in `workdir`), then publish it as a new version."""
        name = self.check_new_name(form.fields.get("name", "") if "name" in form.fields else None)
        accept = form_flag(form.fields.get("accept_failed_check"), "accept_failed_check")
        info, files = await asyncio.to_thread(self._validated_files, form, workdir)
        return await self.publish(principal, name, info, files, origin={"kind": "upload"}, accept_failed_check=accept)

    def check_new_name(self, name: str | None) -> str:
        """The name a new version is published under, checked (every way in: upload, import, merge)."""
        if name is None:
            raise Invalid("missing form field 'name' (the model name clients will use)", param="name")
        name = check_name(name, "adapter name")
        if name == self.base_model_name:
            raise Invalid(f"adapter name {name!r} is the base model's name; choose another", param="name")
        return name

    def inspect_folder(self, root: Path) -> tuple[AdapterInfo, dict[str, Path]]:
        """Check an adapter folder (config + safetensors weights) as an upload is checked; its two files to store.
        Every way in (upload, import, merge) goes through here. Runs in a worker thread."""
        single_threaded_torch()
        info = self._inspect(root)
        return info, {CONFIG_NAME: root / CONFIG_NAME, WEIGHTS_NAME: root / WEIGHTS_NAME}

    async def publish(
        self,
        principal: Principal,
        name: str,
        info: AdapterInfo,
        files: dict[str, Path],
        *,
        origin: dict[str, object],
        accept_failed_check: bool = False,
    ) -> AdapterRecord:
        """Store a checked adapter's files and commit them as the next version of `name` (the versions past the
        tenant's retention are retired in the same transaction); `origin` records how it came (upload, import,
        merge). When `publish_check` is set it runs first, on the files, and may refuse the version (nothing is
        stored then) or return the figures the version records (`accept_failed_check`: a failed check is recorded,
        with a warning, instead of refusing the version)."""
        check: dict[str, object] | None = None
        if self.publish_check is not None:
            check = await self.publish_check(principal, name, info, files, accept_failed_check)
        blob = await asyncio.to_thread(self.store.put, files)
        try:
            record, retired = await self._commit(principal, name, info, blob, origin=origin, publish_check=check)
        except BaseException:
            await asyncio.to_thread(self.store.delete, blob)
            raise
        await self.cache.invalidate(cache_key(principal.tenant_id, name))
        await self._drop(principal.tenant_id, retired)
        if self.on_publish is not None:
            await self.on_publish([record])
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
                raise refused(
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
                raise refused(exc) from None
            archive.unlink()
            info = self._inspect(root)
        elif parts == {"adapter_config", "adapter_model"}:
            model_name = form.files["adapter_model"].filename.lower()
            if model_name.endswith(PICKLE_SUFFIXES):
                raise refused(
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
            raise Invalid(
                "upload either one 'file' (a .zip or .tar.gz of the PEFT adapter folder) or the "
                f"two files 'adapter_config' ({CONFIG_NAME}) and 'adapter_model' ({WEIGHTS_NAME}); "
                f"got {', '.join(sorted(parts)) or 'no file'}",
                param="file",
            )
        return info, {CONFIG_NAME: root / CONFIG_NAME, WEIGHTS_NAME: root / WEIGHTS_NAME}

    def _inspect(self, source: Path) -> AdapterInfo:
        try:
            return inspect_adapter(
                source, self.base, max_lora_rank=self.max_lora_rank, limits=self.limits, base_weights=self.base_weights
            )
        except AdapterError as exc:
            raise refused(exc) from None

    async def _commit(
        self,
        principal: Principal,
        name: str,
        info: AdapterInfo,
        blob: str,
        *,
        origin: dict[str, object],
        publish_check: dict[str, object] | None,
    ) -> tuple[AdapterRecord, list[Adapter]]:
        """The new version's record, and the versions it retired (past the tenant's retention)."""
        tenant_id = uuid.UUID(principal.tenant_id)
        async with self.db.session() as session:
            # Serialises concurrent uploads, endpoint changes and deletions of one tenant on PostgreSQL.
            tenant = await session.scalar(select(Tenant).where(Tenant.id == tenant_id).with_for_update())
            if tenant is None:
                raise NotFound("tenant no longer exists", code="tenant_not_found")
            if await session.scalar(select(Endpoint.id).where(Endpoint.tenant_id == tenant_id, Endpoint.name == name)):
                raise Conflict(
                    f"{name!r} is the name of one of your endpoints; choose another", param="name", code="conflict"
                )
            live = (
                await session.scalars(
                    select(Adapter)
                    .where(Adapter.tenant_id == tenant_id, Adapter.deleted_at.is_(None))
                    .order_by(Adapter.version.desc())
                )
            ).all()
            kept = self.versions_kept(tenant)
            same = [a for a in live if a.name == name]
            retired = same[kept - 1 :]
            await self._refuse_in_use(
                session, tenant_id, name, [a.version for a in retired], "retention would retire", True
            )
            self._check_quotas(tenant, [a for a in live if a not in retired], name, info)
            last = await session.scalar(
                select(func.max(Adapter.version)).where(Adapter.tenant_id == tenant_id, Adapter.name == name)
            )
            now = utcnow()
            for old in retired:
                old.deleted_at = now
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
                created_at=now,
                origin=origin,
                publish_check=publish_check,
            )
            session.add(row)
            try:
                await session.commit()
            except IntegrityError:
                raise Conflict(
                    f"adapter {name!r} was uploaded concurrently; retry the upload", param="name", code="conflict"
                ) from None
        return AdapterRecord.from_row(row), list(retired)

    def versions_kept(self, tenant: Tenant) -> int:
        kept = tenant.adapter_versions_kept
        return max(1, kept if kept is not None else self.quotas.adapter_versions_kept)

    async def _refuse_in_use(
        self,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        name: str,
        versions: list[int],
        action: str,
        protect_current: bool = False,
    ) -> None:
        """409 when an endpoint serves one of these versions of `name` (or, with `protect_current`, the tenant
        marked one of them current)."""
        if not versions:
            return
        endpoint = await session.scalar(
            select(Endpoint).where(
                Endpoint.tenant_id == tenant_id,
                Endpoint.adapter_name == name,
                or_(Endpoint.adapter_version.in_(versions), Endpoint.canary_version.in_(versions)),
            )
        )
        if endpoint is not None:
            used = endpoint.adapter_version if endpoint.adapter_version in versions else endpoint.canary_version
            raise Conflict(
                f"{action} {name}@{used}, which endpoint {endpoint.name!r} serves; change or delete the endpoint first",
                param="name",
                code="version_in_use",
            )
        current = await session.get(AdapterCurrent, (tenant_id, name)) if protect_current else None
        if current is not None and current.version in versions:
            raise Conflict(
                f"{action} {name}@{current.version}, which is marked current; mark another version current first",
                param="name",
                code="version_in_use",
            )

    def _check_quotas(self, tenant: Tenant, kept: Sequence[Adapter], name: str, info: AdapterInfo) -> None:
        """`max_adapters` counts names, `max_adapter_bytes` every kept version's weights."""
        max_count = tenant.max_adapters if tenant.max_adapters is not None else self.quotas.max_adapters
        max_bytes = tenant.max_adapter_bytes if tenant.max_adapter_bytes is not None else self.quotas.max_adapter_bytes
        others = {a.name for a in kept if a.name != name}
        if len(others) + 1 > max_count:
            raise Forbidden(
                f"adapter quota exceeded: tenant {tenant.name!r} may keep {max_count} adapters "
                f"and has {len(others)}; delete one first",
                code="adapter_quota_exceeded",
            )
        used = sum(a.size_bytes for a in kept)
        if used + info.size_bytes > max_bytes:
            raise Forbidden(
                f"storage quota exceeded: this adapter has {info.size_bytes} bytes of weights, "
                f"tenant {tenant.name!r} uses {used} of {max_bytes} bytes (every kept version counts)",
                code="storage_quota_exceeded",
            )

    # -- read / delete -----------------------------------------------------------------------

    async def list(self, principal: Principal) -> list[AdapterRecord]:
        return await self.list_of_tenant(principal.tenant_id)

    async def list_of_tenant(self, tenant_id: str) -> list[AdapterRecord]:
        """The current version of each of the tenant's adapter names."""
        async with self.db.session() as session:
            rows = (await session.scalars(self._live(tenant_id).order_by(Adapter.name, Adapter.version))).all()
            marked = {
                c.name: c.version
                for c in await session.scalars(
                    select(AdapterCurrent).where(AdapterCurrent.tenant_id == uuid.UUID(tenant_id))
                )
            }
        by_name: dict[str, list[Adapter]] = {}
        for r in rows:
            by_name.setdefault(r.name, []).append(r)
        current = [next((r for r in rs if r.version == marked.get(name)), rs[-1]) for name, rs in by_name.items()]
        return [AdapterRecord.from_row(r) for r in current]

    async def versions(self, principal: Principal, name: str) -> tuple[list[AdapterRecord], int]:
        """Every live version of `name`, oldest first, and the current one's number (404 if none)."""
        async with self.db.session() as session:
            rows = (
                await session.scalars(
                    self._live(principal.tenant_id).where(Adapter.name == name).order_by(Adapter.version)
                )
            ).all()
        if not rows:
            raise NotFound(f"adapter {name!r} not found", code="adapter_not_found")
        current = await self.resolve(principal.tenant_id, name)
        return [AdapterRecord.from_row(r) for r in rows], current.version if current else rows[-1].version

    def _live(self, tenant_id: str) -> Select[tuple[Adapter]]:
        return select(Adapter).where(Adapter.tenant_id == uuid.UUID(tenant_id), Adapter.deleted_at.is_(None))

    async def resolve(self, tenant_id: str, model: str) -> AdapterRecord | None:
        """The adapter version `model` names for this tenant (`name`: the current one, `name@N`: version N),
        cached, or None."""
        ref = parse_ref(model)
        if ref is None:
            return None
        name, version = ref

        async def load() -> dict[str, object] | None:
            async with self.db.session() as session:
                row = await self._load(session, uuid.UUID(tenant_id), name, version)
            return asdict(AdapterRecord.from_row(row)) if row is not None else None

        key = cache_key(tenant_id, name) if version is None else cache_key(tenant_id, f"{name}@{version}")
        found = await self.cache.get_or_load(key, load)
        return AdapterRecord(**found) if found is not None else None

    async def _load(
        self, session: AsyncSession, tenant_id: uuid.UUID, name: str, version: int | None
    ) -> Adapter | None:
        live = select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.name == name, Adapter.deleted_at.is_(None))
        if version is None:
            marked = await session.get(AdapterCurrent, (tenant_id, name))
            version = marked.version if marked is not None else None
        if version is not None:
            return await session.scalar(live.where(Adapter.version == version))
        return await session.scalar(live.order_by(Adapter.version.desc()).limit(1))

    async def get(self, principal: Principal, model: str) -> AdapterRecord:
        record = await self.resolve(principal.tenant_id, model)
        if record is None:
            raise NotFound(f"adapter {model!r} not found", code="adapter_not_found")
        return record

    async def set_current(self, principal: Principal, name: str, version: int | None) -> AdapterRecord:
        """Mark `version` of `name` current (a rollback or a roll forward), or follow the newest again (None)."""
        tenant_id = uuid.UUID(principal.tenant_id)
        async with self.db.session() as session:
            await session.scalar(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
            if version is not None and await self._load(session, tenant_id, name, version) is None:
                raise NotFound(f"adapter {name}@{version} not found", code="adapter_not_found")
            marked = await session.get(AdapterCurrent, (tenant_id, name))
            if version is None:
                if marked is not None:
                    await session.delete(marked)
            elif marked is None:
                session.add(AdapterCurrent(tenant_id=tenant_id, name=name, version=version))
            else:
                marked.version = version
            await session.flush()
            row = await self._load(session, tenant_id, name, None)
            if row is None:
                raise NotFound(f"adapter {name!r} not found", code="adapter_not_found")
            await session.commit()
        await self.cache.invalidate(cache_key(principal.tenant_id, name))
        return AdapterRecord.from_row(row)

    async def mark_broken(self, record: AdapterRecord, reason: str | None) -> None:
        """Record why serving this version failed on its stored files (None: they load again), so its tenant sees
        it in the adapter's listing; the cached records of its name are dropped on every replica."""
        async with self.db.session() as session:
            row = await session.get(Adapter, uuid.UUID(record.id))
            if row is None or row.broken_reason == reason:
                return
            row.broken_reason = reason
            await session.commit()
        await self.cache.invalidate(cache_key(record.tenant_id, record.name))
        await self.cache.invalidate(cache_key(record.tenant_id, f"{record.name}@{record.version}"))

    async def delete(self, principal: Principal, model: str) -> AdapterRecord:
        return await self.delete_of_tenant(principal.tenant_id, model)

    async def delete_of_tenant(self, tenant_id: str, model: str) -> AdapterRecord:
        """Delete version N (`name@N`) or every version of `name`; 409 while an endpoint serves one of them.
        Returns the current version before the deletion (`name`) or the deleted version (`name@N`)."""
        ref = parse_ref(model)
        if ref is None:
            raise NotFound(f"adapter {model!r} not found", code="adapter_not_found")
        name, version = ref
        tid = uuid.UUID(tenant_id)
        async with self.db.session() as session:
            await session.scalar(select(Tenant.id).where(Tenant.id == tid).with_for_update())
            shown = await self._load(session, tid, name, version)
            if shown is None:
                raise NotFound(f"adapter {model!r} not found", code="adapter_not_found")
            query = self._live(tenant_id).where(Adapter.name == name)
            doomed = list(
                (await session.scalars(query if version is None else query.where(Adapter.version == version))).all()
            )
            await self._refuse_in_use(session, tid, name, [a.version for a in doomed], "cannot delete")
            now = utcnow()
            for row in doomed:
                row.deleted_at = now
            marked = await session.get(AdapterCurrent, (tid, name))
            if marked is not None and (version is None or marked.version == version):
                await session.delete(marked)  # the name follows its newest version again
            await session.commit()
        await self.cache.invalidate(cache_key(tenant_id, name))
        await self._drop(tenant_id, doomed)
        return AdapterRecord.from_row(shown)

    async def _drop(self, tenant_id: str, rows: Sequence[Adapter]) -> None:
        """After a commit that deleted `rows`: their cache entries, blobs and (where unused) engine copies."""
        for row in rows:
            await self.cache.invalidate(cache_key(tenant_id, f"{row.name}@{row.version}"))
            await asyncio.to_thread(self.store.delete, row.blob)
            await self.cache.invalidate(DELETED_BLOB + row.blob)  # other replicas drop their local copies
            await self._retire(row.sha256)

    async def _retire(self, sha256: str) -> None:
        """Tell every replica that no live adapter has these weights any more (unless one still does)."""
        async with self.db.session() as session:
            still_live = await session.scalar(
                select(func.count()).select_from(Adapter).where(Adapter.sha256 == sha256, Adapter.deleted_at.is_(None))
            )
        if not still_live:
            await self.cache.invalidate(RETIRED_CONTENT + sha256)


def form_flag(value: str | None, field: str) -> bool:
    """A true/false form field (absent: false)."""
    if value is None or value.lower() in ("false", "0", ""):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise Invalid(f"form field {field!r} must be true or false, got {value!r}", param=field)


def parse_ref(model: str) -> tuple[str, int | None] | None:
    """`name` -> (name, None); `name@N` -> (name, N) for N >= 1; anything else (no valid name) -> None."""
    name, at, version = model.partition("@")
    if not NAME_RE.match(name):
        return None
    if not at:
        return name, None
    if not version.isdigit() or version.startswith("0") or len(version) > 9:
        return None
    return name, int(version)
