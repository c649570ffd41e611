"""Migrations upgrade a populated registry: rows written in the oldest revision's schema (with that schema's
own table descriptions below, not today's models) are served by today's code after `upgrade` to head, on
SQLite and on PostgreSQL. Every new migration runs against this data."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import uuid
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from loraplex.platform.app import create_app
from loraplex.platform.db.migrate import current_revision, upgrade
from loraplex.platform.db.session import create_engine
from tests.platform.conftest import settings_for
from tests.platform.helpers import ADMIN_KEY, PG_URL, ServerThread, auth

OLDEST = "0001"
TENANT_KEY = "lpx-0123456789abcdef.a-secret-only-this-test-knows"
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)

# The tables as revision 0001 created them (only the columns written here).
tenants = sa.table(
    "tenants",
    sa.column("id", sa.Uuid()),
    sa.column("name", sa.String()),
    sa.column("max_adapters", sa.Integer()),
    sa.column("max_adapter_bytes", sa.BigInteger()),
    sa.column("rate_limit_per_minute", sa.Integer()),
    sa.column("created_at", sa.DateTime(True)),
)
api_keys = sa.table(
    "api_keys",
    sa.column("id", sa.Uuid()),
    sa.column("tenant_id", sa.Uuid()),
    sa.column("prefix", sa.String()),
    sa.column("key_hash", sa.String()),
    sa.column("created_at", sa.DateTime(True)),
    sa.column("revoked_at", sa.DateTime(True)),
)
adapters = sa.table(
    "adapters",
    sa.column("id", sa.Uuid()),
    sa.column("tenant_id", sa.Uuid()),
    sa.column("name", sa.String()),
    sa.column("version", sa.Integer()),
    sa.column("sha256", sa.String()),
    sa.column("rank", sa.Integer()),
    sa.column("alpha", sa.Float()),
    sa.column("target_modules", sa.JSON()),
    sa.column("size_bytes", sa.BigInteger()),
    sa.column("blob", sa.String()),
    sa.column("created_at", sa.DateTime(True)),
    sa.column("deleted_at", sa.DateTime(True)),
)


async def populate_oldest(url: str, schema: str | None) -> uuid.UUID:
    await upgrade(url, schema, OLDEST)
    assert await current_revision(url, schema) == OLDEST
    tenant = uuid.uuid4()
    engine = create_engine(url, schema)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                sa.insert(tenants).values(
                    id=tenant,
                    name="migrated",
                    max_adapters=7,
                    max_adapter_bytes=10**9,
                    rate_limit_per_minute=None,
                    created_at=NOW,
                )
            )
            await conn.execute(
                sa.insert(api_keys).values(
                    id=uuid.uuid4(),
                    tenant_id=tenant,
                    prefix="0123456789abcdef",
                    key_hash=hashlib.sha256(TENANT_KEY.encode()).hexdigest(),
                    created_at=NOW,
                    revoked_at=None,
                )
            )
            for version, deleted in ((1, NOW), (2, None)):
                await conn.execute(
                    sa.insert(adapters).values(
                        id=uuid.uuid4(),
                        tenant_id=tenant,
                        name="extractor",
                        version=version,
                        sha256=f"{version}" * 64,
                        rank=8,
                        alpha=16.0,
                        target_modules=["q_proj", "v_proj"],
                        size_bytes=1234 * version,
                        blob=f"blob{version}",
                        created_at=NOW,
                        deleted_at=deleted,
                    )
                )
    finally:
        await engine.dispose()
    return tenant


def _serve_and_check(settings, tiny_engine) -> None:
    server = ServerThread(create_app(settings, engine=tiny_engine)).start()
    try:
        listed = httpx.get(f"{server.url}/v1/adapters", headers=auth(TENANT_KEY))
        assert listed.status_code == 200, listed.text
        [adapter] = listed.json()["data"]  # the deleted version stays deleted
        assert (adapter["name"], adapter["version"], adapter["sha256"], adapter["rank"], adapter["alpha"]) == (
            "extractor",
            2,
            "2" * 64,
            8,
            16.0,
        )
        assert adapter["target_modules"] == ["q_proj", "v_proj"] and adapter["size_bytes"] == 2468
        assert (adapter["status"], adapter["broken_reason"]) == ("ready", None)  # 0006: no version is broken
        # 0004: the live adapter is the one kept version of its name, addressable as name@2 and current.
        pinned = httpx.get(f"{server.url}/v1/adapters/extractor@2", headers=auth(TENANT_KEY))
        assert pinned.status_code == 200 and pinned.json()["sha256"] == "2" * 64
        assert httpx.get(f"{server.url}/v1/adapters/extractor@1", headers=auth(TENANT_KEY)).status_code == 404
        versions = httpx.get(f"{server.url}/v1/adapters/extractor/versions", headers=auth(TENANT_KEY)).json()
        assert (versions["current"], [v["version"] for v in versions["data"]]) == (2, [2])
        tenants_listed = httpx.get(f"{server.url}/v1/tenants", headers=auth(ADMIN_KEY)).json()["data"]
        [migrated] = [t for t in tenants_listed if t["name"] == "migrated"]
        assert migrated["max_adapters"] == 7 and migrated["max_adapter_bytes"] == 10**9
    finally:
        server.stop()


def test_upgrade_keeps_a_populated_sqlite_registry(tiny_engine, tmp_path: Path) -> None:
    settings = settings_for("sqlite", tmp_path / "data")
    settings.data_dir.mkdir(parents=True)
    asyncio.run(populate_oldest(settings.resolved_database_url, None))
    _serve_and_check(settings, tiny_engine)  # the server upgrades to head as it starts
    assert asyncio.run(current_revision(settings.resolved_database_url)) == _head()


@pytest.mark.services
def test_upgrade_keeps_a_populated_postgresql_registry(tiny_engine, tmp_path: Path) -> None:
    schema = f"lpx_popmig_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(populate_oldest(PG_URL, schema))
        settings = settings_for("sqlite", tmp_path / "data", database_url=PG_URL, database_schema=schema)
        _serve_and_check(settings, tiny_engine)
        assert asyncio.run(current_revision(PG_URL, schema)) == _head()
    finally:
        import asyncpg

        async def drop() -> None:
            conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()

        asyncio.run(drop())


def test_upgrade_from_0003_with_data_to_versions(tiny_engine, tmp_path: Path) -> None:
    """A registry at 0003 holding adapters and keys (written at 0001, then upgraded) keeps them all at 0004."""
    settings = settings_for("sqlite", tmp_path / "data")
    settings.data_dir.mkdir(parents=True)
    url = settings.resolved_database_url

    async def at_0003() -> None:
        await populate_oldest(url, None)
        await upgrade(url, None, "0003")
        assert await current_revision(url) == "0003"

    asyncio.run(at_0003())
    _serve_and_check(settings, tiny_engine)
    assert asyncio.run(current_revision(url)) == _head() == "0010"


# The endpoints table as revision 0004 created it.
endpoints_0004 = sa.table(
    "endpoints",
    sa.column("id", sa.Uuid()),
    sa.column("tenant_id", sa.Uuid()),
    sa.column("name", sa.String()),
    sa.column("revision", sa.Integer()),
    sa.column("adapter_name", sa.String()),
    sa.column("adapter_version", sa.Integer()),
    sa.column("canary_version", sa.Integer()),
    sa.column("canary_weight", sa.Float()),
    sa.column("config", sa.JSON()),
    sa.column("created_at", sa.DateTime(True)),
    sa.column("updated_at", sa.DateTime(True)),
)


def test_upgrade_from_0004_keeps_endpoints_unpinned(tiny_engine, tmp_path: Path) -> None:
    """0005 adds `endpoints.pinned`: an endpoint written at 0004 keeps every field and is not pinned."""
    settings = settings_for("sqlite", tmp_path / "data")
    settings.data_dir.mkdir(parents=True)
    url = settings.resolved_database_url

    async def at_0004() -> None:
        tenant = await populate_oldest(url, None)
        await upgrade(url, None, "0004")
        engine = create_engine(url, None)
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    endpoints_0004.insert().values(
                        id=uuid.uuid4(),
                        tenant_id=tenant,
                        name="extract",
                        revision=3,
                        adapter_name="extractor",
                        adapter_version=2,
                        config={"defaults": {"temperature": 0.0}, "overridable": []},
                        created_at=NOW,
                        updated_at=NOW,
                    )
                )
        finally:
            await engine.dispose()

    asyncio.run(at_0004())
    _serve_and_check(settings, tiny_engine)
    server = ServerThread(create_app(settings, engine=tiny_engine)).start()
    try:
        r = httpx.get(f"{server.url}/v1/endpoints/extract", headers=auth(TENANT_KEY))
        assert r.status_code == 200, r.text
        got = r.json()
        assert (got["revision"], got["adapter"], got["pinned"], got["defaults"]["temperature"]) == (
            3,
            "extractor@2",
            False,
            0.0,
        )
    finally:
        server.stop()


def _head() -> str:
    from alembic.script import ScriptDirectory

    from loraplex.platform.db.migrate import alembic_config

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


# ------------------------------------------------------------------ 0002: tenants' weight and limits

LIMIT_COLUMNS = {"weight", "priority", "max_concurrent_sequences", "tokens_per_minute", "max_queued_requests"}


async def _limits_round_trip(url: str, schema: str | None) -> None:
    """0001 rows -> 0002 (limits set) -> back to 0001 (columns gone, every row kept) -> 0002 again (null)."""
    from loraplex.platform.db.migrate import downgrade

    tenant = await populate_oldest(url, schema)
    await upgrade(url, schema, "0002")
    engine = create_engine(url, schema)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                sa.text("UPDATE tenants SET weight = 2.5, priority = 3, tokens_per_minute = 900 WHERE id = :id"),
                {"id": tenant.hex if conn.dialect.name == "sqlite" else tenant},
            )
            assert (await conn.execute(sa.text("SELECT weight FROM tenants"))).scalar_one() == 2.5
        await downgrade(url, "0001", schema)
        assert await current_revision(url, schema) == "0001"
        async with engine.connect() as conn:
            columns = await conn.run_sync(lambda c: {col["name"] for col in sa.inspect(c).get_columns("tenants")})
            counts = [
                (await conn.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar_one()
                for table in ("tenants", "api_keys", "adapters")
            ]
        assert not columns & LIMIT_COLUMNS and "max_adapters" in columns
        assert counts == [1, 1, 2]  # dropping columns never cascades to keys or adapters
        await upgrade(url, schema)
        async with engine.connect() as conn:
            row = (await conn.execute(sa.text("SELECT name, weight, priority, tokens_per_minute FROM tenants"))).one()
        assert tuple(row) == ("migrated", None, None, None)
    finally:
        await engine.dispose()


def test_0002_downgrades_and_upgrades_on_sqlite(tiny_engine, tmp_path: Path) -> None:
    settings = settings_for("sqlite", tmp_path / "data")
    settings.data_dir.mkdir(parents=True)
    asyncio.run(_limits_round_trip(settings.resolved_database_url, None))
    _serve_and_check(settings, tiny_engine)


@pytest.mark.services
def test_0002_downgrades_and_upgrades_on_postgresql(tiny_engine, tmp_path: Path) -> None:
    schema = f"lpx_limmig_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(_limits_round_trip(PG_URL, schema))
        _serve_and_check(
            settings_for("sqlite", tmp_path / "data", database_url=PG_URL, database_schema=schema), tiny_engine
        )
    finally:
        import asyncpg

        async def drop() -> None:
            conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()

        asyncio.run(drop())
