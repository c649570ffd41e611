"""Operations over real HTTP: /health, /ready, /metrics (Prometheus), the OpenAPI document, and client
disconnects mid-stream freeing every KV block."""

from __future__ import annotations

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.platform.helpers import auth, create_tenant, upload, zip_folder


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_health_ready_and_metrics(start_server, adapter_factory) -> None:
    server = start_server("sqlite")
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    ready = httpx.get(f"{server.url}/ready")
    assert ready.status_code == 200 and ready.json()["detail"] == {"engine": "ok", "database": "ok"}
    key = create_tenant(server.url, "metered")
    assert upload(server.url, key, "m-lora", archive=zip_folder(adapter_factory("basic"))).status_code == 201
    base = httpx.get(f"{server.url}/v1/models", headers=auth(key)).json()["data"][0]["id"]
    for model in (base, "m-lora"):
        r = httpx.post(
            f"{server.url}/v1/completions",
            headers=auth(key),
            timeout=60,
            json={"model": model, "prompt": "hello there", "max_tokens": 3, "temperature": 0},
        )
        assert r.status_code == 200, r.text
    r = httpx.get(f"{server.url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fam = _families(r.text)
    for name in (
        "loraplex_time_to_first_token_seconds",
        "loraplex_inter_token_latency_seconds",
        "loraplex_prompt_tokens",
        "loraplex_generation_tokens",
        "loraplex_requests",
        "loraplex_num_requests_running",
        "loraplex_num_requests_waiting",
        "loraplex_kv_cache_usage_ratio",
        "loraplex_prefix_cache_hit_rate",
        "loraplex_lora_loads",
        "loraplex_lora_evictions",
        "vllm:lora_requests_info",
        "vllm:num_requests_waiting",
    ):
        assert name in fam, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fam.values() for s in f.samples}
    assert samples[("loraplex_generation_tokens_total", ())] >= 6
    assert samples[("loraplex_time_to_first_token_seconds_count", ())] >= 2
    per_model = {dict(k[1]).get("model"): v for k, v in samples.items() if k[0] == "loraplex_requests_total"}
    assert per_model[base] >= 1 and per_model["m-lora"] >= 1
    info = list(fam["vllm:lora_requests_info"].samples)
    assert set(info[0].labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    assert info[0].labels["max_lora"] == "4"


def test_openapi_document_is_served_and_accurate(start_server) -> None:
    server = start_server("sqlite")
    doc = httpx.get(f"{server.url}/schema/openapi.json").json()
    paths = doc["paths"]
    for path, method in [
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/models", "get"),
        ("/v1/adapters", "post"),
        ("/v1/adapters/{name}", "delete"),
        ("/v1/tenants", "post"),
        ("/v1/tenants/{tenant}/keys", "post"),
        ("/v1/tenants/{tenant}/keys/{key_id}", "delete"),
        ("/health", "get"),
        ("/ready", "get"),
        ("/metrics", "get"),
    ]:
        assert method in paths[path], (path, method)
    upload_body = paths["/v1/adapters"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert set(upload_body["properties"]) == {"name", "file", "adapter_config", "adapter_model"}
    chat = paths["/v1/chat/completions"]["post"]
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    schemas = doc["components"]["schemas"]
    req = schemas["ChatCompletionRequest"]["properties"]
    assert {
        "messages",
        "model",
        "max_tokens",
        "max_completion_tokens",
        "response_format",
        "structured_outputs",
        "guided_json",
        "stream",
        "n",
        "seed",
        "stop",
        "logprobs",
        "top_logprobs",
    } <= set(req)
    assert doc["components"]["securitySchemes"]["BearerAuth"]["scheme"] == "bearer"
    created = paths["/v1/adapters"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    assert created["$ref"].endswith("/AdapterOut")
    # Every documented error is in OpenAI's error body, as the server sends it.
    errors = [
        (path, code, r["content"]["application/json"]["schema"]["$ref"])
        for path, ops in paths.items()
        for op in ops.values()
        for code, r in op["responses"].items()
        if not code.startswith("2")
    ]
    assert errors and all(ref.endswith("/ErrorResponse") for _, _, ref in errors), errors
    assert set(schemas["ErrorResponse"]["properties"]["error"]["$ref"].split("/")[-1:]) == {"ErrorDetail"}
    assert set(schemas["AdapterOut"]["properties"]) == {
        "id",
        "name",
        "model",
        "version",
        "sha256",
        "rank",
        "alpha",
        "target_modules",
        "size_bytes",
        "created_at",
    }


def test_disconnecting_streams_free_every_kv_block(start_server, tiny_engine) -> None:
    """20 streaming clients (10 with n=2: 30 engine requests) read a few events and hang up mid-stream."""
    server = start_server("sqlite")
    key = create_tenant(server.url, "quitters")
    base = httpx.get(f"{server.url}/v1/models", headers=auth(key)).json()["data"][0]["id"]

    in_flight: list[dict] = []

    async def client(i: int, barrier: asyncio.Barrier) -> int:
        body = {
            "model": base,
            "messages": [{"role": "user", "content": f"story number {i}"}],
            "max_tokens": 900,
            "ignore_eos": True,
            "stream": True,
            "n": 1 + i % 2,
        }  # half of them stream two choices
        async with (
            httpx.AsyncClient(timeout=60) as http,
            http.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=auth(key)) as r,
        ):
            assert r.status_code == 200
            lines = r.aiter_lines()  # held open (a dropped iterator would close the connection early)
            events = 0
            while events < 3:
                if (await lines.__anext__()).startswith("data: "):
                    events += 1
            if await barrier.wait() == 0:  # every client is mid-stream: look at the engine once
                in_flight.append(tiny_engine.stats())
            await barrier.wait()  # nobody hangs up before that look
            return events  # leaving the block closes the connection mid-stream

    async def run() -> list[int]:
        barrier = asyncio.Barrier(20)
        return await asyncio.gather(*(client(i, barrier) for i in range(20)))

    assert all(n >= 3 for n in asyncio.run(run()))
    finished = [
        line
        for line in httpx.get(f"{server.url}/metrics").text.splitlines()
        if line.startswith("loraplex_requests_total")
    ]
    assert in_flight[0]["num_running"] + in_flight[0]["num_waiting"] == 30, (in_flight, finished)
    assert in_flight[0]["kv_blocks_used"] > 0
    deadline = time.monotonic() + 30
    stats = tiny_engine.stats()
    while time.monotonic() < deadline:
        stats = tiny_engine.stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and stats["kv_blocks_used"] == 0:
            break
        time.sleep(0.1)
    assert (stats["num_running"], stats["num_waiting"], stats["kv_blocks_used"]) == (0, 0, 0), stats
