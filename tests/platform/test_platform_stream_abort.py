"""A client that closes its stream aborts the engine requests behind it: they stop where they were and give
their KV blocks back, instead of running to max_tokens for nobody. The platform's own counting (an "abort" in
the metrics, the tenant's slot released) happens either way, so this test watches the engine itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loraplex.engine.probe import EngineProbe
from tests.platform.helpers import create_tenant

HOLD_AT = 4  # the engine thread is held when a sequence samples its output position HOLD_AT
MAX_TOKENS = 300


class PositionRecorder:
    """Records each request's furthest output position; holds the engine thread at HOLD_AT until released
    (while held, the engine takes no message, so an abort sent meanwhile is the first thing it sees after)."""

    def __init__(self) -> None:
        self.furthest: dict[str, int] = {}
        self.held = threading.Event()
        self.released = threading.Event()

    def on_logits(self, request_ids: list[str], positions: list[int], _logits: Any) -> None:
        for rid, pos in zip(request_ids, positions):
            self.furthest[rid] = max(pos, self.furthest.get(rid, -1))
        if any(p >= HOLD_AT for p in positions) and not self.released.is_set():
            self.held.set()
            self.released.wait(timeout=120)  # liveness bound: a failing test never hangs the suite


@pytest.fixture
def recorder(tiny_engine: Any) -> Iterator[PositionRecorder]:
    rec = PositionRecorder()
    tiny_engine.engine.probe = EngineProbe(on_logits=rec.on_logits)
    try:
        yield rec
    finally:
        rec.released.set()
        tiny_engine.engine.probe = None


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


def wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def test_closing_a_stream_aborts_its_engine_requests(start_server, tiny_engine, recorder) -> None:
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
    assert recorder.held.wait(timeout=60), "the engine never reached the held position"
    stream.close()  # the client hangs up while the engine is held mid-generation
    # The abort is sent when the server's response ends; the engine takes it once released. Both requests were
    # running, so the engine must go idle without either reaching anywhere near max_tokens.
    wait_for(lambda: aborted(server.url, "stream-closer") == 2, "the server closed both choices")
    recorder.released.set()
    wait_for(lambda: not tiny_engine.stats().num_running and not tiny_engine.stats().num_waiting, "the engine idles")
    assert len(recorder.furthest) == 2, recorder.furthest
    assert all(pos <= HOLD_AT + 1 for pos in recorder.furthest.values()), recorder.furthest
    assert tiny_engine.stats().kv_cache.blocks_used == 0
