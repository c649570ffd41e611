"""Deleting or replacing an adapter over HTTP drops its weights from the engine's host memory and device slots
(on SQLite, and on PostgreSQL + Redis where the news travels over pub/sub)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.platform.helpers import auth, create_tenant, upload, zip_folder


def _chat(url: str, key: str, model: str) -> None:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        headers=auth(key),
        timeout=60,
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert r.status_code == 200, r.text


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def _copies(engine: Any, content_hash: str) -> tuple[bool, bool]:
    """(in host memory, in a device slot) for one adapter, from the engine's published stats."""
    stats = engine.stats()
    return content_hash in stats.lora.host_adapters, content_hash in stats.lora.resident_adapters


def test_delete_and_replace_drop_the_engines_copies(server, tiny_engine, adapter_factory) -> None:
    key = create_tenant(server.url, "copies", adapter_versions_kept=1)
    first = upload(server.url, key, "doomed", archive=zip_folder(adapter_factory("copies-v1", seed=41))).json()
    _chat(server.url, key, "doomed")
    _wait_for(lambda: _copies(tiny_engine, first["sha256"]) == (True, True), "v1 is in host memory and a slot")

    # A new version under the same name retires the old one (the tenant keeps one version), and its weights.
    second = upload(server.url, key, "doomed", archive=zip_folder(adapter_factory("copies-v2", seed=42))).json()
    assert second["version"] == 2 and second["sha256"] != first["sha256"]
    _wait_for(lambda: _copies(tiny_engine, first["sha256"]) == (False, False), "v1's copies are dropped")
    _chat(server.url, key, "doomed")
    _wait_for(lambda: _copies(tiny_engine, second["sha256"]) == (True, True), "v2 is in host memory and a slot")

    r = httpx.delete(f"{server.url}/v1/adapters/doomed", headers=auth(key))
    assert r.status_code == 200, r.text
    _wait_for(lambda: _copies(tiny_engine, second["sha256"]) == (False, False), "v2's copies are dropped")


def test_weights_another_adapter_still_uses_stay_cached(server, tiny_engine, adapter_factory) -> None:
    key = create_tenant(server.url, "shared-weights")
    folder = adapter_factory("copies-shared", seed=43)
    kept = upload(server.url, key, "kept", archive=zip_folder(folder)).json()
    gone = upload(server.url, key, "gone", archive=zip_folder(folder)).json()
    assert kept["sha256"] == gone["sha256"]
    _chat(server.url, key, "gone")
    _wait_for(lambda: _copies(tiny_engine, kept["sha256"]) == (True, True), "the weights are cached")
    disk_loads = tiny_engine.stats().lora.disk_loads
    assert httpx.delete(f"{server.url}/v1/adapters/gone", headers=auth(key)).status_code == 200
    _chat(server.url, key, "kept")  # had the delete dropped the weights, this request would read them again
    _wait_for(lambda: tiny_engine.stats().num_running == 0, "the engine is idle")
    assert tiny_engine.stats().lora.disk_loads == disk_loads
    assert _copies(tiny_engine, kept["sha256"]) == (True, True)
