"""Bounded staleness across replicas, whatever Redis does: two `loraplex serve` processes share PostgreSQL and a
redis-server of the test's own, which the test pauses (SIGSTOP, as a partition looks) or whose messages it
drops. A deletion or revocation made through one replica must be honoured by the other. The registry cache
keeps entries for an hour here, so without the bound on staleness (about 1 s by design: a heartbeat sent within
the last 0.5 s must have come back before anything cached is used; see platform/storage/cache.py) the other
replica would serve the old record for the whole test. How fast it is honoured is not asserted (these machines
are shared and noisy: speed belongs in bench/); the tests wait for it with a generous deadline, far below the
TTL, whose expiry fails them."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis

from loraplex.platform.adapters.service import cache_key
from loraplex.platform.storage.cache import queue_invalidation
from tests.platform.helpers import (
    ADMIN_KEY,
    ServerProcess,
    auth,
    create_tenant,
    free_port,
    replica_args,
    running_replicas,
    upload,
    zip_folder,
)

pytestmark = pytest.mark.services

CACHE_TTL_S = 3600  # what the replicas' registry caches keep an entry for, unless it is invalidated
HONOURED_WITHIN_S = 30.0  # a liveness deadline (1 s by design, an hour without the bound), not a speed threshold
POLL_S = 0.05


class RedisServer:
    """A redis-server process of this test's own, which it may pause and resume."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed on this machine")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--save", "", "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def replicas(
    private_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, pg_schema: str
) -> Iterator[list[ServerProcess]]:
    root = tmp_path_factory.mktemp("staleness")
    # No --log-level: these replicas log at the server's default level.
    args = replica_args(
        tiny_llama_dir, pg_schema, redis_url=private_redis.url, data_dir=root / "shared-data", log_level=None
    )
    env = {"LORAPLEX_ADMIN_KEY": ADMIN_KEY, "LORAPLEX_CACHE_TTL_S": str(CACHE_TTL_S)}
    with running_replicas(args, env, root) as procs:
        yield procs


def _client(server: ServerProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=10)


def _adapter_served(server: ServerProcess, key: str, model: str) -> bool:
    """True when `model` answers a chat completion, False when it is refused as missing."""
    try:
        _client(server, key).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    except openai.NotFoundError as exc:
        assert exc.code == "model_not_found", exc
        return False
    return True


def _key_accepted(server: ServerProcess, key: str) -> bool:
    try:
        _client(server, key).models.list()
    except openai.AuthenticationError:
        return False
    return True


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` every 50 ms until it holds; fail naming `what` once HONOURED_WITHIN_S have passed."""
    deadline = time.monotonic() + HONOURED_WITHIN_S
    while not condition():
        assert time.monotonic() < deadline, (
            f"{what}: still not so after {HONOURED_WITHIN_S:.0f}s (cached entries live {CACHE_TTL_S}s here)"
        )
        time.sleep(POLL_S)


def _holds_for(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert condition()
        time.sleep(POLL_S)


def _setup_tenant(one: ServerProcess, two: ServerProcess, adapter_folder: Path) -> tuple[str, str, dict]:
    """A tenant with an adapter `held` and a second key, both in use (cached) on replica two."""
    tenant = f"stale-{uuid.uuid4().hex[:6]}"
    key = create_tenant(one.url, tenant)
    spare = httpx.post(f"{one.url}/v1/tenants/{tenant}/keys", headers=auth(ADMIN_KEY)).json()
    assert upload(one.url, key, "held", archive=zip_folder(adapter_folder)).status_code == 201
    for _ in range(3):
        assert _adapter_served(two, key, "held")
        assert _key_accepted(two, spare["key"])
    return tenant, key, spare


def _redis_ok(server: ServerProcess) -> bool:
    return httpx.get(f"{server.url}/ready", timeout=10).json()["detail"].get("redis") == "ok"


def test_delete_and_revoke_are_honoured_while_redis_hangs(replicas, private_redis, adapter_factory) -> None:
    one, two = replicas
    tenant, key, spare = _setup_tenant(one, two, adapter_factory("basic"))
    private_redis.pause()
    try:
        r = httpx.delete(f"{one.url}/v1/adapters/held", headers=auth(key), timeout=10)
        assert r.status_code == 200, r.text
        _wait_until(lambda: not _adapter_served(two, key, "held"), "replica two stops serving the deleted adapter")
        _holds_for(lambda: not _adapter_served(two, key, "held"), 1.0)

        r = httpx.delete(f"{one.url}/v1/tenants/{tenant}/keys/{spare['id']}", headers=auth(ADMIN_KEY), timeout=10)
        assert r.status_code == 200, r.text
        _wait_until(lambda: not _key_accepted(two, spare["key"]), "replica two refuses the revoked key")
        # Everyone else is still served, from the database, without waiting on the hung Redis.
        assert _key_accepted(two, key) and _key_accepted(one, key)
    finally:
        private_redis.resume()

    # Redis is back: both replicas use it again, and nothing stale comes back with it.
    _wait_until(lambda: _redis_ok(one) and _redis_ok(two), "both replicas use Redis again")
    _holds_for(lambda: not _adapter_served(two, key, "held") and not _key_accepted(two, spare["key"]), 2.0)
    assert upload(one.url, key, "held", archive=zip_folder(adapter_factory("basic"))).status_code == 201
    _wait_until(lambda: _adapter_served(two, key, "held"), "replica two serves the new upload")
    assert httpx.delete(f"{one.url}/v1/adapters/held", headers=auth(key), timeout=10).status_code == 200
    _wait_until(
        lambda: not _adapter_served(two, key, "held"), "after recovery, replica two stops serving the deleted adapter"
    )


def _pg_execute(schema: str, sql: str, *args: object) -> str:
    async def run() -> str:
        import asyncpg

        dsn = "postgresql://postgres@127.0.0.1:5432/test"
        conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
        try:
            return await conn.execute(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def _invalidate_without_message(redis_url: str, key: str) -> None:
    """What an invalidation does in Redis, with its pub/sub message lost on the way."""
    client = redis.Redis.from_url(redis_url)
    try:
        with client.pipeline(transaction=True) as pipe:
            queue_invalidation(pipe, key, 3600)
            pipe.execute()
    finally:
        client.close()


def test_lost_invalidation_messages_are_noticed(replicas, private_redis, adapter_factory, pg_schema) -> None:
    one, two = replicas
    tenant, key, spare = _setup_tenant(one, two, adapter_factory("basic"))
    tenant_id = httpx.get(f"{one.url}/v1/tenants/{tenant}", headers=auth(ADMIN_KEY)).json()["id"]

    # The adapter is deleted and the key revoked in the registry; their invalidation messages never arrive.
    status = _pg_execute(
        pg_schema,
        "UPDATE adapters SET deleted_at = now() WHERE tenant_id = $1 AND name = 'held' AND deleted_at IS NULL",
        uuid.UUID(tenant_id),
    )
    assert status == "UPDATE 1"
    _invalidate_without_message(private_redis.url, cache_key(tenant_id, "held"))
    _wait_until(lambda: not _adapter_served(two, key, "held"), "replica two stops serving the deleted adapter")

    assert _pg_execute(pg_schema, "UPDATE api_keys SET revoked_at = now() WHERE prefix = $1", spare["prefix"]) == (
        "UPDATE 1"
    )
    _invalidate_without_message(private_redis.url, f"key:{spare['prefix']}")
    _wait_until(lambda: not _key_accepted(two, spare["key"]), "replica two refuses the revoked key")

    # The subscriptions themselves dropped (messages published meanwhile are lost): the bound still holds.
    assert upload(one.url, key, "held", archive=zip_folder(adapter_factory("basic"))).status_code == 201
    _wait_until(lambda: _adapter_served(two, key, "held"), "replica two serves the new upload")
    admin = redis.Redis.from_url(private_redis.url)
    try:
        assert admin.client_kill_filter(_type="pubsub") >= 2
    finally:
        admin.close()
    assert httpx.delete(f"{one.url}/v1/adapters/held", headers=auth(key), timeout=10).status_code == 200
    _wait_until(lambda: not _adapter_served(two, key, "held"), "replica two stops serving the deleted adapter")
