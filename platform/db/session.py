"""Async SQLAlchemy engine and session factory for SQLite (aiosqlite) or PostgreSQL (asyncpg)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine


def engine_options(url: str, schema: str | None = None) -> dict[str, Any]:
    """create_async_engine keyword arguments for `url` (SQLite file creation, PostgreSQL search_path)."""
    parsed = make_url(url)
    options: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        options["connect_args"] = {"timeout": 30}
    elif schema:
        if parsed.get_driver_name() != "asyncpg":
            raise ValueError(f"database_schema needs PostgreSQL with asyncpg, got {parsed.drivername}")
        options["connect_args"] = {"server_settings": {"search_path": schema}}
    return options


def create_engine(url: str, schema: str | None = None) -> AsyncEngine:
    engine = create_async_engine(url, **engine_options(url, schema))
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets readers proceed during a write; foreign keys are off by default in SQLite.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


class Database:
    """Owns the engine and hands out sessions (one per unit of work)."""

    def __init__(self, url: str, schema: str | None = None) -> None:
        self.url = url
        self.schema = schema
        self.engine = create_engine(url, schema)
        self.sessionmaker = async_sessionmaker(self.engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        async with self.sessionmaker() as session:
            yield session

    async def ping(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def close(self) -> None:
        await self.engine.dispose()
