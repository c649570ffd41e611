"""The Batch API through the real server and the official `openai` client: files checked line by line at upload,
a 200-line job whose results equal the same requests sent one by one (greedy), the lines run at background
priority through the route's own path, cancellation, tenant isolation, the 0003 migration, and a server killed
with SIGKILL mid-job that, restarted, finishes the job with every line exactly once and no finished line re-run.

Where a job must be caught mid-way inside one process, the engine thread is held (an `EngineProbe` callback
waits on a gate), so nothing here depends on how fast the engine runs."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import sqlalchemy as sa

from loraplex.engine import Share
from loraplex.engine.probe import EngineProbe
from loraplex.platform.db.migrate import current_revision, downgrade, upgrade
from loraplex.platform.db.session import create_engine
from tests.platform.helpers import ADMIN_KEY, PG_URL, ServerProcess, auth, create_tenant, error_of

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def client_for(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def line(custom_id: str, body: dict[str, Any], url: str = CHAT) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def upload_jsonl(url: str, key: str, content: bytes, purpose: str = "batch") -> httpx.Response:
    return httpx.post(
        f"{url}/v1/files",
        headers=auth(key),
        data={"purpose": purpose},
        files={"file": ("input.jsonl", content, "application/jsonl")},
        timeout=60,
    )


def wait_for_status(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float = 600) -> Any:
    """Liveness bound only: a broken runner fails the test instead of hanging it."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.1)


def read_jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def model_of(url: str, key: str) -> str:
    return httpx.get(f"{url}/v1/models", headers=auth(key)).json()["data"][0]["id"]


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """A response body without what differs between two runs of one request: its id, creation time, and how
    many prompt tokens the prefix cache held."""
    usage = {k: v for k, v in body["usage"].items() if k != "prompt_tokens_details"}
    return {**{k: v for k, v in body.items() if k not in ("id", "created")}, "usage": usage}


# ------------------------------------------------------------------------------------- identity


def test_a_200_line_job_equals_the_requests_sent_one_by_one(server) -> None:
    key = create_tenant(server.url, f"batch-{uuid.uuid4().hex[:6]}")
    model = model_of(server.url, key)
    bodies = []
    for i in range(200):
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": f"Request {i}: tell me about the number {i * 7}."}],
            "max_tokens": 4 + i % 9,
            "temperature": 0,
        }
        if i % 10 == 3:
            body["guided_choice"] = ["yes", "no", "maybe"]
        if i % 50 == 7:
            body["max_tokens"] = 10**6  # over the context: the route answers 400, so does the batch line
        bodies.append(body)
    lines = [line(f"req-{i}", b) for i, b in enumerate(bodies)]
    client = client_for(server.url, key)
    uploaded = client.files.create(file=("job.jsonl", jsonl(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    assert batch.status == "in_progress" and batch.request_counts.total == 200

    one_by_one = [httpx.post(f"{server.url}{CHAT}", headers=auth(key), json=b, timeout=120) for b in bodies]

    done = wait_for_status(client, batch.id, {"completed", "failed", "cancelled", "expired"})
    assert done.status == "completed"
    refused = [i for i, r in enumerate(one_by_one) if r.status_code != 200]
    assert refused == [i for i in range(200) if i % 50 == 7]
    assert (done.request_counts.completed, done.request_counts.failed) == (200 - len(refused), len(refused))
    outputs = read_jsonl(client, done.output_file_id)
    errors = read_jsonl(client, done.error_file_id)
    by_id = {o["custom_id"]: o for o in outputs + errors}
    assert len(by_id) == len(outputs) + len(errors) == 200  # every line exactly once
    assert [o["custom_id"] for o in outputs] == [f"req-{i}" for i in range(200) if i not in refused]
    for i, single in enumerate(one_by_one):
        entry = by_id[f"req-{i}"]
        assert entry["id"].startswith("batch_req_") and entry["error"] is None
        response = entry["response"]
        assert response["status_code"] == single.status_code, (i, response)
        if single.status_code == 200:
            assert response["request_id"] == response["body"]["id"]
            assert comparable(response["body"]) == comparable(single.json()), i
        else:
            assert response["body"] == single.json(), i
            assert error_of(single)["param"] == "max_tokens"
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"


def test_batch_lines_run_at_background_priority_for_their_tenant(start_server, tiny_engine) -> None:
    server = start_server()
    name = f"prio-{uuid.uuid4().hex[:6]}"
    key = create_tenant(server.url, name)
    seen: dict[str, Share] = {}

    def record(request_ids: list[str], _positions: list[int], _logits: Any) -> None:
        running = {s.request_id: s for s in tiny_engine.engine.scheduler.running}
        seen.update({rid: running[rid].share for rid in request_ids if rid in running})

    tiny_engine.engine.probe = EngineProbe(on_logits=record)
    try:
        client = client_for(server.url, key)
        model = model_of(server.url, key)
        body = {"model": model, "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0}
        f = client.files.create(file=("p.jsonl", jsonl([line("a", body, COMPLETIONS)])), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=COMPLETIONS, completion_window="24h")
        assert wait_for_status(client, batch.id, {"completed"}).request_counts.completed == 1
        batch_shares = set(seen.values())
        seen.clear()
        assert httpx.post(f"{server.url}{COMPLETIONS}", headers=auth(key), json=body).status_code == 200
    finally:
        tiny_engine.engine.probe = None
    tenant_id = httpx.get(f"{server.url}/v1/tenants/{name}", headers=auth(ADMIN_KEY)).json()["id"]
    assert batch_shares == {Share(tenant=tenant_id, weight=1.0, priority=1)}
    assert set(seen.values()) == {Share(tenant=tenant_id, weight=1.0, priority=0)}


# ----------------------------------------------------------------------------------- refusals


def test_upload_checks_every_line_and_names_the_bad_one(start_server) -> None:
    server = start_server()
    key = create_tenant(server.url, f"val-{uuid.uuid4().hex[:6]}")
    good = line("a", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    cases = [
        (jsonl([good, good]), "line 2", "custom_id 'a' repeats line 1"),
        (jsonl([good]) + b"{not json\n", "line 2", "not valid JSON"),
        (jsonl([good, {**good, "custom_id": "b", "url": "/v1/embeddings"}]), "line 2", "url must be one of"),
        (jsonl([{**good, "method": "GET"}]), "line 1", "method must be"),
        (jsonl([{**good, "body": [1]}]), "line 1", "body must be a JSON object"),
        (jsonl([{**good, "extra": 1}]), "line 1", "unknown field 'extra'"),
        (jsonl([{**good, "body": {**good["body"], "stream": True}}]), "line 1", "body.stream"),
        (jsonl([good]) + b"\n" + jsonl([{**good, "custom_id": "c"}]), "line 2", "empty line"),
        (b"[" * 100 + b"]" * 100 + b"\n", "line 1", "max_json_depth"),
    ]
    for content, where, what in cases:
        r = upload_jsonl(server.url, key, content)
        assert r.status_code == 400, (what, r.text)
        err = error_of(r)
        assert err["param"] == "file" and err["message"].startswith(where) and what in err["message"], err
    r = upload_jsonl(server.url, key, b"")
    assert r.status_code == 400 and error_of(r)["code"] == "empty_file"
    r = upload_jsonl(server.url, key, jsonl([good]), purpose="fine-tune")
    assert r.status_code == 400 and error_of(r)["param"] == "purpose"
    assert httpx.get(f"{server.url}/v1/files", headers=auth(key)).json()["data"] == []  # nothing was stored

    file_id = upload_jsonl(server.url, key, jsonl([good])).json()["id"]
    create = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
    for change, param in (
        ({"endpoint": COMPLETIONS}, "input_file_id"),  # line 1 is a chat request
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": "file-" + "0" * 32}, "input_file_id"),
    ):
        r = httpx.post(f"{server.url}/v1/batches", headers=auth(key), json={**create, **change})
        assert r.status_code in (400, 404), r.text
        assert error_of(r)["param"] == param, (change, r.text)
    r = httpx.post(f"{server.url}/v1/batches", headers=auth(key), json={**create, "priority": 3})
    assert r.status_code == 400 and "unknown field `priority`" in error_of(r)["message"]  # refused, never ignored
    r = httpx.post(f"{server.url}/v1/batches", headers=auth(key), json={**create, "endpoint": COMPLETIONS})
    assert "line 1" in error_of(r)["message"]


def test_a_line_over_the_http_body_limit_is_refused_like_the_same_body_sent_alone(start_server) -> None:
    server = start_server(max_request_bytes=4096)
    key = create_tenant(server.url, f"big-{uuid.uuid4().hex[:6]}")
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
    alone = httpx.post(f"{server.url}/v1/chat/completions", headers=auth(key), json=big)
    assert alone.status_code == 413  # the route's own limit
    small = line("a", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    r = upload_jsonl(server.url, key, jsonl([small, line("b", big)]))
    assert r.status_code == 413, r.text
    err = error_of(r)
    assert err["code"] == "request_too_large" and err["param"] == "file" and err["message"].startswith("line 2")
    assert httpx.get(f"{server.url}/v1/files", headers=auth(key)).json()["data"] == []  # nothing was stored


def test_another_tenant_cannot_read_files_batches_or_outputs(server) -> None:
    owner = create_tenant(server.url, f"own-{uuid.uuid4().hex[:6]}")
    other = create_tenant(server.url, f"oth-{uuid.uuid4().hex[:6]}")
    model = model_of(server.url, owner)
    body = {"model": model, "prompt": "secret", "max_tokens": 2, "temperature": 0}
    client = client_for(server.url, owner)
    f = client.files.create(file=("s.jsonl", jsonl([line("s", body, COMPLETIONS)])), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=COMPLETIONS, completion_window="24h")
    done = wait_for_status(client, batch.id, {"completed"})
    assert done.output_file_id is not None and read_jsonl(client, done.output_file_id)[0]["custom_id"] == "s"

    h = auth(other)
    for method, path in (
        ("GET", f"/v1/files/{f.id}"),
        ("GET", f"/v1/files/{f.id}/content"),
        ("DELETE", f"/v1/files/{f.id}"),
        ("GET", f"/v1/files/{done.output_file_id}"),
        ("GET", f"/v1/files/{done.output_file_id}/content"),
        ("GET", f"/v1/batches/{batch.id}"),
        ("POST", f"/v1/batches/{batch.id}/cancel"),
        ("GET", "/v1/files/file-not-an-id/content"),
    ):
        r = httpx.request(method, f"{server.url}{path}", headers=h)
        assert r.status_code == 404, (method, path, r.text)
        assert "secret" not in r.text
    r = httpx.post(
        f"{server.url}/v1/batches",
        headers=h,
        json={"input_file_id": f.id, "endpoint": COMPLETIONS, "completion_window": "24h"},
    )
    assert r.status_code == 404 and error_of(r)["param"] == "input_file_id"
    assert httpx.get(f"{server.url}/v1/files", headers=h).json()["data"] == []
    assert httpx.get(f"{server.url}/v1/batches", headers=h).json()["data"] == []
    # the owner still has everything, and deleting a file removes it
    assert [b.id for b in client.batches.list().data] == [batch.id]
    assert {x.id for x in client.files.list().data} == {f.id, done.output_file_id}
    assert client.files.delete(f.id).deleted
    assert httpx.get(f"{server.url}/v1/files/{f.id}", headers=auth(owner)).status_code == 404


# -------------------------------------------------------------------------------- cancellation


def test_cancel_stops_the_job_and_accounts_for_every_line(start_server, tiny_engine) -> None:
    server = start_server(batch_max_in_flight=2)
    key = create_tenant(server.url, f"cnl-{uuid.uuid4().hex[:6]}")
    model = model_of(server.url, key)
    opened, held = threading.Event(), threading.Event()

    def hold(_ids: list[str], positions: list[int], _logits: Any) -> None:
        if any(p >= 2 for p in positions) and not opened.is_set():
            held.set()
            opened.wait(timeout=120)  # liveness bound

    body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    client = client_for(server.url, key)
    f = client.files.create(
        file=("c.jsonl", jsonl([line(f"c{i}", body, COMPLETIONS) for i in range(20)])), purpose="batch"
    )
    tiny_engine.engine.probe = EngineProbe(on_logits=hold)
    try:
        batch = client.batches.create(input_file_id=f.id, endpoint=COMPLETIONS, completion_window="24h")
        assert held.wait(timeout=60)
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    finally:
        opened.set()
        tiny_engine.engine.probe = None
    done = wait_for_status(client, batch.id, {"cancelled", "completed"})
    assert done.status == "cancelled" and done.cancelled_at is not None
    outputs, errors = read_jsonl(client, done.output_file_id), read_jsonl(client, done.error_file_id)
    assert sorted(o["custom_id"] for o in outputs + errors) == sorted(f"c{i}" for i in range(20))
    assert len(outputs) <= 2 and done.request_counts.completed == len(outputs)  # at most the lines in flight
    assert all(e["response"] is None and e["error"]["code"] == "batch_cancelled" for e in errors)
    r = httpx.post(f"{server.url}/v1/batches/{batch.id}/cancel", headers=auth(key))
    assert r.status_code == 200 and r.json()["status"] == "cancelled"  # cancelling again changes nothing


# ------------------------------------------------------------------------------------- restart


@pytest.fixture
def serve_args(tiny_llama_dir: Path, tmp_path: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    args = [
        "--model",
        str(tiny_llama_dir),
        "--data-dir",
        str(tmp_path / "data"),
        "--num-kv-blocks",
        "256",
        "--max-model-len",
        "512",
        "--batch-max-in-flight",
        "4",
        "--batch-lease-ttl-s",
        "2",
        "--log-level",
        "warning",
    ]
    yield args, {"LORAPLEX_ADMIN_KEY": ADMIN_KEY}


def stored_results(db: Path) -> dict[str, tuple[int, str]]:
    """custom_id -> (attempts, response JSON) of every line with a stored result, read from the SQLite file."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT custom_id, attempts, response FROM batch_lines WHERE status_code IS NOT NULL")
        return {cid: (attempts, response) for cid, attempts, response in rows}


def test_a_job_killed_mid_way_resumes_after_restart_without_duplicates(serve_args, tmp_path: Path) -> None:
    args, env = serve_args
    first = ServerProcess(args, env, tmp_path / "first.log").wait_ready()
    try:
        key = create_tenant(first.url, "resume")
        model = model_of(first.url, key)
        lines = [
            line(
                f"r{i}",
                {"model": model, "prompt": [3 + i % 50, 9, 4], "max_tokens": 16, "ignore_eos": True, "temperature": 0},
                COMPLETIONS,
            )
            for i in range(200)
        ]
        client = client_for(first.url, key)
        f = client.files.create(file=("r.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=COMPLETIONS, completion_window="24h")
        deadline = time.monotonic() + 300
        while client.batches.retrieve(batch.id).request_counts.completed < 6:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        first.proc.kill()  # SIGKILL: no shutdown code runs
        first.proc.wait()
        first._log_file.close()
    db = tmp_path / "data" / "loraplex.db"
    before = stored_results(db)
    assert 6 <= len(before) < 200, len(before)
    assert all(attempts == 1 for attempts, _ in before.values())

    second = ServerProcess(args, env, tmp_path / "second.log").wait_ready()
    try:
        client = client_for(second.url, key)
        done = wait_for_status(client, batch.id, {"completed", "failed", "expired", "cancelled"})
        assert done.status == "completed" and done.request_counts.completed == 200
        outputs = read_jsonl(client, done.output_file_id)
        assert [o["custom_id"] for o in outputs] == [f"r{i}" for i in range(200)]  # each exactly once, in order
        after = stored_results(db)
        for cid, (_, response) in before.items():
            assert after[cid] == (1, response), cid  # finished before the kill: never run again
        rerun = [cid for cid, (attempts, _) in after.items() if attempts > 1]
        assert len(rerun) <= 4 and all(after[c][0] == 2 for c in rerun)  # only what was in flight at the kill
        # every line, re-run or not, equals the same request sent alone
        for i in sorted({int(c[1:]) for c in rerun} | {0, 57, 199}):
            single = httpx.post(f"{second.url}{COMPLETIONS}", headers=auth(key), json=lines[i]["body"], timeout=120)
            assert comparable(outputs[i]["response"]["body"]) == comparable(single.json()), i
    finally:
        second.stop()


# ----------------------------------------------------------------------------------- migration


async def _batches_round_trip(url: str, schema: str | None) -> None:
    """0002 -> 0003 (a file stored) -> back to 0002 (the three tables gone, tenants kept) -> head again."""
    await upgrade(url, schema, "0003")
    engine = create_engine(url, schema)
    tenant = uuid.uuid4()
    try:
        async with engine.begin() as conn:
            tid = tenant.hex if conn.dialect.name == "sqlite" else tenant
            await conn.execute(
                sa.text("INSERT INTO tenants (id, name, created_at) VALUES (:id, 'm', CURRENT_TIMESTAMP)"), {"id": tid}
            )
            await conn.execute(
                sa.text(
                    "INSERT INTO batch_files (id, tenant_id, filename, purpose, size_bytes, lines, blob, created_at) "
                    "VALUES (:id, :t, 'f.jsonl', 'batch', 10, 1, 'b', CURRENT_TIMESTAMP)"
                ),
                {"id": uuid.uuid4().hex if conn.dialect.name == "sqlite" else uuid.uuid4(), "t": tid},
            )
        await downgrade(url, "0002", schema)
        assert await current_revision(url, schema) == "0002"
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: set(sa.inspect(c).get_table_names()))
            assert (await conn.execute(sa.text("SELECT count(*) FROM tenants"))).scalar_one() == 1
        assert not tables & {"batch_files", "batches", "batch_lines"} and "tenants" in tables
        await upgrade(url, schema)
        async with engine.connect() as conn:
            assert (await conn.execute(sa.text("SELECT count(*) FROM batch_lines"))).scalar_one() == 0
    finally:
        await engine.dispose()


def test_0003_downgrades_and_upgrades_on_sqlite(tmp_path: Path) -> None:
    asyncio.run(_batches_round_trip(f"sqlite+aiosqlite:///{tmp_path / 'm.db'}", None))


@pytest.mark.services
def test_0003_downgrades_and_upgrades_on_postgresql() -> None:
    schema = f"lpx_batmig_{uuid.uuid4().hex[:8]}"
    try:
        asyncio.run(_batches_round_trip(PG_URL, schema))
    finally:
        import asyncpg

        async def drop() -> None:
            conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()

        asyncio.run(drop())
