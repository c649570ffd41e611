"""Apply the Alembic migrations in `migrations/` programmatically (no alembic.ini needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Connection

from loraplex.platform.db.session import create_engine

# Any fixed 64-bit number: serialises concurrent `upgrade` calls of replicas sharing PostgreSQL.
_PG_LOCK_ID = 0x6C6F7261706C6578


def migrations_dir() -> Path:
    """`migrations/` beside `platform/` in a checkout, `loraplex/migrations` in an installed wheel."""
    path = Path(__file__).resolve().parents[2] / "migrations"
    if not (path / "env.py").is_file():
        raise FileNotFoundError(f"Alembic environment not found at {path}")
    return path


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["connection"] = connection
    return cfg


async def upgrade(url: str, schema: str | None = None, revision: str = "head") -> None:
    """Bring the registry schema at `url` (and PostgreSQL `schema`, created if missing) up to `revision`."""
    await _run(url, schema, lambda cfg: command.upgrade(cfg, revision))


async def downgrade(url: str, revision: str, schema: str | None = None) -> None:
    """Revert the registry schema to `revision` ("base": drop every table)."""
    await _run(url, schema, lambda cfg: command.downgrade(cfg, revision))


async def _run(url: str, schema: str | None, action: Callable[[Config], None]) -> None:
    engine = create_engine(url, schema)
    try:
        async with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_ID})
                if schema:
                    await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            await conn.run_sync(lambda sync_conn: action(alembic_config(sync_conn)))
    finally:
        await engine.dispose()


async def current_revision(url: str, schema: str | None = None) -> str | None:
    """The revision the database is at (None before the first upgrade)."""
    from alembic.runtime.migration import MigrationContext

    engine = create_engine(url, schema)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())
    finally:
        await engine.dispose()
