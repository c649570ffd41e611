"""Per-request caps and per-tenant serving limits through the real server (tiny engine, SQLite without Redis
and PostgreSQL + Redis): 400s naming the cap, 429s with Retry-After naming the tenant's limit, every
reservation released after completion or cancellation, limits shared by two apps on one Redis and kept per
replica while Redis is unreachable; and the tenant's share (weight, priority) reaching the engine.

Requests are held in flight by blocking the engine thread (an `EngineProbe` callback waits on a gate once a
sequence has sampled `HOLD_AFTER` tokens), so nothing here depends on how fast the engine runs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from loraplex.engine import Share
from tests.platform.helpers import (
    ADMIN_KEY,
    EngineGate,
    auth,
    create_tenant,
    engine_gate,
    error_of,
    eventually,
    free_port,
)

HOLD_AFTER = 2  # a held sequence samples this many tokens, then waits for the gate
PROMPT = [1, 2, 3, 4]  # token ids: 4 prompt tokens whatever the tokenizer


@pytest.fixture
def gate(tiny_engine: Any) -> Iterator[EngineGate]:
    with engine_gate(tiny_engine, HOLD_AFTER) as g:
        yield g


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as p:
        yield p


def completion(url: str, key: str, **body: Any) -> httpx.Response:
    payload = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, "temperature": 0, **body}
    return httpx.post(f"{url}/v1/completions", headers=auth(key), json=payload, timeout=120)


def model_of(url: str, key: str) -> str:
    return httpx.get(f"{url}/v1/models", headers=auth(key)).json()["data"][0]["id"]


def usage(url: str, tenant: str) -> dict[str, int]:
    r = httpx.get(f"{url}/v1/tenants/{tenant}/usage", headers=auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    return r.json()


def too_many(r: httpx.Response, limit: str) -> str:
    """Checks a 429 for `limit` (code, Retry-After, the limit named); returns the message."""
    assert r.status_code == 429, r.text
    err = error_of(r)
    assert err["code"] == f"{limit}_exceeded" and err["type"] == "rate_limit_error", err
    assert limit in err["message"], err
    assert int(r.headers["retry-after"]) >= 1
    return err["message"]


def new_tenant(url: str, **limits: Any) -> tuple[str, str]:
    name = f"lim-{uuid.uuid4().hex[:8]}"
    return name, create_tenant(url, name, **limits)


def in_flight(pool: ThreadPoolExecutor, fn, *args: Any, **kwargs: Any) -> Future:
    return pool.submit(fn, *args, **kwargs)


# ----------------------------------------------------------------------------------- per request


def test_the_flood_is_refused_by_the_sequence_cap_with_default_settings(start_server) -> None:
    server = start_server()
    _, key = new_tenant(server.url)
    model = model_of(server.url, key)
    r = httpx.post(
        f"{server.url}/v1/completions",
        headers=auth(key),
        json={"model": model, "prompt": ["tell me a story"] * 500, "n": 16, "max_tokens": 16},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["code"] == "request_too_large" and err["param"] == "prompt"
    assert "8000 sequences" in err["message"] and "the limit is 256" in err["message"], err
    # 16 prompts x n=16 is exactly the cap: served.
    r = httpx.post(
        f"{server.url}/v1/completions",
        headers=auth(key),
        json={"model": model, "prompt": [PROMPT] * 16, "n": 16, "max_tokens": 1},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 256


def test_requested_tokens_cap_counts_max_tokens_as_defaulted(start_server) -> None:
    server = start_server(max_request_tokens=39, max_request_sequences=4)
    _, key = new_tenant(server.url)
    model = model_of(server.url, key)
    # completions: max_tokens defaults to 16, so 2 sequences x (4 + 16) = 40 tokens
    r = completion(server.url, key, model=model, n=2, max_tokens=None)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["code"] == "request_too_large" and err["param"] == "max_tokens"
    assert "40 tokens" in err["message"] and "the limit is 39" in err["message"], err
    assert completion(server.url, key, model=model, n=1, max_tokens=None).status_code == 200  # 20 tokens
    # chat: max_tokens defaults to the rest of the context (max_model_len 1024), so one sequence asks for 1024
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=auth(key), json=chat, timeout=60)
    assert r.status_code == 400 and "1024 tokens" in error_of(r)["message"], r.text
    r = completion(server.url, key, model=model, n=5, max_tokens=1)
    assert r.status_code == 400 and error_of(r)["param"] == "n" and "5 sequences" in error_of(r)["message"]


# ------------------------------------------------------------------------------------ per tenant


def test_concurrent_sequences_limit_and_release_after_completion(server, gate, pool) -> None:
    name, key = new_tenant(server.url, max_concurrent_sequences=3)
    model = model_of(server.url, key)
    held = in_flight(pool, completion, server.url, key, model=model, n=2)
    gate.wait_held()
    assert usage(server.url, name)["sequences"] == 2
    msg = too_many(completion(server.url, key, model=model, n=2), "max_concurrent_sequences")
    assert "2 sequences running" in msg and "limit is 3" in msg
    # A request that could never fit is a 400, not a 429 to retry.
    r = completion(server.url, key, model=model, n=4)
    assert r.status_code == 400 and error_of(r)["code"] == "request_too_large"
    # Another tenant is not limited by this one's use.
    other_name, other = new_tenant(server.url, max_concurrent_sequences=3)
    other_req = in_flight(pool, completion, server.url, other, model=model, n=3)
    eventually(lambda: usage(server.url, other_name)["sequences"] == 3, "the other tenant's request is admitted")
    gate.opened.set()
    assert held.result(timeout=120).status_code == 200
    assert other_req.result(timeout=120).status_code == 200
    assert usage(server.url, name)["sequences"] == 0  # released before the response was sent
    assert usage(server.url, name)["queued_requests"] == 0
    assert completion(server.url, key, model=model, n=3).status_code == 200


def test_queued_requests_limit_and_release_after_a_client_disconnects(server, gate, pool) -> None:
    name, key = new_tenant(server.url, max_queued_requests=1)
    model = model_of(server.url, key)
    with httpx.Client(timeout=120) as client:
        payload = {"model": model, "prompt": PROMPT, "max_tokens": 64, "ignore_eos": True, "stream": True}
        with client.stream("POST", f"{server.url}/v1/completions", headers=auth(key), json=payload) as stream:
            assert stream.status_code == 200
            gate.wait_held()
            assert usage(server.url, name)["queued_requests"] == 1
            msg = too_many(completion(server.url, key, model=model), "max_queued_requests")
            assert "1 requests queued or running" in msg
        # the stream is closed (the client went away) while the engine still holds the sequence
    eventually(lambda: usage(server.url, name)["queued_requests"] == 0, "the cancelled request's slot is released")
    assert usage(server.url, name)["sequences"] == 0
    gate.opened.set()
    assert completion(server.url, key, model=model).status_code == 200


def test_tokens_per_minute_reserve_then_settle(server, gate, pool) -> None:
    # Every request of this test falls into one one-minute window, 20 s in, wherever the wall clock is.
    window_start = (time.time() // 60) * 60
    server.services.tenant_limits.clock = lambda: window_start + 20.0
    name, key = new_tenant(server.url, tokens_per_minute=100)
    model = model_of(server.url, key)
    with httpx.Client(timeout=120) as client:
        payload = {"model": model, "prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "stream": True}
        with client.stream("POST", f"{server.url}/v1/completions", headers=auth(key), json=payload) as stream:
            assert stream.status_code == 200
            gate.wait_held()
            assert usage(server.url, name)["tokens_this_minute"] == 44  # reserved: 4 prompt + 40 max_tokens
            r = completion(server.url, key, model=model, max_tokens=60)  # 64 more would make 108
            msg = too_many(r, "tokens_per_minute")
            assert "44 tokens" in msg and "asks for 64" in msg and "limit is 100" in msg
            assert int(r.headers["retry-after"]) == 40  # until the window ends
    # Cancelled after at most HOLD_AFTER + 1 generated tokens: the unused part of the 40 comes back.
    eventually(lambda: usage(server.url, name)["tokens_this_minute"] <= 4 + HOLD_AFTER + 1, "unused tokens return")
    spent = usage(server.url, name)["tokens_this_minute"]
    assert spent >= 4
    gate.opened.set()
    assert completion(server.url, key, model=model, max_tokens=60).status_code == 200
    assert usage(server.url, name)["tokens_this_minute"] == spent + 64  # used all it reserved: nothing returned
    r = completion(server.url, key, model=model, max_tokens=200)
    assert r.status_code == 400 and "tokens_per_minute" in error_of(r)["message"]  # could never fit
    server.services.tenant_limits.clock = lambda: window_start + 61.0  # the next window starts afresh
    assert usage(server.url, name)["tokens_this_minute"] == 0
    assert completion(server.url, key, model=model, max_tokens=60).status_code == 200
    assert usage(server.url, name)["tokens_this_minute"] == 64


# --------------------------------------------------------------------------------- across replicas


@pytest.mark.services
def test_limits_are_shared_by_two_apps_on_one_redis(start_server, gate, pool) -> None:
    one, two = start_server("postgres+redis"), start_server("postgres+redis")
    name, key = new_tenant(one.url, max_queued_requests=1, max_concurrent_sequences=2)
    model = model_of(one.url, key)
    held = in_flight(pool, completion, one.url, key, model=model)
    gate.wait_held()
    assert usage(two.url, name)["queued_requests"] == 1
    too_many(completion(two.url, key, model=model), "max_queued_requests")
    gate.opened.set()
    assert held.result(timeout=120).status_code == 200
    assert usage(two.url, name)["queued_requests"] == 0
    assert completion(two.url, key, model=model).status_code == 200


def test_without_redis_each_replica_counts_its_own(start_server, gate, pool) -> None:
    server = start_server("sqlite", redis_url=f"redis://127.0.0.1:{free_port()}/0")  # nobody listens there
    name, key = new_tenant(server.url, max_queued_requests=1)
    model = model_of(server.url, key)
    held = in_flight(pool, completion, server.url, key, model=model)
    gate.wait_held()
    assert usage(server.url, name)["queued_requests"] == 1
    too_many(completion(server.url, key, model=model), "max_queued_requests")
    gate.opened.set()
    assert held.result(timeout=120).status_code == 200
    assert usage(server.url, name)["queued_requests"] == 0
    assert completion(server.url, key, model=model).status_code == 200


# ------------------------------------------------------------------------------- share and priority


def test_weight_and_priority_reach_the_engine(server, gate) -> None:
    gate.opened.set()  # record only
    name, key = new_tenant(server.url, weight=2.5, priority=3)
    tenant_id = httpx.get(f"{server.url}/v1/tenants/{name}", headers=auth(ADMIN_KEY)).json()["id"]
    model = model_of(server.url, key)
    assert completion(server.url, key, model=model, max_tokens=1).status_code == 200
    assert completion(server.url, key, model=model, max_tokens=1, priority=7).status_code == 200
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "priority": 9}
    assert httpx.post(f"{server.url}/v1/chat/completions", headers=auth(key), json=chat).status_code == 200
    ours = [s for s in gate.shares.values() if s.tenant == tenant_id]
    assert sorted(s.priority for s in ours) == [3, 7, 9]
    assert {s.weight for s in ours} == {2.5}
    # A request may not ask for a more urgent class than its tenant's, nor for one out of range.
    r = completion(server.url, key, model=model, max_tokens=1, priority=2)
    assert r.status_code == 400 and error_of(r)["param"] == "priority", r.text
    r = completion(server.url, key, model=model, max_tokens=1, priority=2**31 + 1)
    assert r.status_code == 400 and error_of(r)["param"] == "priority", r.text
    # The server's defaults apply to a tenant that sets nothing: weight 1, priority class 0.
    plain_name, plain = new_tenant(server.url)
    plain_id = httpx.get(f"{server.url}/v1/tenants/{plain_name}", headers=auth(ADMIN_KEY)).json()["id"]
    assert completion(server.url, plain, model=model, max_tokens=1).status_code == 200
    assert [s for s in gate.shares.values() if s.tenant == plain_id] == [Share(plain_id, 1.0, 0)]
    r = completion(server.url, plain, model=model, max_tokens=1, priority=-1)
    assert r.status_code == 400 and error_of(r)["param"] == "priority"


# ------------------------------------------------------------------------- leases of crashed replicas


@pytest.mark.services
async def test_a_crashed_replicas_slots_come_back_and_a_live_ones_stay() -> None:
    """Leases live `ttl` seconds unless their replica refreshes them: a live replica's request keeps its slot
    past the TTL, a replica that stops (crashes) without releasing loses its slots within the TTL."""
    import asyncio

    from loraplex.platform.domain_errors import RateLimited
    from loraplex.platform.storage.redis_link import RedisLink
    from loraplex.platform.tenants.limits import TenantLimits, TenantQuota
    from tests.platform.helpers import REDIS_URL

    tenant, quota, ttl = str(uuid.uuid4()), TenantQuota(max_queued_requests=1), 3.0
    links = [RedisLink(REDIS_URL), RedisLink(REDIS_URL)]
    live, other = TenantLimits(links[0], ttl_s=ttl), TenantLimits(links[1], ttl_s=ttl)
    await live.start()
    try:
        lease = await live.admit(tenant, "t", quota, 1, 10)
        await asyncio.sleep(ttl + 2)  # the heartbeat (every ttl / 3) keeps it
        with pytest.raises(RateLimited) as refused:  # (the app answers it 429 with Retry-After: its HTTP tests)
            await other.admit(tenant, "t", quota, 1, 10)
        assert refused.value.code == "max_queued_requests_exceeded" and refused.value.retry_after_s == 1
        assert (await other.usage(tenant)).queued_requests == 1
        await live.close()  # the replica "crashes": no more heartbeats, no release
        deadline = time.monotonic() + ttl + 15
        while (await other.usage(tenant)).queued_requests:
            assert time.monotonic() < deadline, "the crashed replica's lease never expired"
            await asyncio.sleep(0.1)
        taken = await other.admit(tenant, "t", quota, 1, 10)
        await lease.release(10)  # a late release of the expired lease frees nothing of the new one
        assert (await other.usage(tenant)).queued_requests == 1
        await taken.release(10)
        assert (await other.usage(tenant)).queued_requests == 0
    finally:
        await live.close()
        for link in links:
            await link.close()


def test_limit_settings_from_environment_and_flags(tmp_path) -> None:
    import contextlib
    import io

    from loraplex.platform.cli import build_parser
    from loraplex.platform.settings import Settings, settings_from_args

    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    for flag in (
        "--max-request-sequences",
        "--max-request-tokens",
        "--default-tokens-per-minute",
        "--scheduling-policy",
    ):
        assert flag in help_text.getvalue(), flag
    env = {"LORAPLEX_MAX_REQUEST_SEQUENCES": "100", "LORAPLEX_DEFAULT_MAX_QUEUED_REQUESTS": "7"}
    args = build_parser().parse_args(
        [
            "serve",
            "--default-tokens-per-minute",
            "5000",
            "--default-tenant-weight",
            "0.5",
            "--scheduling-policy",
            "priority",
        ]
    )
    s = settings_from_args(args, {**env, "LORAPLEX_DATA_DIR": str(tmp_path)})
    assert (s.max_request_sequences, s.default_max_queued_requests, s.default_tokens_per_minute) == (100, 7, 5000)
    assert s.default_tenant_weight == 0.5 and s.max_request_tokens == 524_288
    assert s.build_engine_args().scheduling_policy == "priority"
    for bad in ({"default_tenant_weight": 0.0}, {"max_request_sequences": 0}, {"default_tokens_per_minute": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Settings(data_dir=tmp_path, **bad)
