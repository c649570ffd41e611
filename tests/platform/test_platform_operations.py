"""Operations over real HTTP: /health, /ready, /metrics (Prometheus), the OpenAPI document, and client
disconnects mid-stream freeing every KV block."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.platform.helpers import auth, create_tenant, upload, zip_folder


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(server_url: str) -> dict[tuple[str, tuple], float]:
    r = httpx.get(f"{server_url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in _families(r.text).values() for s in f.samples}


def test_health_ready_and_metrics(start_server, adapter_factory, tiny_engine) -> None:
    # Publish-time warming off: the first request reads the adapter from the store (test_platform_warm.py has it on).
    server = start_server("sqlite", warm_adapters=False)
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    ready = httpx.get(f"{server.url}/ready")
    assert ready.status_code == 200 and ready.json()["detail"] == {"engine": "ok", "database": "ok", "blob_store": "ok"}
    key = create_tenant(server.url, "metered")
    folder = adapter_factory("metered", seed=47)  # weights no other test loads: this test's loads are its own
    assert upload(server.url, key, "m-lora", archive=zip_folder(folder)).status_code == 201
    base = httpx.get(f"{server.url}/v1/models", headers=auth(key)).json()["data"][0]["id"]
    names = {f.name for f in _families(httpx.get(f"{server.url}/metrics").text).values()}
    for name in (
        "loraplex_time_to_first_token_seconds",
        "loraplex_inter_token_latency_seconds",
        "loraplex_e2e_request_latency_seconds",
        "loraplex_prompt_tokens",
        "loraplex_generation_tokens",
        "loraplex_requests",
        "loraplex_num_requests_running",
        "loraplex_num_requests_waiting",
        "loraplex_kv_cache_usage_ratio",
        "loraplex_prefix_cache_hit_rate",
        "loraplex_prefix_cache_queries",
        "loraplex_prefix_cache_hits",
        "loraplex_lora_loads",
        "loraplex_lora_evictions",
        "loraplex_lora_disk_loads",
        "loraplex_lora_host_adapters",
        "vllm:lora_requests_info",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "loraplex_spec_decode_num_forced_tokens",
    ):
        assert name in names, name
    before = _samples(server.url)
    usage, finish = {}, {}
    for model in (base, "m-lora"):
        r = httpx.post(
            f"{server.url}/v1/completions",
            headers=auth(key),
            timeout=60,
            json={"model": model, "prompt": "hello there", "max_tokens": 3, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        usage[model], finish[model] = r.json()["usage"], r.json()["choices"][0]["finish_reason"]
    deadline = time.monotonic() + 60
    while tiny_engine.stats().num_running:  # the engine publishes its gauges once its step is over
        assert time.monotonic() < deadline
        time.sleep(0.02)
    after = _samples(server.url)

    def delta(name: str, **labels: str) -> float:
        k = (name, tuple(sorted(labels.items())))
        return after.get(k, 0.0) - before.get(k, 0.0)

    assert delta("loraplex_generation_tokens_total") == sum(u["completion_tokens"] for u in usage.values())
    assert delta("loraplex_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usage.values())
    assert delta("loraplex_time_to_first_token_seconds_count") == 2
    assert delta("loraplex_e2e_request_latency_seconds_count") == 2
    for model, label in ((base, base), ("m-lora", "metered/m-lora")):  # adapters by their unique model id
        assert delta("loraplex_requests_total", tenant="metered", model=label, finish_reason=finish[model]) == 1
    assert delta("loraplex_lora_loads_total") == 1 and delta("loraplex_lora_disk_loads_total") == 1
    stats = tiny_engine.stats()
    gauges = {k[0]: v for k, v in after.items() if not k[1]}
    assert gauges["loraplex_num_requests_running"] == gauges["vllm:num_requests_running"] == 0
    assert gauges["loraplex_num_requests_waiting"] == gauges["vllm:num_requests_waiting"] == 0
    usage_ratio = stats.kv_cache.blocks_used / stats.kv_cache.blocks_total
    assert gauges["loraplex_kv_cache_usage_ratio"] == gauges["vllm:kv_cache_usage_perc"] == usage_ratio
    assert gauges["loraplex_prefix_cache_hit_rate"] == stats.kv_cache.prefix_cache_hit_rate
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert after[(f"vllm:spec_decode_{name}_total", ())] == getattr(stats.spec_decode, name)
    info = [labels for (name, labels) in after if name == "vllm:lora_requests_info"]
    assert [dict(labels) for labels in info] == [
        {"max_lora": "4", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    ]


def test_openapi_document_is_served_and_accurate(start_server) -> None:
    server = start_server("sqlite")
    for page in ("/schema", "/schema/swagger", "/schema/redoc", "/schema/elements", "/schema/rapidoc"):
        r = httpx.get(f"{server.url}{page}")  # no HTML viewers (they load unpinned scripts from public CDNs)
        assert "<script" not in r.text, page
        assert r.status_code == 404 or r.headers["content-type"] == "application/vnd.oai.openapi+json", page
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
    assert set(upload_body["properties"]) == {"name", "file", "adapter_config", "adapter_model", "accept_failed_check"}
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
    imported = paths["/v1/adapters"]["post"]["responses"]["202"]["content"]["application/json"]["schema"]
    assert imported["$ref"].endswith("/ImportOut")
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
        "status",
        "broken_reason",
        "origin",
        "publish_check",
    }
    assert {"id", "status", "source", "version"} <= set(schemas["ImportOut"]["properties"])


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
    assert in_flight[0].num_running + in_flight[0].num_waiting == 30, (in_flight, finished)
    assert in_flight[0].kv_cache.blocks_used > 0
    deadline = time.monotonic() + 30
    stats = tiny_engine.stats()
    while time.monotonic() < deadline:
        stats = tiny_engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache.blocks_used == 0:
            break
        time.sleep(0.1)
    assert (stats.num_running, stats.num_waiting, stats.kv_cache.blocks_used) == (0, 0, 0), stats


def test_prefix_cache_is_never_shared_between_tenants(start_server, tiny_engine) -> None:
    """The same prompt from two tenants: each hits only its own cached blocks (the cache salt is the tenant),
    seen in the response's cached_tokens and in the engine's prefix-cache counters."""
    server = start_server("sqlite")
    keys = [create_tenant(server.url, f"prefix-{i}") for i in range(2)]
    prompt = " ".join(f"word{i}-{uuid.uuid4().hex[:6]}" for i in range(30))  # shared by no other test
    block = tiny_engine.args.block_size

    def complete(key: str) -> tuple[int, int, float, float]:
        """(prompt tokens, cached tokens, prefix-cache queries and hits counted for this request)"""
        before = _samples(server.url)
        r = httpx.post(
            f"{server.url}/v1/completions",
            headers=auth(key),
            timeout=60,
            json={"model": tiny_engine.model_name, "prompt": prompt, "max_tokens": 1},
        )
        assert r.status_code == 200, r.text
        after = _samples(server.url)
        usage = r.json()["usage"]
        counted = [
            after[(n, ())] - before[(n, ())]
            for n in ("loraplex_prefix_cache_queries_total", "loraplex_prefix_cache_hits_total")
        ]
        return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], *counted

    n, cached, queries, hits = complete(keys[0])
    assert n > 2 * block and cached == 0 and (queries, hits) == (n, 0)
    full_blocks = (n - 1) // block * block  # a hit always leaves the last token to compute
    assert complete(keys[0]) == (n, full_blocks, n, full_blocks)  # the tenant's own blocks
    assert complete(keys[1]) == (n, 0, n, 0)  # another tenant: nothing shared
    assert complete(keys[1]) == (n, full_blocks, n, full_blocks)
