"""/health and /ready say what is down: 503 with the failing part named when the engine or the database is
gone; a failing engine step is a 500 for its own request and the server goes on serving."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
import pytest

from loraplex.engine import AsyncEngine, EngineArgs
from loraplex.platform.app import create_app
from tests.engine.test_step_failure import fail_next_step
from tests.platform.conftest import settings_for
from tests.platform.helpers import ServerThread, auth, create_tenant, error_of

PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def test_engine_down_is_503_on_health_and_ready(tiny_llama_dir: Path, tmp_path: Path) -> None:
    engine = AsyncEngine(EngineArgs(model=str(tiny_llama_dir), num_kv_blocks=32, block_size=8))
    server = ServerThread(create_app(settings_for("sqlite", tmp_path / "data"), engine=engine)).start()
    try:
        assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
        engine.shutdown()  # the engine thread ends
        r = httpx.get(f"{server.url}/health")
        assert r.status_code == 503 and r.json()["status"] == "engine_dead"
        r = httpx.get(f"{server.url}/ready")
        assert r.status_code == 503 and r.json()["detail"] == {"engine": "dead", "database": "ok", "blob_store": "ok"}
    finally:
        server.stop()


@pytest.mark.services
def test_database_down_is_503_on_ready_only(tiny_engine, tmp_path: Path) -> None:
    """The registry's PostgreSQL database disappears: not ready (the database is named), but alive."""
    name = f"lpx_ready_{uuid.uuid4().hex[:10]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    settings = settings_for(
        "sqlite", tmp_path / "data", database_url=f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    )
    server = ServerThread(create_app(settings, engine=tiny_engine)).start()
    try:
        r = httpx.get(f"{server.url}/ready")
        assert r.status_code == 200 and r.json()["detail"] == {"engine": "ok", "database": "ok", "blob_store": "ok"}
        asyncio.run(admin(f'DROP DATABASE "{name}" WITH (FORCE)'))
        r = httpx.get(f"{server.url}/ready")
        assert r.status_code == 503 and r.json()["status"] == "not_ready"
        detail = r.json()["detail"]
        assert detail["engine"] == "ok" and detail["database"] != "ok" and name in detail["database"]
        assert httpx.get(f"{server.url}/health").status_code == 200  # alive: the process and its engine are up
    finally:
        server.stop()
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_a_failing_engine_step_is_a_500_and_the_server_goes_on(start_server, tiny_engine) -> None:
    server = start_server("sqlite")
    key = create_tenant(server.url, "unlucky-step")
    body = {"model": tiny_engine.model_name, "prompt": "hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    expected = httpx.post(f"{server.url}/v1/completions", headers=auth(key), json=body, timeout=60).json()
    fail_next_step(tiny_engine.engine)
    r = httpx.post(f"{server.url}/v1/completions", headers=auth(key), json=body, timeout=60)
    assert r.status_code == 500
    err = error_of(r)
    assert err["code"] == "engine_error" and "injected step failure" in err["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200
    again = httpx.post(f"{server.url}/v1/completions", headers=auth(key), json=body, timeout=60)
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == expected["choices"][0]["text"]
    deadline = time.monotonic() + 60
    while tiny_engine.stats().num_running or tiny_engine.stats().kv_cache.blocks_used:
        assert time.monotonic() < deadline, "KV blocks were not returned"
        time.sleep(0.02)
