"""Two `loraplex serve` processes sharing PostgreSQL, Redis and the adapter store: an adapter uploaded
through one is served by the other; after a delete through one, the other refuses it. The registry cache
keeps entries for an hour here, so only the invalidation (Redis pub/sub) can make the other see a change
within the tests' waiting time; how fast it arrives is not asserted (bench/, not tests, measures speed)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.platform.helpers import (
    ADMIN_KEY,
    ServerProcess,
    auth,
    create_tenant,
    eventually,
    replica_args,
    running_replicas,
    upload,
    zip_folder,
)

pytestmark = pytest.mark.services


@pytest.fixture
def replicas(tmp_path: Path, tiny_llama_dir: Path, pg_schema: str) -> Iterator[list[ServerProcess]]:
    args = replica_args(tiny_llama_dir, pg_schema, data_dir=tmp_path / "shared-data")
    env = {"LORAPLEX_ADMIN_KEY": ADMIN_KEY, "LORAPLEX_CACHE_TTL_S": "3600"}
    with running_replicas(args, env, tmp_path) as procs:
        yield procs


def test_upload_on_one_replica_is_served_by_the_other_and_delete_propagates(replicas, adapter_factory) -> None:
    one, two = replicas
    tenant = f"shared-{uuid.uuid4().hex[:6]}"
    key = create_tenant(one.url, tenant)
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0}
    r = httpx.post(f"{two.url}/v1/chat/completions", headers=auth(key), json={"model": "roaming", **chat})
    assert r.status_code == 404  # not there yet (and the miss is not cached)

    assert upload(one.url, key, "roaming", archive=zip_folder(adapter_factory("basic"))).status_code == 201
    r = httpx.post(f"{two.url}/v1/chat/completions", headers=auth(key), json={"model": "roaming", **chat}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "roaming"
    assert httpx.get(f"{two.url}/v1/adapters/roaming", headers=auth(key)).json()["version"] == 1

    # A re-upload through one is the version the other uses next.
    r = upload(one.url, key, "roaming", archive=zip_folder(adapter_factory("basic-r8", r=8, seed=1)))
    assert r.status_code == 201 and r.json()["version"] == 2
    eventually(
        lambda: httpx.get(f"{two.url}/v1/adapters/roaming", headers=auth(key)).json()["version"] == 2,
        "replica two serves version 2",
    )
    assert (
        httpx.post(
            f"{two.url}/v1/chat/completions", headers=auth(key), json={"model": "roaming", **chat}, timeout=60
        ).status_code
        == 200
    )

    # Delete through one: two refuses it within a second (it had the record cached).
    assert httpx.delete(f"{one.url}/v1/adapters/roaming", headers=auth(key)).status_code == 200

    def refused() -> bool:
        r = httpx.post(
            f"{two.url}/v1/chat/completions", headers=auth(key), json={"model": "roaming", **chat}, timeout=60
        )
        return r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"

    eventually(refused, "replica two refuses the deleted adapter")

    # Keys are shared as well: a key revoked through two is refused by one.
    new_key = httpx.post(f"{two.url}/v1/tenants/{tenant}/keys", headers=auth(ADMIN_KEY)).json()
    assert httpx.get(f"{one.url}/v1/models", headers=auth(new_key["key"])).status_code == 200
    assert (
        httpx.delete(f"{two.url}/v1/tenants/{tenant}/keys/{new_key['id']}", headers=auth(ADMIN_KEY)).status_code == 200
    )
    eventually(
        lambda: httpx.get(f"{one.url}/v1/models", headers=auth(new_key["key"])).status_code == 401,
        "replica one refuses the revoked key",
    )
