"""Tenants and API keys over real HTTP: admin-only creation, keys shown once and stored hashed,
rotation and revocation, and the admin routes refusing tenant keys."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid

import httpx

from loraplex.platform.db.session import Database
from tests.platform.helpers import ADMIN_KEY, auth, create_tenant, error_of


def test_create_tenant_returns_key_once_and_stores_only_its_hash(server) -> None:
    r = httpx.post(f"{server.url}/v1/tenants", json={"name": "acme", "max_adapters": 3}, headers=auth(ADMIN_KEY))
    assert r.status_code == 201, r.text
    body = r.json()
    key = body["api_key"]["key"]
    assert body["tenant"]["name"] == "acme" and body["tenant"]["max_adapters"] == 3
    assert key.startswith("lpx-") and body["api_key"]["prefix"] in key
    # The key works, and listing keys never shows it again.
    assert httpx.get(f"{server.url}/v1/models", headers=auth(key)).status_code == 200
    listed = httpx.get(f"{server.url}/v1/tenants/acme/keys", headers=auth(ADMIN_KEY)).json()["data"]
    assert [k["prefix"] for k in listed] == [body["api_key"]["prefix"]] and "key" not in listed[0]

    async def stored() -> list[tuple[str, str]]:
        db = Database(server.settings.resolved_database_url, server.settings.database_schema)
        try:
            async with db.engine.connect() as conn:
                from sqlalchemy import text

                rows = await conn.execute(text("SELECT prefix, key_hash FROM api_keys"))
                return [tuple(r) for r in rows]
        finally:
            await db.close()

    rows = dict(asyncio.run(stored()))
    assert rows[body["api_key"]["prefix"]] == hashlib.sha256(key.encode()).hexdigest()
    assert all(key not in v for v in rows.values())


def test_duplicate_and_invalid_tenant_names(server) -> None:
    create_tenant(server.url, "dup")
    r = httpx.post(f"{server.url}/v1/tenants", json={"name": "dup"}, headers=auth(ADMIN_KEY))
    assert r.status_code == 409 and error_of(r)["code"] == "tenant_exists"
    r = httpx.post(f"{server.url}/v1/tenants", json={"name": "../evil"}, headers=auth(ADMIN_KEY))
    assert r.status_code == 400 and error_of(r)["param"] == "name"
    r = httpx.post(f"{server.url}/v1/tenants", json={"name": "x", "max_adapters": -1}, headers=auth(ADMIN_KEY))
    assert r.status_code == 400 and error_of(r)["param"] == "max_adapters"


def test_admin_routes_refuse_tenant_keys_and_missing_keys(server) -> None:
    key = create_tenant(server.url, "tenant-a")
    for method, path in [("POST", "/v1/tenants"), ("GET", "/v1/tenants"), ("GET", "/v1/tenants/tenant-a")]:
        r = httpx.request(method, server.url + path, json={"name": "sneaky"}, headers=auth(key))
        assert r.status_code == 403, (method, path, r.text)
        assert error_of(r)["code"] == "admin_required"
        r = httpx.request(method, server.url + path, json={"name": "sneaky"})
        assert r.status_code == 401 and error_of(r)["type"] == "authentication_error"
        r = httpx.request(method, server.url + path, json={"name": "sneaky"}, headers=auth("lpx-nope.wrong"))
        assert r.status_code == 401
    names = [t["name"] for t in httpx.get(f"{server.url}/v1/tenants", headers=auth(ADMIN_KEY)).json()["data"]]
    assert "sneaky" not in names and "tenant-a" in names


def test_rotate_and_revoke_keys(server) -> None:
    first = create_tenant(server.url, "rotator")
    # The tenant itself may add a key; the new key works at once.
    r = httpx.post(f"{server.url}/v1/tenants/rotator/keys", headers=auth(first))
    assert r.status_code == 201, r.text
    second = r.json()
    assert httpx.get(f"{server.url}/v1/adapters", headers=auth(second["key"])).status_code == 200
    # Revoke the first key (by prefix) with the second; the first is refused from then on.
    first_prefix = first.split("-", 1)[1].split(".", 1)[0]
    r = httpx.delete(f"{server.url}/v1/tenants/rotator/keys/{first_prefix}", headers=auth(second["key"]))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    r = httpx.get(f"{server.url}/v1/adapters", headers=auth(first))
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    # The admin revokes the second by id.
    r = httpx.delete(f"{server.url}/v1/tenants/rotator/keys/{second['id']}", headers=auth(ADMIN_KEY))
    assert r.status_code == 200
    assert httpx.get(f"{server.url}/v1/adapters", headers=auth(second["key"])).status_code == 401
    r = httpx.delete(f"{server.url}/v1/tenants/rotator/keys/{uuid.uuid4()}", headers=auth(ADMIN_KEY))
    assert r.status_code == 404


def test_a_tenant_cannot_manage_another_tenants_keys(server) -> None:
    key_a = create_tenant(server.url, "keys-a")
    key_b = create_tenant(server.url, "keys-b")
    for method in ("GET", "POST"):
        r = httpx.request(method, f"{server.url}/v1/tenants/keys-a/keys", headers=auth(key_b))
        assert r.status_code == 404 and error_of(r)["code"] == "tenant_not_found"
    prefix_a = key_a.split("-", 1)[1].split(".", 1)[0]
    r = httpx.delete(f"{server.url}/v1/tenants/keys-a/keys/{prefix_a}", headers=auth(key_b))
    assert r.status_code == 404
    assert httpx.get(f"{server.url}/v1/models", headers=auth(key_a)).status_code == 200


def test_rate_limit_per_tenant(server) -> None:
    # Every request of this test falls into one one-minute window, wherever the wall clock is.
    window_start = (time.time() // 60) * 60
    server.services.rate_limiter.clock = lambda: window_start + 20.0
    limited = create_tenant(server.url, "limited", rate_limit_per_minute=3)
    free = create_tenant(server.url, "free")
    codes = [httpx.get(f"{server.url}/v1/models", headers=auth(limited)).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    r = httpx.get(f"{server.url}/v1/models", headers=auth(limited))
    assert r.status_code == 429
    assert error_of(r)["code"] == "rate_limit_exceeded" and int(r.headers["retry-after"]) == 40
    assert all(httpx.get(f"{server.url}/v1/models", headers=auth(free)).status_code == 200 for _ in range(5))
