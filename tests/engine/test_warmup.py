"""Start-up warm-up on a real AsyncEngine (tiny random Llama): it runs every concurrency from 1 to
max_num_seqs, compiles a grammar, leaves nothing behind, and stops at its budget (held by a probe)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from loraplex.engine import AsyncEngine, EngineProbe
from loraplex.engine.warmup import warm_up

MAX_NUM_SEQS = 6


def _engine(tiny_llama_dir: Path) -> AsyncEngine:
    return AsyncEngine(model=str(tiny_llama_dir), num_kv_blocks=512, block_size=8, max_num_seqs=MAX_NUM_SEQS)


def _idle(engine: AsyncEngine) -> bool:
    deadline = time.monotonic() + 60
    while engine.stats().num_running or engine.stats().num_waiting:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_warm_up_runs_every_batch_width_and_a_grammar(tiny_llama_dir: Path) -> None:
    engine = _engine(tiny_llama_dir)
    widths: set[int] = set()
    engine.engine.probe = EngineProbe(on_logits=lambda ids, _pos, _logits: widths.add(len(ids)))
    try:
        report = asyncio.run(warm_up(engine, budget_s=600))  # a liveness bound, not a speed expectation
        assert report.finished and report.waves == 4  # concurrencies 1, 2, 4, 6
        assert report.requests == 1 + 2 + 4 + MAX_NUM_SEQS + 1  # the waves and one JSON-schema request
        assert MAX_NUM_SEQS in widths  # the widest decode step real traffic can produce was run
        assert _idle(engine)
        assert engine.stats().grammar.compiles >= 1
    finally:
        engine.engine.probe = None
        engine.shutdown()


def test_warm_up_stops_at_its_budget_and_aborts_what_is_left(tiny_llama_dir: Path) -> None:
    engine = _engine(tiny_llama_dir)
    release = threading.Event()

    def hold(_ids: list[str], _pos: list[int], _logits: Any) -> None:
        release.wait(timeout=120)  # the first wave cannot finish until released

    engine.engine.probe = EngineProbe(on_logits=hold)
    try:

        async def run() -> Any:
            task = asyncio.create_task(warm_up(engine, budget_s=0.5))
            report = await task
            release.set()
            return report

        report = asyncio.run(run())
        assert not report.finished and report.waves == 0 and report.requests == 0
        engine.engine.probe = None
        assert _idle(engine)  # the aborted requests left the engine
    finally:
        release.set()
        engine.engine.probe = None
        engine.shutdown()
    assert asyncio.run(warm_up(engine, budget_s=0)).requests == 0  # 0: no warm-up at all
