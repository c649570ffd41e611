"""Routing-ready ids and metrics: every adapter has a globally unique model id `<tenant>/<adapter>`, and
/metrics carries what the Gateway API Inference Extension's endpoint picker reads, parsed the way its
model-server protocol describes (Prometheus text; `vllm:lora_requests_info`'s latest sample by value)."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from loraplex.engine.probe import EngineProbe
from tests.platform.helpers import auth, create_tenant, error_of, upload, zip_folder

PICKER_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


def _picker_view(text: str) -> dict[str, Any]:
    """What an endpoint picker takes from one scrape: the queue and cache gauges, the cache configuration,
    and the LoRA info sample with the latest timestamp value, its adapter lists split on commas."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    view: dict[str, Any] = {}
    for name in (*PICKER_GAUGES, "vllm:gpu_cache_usage_perc"):
        assert families[name].type == "gauge", name
        (sample,) = families[name].samples
        view[name] = sample.value
    (config,) = families["vllm:cache_config_info"].samples
    view["cache_config"] = config.labels
    assert families["vllm:lora_requests_info"].type == "gauge"
    latest = max(families["vllm:lora_requests_info"].samples, key=lambda s: s.value)
    view["max_lora"] = int(latest.labels["max_lora"])
    for kind in ("running", "waiting"):
        listed = latest.labels[f"{kind}_lora_adapters"]
        view[kind] = {a.strip() for a in listed.split(",") if a.strip()}
    return view


def test_same_named_adapters_of_two_tenants_have_distinct_ids(start_server, adapter_factory) -> None:
    server = start_server("sqlite")
    suffix = uuid.uuid4().hex[:6]
    tenants = {f"acme-{suffix}": 71, f"globex-{suffix}": 72}
    keys = {t: create_tenant(server.url, t) for t in tenants}
    for t, seed in tenants.items():
        r = upload(server.url, keys[t], "support-bot", archive=zip_folder(adapter_factory(f"rt-{seed}", seed=seed)))
        assert r.status_code == 201, r.text
        assert r.json()["model"] == f"{t}/support-bot" and r.json()["name"] == "support-bot"
    (a, b) = tenants
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=keys[a], max_retries=0)
    cards = {m.id: m for m in client.models.list().data}
    assert f"{a}/support-bot" in cards and f"{b}/support-bot" not in cards
    assert cards[f"{a}/support-bot"].model_extra["name"] == "support-bot"
    assert client.models.retrieve(f"{a}/support-bot").id == f"{a}/support-bot"
    assert client.models.retrieve("support-bot").id == f"{a}/support-bot"

    texts = {}
    for model in ("support-bot", f"{a}/support-bot"):  # both forms name the same adapter
        out = client.completions.create(model=model, prompt=[5, 6, 7], max_tokens=4, temperature=0)
        texts[model] = out.choices[0].text
        assert out.model == model  # the response echoes what the client sent, as OpenAI's does
    assert texts["support-bot"] == texts[f"{a}/support-bot"]

    body = {"prompt": [5, 6, 7], "max_tokens": 2}
    other = httpx.post(
        f"{server.url}/v1/completions", headers=auth(keys[a]), json={"model": f"{b}/support-bot", **body}
    )
    missing = httpx.post(f"{server.url}/v1/completions", headers=auth(keys[a]), json={"model": f"{a}/nothing", **body})
    assert other.status_code == missing.status_code == 404
    assert error_of(other)["code"] == error_of(missing)["code"] == "model_not_found"
    assert httpx.get(f"{server.url}/v1/models/{b}/support-bot", headers=auth(keys[a])).status_code == 404


def test_metrics_parse_as_the_picker_reads_them(start_server, adapter_factory, tiny_engine) -> None:
    server = start_server("sqlite")
    suffix = uuid.uuid4().hex[:6]
    tenants = [f"initech-{suffix}", f"umbrella-{suffix}"]
    keys = {t: create_tenant(server.url, t) for t in tenants}
    for t, seed in zip(tenants, (73, 74)):
        r = upload(server.url, keys[t], "support-bot", archive=zip_folder(adapter_factory(f"rt-{seed}", seed=seed)))
        assert r.status_code == 201, r.text

    idle = _picker_view(httpx.get(f"{server.url}/metrics").text)
    args = tiny_engine.args
    assert idle["cache_config"] == {"block_size": str(args.block_size), "num_gpu_blocks": "2048"}  # the fixture's
    assert idle["max_lora"] == 4 and idle["running"] == idle["waiting"] == set()
    assert idle["vllm:kv_cache_usage_perc"] == idle["vllm:gpu_cache_usage_perc"]

    # Hold the engine once both tenants' requests have sampled a few tokens: the gauges published after the
    # step before show both running, each under its own id.
    both, release = threading.Event(), threading.Event()

    def hold(ids: list[str], positions: list[int], _logits: Any) -> None:
        if len(ids) >= 2 and min(positions) >= 2 and not release.is_set():
            both.set()
            release.wait(timeout=120)  # liveness bound

    def send(tenant: str) -> httpx.Response:
        body = {"model": "support-bot", "prompt": [5, 6, 7], "max_tokens": 200, "ignore_eos": True}
        return httpx.post(f"{server.url}/v1/completions", headers=auth(keys[tenant]), json=body, timeout=120)

    tiny_engine.engine.probe = EngineProbe(on_logits=hold)
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(send, t) for t in tenants]
            assert both.wait(timeout=60)
            busy = _picker_view(httpx.get(f"{server.url}/metrics").text)
            release.set()
            assert all(f.result().status_code == 200 for f in futures)
    finally:
        release.set()
        tiny_engine.engine.probe = None
    assert busy["running"] == {f"{t}/support-bot" for t in tenants}
    assert busy["vllm:num_requests_running"] == 2 and busy["vllm:num_requests_waiting"] == 0
    assert busy["vllm:kv_cache_usage_perc"] > 0
