"""The check at publish under concurrency: copies of ONE adapter (one content hash, one engine entry) published at
once on one server and across two replicas that share the engine in this process (each copy read back from the other
replica), and a check beside tenants' requests for a published copy of that content. Every copy must pass and serve.

The two-replica case is the regression test for two replicas' checks building their float references at the same
time: transformers' overlapping model builds left torch's init functions swapped process-wide, the reference came
out with NaN logits (reference tokens [0, 0, 0, 0]) and good copies were refused (adapter_check_failed); it failed
in 4 of 5 runs before the checks shared one process-wide lock."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.platform.helpers import auth, create_tenant, upload, zip_folder

COPIES = 6
ROUNDS = 3


def chat(url: str, key: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": "hi", "max_tokens": 3, "temperature": 0},
        headers=auth(key),
        timeout=120,
    )


@pytest.mark.parametrize(
    "backend, replicas",
    [
        pytest.param("sqlite", 1, id="one-server"),
        # two apps on one engine, one registry and one blob store; each copy is read back from the other
        pytest.param("postgres+redis", 2, id="two-replicas", marks=pytest.mark.services),
    ],
)
def test_copies_of_one_adapter_published_at_once_all_pass_and_serve(
    start_server, adapter_factory, tmp_path, backend, replicas
) -> None:
    """Each round starts fresh servers (so their checks load their references again, at the same time) and
    publishes the copies across them at once; each copy then serves, read back from another replica."""
    limits = dict(max_concurrent_uploads=COPIES, max_concurrent_uploads_per_tenant=COPIES)
    archive = zip_folder(adapter_factory("concurrent-same", seed=61))
    with ThreadPoolExecutor(COPIES) as pool:
        for round_ in range(ROUNDS):
            store = tmp_path / f"store-{round_}"  # one store (and SQLite file) for the round's replicas
            servers = [start_server(backend, data_dir=store, **limits) for _ in range(replicas)]
            key = create_tenant(servers[0].url, f"copies-{replicas}-{round_}")
            names = [f"same-{round_}-{i}" for i in range(COPIES)]
            uploads = [
                pool.submit(upload, servers[i % replicas].url, key, n, archive=archive) for i, n in enumerate(names)
            ]
            responses = [f.result() for f in uploads]
            failed = [(n, r.status_code, r.text) for n, r in zip(names, responses, strict=True) if r.status_code != 201]
            assert not failed, failed
            assert all(r.json()["publish_check"]["passed"] for r in responses), [r.text for r in responses]
            chats = [pool.submit(chat, servers[(i + 1) % replicas].url, key, n) for i, n in enumerate(names)]
            served = [f.result() for f in chats]
            assert [r.status_code for r in served] == [200] * COPIES, [r.text for r in served]


def test_a_check_beside_requests_for_a_published_copy(start_server, adapter_factory) -> None:
    server = start_server("sqlite", max_concurrent_uploads=COPIES, max_concurrent_uploads_per_tenant=COPIES)
    key = create_tenant(server.url, "beside")
    archive = zip_folder(adapter_factory("concurrent-beside", seed=62))
    assert upload(server.url, key, "live", archive=archive).status_code == 201
    with ThreadPoolExecutor(COPIES + 2) as pool:
        for round_ in range(ROUNDS):
            chats = [pool.submit(chat, server.url, key, "live") for _ in range(COPIES)]
            uploads = [pool.submit(upload, server.url, key, f"beside-{round_}-{i}", archive=archive) for i in range(2)]
            bad = [(f.result().status_code, f.result().text) for f in uploads if f.result().status_code != 201]
            bad += [(f.result().status_code, f.result().text) for f in chats if f.result().status_code != 200]
            assert not bad, bad
