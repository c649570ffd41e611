"""Endpoints over REST and through the official openai client: defaults applied when the caller sends none
(the output validates against the endpoint's schema, the system prompt is in the prompt), overrides the endpoint
forbids refused by name, the answering endpoint revision and adapter version in response headers, canary split
sticky per user, promote and rollback, per-version metrics, and hostile input refused with nothing written."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.platform.helpers import auth, create_tenant, error_of, stored_blobs, upload, zip_folder

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
SYSTEM = "You answer with a verdict."


def _endpoint(url: str, key: str, **body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/endpoints", json=body, headers=auth(key), timeout=120)


@pytest.fixture
def published(start_server, adapter_factory):
    """A SQLite server, a tenant with adapter `bot` (versions 1 and 2) and endpoint `extract` on bot@1."""
    server = start_server()
    key = create_tenant(server.url, "publisher")
    v1 = upload(server.url, key, "bot", archive=zip_folder(adapter_factory("ep-1", seed=91))).json()
    v2 = upload(server.url, key, "bot", archive=zip_folder(adapter_factory("ep-2", seed=92))).json()
    r = _endpoint(
        server.url,
        key,
        name="extract",
        adapter="bot@1",
        defaults={"system_prompt": SYSTEM, "response_format": RESPONSE_FORMAT, "temperature": 0.0, "max_tokens": 40},
        overridable=["temperature"],
    )
    assert r.status_code == 201, r.text
    return server, key, v1, v2, r.json()


def test_defaults_apply_and_forbidden_overrides_are_refused(published, tiny_llama_dir: Path) -> None:
    from transformers import AutoTokenizer

    server, key, _v1, v2, endpoint = published
    assert (endpoint["revision"], endpoint["adapter"], endpoint["canary"]) == (1, "bot@1", None)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "is it ok?"}]

    raw = client.chat.completions.with_raw_response.create(model="extract", messages=messages)
    assert raw.headers["x-loraplex-endpoint"] == "extract@1" and raw.headers["x-loraplex-served-by"] == "bot@1"
    assert raw.headers["x-loraplex-schema"] == "exact"
    out = raw.parse()
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    assert out.model == "extract" and out.usage.completion_tokens <= 40
    # The system prompt is in the prompt: its token count is the chat template's with the system message.
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    with_system = [{"role": "system", "content": SYSTEM}, *messages]
    text = tokenizer.apply_chat_template(with_system, tokenize=False, add_generation_prompt=True)
    assert out.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))
    # Streaming gets the same defaults and headers.
    raw = client.chat.completions.with_raw_response.create(model="extract", messages=messages, stream=True)
    assert raw.headers["x-loraplex-endpoint"] == "extract@1"
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)

    # Allowed: temperature (overridable), fewer tokens than the cap, fields the endpoint does not set.
    r = client.chat.completions.create(model="extract", messages=messages, temperature=0.5, max_tokens=30, top_p=0.9)
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)

    forbidden = [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"extra_body": {"guided_json": {"type": "string"}}}, "guided_json"),
        ({"max_tokens": 41}, "max_tokens"),
        ({"max_completion_tokens": 100}, "max_completion_tokens"),
    ]
    for extra, param in forbidden:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="extract", messages=messages, **extra)
        assert (e.value.body["param"], e.value.body["code"]) == (param, "override_not_allowed"), extra
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="extract", messages=[{"role": "system", "content": "x"}, *messages])
    assert (e.value.body["param"], e.value.body["code"]) == ("messages", "override_not_allowed")
    with pytest.raises(openai.BadRequestError) as e:  # a system prompt needs the chat route
        client.completions.create(model="extract", prompt="x")
    assert e.value.body["param"] == "model"

    # Per-version metrics: the three constrained calls were exact, the six refused ones count as errors.
    samples = {
        (s.name, s.labels.get("schema") or s.labels.get("outcome")): s.value
        for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
        for s in f.samples
        if s.labels.get("endpoint") == "extract" and s.labels.get("version") == "bot@1"
    }
    assert samples[("loraplex_endpoint_constrained_requests_total", "exact")] == 3
    assert ("loraplex_endpoint_constrained_requests_total", "narrowed") not in samples
    assert samples[("loraplex_endpoint_requests_total", "error")] == 6

    # Listed in /v1/models, its root the adapter version it serves.
    cards = {m.id: m for m in client.models.list().data}  # ids are `<tenant>/<name>`
    extract, bot = (next(m for i, m in cards.items() if i.endswith("/" + n)) for n in ("extract", "bot"))
    assert extract.root == "bot@1" and bot.root == v2["sha256"]
    assert client.models.retrieve("extract").root == "bot@1"


def test_canary_split_is_sticky_then_promote_and_rollback(published) -> None:
    server, key, _v1, _v2, _ = published
    r = httpx.patch(
        f"{server.url}/v1/endpoints/extract",
        json={"canary": {"version": 2, "weight": 0.3}, "defaults": {"max_tokens": 1}},
        headers=auth(key),
    )
    assert r.status_code == 200 and r.json()["revision"] == 2 and r.json()["canary"] == {"version": 2, "weight": 0.3}
    assert r.json()["defaults"] == {"max_tokens": 1}  # defaults are replaced as a whole

    def call(user: str | None, header: str | None = None, revision: int = 2) -> str:
        headers = auth(key) | ({"x-loraplex-sticky-key": header} if header else {})
        body: dict = {"model": "extract", "messages": [{"role": "user", "content": "hi"}]}
        if user is not None:
            body["user"] = user
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["x-loraplex-endpoint"] == f"extract@{revision}"
        return r.headers["x-loraplex-served-by"]

    users = [f"user-{i}" for i in range(120)]
    with ThreadPoolExecutor(8) as pool:  # concurrent callers share the engine's batch
        first = dict(zip(users, pool.map(call, users)))
        share = Counter(first.values())["bot@2"] / len(users)
        # 120 independent draws at 0.3: the standard deviation is 0.042, so +-0.15 is beyond 3.5 of them.
        assert set(first.values()) == {"bot@1", "bot@2"} and abs(share - 0.3) < 0.15, share
        sticky = users[:24]  # the same user lands on the same version, by `user` or by the header
        assert list(pool.map(call, sticky)) == [first[u] for u in sticky]
        assert list(pool.map(lambda u: call(None, header=u), sticky)) == [first[u] for u in sticky]

    # Per-version metrics: requests, tokens and latency for each version that answered.
    metrics = {
        (s.name, s.labels.get("version"), s.labels.get("outcome"), s.labels.get("kind")): s.value
        for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
        for s in f.samples
        if s.labels.get("endpoint") == "extract"
    }
    for version in ("bot@1", "bot@2"):
        served = sum(1 for u in users if first[u] == version) + 2 * sum(1 for u in sticky if first[u] == version)
        assert metrics[("loraplex_endpoint_requests_total", version, "length", None)] == served
        assert metrics[("loraplex_endpoint_tokens_total", version, None, "generation")] == served
        assert metrics[("loraplex_endpoint_request_latency_seconds_count", version, None, None)] == served

    r = httpx.post(f"{server.url}/v1/endpoints/extract/promote", headers=auth(key))
    assert r.status_code == 200 and (r.json()["adapter"], r.json()["canary"], r.json()["revision"]) == (
        "bot@2",
        None,
        3,
    )
    assert {call(u, revision=3) for u in users[:10]} == {"bot@2"}
    r = httpx.post(f"{server.url}/v1/endpoints/extract/rollback", headers=auth(key))
    assert r.status_code == 409 and error_of(r)["code"] == "no_canary"
    # A canary of version 1 on the promoted endpoint, rolled back in one call.
    r = httpx.patch(
        f"{server.url}/v1/endpoints/extract", json={"canary": {"version": 1, "weight": 0.5}}, headers=auth(key)
    )
    assert r.status_code == 200
    r = httpx.post(f"{server.url}/v1/endpoints/extract/rollback", headers=auth(key))
    assert r.status_code == 200 and (r.json()["adapter"], r.json()["canary"]) == ("bot@2", None)
    assert {call(u, revision=5) for u in users[:10]} == {"bot@2"}


def test_versions_an_endpoint_serves_cannot_be_deleted_or_retired(published, adapter_factory) -> None:
    server, key, _v1, _v2, _ = published
    r = httpx.patch(
        f"{server.url}/v1/endpoints/extract", json={"canary": {"version": 2, "weight": 0.1}}, headers=auth(key)
    )
    assert r.status_code == 200
    blobs = stored_blobs(server.settings.data_dir)
    for model in ("bot@1", "bot@2", "bot"):
        r = httpx.delete(f"{server.url}/v1/adapters/{model}", headers=auth(key))
        assert r.status_code == 409 and error_of(r)["code"] == "version_in_use", model
        assert "'extract'" in error_of(r)["message"]
    # Retention that would retire bot@1 (the tenant now keeps 2 versions, bot has 2) refuses the upload.
    from tests.platform.helpers import ADMIN_KEY

    httpx.patch(f"{server.url}/v1/tenants/publisher", json={"adapter_versions_kept": 2}, headers=auth(ADMIN_KEY))
    r = upload(server.url, key, "bot", archive=zip_folder(adapter_factory("ep-3", seed=93)))
    assert r.status_code == 409 and error_of(r)["code"] == "version_in_use" and "bot@1" in error_of(r)["message"]
    assert stored_blobs(server.settings.data_dir) == blobs
    versions = httpx.get(f"{server.url}/v1/adapters/bot/versions", headers=auth(key)).json()
    assert [v["version"] for v in versions["data"]] == [1, 2]
    # Once the endpoint is gone, the versions can go.
    assert httpx.delete(f"{server.url}/v1/endpoints/extract", headers=auth(key)).status_code == 200
    assert httpx.delete(f"{server.url}/v1/adapters/bot@1", headers=auth(key)).status_code == 200


def test_a_description_is_kept_as_written_and_changed_by_patch(published) -> None:
    server, key, *_ = published
    url = f"{server.url}/v1/endpoints"
    assert httpx.get(f"{url}/extract", headers=auth(key)).json()["description"] is None
    words = 'Invoices <b>bold</b> & "quotes"\nsecond line, 1,000 characters at most: ' + "é" * 900
    r = _endpoint(server.url, key, name="described", description=words)
    assert r.status_code == 201, r.text
    assert (r.json()["description"], r.json()["revision"]) == (words, 1)
    assert httpx.get(f"{url}/described", headers=auth(key)).json()["description"] == words
    listed = {e["name"]: e for e in httpx.get(url, headers=auth(key)).json()["data"]}
    assert (listed["described"]["description"], listed["extract"]["description"]) == (words, None)
    r = httpx.patch(f"{url}/described", json={"description": "only this"}, headers=auth(key))
    assert (r.status_code, r.json()["description"], r.json()["revision"]) == (200, "only this", 2)
    r = httpx.patch(f"{url}/described", json={"pinned": False}, headers=auth(key))
    assert (r.json()["description"], r.json()["revision"]) == ("only this", 3)  # left out: unchanged
    r = httpx.patch(f"{url}/described", json={"description": None}, headers=auth(key))
    assert (r.json()["description"], r.json()["revision"]) == (None, 4)
    r = httpx.patch(f"{url}/described", json={"description": "y" * 1001}, headers=auth(key))
    assert (r.status_code, error_of(r)["param"]) == (400, "description")
    assert httpx.get(f"{url}/described", headers=auth(key)).json()["revision"] == 4


def test_hostile_input_is_refused_with_nothing_written(published, adapter_factory) -> None:
    server, key, _v1, _v2, _ = published
    before = httpx.get(f"{server.url}/v1/endpoints", headers=auth(key)).json()["data"]
    refusals = [
        ({"name": "a/b", "adapter": "bot@1"}, 400, "name"),
        ({"name": "../x", "adapter": "bot@1"}, 400, "name"),
        ({"name": "x@1", "adapter": "bot@1"}, 400, "name"),
        ({"name": "new", "adapter": "bot@9"}, 404, "adapter"),
        ({"name": "new", "adapter": "nobot"}, 404, "adapter"),
        ({"name": "new", "adapter": "bot@1", "canary": {"version": 1, "weight": 0.1}}, 400, "canary.version"),
        ({"name": "new", "adapter": "bot@1", "canary": {"version": 7, "weight": 0.1}}, 404, "canary.version"),
        ({"name": "new", "canary": {"version": 2, "weight": 0.1}}, 400, "canary"),
        ({"name": "extract", "adapter": "bot@1"}, 409, "name"),
        ({"name": "bot", "adapter": "bot@1"}, 409, "name"),
        ({"name": "new", "description": "x" * 1001}, 400, "description"),
        ({"name": "new", "description": 7}, 400, "description"),
        (
            {
                "name": "new",
                "defaults": {
                    "response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "http://x/y"}}}
                },
            },
            400,
            "defaults.response_format",
        ),
    ]
    for body, status, param in refusals:
        r = _endpoint(server.url, key, **body)
        assert (r.status_code, error_of(r)["param"]) == (status, param), (body, r.text)
    for body in ({"name": "new", "canary": {"version": 2, "weight": 1.0}}, {"name": "new", "overridable": ["n"]}):
        assert _endpoint(server.url, key, **body).status_code == 400, body
    assert httpx.get(f"{server.url}/v1/endpoints", headers=auth(key)).json()["data"] == before
    # A PATCH with a refused schema leaves the endpoint at its revision.
    bad = {"defaults": {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "http://x/y"}}}}}
    r = httpx.patch(f"{server.url}/v1/endpoints/extract", json=bad, headers=auth(key))
    assert r.status_code == 400 and error_of(r)["param"] == "defaults.response_format"
    assert httpx.get(f"{server.url}/v1/endpoints/extract", headers=auth(key)).json()["revision"] == 1
    # An adapter may not take an endpoint's name.
    blobs = stored_blobs(server.settings.data_dir)
    r = upload(server.url, key, "extract", archive=zip_folder(adapter_factory("ep-1", seed=91)))
    assert r.status_code == 409 and error_of(r)["param"] == "name"
    assert stored_blobs(server.settings.data_dir) == blobs

    # Another tenant's endpoint is a missing one, everywhere.
    other = create_tenant(server.url, "publisher-other")
    for method, path in (("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/promote")):
        body = {} if method == "PATCH" else None
        r = httpx.request(method, f"{server.url}/v1/endpoints/extract{path}", json=body, headers=auth(other))
        missing = httpx.request(method, f"{server.url}/v1/endpoints/nothing{path}", json=body, headers=auth(other))
        assert r.status_code == missing.status_code == 404 and error_of(r) == {
            **error_of(missing),
            "message": error_of(r)["message"],
        }
    body = {"model": "extract", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=auth(other))
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"
    assert "extract" not in [m["id"] for m in httpx.get(f"{server.url}/v1/models", headers=auth(other)).json()["data"]]
