"""Operations over real HTTP: /metrics behind a token and without tenant labels, aborted streams counted once,
admin routes over any tenant's adapters (audited), and the admin key refused on tenant routes with a 403 that
says why."""

from __future__ import annotations

import logging
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.platform.helpers import ADMIN_KEY, ServerThread, auth, create_tenant, error_of, upload, zip_folder


def _requests_total(text: str) -> dict[tuple, float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "loraplex_requests_total"
    }


def _handlers_running(server: ServerThread) -> int:
    """HTTP requests the in-process server is still handling (uvicorn's running request tasks)."""
    return len(server.server.server_state.tasks)


def test_metrics_token_guards_metrics(start_server) -> None:
    server = start_server("sqlite", metrics_token="scrape-secret")
    for headers in ({}, auth("wrong"), {"Authorization": "Basic scrape-secret"}):
        r = httpx.get(f"{server.url}/metrics", headers=headers)
        assert r.status_code == 401, r.text
        error = error_of(r)
        assert "metrics_token" in error["message"] and error["code"] == "invalid_metrics_token"
    r = httpx.get(f"{server.url}/metrics", headers=auth("scrape-secret"))
    assert r.status_code == 200 and "loraplex_time_to_first_token_seconds_count" in r.text
    assert r.headers["content-type"].startswith("text/plain")
    # Health and readiness stay open for probes.
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/ready").status_code == 200


def test_metrics_without_tenant_labels_name_no_tenant_or_adapter(start_server, adapter_factory) -> None:
    server = start_server("sqlite", metrics_tenant_labels=False)
    key = create_tenant(server.url, "unlabelled-tenant")
    archive = zip_folder(adapter_factory("basic"))
    assert upload(server.url, key, "secret-adapter-name", archive=archive).status_code == 201
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    before = _requests_total(httpx.get(f"{server.url}/metrics").text)
    out = client.completions.create(
        model="secret-adapter-name", prompt="hi", max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].finish_reason == "length"
    text = httpx.get(f"{server.url}/metrics").text
    assert "unlabelled-tenant" not in text and "secret-adapter-name" not in text
    after = _requests_total(text)
    assert after[(("finish_reason", "length"),)] - before.get((("finish_reason", "length"),), 0.0) == 1
    assert all(dict(labels).keys() == {"finish_reason"} for labels in after)


def test_cancelled_streams_count_once_as_abort(start_server, tiny_engine) -> None:
    server = start_server("sqlite")
    key = create_tenant(server.url, "leaver")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)
    base = client.models.list().data[0].id
    labels = (("finish_reason", "abort"), ("model", base), ("tenant", "leaver"))
    before = _requests_total(httpx.get(f"{server.url}/metrics").text)
    for n in (1, 2):  # one stream with one choice, one with two: three aborted engine requests
        stream = client.chat.completions.create(
            model=base,
            messages=[{"role": "user", "content": "a long story"}],
            max_tokens=400,
            stream=True,
            n=n,
            extra_body={"ignore_eos": True},
        )
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()  # the client hangs up mid-stream

    def aborted() -> float:
        return _requests_total(httpx.get(f"{server.url}/metrics").text).get(labels, 0.0) - before.get(labels, 0.0)

    # Every request handler has returned (where a request is counted) and the engine holds nothing: all the
    # counting these requests cause has happened, so a double count would show in what is read next.
    deadline = time.monotonic() + 60  # liveness bound only
    while _handlers_running(server) or tiny_engine.stats().num_running or tiny_engine.stats().num_waiting:
        assert time.monotonic() < deadline, (aborted(), _handlers_running(server), tiny_engine.stats())
        time.sleep(0.05)
    after = _requests_total(httpx.get(f"{server.url}/metrics").text)
    mine = {k: v - before.get(k, 0.0) for k, v in after.items() if ("tenant", "leaver") in k}
    assert {k: v for k, v in mine.items() if v} == {labels: 3}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres+redis", marks=pytest.mark.services)])
def test_admin_lists_and_deletes_any_tenants_adapters(start_server, adapter_factory, caplog, backend) -> None:
    server = start_server(backend)
    tenant = f"managed-{backend.replace('+', '-')}"
    key = create_tenant(server.url, tenant)
    other_key = create_tenant(server.url, f"{tenant}-other")
    for name in ("one", "two"):
        assert upload(server.url, key, name, archive=zip_folder(adapter_factory("basic"))).status_code == 201
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    assert client.completions.create(model="two", prompt="hi", max_tokens=1).model == "two"  # cached now

    admin = f"{server.url}/v1/admin/tenants/{tenant}/adapters"
    r = httpx.get(admin, headers=auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    assert [a["name"] for a in r.json()["data"]] == ["one", "two"]

    caplog.set_level(logging.INFO, logger="loraplex.platform.audit")
    r = httpx.delete(f"{admin}/two", headers=auth(ADMIN_KEY))
    assert r.status_code == 200 and r.json()["name"] == "two"
    audit = [rec.getMessage() for rec in caplog.records if rec.name == "loraplex.platform.audit"]
    assert len(audit) == 1 and "lpx-admin" in audit[0] and repr("two") in audit[0] and repr(tenant) in audit[0]
    assert ADMIN_KEY not in audit[0]  # the prefix only, never the secret

    assert [a["name"] for a in httpx.get(admin, headers=auth(ADMIN_KEY)).json()["data"]] == ["one"]
    assert [a["name"] for a in httpx.get(f"{server.url}/v1/adapters", headers=auth(key)).json()["data"]] == ["one"]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="two", prompt="hi", max_tokens=1)

    # Unknown tenant or adapter: 404 naming it; tenant keys and no key: refused.
    r = httpx.delete(f"{admin}/two", headers=auth(ADMIN_KEY))
    assert r.status_code == 404 and "'two'" in error_of(r)["message"]
    r = httpx.get(f"{server.url}/v1/admin/tenants/nobody/adapters", headers=auth(ADMIN_KEY))
    assert r.status_code == 404 and "'nobody'" in error_of(r)["message"]
    for k in (key, other_key):
        r = httpx.delete(f"{admin}/one", headers=auth(k))
        assert r.status_code == 403 and error_of(r)["code"] == "admin_required"
    assert httpx.get(admin).status_code == 401
    assert [a["name"] for a in httpx.get(admin, headers=auth(ADMIN_KEY)).json()["data"]] == ["one"]


def test_admin_key_on_tenant_routes_is_a_403_that_says_why(start_server) -> None:
    server = start_server("sqlite")
    create_tenant(server.url, "someone")
    admin_client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        admin_client.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert "admin key cannot act as a tenant" in str(caught.value) and "/v1/admin/" in str(caught.value)
    with pytest.raises(openai.PermissionDeniedError):
        admin_client.models.list()
    r = httpx.get(f"{server.url}/v1/adapters", headers=auth(ADMIN_KEY))
    assert r.status_code == 403
    error = error_of(r)
    assert error["code"] == "admin_key_not_a_tenant" and "tenant's key" in error["message"]
    # A wrong key is still a 401.
    r = httpx.get(f"{server.url}/v1/adapters", headers=auth("lpx-0123456789abcdef.nope"))
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
