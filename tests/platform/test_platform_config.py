"""Settings (defaults < LORAPLEX_* < flags), Alembic migrations on SQLite and PostgreSQL (schema equal
to the models), `loraplex db upgrade`, and a first `loraplex serve` printing its generated admin key."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from loraplex.envvars.safe_path import python_module_command
from loraplex.platform.cli import build_parser
from loraplex.platform.db.migrate import current_revision, downgrade, upgrade
from loraplex.platform.db.models import Base
from loraplex.platform.db.session import create_engine
from loraplex.platform.settings import Settings, settings_from_args
from tests.platform.helpers import PG_URL, ServerProcess, auth


def test_settings_defaults_env_and_flags(tmp_path: Path) -> None:
    env = {
        "LORAPLEX_DATA_DIR": str(tmp_path / "env-data"),
        "LORAPLEX_PORT": "9100",
        "LORAPLEX_MAX_NUM_SEQS": "7",
        "LORAPLEX_ENABLE_PREFIX_CACHING": "false",
        "LORAPLEX_REDIS_URL": "redis://example:6379/0",
    }
    args = build_parser().parse_args(["serve", "--port", "9200", "--max-loras", "3", "--model", "/m"])
    s = settings_from_args(args, env)
    assert s.port == 9200  # the flag wins over the environment
    assert s.data_dir == tmp_path / "env-data" and s.redis_url == "redis://example:6379/0"
    assert s.engine_args == {"max_num_seqs": 7, "enable_prefix_caching": False, "max_loras": 3, "model": "/m"}
    engine_args = s.build_engine_args()
    assert (engine_args.max_num_seqs, engine_args.max_loras, engine_args.enable_prefix_caching) == (7, 3, False)
    assert s.resolved_database_url == f"sqlite+aiosqlite:///{tmp_path / 'env-data' / 'loraplex.db'}"
    plain = Settings.from_sources({"HOME": str(tmp_path)})
    assert plain.data_dir == tmp_path / ".local" / "share" / "loraplex" and plain.redis_url is None
    with pytest.raises(ValueError, match="LORAPLEX_MAX_NUM_SEQS"):
        Settings.from_sources({"LORAPLEX_MAX_NUM_SEQS": "many"})


async def _schema_diff(url: str, schema: str | None) -> list:
    engine = create_engine(url, schema)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata))
    finally:
        await engine.dispose()


async def _tables(url: str, schema: str | None) -> set[str]:
    engine = create_engine(url, schema)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
    finally:
        await engine.dispose()


async def test_migrations_on_sqlite_match_the_models(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    assert await current_revision(url) is None
    await upgrade(url)
    await upgrade(url)  # idempotent
    assert await current_revision(url) == "0010"
    assert await _schema_diff(url, None) == []
    await downgrade(url, "base")
    assert await _tables(url, None) == {"alembic_version"} and await current_revision(url) is None


@pytest.mark.services
async def test_migrations_on_postgresql_match_the_models() -> None:
    schema = f"lpx_mig_{uuid.uuid4().hex[:8]}"
    try:
        await asyncio.gather(upgrade(PG_URL, schema), upgrade(PG_URL, schema))  # concurrent replicas
        assert await current_revision(PG_URL, schema) == "0010"
        assert await _schema_diff(PG_URL, schema) == []
        assert {"tenants", "api_keys", "admin_keys", "adapters"} <= await _tables(PG_URL, schema)
    finally:
        import asyncpg

        conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()


def test_cli_db_upgrade(tmp_path: Path) -> None:
    out = subprocess.run(
        python_module_command("loraplex.platform.cli", "db", "upgrade", "--data-dir", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr
    assert "registry at revision 0010" in out.stdout
    assert (tmp_path / "loraplex.db").is_file()


def test_first_serve_prints_a_generated_admin_key_once(tmp_path: Path, tiny_llama_dir: Path) -> None:
    args = [
        "--model",
        str(tiny_llama_dir),
        "--data-dir",
        str(tmp_path / "d"),
        "--num-kv-blocks",
        "64",
        "--max-model-len",
        "256",
    ]
    env = {"LORAPLEX_ADMIN_KEY": ""}
    first = ServerProcess(args, env, tmp_path / "first.log")
    try:
        first.wait_ready()
    finally:
        first.stop()
    lines = [line for line in first.log.read_text().splitlines() if "generated admin key" in line]
    assert len(lines) == 1
    admin_key = lines[0].rsplit(" ", 1)[1]
    second = ServerProcess(args, env, tmp_path / "second.log")
    try:
        second.wait_ready()
        assert "generated admin key" not in second.log.read_text()
        r = httpx.post(f"{second.url}/v1/tenants", json={"name": "t"}, headers=auth(admin_key))
        assert r.status_code == 201, r.text
    finally:
        second.stop()
