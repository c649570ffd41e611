"""Platform fixtures: one real AsyncEngine on a tiny random Llama (shared by the session), servers on
SQLite without Redis or on the machine's PostgreSQL + Redis, and tiny peft adapters."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loraplex.platform.app import create_app
from loraplex.platform.settings import Settings
from tests.platform.helpers import ADMIN_KEY, PG_URL, REDIS_URL, ServerThread, make_peft_adapter

MAX_UPLOAD = 256 * 1024  # small, so the oversized-upload test stays cheap


@pytest.fixture(autouse=True)
def transformers_functions_left_as_found() -> Iterator[None]:
    """Fail the test after which transformers' process-wide functions are left swapped (two model builds of the
    test and its servers overlapped: hf_builds.py), naming them; they are put back, so later tests are not spoiled."""
    yield
    from loraplex.platform.adapters.hf_builds import restore_between_builds

    repaired = restore_between_builds()
    assert not repaired, f"transformers' process-wide functions were left swapped (now put back): {repaired}"


@pytest.fixture(scope="session")
def tiny_engine(tiny_llama_dir: Path) -> Iterator[Any]:
    from loraplex.engine import AsyncEngine, EngineArgs

    engine = AsyncEngine(
        EngineArgs(
            model=str(tiny_llama_dir),
            max_model_len=1024,
            num_kv_blocks=2048,
            max_num_seqs=32,
            max_num_batched_tokens=512,
            max_loras=4,
            max_cpu_loras=8,
        )
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def pg_schema() -> Iterator[str]:
    """A fresh PostgreSQL schema for this test run, dropped at the end."""
    schema = f"lpx_test_{uuid.uuid4().hex[:10]}"
    yield schema

    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


def settings_for(backend: str, data_dir: Path, pg_schema: str | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(data_dir=data_dir, admin_key=ADMIN_KEY, max_upload_bytes=MAX_UPLOAD)
    if backend == "postgres+redis":
        assert pg_schema is not None
        values.update(database_url=PG_URL, database_schema=pg_schema, redis_url=REDIS_URL)
    values.update(overrides)
    return Settings(**values)


StartServer = Callable[..., ServerThread]


@pytest.fixture
def start_server(tiny_engine: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StartServer]:
    """`start_server(backend="sqlite", data_dir=None, **settings) -> ServerThread` (stopped after the test)."""
    servers: list[ServerThread] = []

    def start(backend: str = "sqlite", data_dir: Path | None = None, **overrides: Any) -> ServerThread:
        schema = request.getfixturevalue("pg_schema") if backend == "postgres+redis" else None
        settings = settings_for(backend, data_dir or tmp_path / f"data-{len(servers)}", schema, **overrides)
        server = ServerThread(create_app(settings, engine=tiny_engine)).start()
        server.settings = settings
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres+redis", id="postgres+redis", marks=pytest.mark.services),
]


@pytest.fixture(params=BACKENDS)
def server(request: pytest.FixtureRequest, start_server: StartServer) -> ServerThread:
    """A server on each registry backend: SQLite without Redis, and PostgreSQL + Redis."""
    return start_server(request.param)


@pytest.fixture
def wrong_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine stacks every adapter with its first module's LoRA scale doubled (a kernel-path bug the check at
    publish must catch)."""
    from dataclasses import replace

    from loraplex.engine.lora import manager

    original = manager.stack_adapter

    def stack(adapter: Any, *args: Any, **kwargs: Any) -> Any:
        first = next(iter(adapter.weights))
        adapter.weights[first] = replace(adapter.weights[first], scaling=2 * adapter.weights[first].scaling)
        return original(adapter, *args, **kwargs)

    monkeypatch.setattr(manager, "stack_adapter", stack)


@pytest.fixture(scope="session")
def adapter_factory(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`adapter_factory(name, **kwargs) -> folder` of a real peft adapter for the tiny model (cached by name)."""
    root = tmp_path_factory.mktemp("adapters")
    made: dict[str, Path] = {}

    def make(name: str, **kwargs: Any) -> Path:
        if name not in made:
            made[name] = make_peft_adapter(tiny_llama_dir, root / name, **kwargs)
        return made[name]

    return make
