"""Per-minute endpoint rollups (platform/endpoints/rollups.py) on SQLite and PostgreSQL: a flush writes the
tallies, a second flush (or another replica) adds into the same row, a failed flush keeps its tallies, rows past
the retention are deleted; then GET /v1/endpoints/{name}/metrics on a started server: per-version counts that
match the versions that answered, refusals as errors, pending tallies included, written at shutdown."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from loraplex.platform.db.migrate import upgrade
from loraplex.platform.db.models import EndpointRollup, Tenant, as_utc
from loraplex.platform.db.session import Database
from loraplex.platform.endpoints.rollups import RollupKey, Rollups
from tests.platform.helpers import PG_URL, auth, create_tenant, error_of, upload, zip_folder

T0 = 1_800_000_000.0  # a whole minute (divisible by 60)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(
    params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.services)]
)
def registry(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None, str]:
    """A migrated registry with one tenant: (url, PostgreSQL schema, tenant id)."""
    if request.param == "sqlite":
        url, schema = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}", None
    else:
        url, schema = PG_URL, request.getfixturevalue("pg_schema")
    tenant_id = uuid.uuid4()

    async def setup() -> None:
        await upgrade(url, schema)
        db = Database(url, schema)
        async with db.session() as session:
            session.add(Tenant(id=tenant_id, name=f"rollups-{tenant_id.hex[:8]}"))
            await session.commit()
        await db.close()

    asyncio.run(setup())
    return url, schema, str(tenant_id)


async def _rows(db: Database, tenant_id: str) -> list[tuple[int, int, int, int, float, float, int, int]]:
    async with db.session() as session:
        rows = await session.scalars(
            select(EndpointRollup)
            .where(EndpointRollup.tenant_id == uuid.UUID(tenant_id))
            .order_by(EndpointRollup.minute, EndpointRollup.adapter_version)
        )
        return [
            (
                int(as_utc(r.minute).timestamp() - T0) // 60,
                r.adapter_version,
                r.requests,
                r.errors,
                round(r.latency_ms_sum, 3),
                round(r.latency_ms_max, 3),
                r.prompt_tokens,
                r.completion_tokens,
            )
            for r in rows
        ]


def test_flush_upserts_and_retention(registry: tuple[str, str | None, str]) -> None:
    url, schema, tenant = registry
    clock = Clock()
    v1, v2 = RollupKey(tenant, "extract", 1), RollupKey(tenant, "extract", 2)

    async def run() -> None:
        db = Database(url, schema)
        replica_a = Rollups(db, retention_s=3600, flush_s=60, clock=clock)
        replica_b = Rollups(db, retention_s=3600, flush_s=60, clock=clock)
        replica_a.record(v1, error=False, latency_s=0.1, prompt_tokens=5, completion_tokens=7)
        replica_a.record(v1, error=True, latency_s=0.3)
        replica_a.record(v2, error=False, latency_s=0.2, prompt_tokens=1, completion_tokens=2)
        assert await replica_a.flush() == 2
        assert await replica_a.flush() == 0  # nothing pending any more
        assert await _rows(db, tenant) == [(0, 1, 2, 1, 400.0, 300.0, 5, 7), (0, 2, 1, 0, 200.0, 200.0, 1, 2)]

        # the same minute again, from this replica and another: counts add, the maximum is the larger one
        replica_a.record(v1, error=False, latency_s=0.05, prompt_tokens=1, completion_tokens=1)
        replica_b.record(v1, error=False, latency_s=0.5, prompt_tokens=2, completion_tokens=3)
        clock.now += 61  # and the next minute gets its own row
        replica_b.record(v2, error=True, latency_s=0.01)
        assert await replica_a.flush() == 1
        assert await replica_b.flush() == 2
        assert await _rows(db, tenant) == [
            (0, 1, 4, 1, 950.0, 500.0, 8, 11),
            (0, 2, 1, 0, 200.0, 200.0, 1, 2),
            (1, 2, 1, 1, 10.0, 10.0, 0, 0),
        ]

        # series: stored rows plus what this replica has not flushed yet, within the window asked for
        replica_a.record(v2, error=False, latency_s=0.02, prompt_tokens=3, completion_tokens=4)
        points = await replica_a.series(tenant, "extract", minutes=2)
        assert [(int(p.minute.timestamp() - T0) // 60, p.adapter_version, p.tally.requests) for p in points] == [
            (0, 1, 4),
            (0, 2, 1),
            (1, 2, 2),
        ]
        assert [p.adapter_version for p in await replica_a.series(tenant, "extract", minutes=1)] == [2]
        assert await replica_a.series(tenant, "other", minutes=60) == []
        assert await replica_a.series(str(uuid.uuid4()), "extract", minutes=60) == []

        # retention: an hour later the first minute's rows go, the second minute's stay
        clock.now = T0 + 3600 + 30
        await replica_a.flush()
        assert await replica_a.prune() == 2
        assert [(m, v) for m, v, *_ in await _rows(db, tenant)] == [(1, 2)]
        await db.close()

    asyncio.run(run())


def test_failed_flush_keeps_tallies_a_refused_row_is_dropped_and_close_writes(tmp_path: Path) -> None:
    async def run() -> None:
        url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
        db = Database(url)
        tenant = uuid.uuid4()
        rollups = Rollups(db, retention_s=3600, flush_s=3600, clock=Clock())
        key = RollupKey(str(tenant), "e", 3)
        rollups.record(key, error=False, latency_s=0.1, prompt_tokens=1, completion_tokens=1)
        with pytest.raises(Exception, match="no such table"):  # the database is not there yet: kept for later
            await rollups.flush()
        await upgrade(url)
        async with db.session() as session:
            session.add(Tenant(id=tenant, name="late"))
            await session.commit()
        # a row for a tenant that does not exist is refused by the database: dropped, the others written
        rollups.record(RollupKey(str(uuid.uuid4()), "e", 1), error=False, latency_s=0.2)
        rollups.record(key, error=False, latency_s=0.3, prompt_tokens=1, completion_tokens=1)
        assert await rollups.flush() == 1
        assert await rollups.flush() == 0
        rollups.record(key, error=True, latency_s=0.5)
        rollups.start()
        await rollups.close()  # stops the task, writes what is pending
        assert await _rows(db, str(tenant)) == [(0, 3, 3, 1, 900.0, 500.0, 2, 2)]
        await db.close()

    asyncio.run(run())


@pytest.fixture
def canary_server(start_server: Any, adapter_factory: Any) -> tuple[Any, str]:
    """A SQLite server whose rollups are written only at shutdown, a tenant with `bot` versions 1 and 2 and an
    endpoint `split` serving bot@1 with bot@2 as a 50% canary."""
    server = start_server(endpoint_rollup_flush_s=3600)
    key = create_tenant(server.url, "rollup-tenant")
    for seed in (31, 32):
        assert upload(
            server.url, key, "bot", archive=zip_folder(adapter_factory(f"rollup-{seed}", seed=seed))
        ).is_success
    r = httpx.post(
        f"{server.url}/v1/endpoints",
        json={
            "name": "split",
            "adapter": "bot@1",
            "canary": {"version": 2, "weight": 0.5},
            "defaults": {"max_tokens": 3},
        },
        headers=auth(key),
    )
    assert r.status_code == 201, r.text
    return server, key


def test_metrics_route_counts_each_version(canary_server: tuple[Any, str], start_server: Any) -> None:
    server, key = canary_server
    served: Counter[str] = Counter()
    first_user = ""
    for i in range(16):
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "split", "messages": [{"role": "user", "content": "hi"}], "user": f"u{i}"},
            headers=auth(key),
            timeout=60,
        )
        assert r.status_code == 200, r.text
        served[r.headers["x-loraplex-served-by"]] += 1
        first_user = first_user or r.headers["x-loraplex-served-by"]
    refused = httpx.post(  # over the endpoint's max_tokens cap: refused, counted as an error of the version picked
        f"{server.url}/v1/chat/completions",
        json={"model": "split", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "user": "u0"},
        headers=auth(key),
    )
    assert refused.status_code == 400, refused.text
    assert set(served) == {"bot@1", "bot@2"}, served

    def metrics(**params: Any) -> httpx.Response:
        return httpx.get(f"{server.url}/v1/endpoints/split/metrics", params=params, headers=auth(key))

    body = metrics().json()
    assert body["object"] == "endpoint.metrics" and body["endpoint"] == "split" and body["minutes"] == 60
    by_version = {s["adapter_version"]: s["points"] for s in body["series"]}
    assert set(by_version) == {1, 2}
    totals = {v: sum(p["requests"] for p in points) for v, points in by_version.items()}
    errors = {v: sum(p["errors"] for p in points) for v, points in by_version.items()}
    first_user_version = int(first_user.removeprefix("bot@"))  # user u0 sticks to it: its refusal counts there
    assert totals == {
        1: served["bot@1"] + (first_user_version == 1),
        2: served["bot@2"] + (first_user_version == 2),
    }
    assert errors == {1: int(first_user_version == 1), 2: int(first_user_version == 2)}
    for points in by_version.values():
        assert all(p["latency_ms_max"] >= p["latency_ms_avg"] > 0 for p in points)
        assert sum(p["completion_tokens"] for p in points) > 0 and sum(p["prompt_tokens"] for p in points) > 0

    # bad windows and other tenants' endpoints are refused like everywhere else
    assert metrics(minutes=0).status_code == 400
    assert metrics(minutes=10081).status_code == 400
    other = create_tenant(server.url, "rollup-other")
    r = httpx.get(f"{server.url}/v1/endpoints/split/metrics", headers=auth(other))
    assert r.status_code == 404 and error_of(r)["code"] == "endpoint_not_found"

    # nothing was flushed yet (flush_s=3600): stopping the server writes the tallies; a new server reads them
    data_dir = server.settings.data_dir
    server.stop()
    again = start_server(data_dir=data_dir, endpoint_rollup_flush_s=3600)
    after = httpx.get(f"{again.url}/v1/endpoints/split/metrics", headers=auth(key)).json()
    assert after["series"] == body["series"]
