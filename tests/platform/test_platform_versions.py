"""Adapter versions over REST: every upload is version N (`name@N`), `name` is the current one (the newest unless
the tenant marked another), rollback is one call, retention keeps the last K per name, deleting or retiring a
version drops its blob and the engine's copies, and a refused change leaves nothing written."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.platform.helpers import ADMIN_KEY, auth, create_tenant, error_of, stored_blobs, upload, zip_folder


def _chat(url: str, key: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers=auth(key),
        timeout=60,
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def _in_host(engine: Any, content_hash: str) -> bool:
    return content_hash in engine.stats().lora.host_adapters


def _versions(url: str, key: str, name: str) -> tuple[int, list[int]]:
    r = httpx.get(f"{url}/v1/adapters/{name}/versions", headers=auth(key))
    assert r.status_code == 200, r.text
    body = r.json()
    return body["current"], [v["version"] for v in body["data"]]


def test_versions_are_addressable_and_rollback_is_one_call(server, tiny_engine, adapter_factory) -> None:
    key = create_tenant(server.url, "versioned")
    v1 = upload(server.url, key, "bot", archive=zip_folder(adapter_factory("ver-1", seed=81))).json()
    v2 = upload(server.url, key, "bot", archive=zip_folder(adapter_factory("ver-2", seed=82))).json()
    assert (v1["version"], v2["version"]) == (1, 2) and v1["sha256"] != v2["sha256"]
    assert _versions(server.url, key, "bot") == (2, [1, 2])

    # name@N serves version N: its weights are the ones the engine loads.
    assert _chat(server.url, key, "bot@1").status_code == 200
    _wait_for(lambda: _in_host(tiny_engine, v1["sha256"]), "bot@1's weights are loaded")
    model = httpx.get(f"{server.url}/v1/models/bot@1", headers=auth(key)).json()
    assert (model["id"], model["name"], model["root"]) == ("versioned/bot", "bot", v1["sha256"])

    # Rollback: `bot` means version 1 until marked otherwise, also for a new upload.
    r = httpx.put(f"{server.url}/v1/adapters/bot/current", json={"version": 1}, headers=auth(key))
    assert r.status_code == 200 and r.json()["version"] == 1
    assert httpx.get(f"{server.url}/v1/models/bot", headers=auth(key)).json()["root"] == v1["sha256"]
    v3 = upload(server.url, key, "bot", archive=zip_folder(adapter_factory("ver-3", seed=83))).json()
    assert v3["version"] == 3 and _versions(server.url, key, "bot") == (1, [1, 2, 3])
    listed = httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"]
    assert [(a["name"], a["version"]) for a in listed] == [("bot", 1)]

    # null: the newest again.
    r = httpx.put(f"{server.url}/v1/adapters/bot/current", json={"version": None}, headers=auth(key))
    assert r.status_code == 200 and r.json()["version"] == 3

    # Versions that do not exist, and references that are no version, answer like a missing model.
    for model in ("bot@4", "bot@0", "bot@01", "bot@x", "bot@", "bot@1@1", "nobot@1"):
        r = _chat(server.url, key, model)
        assert r.status_code == 404 and error_of(r)["code"] == "model_not_found", model
    r = httpx.put(f"{server.url}/v1/adapters/bot/current", json={"version": 4}, headers=auth(key))
    assert r.status_code == 404 and error_of(r)["code"] == "adapter_not_found"
    r = httpx.put(f"{server.url}/v1/adapters/bot/current", json={"version": 0}, headers=auth(key))
    assert r.status_code == 400

    # Another tenant sees none of it.
    other = create_tenant(server.url, "versioned-other")
    for model in ("bot", "bot@1"):
        r = _chat(server.url, other, model)
        assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    assert httpx.get(f"{server.url}/v1/adapters/bot/versions", headers=auth(other)).status_code == 404


def test_deleting_a_version_drops_its_blob_and_engine_copies(start_server, tiny_engine, adapter_factory) -> None:
    server = start_server()
    key = create_tenant(server.url, "version-delete")
    v1 = upload(server.url, key, "doomed", archive=zip_folder(adapter_factory("del-1", seed=84))).json()
    v2 = upload(server.url, key, "doomed", archive=zip_folder(adapter_factory("del-2", seed=85))).json()
    assert _chat(server.url, key, "doomed@1").status_code == 200
    _wait_for(lambda: _in_host(tiny_engine, v1["sha256"]), "version 1 is in host memory")
    assert len(stored_blobs(server.settings.data_dir)) == 2

    r = httpx.delete(f"{server.url}/v1/adapters/doomed@1", headers=auth(key))
    assert r.status_code == 200 and r.json()["version"] == 1
    _wait_for(lambda: not _in_host(tiny_engine, v1["sha256"]), "version 1's copies are dropped")
    assert len(stored_blobs(server.settings.data_dir)) == 1
    assert _versions(server.url, key, "doomed") == (2, [2])
    assert _chat(server.url, key, "doomed@1").status_code == 404
    assert _chat(server.url, key, "doomed").status_code == 200
    _wait_for(lambda: _in_host(tiny_engine, v2["sha256"]), "version 2 is in host memory")


def test_retention_retires_the_oldest_and_refuses_retiring_the_current(
    start_server, tiny_engine, adapter_factory
) -> None:
    server = start_server()
    key = create_tenant(server.url, "retention", adapter_versions_kept=2)
    v1 = upload(server.url, key, "kept", archive=zip_folder(adapter_factory("ret-1", seed=86))).json()
    assert _chat(server.url, key, "kept").status_code == 200
    _wait_for(lambda: _in_host(tiny_engine, v1["sha256"]), "version 1 is in host memory")
    upload(server.url, key, "kept", archive=zip_folder(adapter_factory("ret-2", seed=87)))
    upload(server.url, key, "kept", archive=zip_folder(adapter_factory("ret-3", seed=88)))
    # The third upload retired version 1: its row, its blob and the engine's copies.
    assert _versions(server.url, key, "kept") == (3, [2, 3])
    assert len(stored_blobs(server.settings.data_dir)) == 2
    _wait_for(lambda: not _in_host(tiny_engine, v1["sha256"]), "version 1's copies are dropped")

    # Version 2 marked current: an upload that would retire it is refused, and nothing is written.
    assert httpx.put(f"{server.url}/v1/adapters/kept/current", json={"version": 2}, headers=auth(key)).is_success
    blobs = stored_blobs(server.settings.data_dir)
    r = upload(server.url, key, "kept", archive=zip_folder(adapter_factory("ret-4", seed=89)))
    assert r.status_code == 409 and error_of(r)["code"] == "version_in_use" and "kept@2" in error_of(r)["message"]
    assert stored_blobs(server.settings.data_dir) == blobs
    assert _versions(server.url, key, "kept") == (2, [2, 3])
    # Marking the newest current again lets the upload retire version 2 (the refused one took no number).
    assert httpx.put(f"{server.url}/v1/adapters/kept/current", json={"version": None}, headers=auth(key)).is_success
    r = upload(server.url, key, "kept", archive=zip_folder(adapter_factory("ret-4", seed=89)))
    assert r.status_code == 201 and r.json()["version"] == 4
    assert _versions(server.url, key, "kept") == (4, [3, 4])


def test_retention_below_one_is_refused(start_server) -> None:
    server = start_server()
    for body in (
        {"name": "retention-zero", "adapter_versions_kept": 0},
        {"name": "retention-x", "adapter_versions_kept": -1},
    ):
        r = httpx.post(f"{server.url}/v1/tenants", json=body, headers=auth(ADMIN_KEY))
        assert r.status_code == 400 and "adapter_versions_kept" in error_of(r)["message"], r.text


def test_a_running_request_finishes_on_a_version_deleted_under_it(start_server, tiny_engine, adapter_factory) -> None:
    """The version is deleted while its request streams: the request keeps its device slot and ends normally with
    every token it asked for; then the engine drops the copies."""
    server = start_server()
    key = create_tenant(server.url, "running")
    v1 = upload(server.url, key, "live", archive=zip_folder(adapter_factory("run-1", seed=103))).json()
    body = {
        "model": "live@1",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 120,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=auth(key), timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # the request runs
        assert tiny_engine.stats().num_running >= 1  # 120 tokens: far from done
        assert httpx.delete(f"{server.url}/v1/adapters/live@1", headers=auth(key)).status_code == 200
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finish == ["length"] and events[-1]["usage"]["completion_tokens"] == 120
    _wait_for(lambda: not _in_host(tiny_engine, v1["sha256"]), "version 1's copies are dropped")
    assert _chat(server.url, key, "live@1").status_code == 404
