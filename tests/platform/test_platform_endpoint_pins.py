"""Pinned endpoints against a started server on an engine with a small host tier (max_cpu_loras 3, one device
slot): the pinned endpoint's adapter version stays in host memory while requests for many other adapters cycle
through the tier, a pin beyond `max_pinned_adapters` is refused with nothing stored, unpinning (PATCH), a version
change (the new version is pinned instead) and deletion free it, and a replica starting up learns the pins."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loraplex.engine.stats import EngineStats
from loraplex.platform.app import build_services, create_app
from tests.platform.conftest import settings_for
from tests.platform.helpers import ServerThread, auth, create_tenant, error_of, upload, zip_folder


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


@pytest.fixture
def small_engine(tiny_llama_dir: Path) -> Iterator[Any]:
    from loraplex.engine import AsyncEngine, EngineArgs

    engine = AsyncEngine(
        EngineArgs(
            model=str(tiny_llama_dir),
            max_model_len=256,
            num_kv_blocks=256,
            max_num_seqs=8,
            max_num_batched_tokens=256,
            max_loras=1,
            max_cpu_loras=3,
        )
    )
    yield engine
    engine.shutdown()


def _chat(url: str, key: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth(key), timeout=60)
    assert r.status_code == 200, r.text


def test_pinned_endpoint_stays_in_the_host_tier(small_engine, adapter_factory, tmp_path: Path) -> None:
    # Warming off: only requests and pins fill the host tier, so its LRU order is the requests'.
    settings = settings_for("sqlite", tmp_path / "data", max_pinned_adapters=1, warm_adapters=False)
    server = ServerThread(create_app(settings, engine=small_engine)).start()
    try:
        url = server.url
        key = create_tenant(url, "pins")
        bot = [
            upload(url, key, "bot", archive=zip_folder(adapter_factory(f"pin-bot-{v}", seed=110 + v))).json()
            for v in (1, 2)
        ]
        others = [f"other-{i}" for i in range(4)]
        for i, name in enumerate(others):
            upload(url, key, name, archive=zip_folder(adapter_factory(f"pin-other-{i}", seed=120 + i)))
        v1, v2 = bot[0]["sha256"], bot[1]["sha256"]

        def stats() -> EngineStats:
            return small_engine.stats()

        r = httpx.post(
            f"{url}/v1/endpoints", json={"name": "extract", "adapter": "bot@1", "pinned": True}, headers=auth(key)
        )
        assert r.status_code == 201 and r.json()["pinned"] is True, r.text
        _wait_for(lambda: stats().lora.pinned_adapters == [v1] and v1 in stats().lora.host_adapters, "bot@1 is pinned")

        # The limit counts adapter contents server-wide: another pinned version is refused and nothing is stored;
        # a second pinned endpoint on the same version adds nothing to count.
        r = httpx.post(
            f"{url}/v1/endpoints", json={"name": "second", "adapter": "other-0", "pinned": True}, headers=auth(key)
        )
        assert r.status_code == 409, r.text
        err = error_of(r)
        assert (err["code"], err["param"]) == ("pinned_adapters_limit", "pinned") and "max_pinned_adapters" in err[
            "message"
        ]
        assert httpx.get(f"{url}/v1/endpoints/second", headers=auth(key)).status_code == 404
        r = httpx.post(f"{url}/v1/endpoints", json={"name": "second", "adapter": "other-0"}, headers=auth(key))
        assert r.status_code == 201, r.text
        r = httpx.patch(f"{url}/v1/endpoints/second", json={"pinned": True}, headers=auth(key))
        assert error_of(r)["code"] == "pinned_adapters_limit"
        assert httpx.get(f"{url}/v1/endpoints/second", headers=auth(key)).json()["pinned"] is False
        r = httpx.post(f"{url}/v1/endpoints", json={"name": "plain", "pinned": True}, headers=auth(key))
        assert (r.status_code, error_of(r)["param"]) == (400, "pinned"), r.text  # the base model: nothing to pin
        r = httpx.post(
            f"{url}/v1/endpoints", json={"name": "twin", "adapter": "bot@1", "pinned": True}, headers=auth(key)
        )
        assert r.status_code == 201, r.text

        # Requests for four other adapters cycle through the three host slots: the pinned one never leaves.
        evictions = stats().lora.cpu_evictions
        for _round in range(2):
            for name in others:
                _chat(url, key, name)
                assert v1 in stats().lora.host_adapters
        assert stats().lora.cpu_evictions >= evictions + 4  # the tier really was full and evicting
        _chat(url, key, "extract")

        # Deleting the twin leaves extract's pin; unpinning extract frees the version for the LRU.
        assert httpx.delete(f"{url}/v1/endpoints/twin", headers=auth(key)).status_code == 200
        r = httpx.patch(f"{url}/v1/endpoints/extract", json={"pinned": False}, headers=auth(key))
        assert r.status_code == 200 and r.json()["pinned"] is False and r.json()["revision"] == 2, r.text
        assert httpx.get(f"{url}/v1/endpoints/extract", headers=auth(key)).json()["pinned"] is False
        _wait_for(lambda: stats().lora.pinned_adapters == [], "bot@1 is unpinned")
        for name in others:
            _chat(url, key, name)
        assert v1 not in stats().lora.host_adapters

        # Pinned again on a new version: the new version is pinned (and loaded), the old one is not.
        r = httpx.patch(f"{url}/v1/endpoints/extract", json={"pinned": True, "adapter": "bot@2"}, headers=auth(key))
        assert r.status_code == 200, r.text
        _wait_for(lambda: stats().lora.pinned_adapters == [v2] and v2 in stats().lora.host_adapters, "bot@2 is pinned")

        # A replica starting up learns the pins from SQL (this engine forgets them first).
        small_engine.pin_adapters([])
        _wait_for(lambda: stats().lora.pinned_adapters == [], "the engine forgot its pins")
        second = ServerThread(create_app(settings, engine=small_engine)).start()
        try:
            _wait_for(lambda: stats().lora.pinned_adapters == [v2], "the starting replica pinned bot@2")
        finally:
            second.stop()

        assert httpx.delete(f"{url}/v1/endpoints/extract", headers=auth(key)).status_code == 200
        _wait_for(lambda: stats().lora.pinned_adapters == [], "deleting the endpoint unpinned bot@2")
    finally:
        server.stop()


def test_a_pin_limit_above_the_host_tier_is_refused_at_startup(small_engine, tmp_path: Path) -> None:
    settings = settings_for("sqlite", tmp_path / "data", max_pinned_adapters=3)
    with pytest.raises(ValueError, match=r"max_pinned_adapters \(3\) must be at most the engine's max_cpu_loras - 1"):
        asyncio.run(build_services(settings, small_engine))
