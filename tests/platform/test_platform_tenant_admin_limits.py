"""The tenant admin API for weights, priority classes and serving limits over real HTTP: set at creation,
changed with PATCH (null restores the server default), read back, refused by name when invalid, admin only,
and in force on the tenant's very next request (its keys' cached principals are dropped)."""

from __future__ import annotations

import httpx
import pytest

from tests.platform.helpers import ADMIN_KEY, auth, create_tenant, error_of

LIMITS = ("weight", "priority", "max_concurrent_sequences", "tokens_per_minute", "max_queued_requests")


def test_set_get_and_reset_weight_and_limits(server) -> None:
    r = httpx.post(
        f"{server.url}/v1/tenants",
        json={"name": "weighted", "weight": 2.5, "priority": 1, "tokens_per_minute": 5000},
        headers=auth(ADMIN_KEY),
    )
    assert r.status_code == 201, r.text
    created = r.json()["tenant"]
    assert {f: created[f] for f in LIMITS} == {
        "weight": 2.5,
        "priority": 1,
        "max_concurrent_sequences": None,
        "tokens_per_minute": 5000,
        "max_queued_requests": None,
    }
    r = httpx.patch(
        f"{server.url}/v1/tenants/weighted",
        json={"weight": 0.25, "max_concurrent_sequences": 64, "max_queued_requests": 0, "tokens_per_minute": None},
        headers=auth(ADMIN_KEY),
    )
    assert r.status_code == 200, r.text
    got = httpx.get(f"{server.url}/v1/tenants/weighted", headers=auth(ADMIN_KEY)).json()
    assert {f: got[f] for f in LIMITS} == {
        "weight": 0.25,
        "priority": 1,  # absent from the PATCH: unchanged
        "max_concurrent_sequences": 64,
        "tokens_per_minute": None,  # null: back to the server default
        "max_queued_requests": 0,
    }
    assert got["max_adapters"] is None and got["name"] == "weighted"
    listed = httpx.get(f"{server.url}/v1/tenants", headers=auth(ADMIN_KEY)).json()["data"]
    assert [t["weight"] for t in listed if t["name"] == "weighted"] == [0.25]


@pytest.mark.parametrize(
    ("field", "value"),  # the value as JSON text
    [
        ("weight", "0"),
        ("weight", "-1.5"),
        ("weight", "1e7"),
        ("weight", '"heavy"'),
        ("priority", str(2**31 + 1)),
        ("priority", "1.5"),
        ("max_concurrent_sequences", "-1"),
        ("tokens_per_minute", "-5"),
        ("max_queued_requests", '"many"'),
    ],
)
def test_invalid_values_are_400s_naming_the_field(start_server, field: str, value: str) -> None:
    server = start_server()
    create_tenant(server.url, "strict")
    raw = f'{{"{field}": {value}}}'
    headers = {**auth(ADMIN_KEY), "content-type": "application/json"}
    for method, url, body in (
        ("PATCH", f"{server.url}/v1/tenants/strict", raw),
        ("POST", f"{server.url}/v1/tenants", raw.replace("{", '{"name": "other", ', 1)),
    ):
        r = httpx.request(method, url, content=body, headers=headers)
        assert r.status_code == 400, (method, r.text)
        assert error_of(r)["param"] == field, (method, r.text)
    assert httpx.get(f"{server.url}/v1/tenants/other", headers=auth(ADMIN_KEY)).status_code == 404  # not created
    got = httpx.get(f"{server.url}/v1/tenants/strict", headers=auth(ADMIN_KEY)).json()
    assert got[field] is None  # nothing half-written


def test_patch_refuses_unknown_fields_missing_tenants_and_tenant_keys(server) -> None:
    key = create_tenant(server.url, "patchy")
    r = httpx.patch(f"{server.url}/v1/tenants/patchy", json={"name": "renamed"}, headers=auth(ADMIN_KEY))
    assert r.status_code == 400 and "name" in error_of(r)["message"], r.text
    r = httpx.patch(f"{server.url}/v1/tenants/nobody", json={"weight": 2}, headers=auth(ADMIN_KEY))
    assert r.status_code == 404 and error_of(r)["code"] == "tenant_not_found"
    r = httpx.patch(f"{server.url}/v1/tenants/patchy", json={"weight": 1e6}, headers=auth(key))
    assert r.status_code == 403 and error_of(r)["code"] == "admin_required"
    assert httpx.get(f"{server.url}/v1/tenants/patchy", headers=auth(ADMIN_KEY)).json()["weight"] is None


def test_a_change_applies_to_the_tenants_next_request(server) -> None:
    key = create_tenant(server.url, "changing")
    model = httpx.get(f"{server.url}/v1/models", headers=auth(key)).json()["data"][0]["id"]
    body = {"model": model, "prompt": [1, 2, 3], "max_tokens": 1, "priority": 0}
    assert httpx.post(f"{server.url}/v1/completions", json=body, headers=auth(key), timeout=60).status_code == 200
    # The key's principal is cached now; raising the tenant's priority class must still apply at once.
    r = httpx.patch(f"{server.url}/v1/tenants/changing", json={"priority": 5}, headers=auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=auth(key), timeout=60)
    assert r.status_code == 400 and error_of(r)["param"] == "priority", r.text
    r = httpx.post(f"{server.url}/v1/completions", json={**body, "priority": 5}, headers=auth(key), timeout=60)
    assert r.status_code == 200, r.text


def test_usage_is_visible_to_the_admin_and_the_tenant_only(server) -> None:
    key = create_tenant(server.url, "seer", max_queued_requests=3)
    other = create_tenant(server.url, "peeker")
    for k in (ADMIN_KEY, key):
        r = httpx.get(f"{server.url}/v1/tenants/seer/usage", headers=auth(k))
        assert r.status_code == 200, r.text
        assert r.json() == {
            "queued_requests": 0,
            "sequences": 0,
            "tokens_this_minute": 0,
            "max_queued_requests": 3,
            "max_concurrent_sequences": 0,  # the server default: unlimited
            "tokens_per_minute": 0,
        }
    assert httpx.get(f"{server.url}/v1/tenants/seer/usage", headers=auth(other)).status_code == 404
