"""Shadow traffic: an endpoint copies a fraction of its calls to a shadow version of its adapter. Against a
started server: the caller's answer is the primary version's (greedy, compared with a direct call to it, which
differs from the shadow's), the shadow's requests, tokens and latency appear in /metrics under the shadow
version with role="shadow", a shadow whose version was deleted fails only in the metrics, and shadows that are
not another live version of the endpoint's adapter are refused. The bound on copies in flight drops (and
counts) a copy beyond it and never raises a copy's failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from loraplex.platform.endpoints.shadow import ShadowTraffic
from loraplex.platform.metrics import Metrics
from tests.platform.helpers import auth, create_tenant, error_of, upload, zip_folder

MESSAGES = [{"role": "user", "content": "tell me something"}]


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def _endpoint_samples(url: str) -> dict[tuple[str, str, str, str | None], float]:
    """(sample name, version, role, outcome or kind) -> value, for endpoint `extract`."""
    return {
        (s.name, s.labels["version"], s.labels["role"], s.labels.get("outcome") or s.labels.get("kind")): s.value
        for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
        for s in f.samples
        if s.labels.get("endpoint") == "extract"
    }


def _sum(samples: dict, name: str, version: str, role: str, key: str | None = None) -> float:
    return sum(v for (n, ver, r, k), v in samples.items() if (n, ver, r) == (name, version, role) and k == key)


def test_shadow_copies_are_measured_and_never_reach_the_caller(start_server, adapter_factory) -> None:
    server = start_server()
    url = server.url
    key = create_tenant(url, "shadowing")
    for v in (1, 2):
        r = upload(url, key, "bot", archive=zip_folder(adapter_factory(f"shadow-{v}", seed=130 + v)))
        assert r.status_code == 201, r.text
    body = {
        "name": "extract",
        "adapter": "bot@1",
        "shadow": {"version": 2, "fraction": 1.0},
        "defaults": {"temperature": 0.0, "max_tokens": 8},
    }
    r = httpx.post(f"{url}/v1/endpoints", json=body, headers=auth(key))
    assert r.status_code == 201 and r.json()["shadow"] == {"version": 2, "fraction": 1.0}, r.text

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)

    def direct(model: str) -> Any:
        return client.chat.completions.create(model=model, messages=MESSAGES, temperature=0.0, max_tokens=8)

    primary, shadow = direct("bot@1"), direct("bot@2")
    assert primary.choices[0].message.content != shadow.choices[0].message.content  # the comparison can fail

    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(model="extract", messages=MESSAGES)
        assert raw.headers["x-loraplex-served-by"] == "bot@1"
        assert raw.parse().choices[0].message.content == primary.choices[0].message.content
    stream = client.chat.completions.create(model="extract", messages=MESSAGES, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == primary.choices[0].message.content

    _wait_for(
        lambda: _sum(_endpoint_samples(url), "loraplex_endpoint_request_latency_seconds_count", "bot@2", "shadow") == 3,
        "the three shadow copies finished",
    )
    samples = _endpoint_samples(url)
    finished = sum(
        v
        for (n, ver, role, _k), v in samples.items()
        if (n, ver, role) == ("loraplex_endpoint_requests_total", "bot@2", "shadow")
    )
    assert finished == 3
    prompt = primary.usage.prompt_tokens
    assert _sum(samples, "loraplex_endpoint_tokens_total", "bot@2", "shadow", "prompt") == 3 * prompt
    assert _sum(samples, "loraplex_endpoint_tokens_total", "bot@2", "shadow", "generation") == 3 * 8
    assert _sum(samples, "loraplex_endpoint_tokens_total", "bot@1", "primary", "prompt") == 3 * prompt
    assert _sum(samples, "loraplex_endpoint_request_latency_seconds_count", "bot@1", "primary") == 3
    assert not any(ver == "bot@2" and role == "primary" for (_n, ver, role, _k) in samples)
    assert not any(ver == "bot@1" and role == "shadow" for (_n, ver, role, _k) in samples)

    # The shadow's version may be deleted: its copies then fail in the metrics only.
    r = httpx.delete(f"{url}/v1/adapters/bot@2", headers=auth(key))
    assert r.status_code == 200, r.text
    for _ in range(2):
        out = client.chat.completions.create(model="extract", messages=MESSAGES)
        assert out.choices[0].message.content == primary.choices[0].message.content
    _wait_for(
        lambda: _sum(_endpoint_samples(url), "loraplex_endpoint_requests_total", "bot@2", "shadow", "error") == 2,
        "the two failed shadow copies are counted",
    )
    assert _sum(_endpoint_samples(url), "loraplex_endpoint_requests_total", "bot@1", "primary", "length") == 5


def test_shadows_that_are_not_another_live_version_are_refused(start_server, adapter_factory) -> None:
    server = start_server()
    url = server.url
    key = create_tenant(url, "shadow-refusals")
    assert upload(url, key, "bot", archive=zip_folder(adapter_factory("shadow-1", seed=131))).status_code == 201
    refused = [
        ({"name": "e", "adapter": "bot@1", "shadow": {"version": 1, "fraction": 0.5}}, 400, "shadow.version"),
        ({"name": "e", "adapter": "bot@1", "shadow": {"version": 9, "fraction": 0.5}}, 404, "shadow.version"),
        ({"name": "e", "shadow": {"version": 1, "fraction": 0.5}}, 400, "shadow"),
    ]
    for body, status, param in refused:
        r = httpx.post(f"{url}/v1/endpoints", json=body, headers=auth(key))
        assert (r.status_code, error_of(r)["param"]) == (status, param), r.text
    r = httpx.post(
        f"{url}/v1/endpoints",
        json={"name": "e", "adapter": "bot@1", "shadow": {"version": 1, "fraction": 0}},
        headers=auth(key),
    )
    assert r.status_code == 400 and "fraction" in error_of(r)["message"], r.text
    assert httpx.get(f"{url}/v1/endpoints/e", headers=auth(key)).status_code == 404  # nothing stored
    r = httpx.post(f"{url}/v1/endpoints", json={"name": "e", "adapter": "bot@1"}, headers=auth(key))
    assert r.status_code == 201 and r.json()["shadow"] is None
    r = httpx.patch(f"{url}/v1/endpoints/e", json={"shadow": {"version": 5, "fraction": 0.5}}, headers=auth(key))
    assert r.status_code == 404 and error_of(r)["param"] == "shadow.version"
    assert httpx.get(f"{url}/v1/endpoints/e", headers=auth(key)).json()["revision"] == 1


def test_copies_beyond_the_bound_are_dropped_and_failures_never_raised() -> None:
    metrics = Metrics(dict, list, block_size=16)
    traffic = ShadowTraffic(metrics, max_concurrent=1)
    labels = metrics.endpoint_labels("t", "extract", "id", "bot@2", "c" * 64, role="shadow")

    async def scenario() -> None:
        release = asyncio.Event()

        async def slow() -> None:
            await release.wait()
            raise RuntimeError("the shadow version failed")

        assert traffic.submit(slow, labels)
        assert not traffic.submit(slow, labels)  # one copy in flight already
        release.set()
        while traffic.in_flight:
            await asyncio.sleep(0)
        assert traffic.submit(slow, labels)  # the failed copy freed its place without raising
        await traffic.close()

    asyncio.run(scenario())
    assert metrics.endpoint_requests.labels(*labels, "dropped")._value.get() == 1
