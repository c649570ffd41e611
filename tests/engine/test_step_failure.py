"""A model step that raises fails the requests in that step and nothing else: the engine thread goes on,
the waiting requests finish with the right tokens, and every KV block comes back."""

from __future__ import annotations

import asyncio
import time

from loraplex.engine import AsyncEngine, LLMEngine, SamplingParams
from tests.engine.helpers import HFOracle

VICTIM, BYSTANDER = [412, 9013, 77, 2044], [318, 5001, 12]


def fail_next_step(engine: LLMEngine) -> None:
    """The next forward raises once (as a kernel or an out-of-memory error would); later ones run normally."""
    run = engine.runner.run

    def broken(batch, lora=None):
        engine.runner.run = run
        raise RuntimeError("injected step failure")

    engine.runner.run = broken


async def _wait_until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.01)


async def test_a_failing_step_fails_its_requests_only(tiny_llama_dir):
    engine = AsyncEngine(model=str(tiny_llama_dir), num_kv_blocks=64, block_size=8, max_num_seqs=1)
    oracle = HFOracle(tiny_llama_dir)
    greedy = dict(temperature=0.0, ignore_eos=True)
    try:
        victim = engine.generate(VICTIM, SamplingParams(max_tokens=40, **greedy), request_id="victim")
        first = await victim.__anext__()  # the victim runs; with max_num_seqs=1 the bystander must wait
        assert first.finish_reason is None

        async def bystander_tokens() -> list[int]:
            tokens: list[int] = []
            async for out in engine.generate(BYSTANDER, SamplingParams(max_tokens=6, **greedy), request_id="by"):
                tokens = out.token_ids
                assert out.finish_reason in (None, "length"), out.error
            return tokens

        bystander = asyncio.create_task(bystander_tokens())
        await _wait_until(lambda: engine.stats().num_waiting == 1, "the bystander waits")
        fail_next_step(engine.engine)
        outs = [o async for o in victim]
        assert outs[-1].finish_reason == "error" and "injected step failure" in outs[-1].error
        assert await bystander == oracle.greedy_ignore_eos(BYSTANDER, 6)
        assert engine.is_alive()
        await _wait_until(lambda: engine.stats().num_running == 0, "the engine is idle")
        assert engine.stats().kv_cache.blocks_used == 0
        # the engine keeps serving: a new request after the failure gets the model's tokens
        again = [o async for o in engine.generate(VICTIM, SamplingParams(max_tokens=5, **greedy))][-1]
        assert again.token_ids == oracle.greedy_ignore_eos(VICTIM, 5)
    finally:
        engine.shutdown()
