"""Alembic environment for the loraplex registry.

`loraplex db upgrade` (and server start-up) pass an open connection in `config.attributes`;
run directly with an alembic.ini, `sqlalchemy.url` (an async URL) is used instead.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from loraplex.platform.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite needs table copies for ALTERs
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_url(url: str) -> None:
    from loraplex.platform.db.session import create_engine

    engine = create_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(run_migrations)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (conn := config.attributes.get("connection")) is not None:
    run_migrations(conn)
else:
    asyncio.run(_run_with_url(config.get_main_option("sqlalchemy.url")))
