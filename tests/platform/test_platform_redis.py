"""The registry cache and rate limits on real Redis: pub/sub invalidation between replicas, the stale-read
guard, shared rate-limit counters, and Redis going away mid-service (degrades to SQL, never fails)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from loraplex.platform.storage.cache import RegistryCache
from loraplex.platform.storage.redis_link import RedisLink
from loraplex.platform.tenants.rate_limit import RateLimiter
from tests.platform.helpers import REDIS_URL, auth, create_tenant, free_port, upload, zip_folder


async def _wait_for(predicate, timeout: float = 30.0) -> None:
    """Wait for ``predicate`` with a generous timeout: these tests assert that a change arrives, not how fast
    (caches here keep entries for an hour, so only an invalidation can make it arrive)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


@pytest.mark.services
async def test_invalidation_reaches_other_replicas() -> None:
    a, b = RegistryCache(3600, RedisLink(REDIS_URL)), RegistryCache(3600, RedisLink(REDIS_URL))
    await a.start()
    await b.start()
    key = f"adapter:{uuid.uuid4()}:demo"
    source = {"v": "version-1"}
    loads = 0

    async def load() -> dict:
        nonlocal loads
        loads += 1
        return dict(source)

    try:
        assert await b.get_or_load(key, load) == {"v": "version-1"}
        assert await b.get_or_load(key, load) == {"v": "version-1"} and loads == 1  # L1 hit
        assert await a.get_or_load(key, load) == {"v": "version-1"} and loads == 1  # Redis hit
        source["v"] = "version-2"
        await a.invalidate(key)

        async def b_sees_new() -> bool:
            return await b.get_or_load(key, load) == {"v": "version-2"}

        await _wait_for(b_sees_new)
    finally:
        for cache in (a, b):
            await cache.close()
            await cache.redis.close()


@pytest.mark.services
async def test_a_slow_reader_cannot_put_a_stale_record_back() -> None:
    cache = RegistryCache(60, RedisLink(REDIS_URL))
    other = RegistryCache(60, RedisLink(REDIS_URL))
    await cache.start()
    await other.start()
    key = f"adapter:{uuid.uuid4()}:race"
    loading, invalidated, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    cache.on_invalidate(key, lambda _rest: invalidated.set())  # `other`'s invalidation reached `cache`

    async def slow_stale_load() -> dict:
        loading.set()
        await release.wait()  # the row is read before the delete commits, returned after
        return {"v": "deleted"}

    try:
        reader = asyncio.create_task(cache.get_or_load(key, slow_stale_load))
        await asyncio.wait_for(loading.wait(), timeout=30)  # the reader has looked up the cache and is loading
        await other.invalidate(key)  # the delete commits and invalidates meanwhile
        await asyncio.wait_for(invalidated.wait(), timeout=30)
        release.set()
        assert await reader == {"v": "deleted"}  # that one request saw the old row...

        async def fresh() -> dict:
            return {"v": "fresh"}

        # ...but nobody serves it from the cache afterwards.
        assert await cache.get_or_load(key, fresh) == {"v": "fresh"}
        assert await other.get_or_load(key, fresh) == {"v": "fresh"}
    finally:
        for c in (cache, other):
            await c.close()
            await c.redis.close()


@pytest.mark.services
async def test_rate_limit_counters_are_shared_through_redis() -> None:
    tenant = str(uuid.uuid4())
    links = [RedisLink(REDIS_URL), RedisLink(REDIS_URL)]
    one, two = RateLimiter(links[0]), RateLimiter(links[1])
    now = time.time()
    try:
        decisions = [await (one if i % 2 else two).hit(tenant, 5, now=now) for i in range(7)]
        assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
        assert decisions[-1].retry_after_s >= 1
        assert (await one.hit(tenant, 5, now=now + 60)).allowed  # the next window starts afresh
    finally:
        for link in links:
            await link.close()


@pytest.fixture
def private_redis(tmp_path: Path):
    """A redis-server of our own, so a test can stop and restart it."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed on this machine")
    port = free_port()

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                import socket

                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return proc
            except OSError:
                time.sleep(0.05)
        proc.kill()
        raise RuntimeError("redis-server did not start")

    state = {"proc": start()}

    def stop() -> None:
        state["proc"].terminate()
        state["proc"].wait(timeout=10)

    def restart() -> None:
        state["proc"] = start()

    yield f"redis://127.0.0.1:{port}/0", stop, restart
    if state["proc"].poll() is None:
        stop()


@pytest.mark.services
def test_redis_going_away_degrades_to_sql_with_a_warning(start_server, private_redis, adapter_factory, caplog) -> None:
    url, stop_redis, restart_redis = private_redis
    server = start_server("postgres+redis", redis_url=url)
    key = create_tenant(server.url, f"degrade-{uuid.uuid4().hex[:6]}", rate_limit_per_minute=1000)
    assert upload(server.url, key, "kept", archive=zip_folder(adapter_factory("basic"))).status_code == 201
    assert httpx.get(f"{server.url}/v1/adapters/kept", headers=auth(key)).status_code == 200
    caplog.set_level(logging.WARNING, logger="loraplex.platform.redis")
    stop_redis()
    # Every kind of request keeps working: auth, registry reads and writes, serving an adapter.
    for _ in range(3):
        r = httpx.get(f"{server.url}/v1/adapters/kept", headers=auth(key), timeout=10)
        assert r.status_code == 200, r.text
    r = httpx.post(
        f"{server.url}/v1/completions",
        headers=auth(key),
        timeout=60,
        json={"model": "kept", "prompt": "hi", "max_tokens": 2},
    )
    assert r.status_code == 200, r.text
    assert httpx.delete(f"{server.url}/v1/adapters/kept", headers=auth(key)).status_code == 200
    assert httpx.get(f"{server.url}/v1/adapters/kept", headers=auth(key)).status_code == 404
    assert httpx.get(f"{server.url}/ready").json()["detail"]["redis"].startswith("unavailable")
    assert any("unavailable" in rec.getMessage() for rec in caplog.records), caplog.text
    # Back again: the server reconnects by itself and uses Redis once more.
    restart_redis()
    deadline = time.monotonic() + 15
    while httpx.get(f"{server.url}/ready").json()["detail"].get("redis") != "ok":
        assert time.monotonic() < deadline, "did not reconnect to Redis"
        time.sleep(0.2)
    assert upload(server.url, key, "kept", archive=zip_folder(adapter_factory("basic"))).status_code == 201
    assert httpx.get(f"{server.url}/v1/adapters/kept", headers=auth(key)).json()["version"] == 2


def test_server_starts_and_serves_while_redis_is_unreachable(start_server, adapter_factory) -> None:
    """Needs no Redis at all: the configured one is a closed port."""
    server = start_server("sqlite", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    key = create_tenant(server.url, "no-redis", rate_limit_per_minute=2)
    ready = httpx.get(f"{server.url}/ready")
    assert ready.status_code == 200 and ready.json()["detail"]["redis"].startswith("unavailable")
    assert upload(server.url, key, "a", archive=zip_folder(adapter_factory("basic"))).status_code == 201
    assert httpx.get(f"{server.url}/v1/adapters/a", headers=auth(key)).status_code == 200
    # Rate limits fall back to this process's own counters.
    assert httpx.get(f"{server.url}/v1/adapters/a", headers=auth(key)).status_code == 429
