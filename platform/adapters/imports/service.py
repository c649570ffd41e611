"""Import jobs: `ImportService` records one (queued) and answers its status; `ImportRunner`, one asyncio task per
server process, claims queued imports under a lease in SQL (as the batch runner claims lines), fetches the source,
checks it as an upload is checked and publishes it through `AdapterService.publish`.

Transient failures (connection errors, 5xx, 429) put the import back in the queue with exponential backoff (its
`lease_until` is the earliest next try) until `import_max_attempts`; anything else fails it with its code. A
replica killed mid-import leaves its lease to expire and another replica runs it again; a version already
published for the import (its origin names the import) is recognised, never published twice."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import or_, select, update

from loraplex.platform.adapters.imports.credentials import CredentialStore
from loraplex.platform.adapters.imports.fetch import Fetcher, SourceError
from loraplex.platform.adapters.imports.sources import Progress, Source, fetch, parse_source
from loraplex.platform.adapters.imports.ssrf import AddressPolicy, AddressRefused
from loraplex.platform.adapters.service import AdapterService
from loraplex.platform.background import stop_task
from loraplex.platform.db.models import Adapter, AdapterImport, Tenant, utcnow
from loraplex.platform.db.session import Database
from loraplex.platform.domain_errors import DomainError, Invalid, NotFound
from loraplex.platform.settings import Settings
from loraplex.platform.storage.blobstore import BlobStore
from loraplex.platform.tenants.service import Principal

log = logging.getLogger("loraplex.platform.imports")
PREFIX = "imp_"
ACTIVE = ("queued", "downloading", "validating")
POLL_S = 0.5


def public_id(value: uuid.UUID) -> str:
    return PREFIX + value.hex


def parse_id(value: str) -> uuid.UUID | None:
    if not value.startswith(PREFIX) or len(value) != len(PREFIX) + 32:
        return None
    try:
        return uuid.UUID(hex=value[len(PREFIX) :])
    except ValueError:
        return None


def import_not_found(name: str, import_id: str) -> NotFound:
    return NotFound(f"no import {import_id} of adapter {name!r}", code="import_not_found")


class ImportService:
    def __init__(self, db: Database, adapters: AdapterService, policy: AddressPolicy, sealer: CredentialStore) -> None:
        self.db = db
        self.adapters = adapters
        self.policy = policy
        self.sealer = sealer  # an https source's query is kept encrypted (a presigned signature is a credential)
        self.on_created: Any = None  # the runner's wake (set by the app)
        self.runner: Any = None  # the ImportRunner of this process (set by the app)

    async def create(self, principal: Principal, body: dict[str, Any]) -> AdapterImport:
        """Check the request (name, the source's shape, a literal address against the policy) and queue it."""
        unknown = sorted(set(body) - {"name", "source", "sha256", "accept_failed_check"})
        if unknown:
            raise Invalid(f"unknown field {unknown[0]!r} in an import request", param=unknown[0], code="unknown_field")
        if not isinstance(body.get("name", ""), str):
            raise Invalid("name must be a string (the model name clients will use)", param="name")
        name = self.adapters.check_new_name(body.get("name"))
        sha256 = body.get("sha256")
        if sha256 is not None and not isinstance(sha256, str):
            raise Invalid("sha256 must be a string of 64 hexadecimal digits", param="sha256", code="invalid_source")
        accept_failed_check = body.get("accept_failed_check", False)
        if not isinstance(accept_failed_check, bool):
            raise Invalid("accept_failed_check must be true or false", param="accept_failed_check")
        source = parse_source(body.get("source"), sha256.lower() if sha256 else None)
        self._check_literal(source)
        row = AdapterImport(
            id=uuid.uuid4(),
            tenant_id=uuid.UUID(principal.tenant_id),
            name=name,
            source=source.shown,
            source_sealed=self.sealer.seal(source.text) if source.text != source.shown else None,
            sha256=sha256.lower() if sha256 else None,
            status="queued",
            bytes_done=0,
            attempts=0,
            accept_failed_check=accept_failed_check,
        )
        async with self.db.session() as session:
            session.add(row)
            await session.commit()
        if self.on_created is not None:
            self.on_created()
        return row

    def _check_literal(self, source: Source) -> None:
        """An address written in the URL is refused at once (a name is resolved and checked when fetched)."""
        if source.kind != "https":
            return
        host = urlsplit(source.url).hostname or ""
        if host.lower() == "localhost" or _is_literal(host):
            try:
                self.policy.resolve(host, 443)
            except AddressRefused as exc:
                raise Invalid(f"source refused: {exc}", param="source", code="source_address_refused") from None

    async def get(self, principal: Principal, name: str, import_id: str) -> AdapterImport:
        key = parse_id(import_id)
        row = None
        if key is not None:
            async with self.db.session() as session:
                row = await session.get(AdapterImport, key)
        if row is None or row.tenant_id != uuid.UUID(principal.tenant_id) or row.name != name:
            raise import_not_found(name, import_id)
        return row


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass
class _Job:
    """An import running here: its progress (written with each lease renewal) and its task."""

    done: int = 0
    total: int | None = None
    task: asyncio.Task[None] | None = None


class ImportRunner:
    def __init__(
        self,
        db: Database,
        adapters: AdapterService,
        store: BlobStore,
        credentials: CredentialStore,
        policy: AddressPolicy,
        settings: Settings,
    ) -> None:
        self.db, self.adapters, self.store, self.credentials = db, adapters, store, credentials
        self.policy, self.settings = policy, settings
        self.owner = f"{socket.gethostname()[:24]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.ttl = timedelta(seconds=settings.import_lease_ttl_s)
        self._jobs: dict[uuid.UUID, _Job] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="import-runner")

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        """Stop claiming; abort the imports running here and hand them back (their leases cleared)."""
        if self._task is not None:
            await stop_task(self._task)
        ids, tasks = list(self._jobs), [j.task for j in self._jobs.values() if j.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            async with self.db.session() as session:
                await session.execute(
                    update(AdapterImport)
                    .where(AdapterImport.id.in_(ids), AdapterImport.lease_owner == self.owner)
                    .values(lease_owner=None, lease_until=None, status="queued")
                )
                await session.commit()
        self._jobs.clear()

    async def _loop(self) -> None:
        while True:
            try:
                await self._cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("import runner cycle failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            self._wake.clear()

    async def _cycle(self) -> None:
        now = utcnow()
        if self._jobs:  # progress and lease renewal of what runs here, one statement each
            async with self.db.session() as session:
                for import_id, job in list(self._jobs.items()):
                    await session.execute(
                        update(AdapterImport)
                        .where(AdapterImport.id == import_id, AdapterImport.lease_owner == self.owner)
                        .values(bytes_done=job.done, bytes_total=job.total, lease_until=now + self.ttl, updated_at=now)
                    )
                await session.commit()
        free = self.settings.import_max_concurrent - len(self._jobs)
        if free > 0:
            await self._claim(now, free)

    async def _claim(self, now: datetime, limit: int) -> None:
        async with self.db.session() as session:
            rows = (
                await session.scalars(
                    select(AdapterImport)
                    .where(
                        AdapterImport.status.in_(ACTIVE),
                        or_(AdapterImport.lease_until.is_(None), AdapterImport.lease_until < now),
                        AdapterImport.id.not_in(list(self._jobs)) if self._jobs else AdapterImport.id.is_not(None),
                    )
                    .order_by(AdapterImport.created_at)
                    .limit(limit)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            claimed = []
            for row in rows:
                if row.attempts >= self.settings.import_max_attempts:
                    row.status, row.error_code = "failed", row.error_code or "source_unreachable"
                    row.error_message = f"gave up after {row.attempts} attempts: {row.error_message or 'no answer'}"
                    row.lease_owner, row.lease_until, row.updated_at = None, None, now
                    continue
                row.attempts += 1
                row.status, row.lease_owner, row.lease_until, row.updated_at = (
                    "downloading",
                    self.owner,
                    now + self.ttl,
                    now,
                )
                row.bytes_done, row.bytes_total = 0, None
                claimed.append(
                    (
                        row.id,
                        row.tenant_id,
                        row.name,
                        row.source,
                        row.source_sealed,
                        row.sha256,
                        bool(row.accept_failed_check),
                        row.attempts,
                    )
                )
            await session.commit()
        for import_id, tenant_id, name, source, sealed, sha256, accept_failed_check, attempt in claimed:
            job = self._jobs[import_id] = _Job()
            job.task = asyncio.create_task(
                self._run(import_id, tenant_id, name, source, sealed, sha256, accept_failed_check, attempt, job)
            )

    async def _update(self, import_id: uuid.UUID, **values: Any) -> None:
        async with self.db.session() as session:
            await session.execute(
                update(AdapterImport)
                .where(AdapterImport.id == import_id, AdapterImport.lease_owner == self.owner)
                .values(updated_at=utcnow(), **values)
            )
            await session.commit()

    async def _run(
        self,
        import_id: uuid.UUID,
        tenant_id: uuid.UUID,
        name: str,
        text: str,
        sealed: str | None,
        sha256: str | None,
        accept_failed_check: bool,
        attempt: int,
        job: _Job,
    ) -> None:
        workdir = await asyncio.to_thread(self.store.new_tmp_dir)
        fetcher = Fetcher(self.policy, allow_http=self.settings.import_allow_http)
        try:
            try:  # the scratch folder goes before the outcome is written (a client seeing it sees a clean store)
                source = parse_source(self.credentials.unseal(sealed) if sealed else text, sha256)
                async with self.db.session() as session:
                    tenant = await session.get(Tenant, tenant_id)
                if tenant is None:
                    raise NotFound("tenant no longer exists", code="tenant_not_found")
                principal = Principal.of_tenant(tenant, "import")
                done = await self._published(tenant_id, name, import_id)
                if done is None:
                    done = await self._fetch_and_publish(
                        principal, import_id, name, source, sha256, fetcher, workdir, job, accept_failed_check
                    )
            finally:
                await fetcher.close()
                await asyncio.to_thread(shutil.rmtree, workdir, True)
            await self._update(
                import_id,
                status="ready",
                version=done[0],
                resolved=done[1],
                lease_owner=None,
                lease_until=None,
                bytes_done=job.done,
                bytes_total=job.total if job.total is not None else job.done,
            )
            log.info("import %s of %s (%s): version %d", public_id(import_id), name, source.shown, done[0])
        except SourceError as exc:
            if exc.transient and attempt < self.settings.import_max_attempts:
                delay = min(self.settings.import_retry_base_s * 2 ** (attempt - 1), 300.0)
                log.info(
                    "import %s: attempt %d failed (%s); retrying in %.1fs",
                    public_id(import_id),
                    attempt,
                    exc.message,
                    delay,
                )
                await self._update(
                    import_id,
                    status="queued",
                    lease_owner=None,
                    lease_until=utcnow() + timedelta(seconds=delay),
                    error_code=exc.code,
                    error_message=exc.message,
                )
            else:
                await self._fail(
                    import_id,
                    exc.code,
                    exc.message
                    if attempt == 1 or not exc.transient
                    else f"gave up after {attempt} attempts: {exc.message}",
                )
        except DomainError as exc:
            await self._fail(import_id, exc.code or "invalid_adapter", exc.message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("import %s failed unexpectedly", public_id(import_id))
            await self._fail(import_id, "internal_error", f"the import failed unexpectedly ({type(exc).__name__})")
        finally:
            self._jobs.pop(import_id, None)
            self._wake.set()

    async def _fail(self, import_id: uuid.UUID, code: str, message: str) -> None:
        log.info("import %s failed: %s", public_id(import_id), code)
        await self._update(
            import_id, status="failed", error_code=code, error_message=message, lease_owner=None, lease_until=None
        )

    async def _published(self, tenant_id: uuid.UUID, name: str, import_id: uuid.UUID) -> tuple[int, str | None] | None:
        """The version an earlier attempt of this import published (it died before recording it), if any."""
        async with self.db.session() as session:
            rows = (
                await session.scalars(select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.name == name))
            ).all()
        for row in rows:
            origin = row.origin or {}
            if origin.get("import_id") == public_id(import_id):
                resolved = origin.get("resolved")
                return row.version, resolved if isinstance(resolved, str) else None
        return None

    async def _fetch_and_publish(
        self,
        principal: Principal,
        import_id: uuid.UUID,
        name: str,
        source: Source,
        sha256: str | None,
        fetcher: Fetcher,
        workdir: Any,
        job: _Job,
        accept_failed_check: bool,
    ) -> tuple[int, str | None]:
        def report(done: int, total: int | None) -> None:
            job.done, job.total = done, total

        credentials = None
        if source.kind in ("s3", "hf"):
            credentials = await self.credentials.get(principal.tenant_id, source.kind)
        fetched = await fetch(
            source,
            sha256,
            fetcher,
            workdir,
            self.adapters.limits,
            Progress(report),
            credentials,
            self.settings.hf_endpoint,
        )
        await self._update(import_id, status="validating", bytes_done=job.done, bytes_total=job.total or job.done)
        info, files = await asyncio.to_thread(self.adapters.inspect_folder, fetched.root)
        origin = {
            "kind": "import",
            "source": source.shown,
            "resolved": fetched.resolved,
            "sha256": fetched.sha256,
            "import_id": public_id(import_id),
        }
        record = await self.adapters.publish(
            principal, name, info, files, origin=origin, accept_failed_check=accept_failed_check
        )
        return record.version, fetched.resolved
