"""Warm adapters: an upload (publishing a version) loads it into the engine's host memory before any request
asks for it, so the first request reads nothing from the store; with warming off the first request reads it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.platform.helpers import auth, create_tenant, upload, zip_folder


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def _chat(url: str, key: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(key), timeout=60).status_code == 200


def _idle(engine: Any) -> None:
    _wait_for(lambda: engine.stats().num_running == 0 and engine.stats().num_waiting == 0, "the engine idles")


def test_publishing_warms_the_host_tier(start_server, tiny_engine, adapter_factory) -> None:
    server = start_server()
    key = create_tenant(server.url, "warm")
    record = upload(server.url, key, "warm-bot", archive=zip_folder(adapter_factory("warm-1", seed=101))).json()
    _wait_for(lambda: record["sha256"] in tiny_engine.stats().lora.host_adapters, "the new version is in host memory")
    _idle(tiny_engine)
    disk_loads = tiny_engine.stats().lora.disk_loads
    _chat(server.url, key, "warm-bot")
    _idle(tiny_engine)
    assert tiny_engine.stats().lora.disk_loads == disk_loads  # the first request read nothing from the store


def test_without_warming_the_first_request_reads_the_store(start_server, tiny_engine, adapter_factory) -> None:
    server = start_server(warm_adapters=False)
    key = create_tenant(server.url, "cold")
    record = upload(server.url, key, "cold-bot", archive=zip_folder(adapter_factory("warm-2", seed=102))).json()
    _idle(tiny_engine)
    disk_loads = tiny_engine.stats().lora.disk_loads
    assert record["sha256"] not in tiny_engine.stats().lora.host_adapters
    _chat(server.url, key, "cold-bot")
    _idle(tiny_engine)
    assert tiny_engine.stats().lora.disk_loads == disk_loads + 1
