"""A client that closes its stream aborts the engine requests behind it: they stop where they were and give
their KV blocks back, instead of running to max_tokens for nobody. The platform's own counting (an "abort" in
the metrics, the tenant's slot released) happens either way, so this test watches the engine itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.platform.helpers import EngineGate, create_tenant, engine_gate, eventually

HOLD_AT = 4  # the engine thread is held when a sequence samples its output position HOLD_AT
MAX_TOKENS = 300


@pytest.fixture
def gate(tiny_engine: Any) -> Iterator[EngineGate]:
    with engine_gate(tiny_engine, HOLD_AT) as g:
        yield g


def aborted(url: str, tenant: str) -> float:
    """Requests the platform counted as aborted for ``tenant`` (it counts them after closing their streams)."""
    return sum(
        s.value
        for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
        for s in f.samples
        if s.name == "loraplex_requests_total"
        and s.labels.get("tenant") == tenant
        and s.labels.get("finish_reason") == "abort"
    )


def test_closing_a_stream_aborts_its_engine_requests(start_server, tiny_engine, gate) -> None:
    server = start_server("sqlite")
    key = create_tenant(server.url, "stream-closer")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "a long story"}],
        max_tokens=MAX_TOKENS,
        stream=True,
        n=2,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))
    gate.wait_held()
    stream.close()  # the client hangs up while the engine is held mid-generation
    # The abort is sent when the server's response ends; the engine takes it once released. Both requests were
    # running, so the engine must go idle without either reaching anywhere near max_tokens.
    eventually(lambda: aborted(server.url, "stream-closer") == 2, "the server closed both choices", timeout=60)
    gate.opened.set()
    eventually(
        lambda: not tiny_engine.stats().num_running and not tiny_engine.stats().num_waiting, "the engine idles", 60
    )
    assert len(gate.furthest) == 2, gate.furthest
    assert all(pos <= HOLD_AT + 1 for pos in gate.furthest.values()), gate.furthest
    assert tiny_engine.stats().kv_cache.blocks_used == 0
