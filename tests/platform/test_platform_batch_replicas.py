"""Two `loraplex serve` replicas on one PostgreSQL database, one Redis and one data directory run one batch job
together: both claim lines (leases, `FOR UPDATE SKIP LOCKED`); one is killed with SIGKILL while it holds lines;
the other takes them over once their lease (`batch_lease_ttl_s`, short here) expires and finishes the job.
Every line has exactly one result, the output file is in input order, and only the lines the dead replica held
were started a second time.

The replica to kill is frozen (SIGSTOP) while the database is read, so the lines it holds when it dies are known
exactly; the test waits on conditions (bounded), never on how fast the engine runs."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from loraplex.platform.batch.ids import BATCH, parse
from tests.platform.helpers import ADMIN_KEY, ServerProcess, auth, create_tenant, replica_args, running_replicas
from tests.platform.test_platform_batch import (
    COMPLETIONS,
    client_for,
    comparable,
    jsonl,
    line,
    model_of,
    read_jsonl,
    wait_for_status,
)

pytestmark = pytest.mark.services

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"  # PG_URL for asyncpg itself
LINES = 40
LEASE_TTL_S = 5  # short, so the takeover comes soon; long enough that a live replica always renews in time


@pytest.fixture
def replicas(tmp_path: Path, tiny_llama_dir: Path, pg_schema: str) -> Iterator[list[ServerProcess]]:
    more = [
        "--batch-max-in-flight",
        "2",  # a few lines each at a time: both replicas have some in hand for most of the job
        "--batch-lease-ttl-s",
        str(LEASE_TTL_S),
    ]
    args = replica_args(tiny_llama_dir, pg_schema, data_dir=tmp_path / "shared-data", extra=more)
    with running_replicas(args, {"LORAPLEX_ADMIN_KEY": ADMIN_KEY}, tmp_path) as procs:
        yield procs


def owner_pid(lease_owner: str) -> int:
    """The process id in a runner's lease owner (`<host>-<pid>-<random>`)."""
    return int(lease_owner.rsplit("-", 2)[1])


async def kill_while_holding_lines(schema: str, batch_id: uuid.UUID, both: list[ServerProcess]) -> set[str]:
    """Wait until each replica has held lines of the batch, then SIGKILL the second one at a moment it holds some;
    return the custom_ids of the lines it held (claimed, no result stored)."""
    victim = both[1]
    held_sql = (
        f'SELECT custom_id, lease_owner FROM "{schema}".batch_lines '
        "WHERE batch_id = $1 AND status_code IS NULL AND lease_owner IS NOT NULL"
    )
    conn = await asyncpg.connect(PG_DSN)
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 300  # liveness bound only
        while True:
            rows = await conn.fetch(held_sql, batch_id)
            seen |= {owner_pid(r["lease_owner"]) for r in rows}
            if seen >= {p.proc.pid for p in both}:
                victim.proc.send_signal(signal.SIGSTOP)  # frozen: what it holds cannot change while we read it
                held = {
                    r["custom_id"]
                    for r in await conn.fetch(held_sql, batch_id)
                    if owner_pid(r["lease_owner"]) == victim.proc.pid
                }
                if held:
                    victim.proc.kill()
                    victim.proc.wait()
                    return held
                victim.proc.send_signal(signal.SIGCONT)  # between two claims: try again
            pending = await conn.fetchval(
                f'SELECT count(*) FROM "{schema}".batch_lines WHERE batch_id = $1 AND status_code IS NULL', batch_id
            )
            assert pending, f"the job ended before both replicas held lines (seen: {seen})"
            assert time.monotonic() < deadline, f"both replicas never held lines (seen: {seen})"
            await asyncio.sleep(0.02)
    finally:
        await conn.close()


async def attempts_of(schema: str, batch_id: uuid.UUID) -> dict[str, int]:
    conn = await asyncpg.connect(PG_DSN)
    try:
        rows = await conn.fetch(
            f'SELECT custom_id, attempts FROM "{schema}".batch_lines WHERE batch_id = $1 AND status_code IS NOT NULL',
            batch_id,
        )
        return {r["custom_id"]: r["attempts"] for r in rows}
    finally:
        await conn.close()


def test_two_replicas_share_a_job_and_the_survivor_takes_over_a_killed_ones_lines(
    replicas: list[ServerProcess], pg_schema: str
) -> None:
    survivor = replicas[0]
    key = create_tenant(survivor.url, f"batch-replicas-{uuid.uuid4().hex[:6]}")
    model = model_of(survivor.url, key)
    lines = [
        line(
            f"line-{i}",
            {"model": model, "prompt": [3 + i % 50, 9, 4], "max_tokens": 32, "ignore_eos": True, "temperature": 0},
            COMPLETIONS,
        )
        for i in range(LINES)
    ]
    client = client_for(survivor.url, key)
    f = client.files.create(file=("lines.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=COMPLETIONS, completion_window="24h")
    batch_id = parse(BATCH, batch.id)
    assert batch_id is not None

    held = asyncio.run(kill_while_holding_lines(pg_schema, batch_id, replicas))

    done = wait_for_status(client, batch.id, {"completed", "failed", "expired", "cancelled"}, timeout=300)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
    outputs = read_jsonl(client, done.output_file_id)
    assert [o["custom_id"] for o in outputs] == [f"line-{i}" for i in range(LINES)]  # each once, in input order
    assert done.error_file_id is None
    assert all(o["response"]["status_code"] == 200 for o in outputs)
    # Started once each, but for the lines the dead replica held: those the survivor ran again after their lease.
    assert asyncio.run(attempts_of(pg_schema, batch_id)) == {
        f"line-{i}": 2 if f"line-{i}" in held else 1 for i in range(LINES)
    }
    for cid in held:  # a line run again answers what the same request sent alone answers (greedy)
        i = int(cid.removeprefix("line-"))
        single = httpx.post(f"{survivor.url}{COMPLETIONS}", headers=auth(key), json=lines[i]["body"], timeout=120)
        assert comparable(outputs[i]["response"]["body"]) == comparable(single.json()), cid
