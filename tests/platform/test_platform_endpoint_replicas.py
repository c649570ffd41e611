"""The endpoint layer across two `loraplex serve` processes sharing PostgreSQL, Redis and an S3 server (moto),
each with its own data directory: version 1 uploaded through replica one, an endpoint with a schema and a
system prompt, a 90/10 canary to version 2 seen through replica two within +-5% over 400 callers and sticky per
user, promote, rollback, a killed replica restarted that lost nothing, and deletions that reach both engines.

Constrained decoding costs the tiny model far more than the routing under test, so the 400 split calls ask for
plain text and one token (the endpoint lets callers override its response_format); the schema default is shown
on the calls that send none."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.platform.helpers import (
    ADMIN_KEY,
    S3Server,
    ServerProcess,
    auth,
    create_tenant,
    eventually,
    replica_args,
    upload,
    zip_folder,
)

pytestmark = pytest.mark.services

WAIT_S = 60.0  # liveness bound for what another replica must come to see (invalidations, warm-up from S3)
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def _gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    [value] = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    return value


def _host_adapters(url: str) -> float:
    return _gauge(url, "loraplex_lora_host_adapters")


@pytest.fixture
def cluster(tmp_path: Path, tiny_llama_dir: Path, pg_schema: str):
    s3 = S3Server(tmp_path / "moto.log")
    args = replica_args(tiny_llama_dir, pg_schema, extra=["--blob-url", f"s3://{s3.bucket}/adapters"])
    env = {"LORAPLEX_ADMIN_KEY": ADMIN_KEY, "LORAPLEX_CACHE_TTL_S": "3600", **s3.env}

    def start(i: int) -> ServerProcess:
        data = ["--data-dir", str(tmp_path / f"data-{i}")]
        return ServerProcess([*args, *data], env, tmp_path / f"replica-{i}-{uuid.uuid4().hex[:4]}.log").wait_ready()

    procs = [start(0), start(1)]
    try:
        yield s3, procs, start
    finally:
        for p in procs:
            p.stop()
        s3.stop()


def test_canary_across_replicas_with_object_storage(cluster, adapter_factory) -> None:
    s3, procs, start = cluster
    one, two = procs
    key = create_tenant(one.url, f"endpoints-{uuid.uuid4().hex[:6]}")
    v1 = upload(one.url, key, "bot", archive=zip_folder(adapter_factory("rep-1", seed=111))).json()
    assert v1["version"] == 1
    body = {
        "name": "extract",
        "adapter": "bot",
        "defaults": {
            "system_prompt": "Answer with a verdict.",
            "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}},
            "max_tokens": 16,
        },
        "overridable": ["response_format"],
    }
    r = httpx.post(f"{one.url}/v1/endpoints", json=body, headers=auth(key), timeout=120)
    assert r.status_code == 201 and r.json()["adapter"] == "bot@1", r.text
    # Publishing warmed version 1 on replica two too (read from S3, nothing asked for it there yet).
    eventually(lambda: _host_adapters(two.url) >= 1, "replica two holds version 1 in host memory", timeout=WAIT_S)

    def call(url: str, user: str, schema: bool = False) -> tuple[str, str]:
        chat = {"model": "extract", "user": user, "messages": [{"role": "user", "content": "ok?"}]}
        if not schema:
            chat |= {"response_format": {"type": "text"}, "max_tokens": 1}
        r = httpx.post(f"{url}/v1/chat/completions", json=chat, headers=auth(key), timeout=120)
        assert r.status_code == 200, r.text
        if schema:  # the endpoint's schema and system prompt apply when the caller sends none
            jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), SCHEMA)
        return r.headers["x-loraplex-endpoint"], r.headers["x-loraplex-served-by"]

    assert call(two.url, "first", schema=True) == ("extract@1", "bot@1")

    assert upload(one.url, key, "bot", archive=zip_folder(adapter_factory("rep-2", seed=112))).json()["version"] == 2
    canary = {"canary": {"version": 2, "weight": 0.1}}
    assert httpx.patch(f"{one.url}/v1/endpoints/extract", json=canary, headers=auth(key)).json()["revision"] == 2
    eventually(lambda: call(two.url, "probe")[0] == "extract@2", "replica two serves revision 2", timeout=WAIT_S)

    users = [f"user-{i}" for i in range(400)]
    with ThreadPoolExecutor(8) as pool:
        served = dict(zip(users, (v for _, v in pool.map(lambda u: call(two.url, u), users))))
        share = Counter(served.values())["bot@2"] / len(users)
        # 400 independent draws at 0.1: the standard deviation is 0.015, so +-0.05 is 3.3 of them.
        if abs(share - 0.1) > 0.05:  # say what was served and what the endpoint was, to tell a bias from chance
            endpoint = httpx.get(f"{two.url}/v1/endpoints/extract", headers=auth(key)).json()
            pytest.fail(f"canary share {share}: {Counter(served.values())}; endpoint {endpoint}")
        again = users[:40]  # sticky: the same user on the same version, through either replica
        assert [v for _, v in pool.map(lambda u: call(two.url, u), again)] == [served[u] for u in again]
        assert [v for _, v in pool.map(lambda u: call(one.url, u), again)] == [served[u] for u in again]

    # A killed replica restarted has lost nothing: the endpoint, its canary and the versions (from S3).
    two.proc.kill()
    two.proc.wait()
    two = procs[1] = start(1)
    assert call(two.url, users[0], schema=True) == ("extract@2", served[users[0]])
    versions = httpx.get(f"{two.url}/v1/adapters/bot/versions", headers=auth(key)).json()
    assert [v["version"] for v in versions["data"]] == [1, 2]

    assert httpx.post(f"{one.url}/v1/endpoints/extract/promote", headers=auth(key)).json()["adapter"] == "bot@2"
    eventually(
        lambda: call(two.url, "after-promote")[0] == "extract@3", "replica two serves the promotion", timeout=WAIT_S
    )
    assert {call(two.url, u)[1] for u in users[:10]} == {"bot@2"}
    half = {"canary": {"version": 1, "weight": 0.5}}
    assert httpx.patch(f"{one.url}/v1/endpoints/extract", json=half, headers=auth(key)).status_code == 200
    r = httpx.post(f"{one.url}/v1/endpoints/extract/rollback", headers=auth(key))
    assert r.status_code == 200 and (r.json()["adapter"], r.json()["canary"]) == ("bot@2", None)
    eventually(
        lambda: call(two.url, "after-rollback")[0] == "extract@5", "replica two serves the rollback", timeout=WAIT_S
    )
    assert {call(two.url, u)[1] for u in users[:10]} == {"bot@2"}

    # Deleting version 1 reaches both engines (their host copies go) and the bucket.
    assert call(two.url, "warm") and call(one.url, "warm")
    held = [_host_adapters(p.url) for p in (one, two)]
    assert httpx.delete(f"{one.url}/v1/adapters/bot@1", headers=auth(key)).status_code == 200
    for p, before in zip((one, two), held):
        eventually(
            lambda p=p, before=before: _host_adapters(p.url) < before, f"{p.url} drops version 1", timeout=WAIT_S
        )
    blobs = {k.split("/")[1] for k in s3.keys("adapters/")}
    assert len(blobs) == 1  # version 2's only
    assert httpx.delete(f"{one.url}/v1/endpoints/extract", headers=auth(key)).status_code == 200
    r = httpx.post(
        f"{two.url}/v1/chat/completions",
        json={"model": "extract", "messages": [{"role": "user", "content": "x"}]},
        headers=auth(key),
    )
    eventually(
        lambda: (
            httpx.post(
                f"{two.url}/v1/chat/completions",
                json={"model": "extract", "messages": [{"role": "user", "content": "x"}]},
                headers=auth(key),
            ).status_code
            == 404
        ),
        "replica two forgets the deleted endpoint",
        timeout=WAIT_S,
    )


def test_pins_reach_every_replica_and_a_restarted_one(cluster, adapter_factory) -> None:
    """Pinning through replica one pins on replica two (Redis), a restarted replica pins at startup (SQL), and
    unpinning through replica two unpins on replica one."""
    _s3, procs, start = cluster
    one, two = procs
    key = create_tenant(one.url, f"pins-{uuid.uuid4().hex[:6]}")
    assert upload(one.url, key, "bot", archive=zip_folder(adapter_factory("rep-pin", seed=113))).status_code == 201
    body = {"name": "pinned", "adapter": "bot@1", "pinned": True}
    assert httpx.post(f"{one.url}/v1/endpoints", json=body, headers=auth(key)).status_code == 201
    for p in (one, two):
        eventually(
            lambda p=p: _gauge(p.url, "loraplex_lora_pinned_adapters") == 1, f"{p.url} pins bot@1", timeout=WAIT_S
        )
    assert _host_adapters(two.url) >= 1

    two.proc.kill()
    two.proc.wait()
    two = procs[1] = start(1)
    eventually(
        lambda: _gauge(two.url, "loraplex_lora_pinned_adapters") == 1,
        "the restarted replica pins bot@1",
        timeout=WAIT_S,
    )
    eventually(lambda: _host_adapters(two.url) >= 1, "the restarted replica loads the pinned version", timeout=WAIT_S)

    r = httpx.patch(f"{two.url}/v1/endpoints/pinned", json={"pinned": False}, headers=auth(key))
    assert r.status_code == 200 and r.json()["pinned"] is False
    for p in (one, two):
        eventually(
            lambda p=p: _gauge(p.url, "loraplex_lora_pinned_adapters") == 0, f"{p.url} unpins bot@1", timeout=WAIT_S
        )
