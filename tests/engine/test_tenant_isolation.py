"""One tenant cannot stall or poison another on the real engine: a flood of one tenant's requests does not
delay a later tenant's request behind it (fair scheduling), and a request whose logits turn non-finite fails
alone, with an error, while the rest of its step samples as usual."""

from __future__ import annotations

import asyncio

import pytest
import torch

from loraplex.engine import AsyncEngine, LLMEngine, SamplingParams, Share
from tests.engine.helpers import HFOracle

GREEDY = dict(temperature=0.0, ignore_eos=True)


async def _finish_order(policy: str, tiny_llama_dir) -> list[str]:
    """Tenant A queues 60 requests, then tenant B one; the order in which requests finish."""
    engine = AsyncEngine(
        model=str(tiny_llama_dir), num_kv_blocks=256, block_size=8, max_num_seqs=4, scheduling_policy=policy
    )
    order: list[str] = []

    async def run(rid: str, tenant: str) -> None:
        prompt = [100 + int(rid.split("-")[1]), 7, 8, 9]
        async for out in engine.generate(
            prompt, SamplingParams(max_tokens=8, **GREEDY), request_id=rid, share=Share(tenant)
        ):
            if out.finished:
                assert out.finish_reason == "length", out.error
                order.append(rid)

    try:
        flood = [asyncio.create_task(run(f"A-{i}", "A")) for i in range(60)]
        while engine.stats().num_running == 0:  # the flood is queued and running before B arrives
            await asyncio.sleep(0.005)
        await run("B-0", "B")
        await asyncio.gather(*flood)
    finally:
        engine.shutdown()
    return order


@pytest.mark.parametrize("policy", ["fair", "fcfs"])
async def test_a_flood_does_not_stall_a_later_tenant_under_fair(policy, tiny_llama_dir):
    order = await _finish_order(policy, tiny_llama_dir)
    ahead = order.index("B-0")
    if policy == "fair":
        assert ahead <= 8  # those running when B arrived, and those admitted beside it
    else:
        assert ahead >= 50  # fcfs: B waits behind the flood (what fair scheduling fixes)


def poison_logits_of(engine: LLMEngine, request_id: str) -> None:
    """Fault injection: the step's logits row of ``request_id`` becomes NaN (what an adapter whose arithmetic
    overflows produces); every other row is left as the model computed it."""
    run = engine.runner.run

    def poisoned(batch, lora=None):
        result = run(batch, lora=lora)
        for r, i in enumerate(result.sample_idx):
            if batch.seqs[i].request_id == request_id:
                result.logits[r] = torch.nan
        return result

    engine.runner.run = poisoned


async def test_non_finite_logits_fail_only_their_request(tiny_llama_dir):
    engine = AsyncEngine(model=str(tiny_llama_dir), num_kv_blocks=64, block_size=8)
    oracle = HFOracle(tiny_llama_dir)
    victim_prompt, bystander_prompt = [412, 9013, 77, 2044], [318, 5001, 12]
    try:
        poison_logits_of(engine.engine, "victim")
        victim = engine.generate(victim_prompt, SamplingParams(max_tokens=6, **GREEDY), request_id="victim")
        bystander = engine.generate(bystander_prompt, SamplingParams(max_tokens=6, **GREEDY), request_id="by")
        victim_outs, bystander_outs = await asyncio.gather(_collect(victim), _collect(bystander))
        assert victim_outs[-1].finish_reason == "error"
        assert "non-finite logits" in victim_outs[-1].error and victim_outs[-1].token_ids == []
        assert bystander_outs[-1].finish_reason == "length"
        assert bystander_outs[-1].token_ids == oracle.greedy_ignore_eos(bystander_prompt, 6)
        assert engine.is_alive() and engine.stats().kv_cache.blocks_used == 0
    finally:
        engine.shutdown()


async def _collect(stream) -> list:
    return [out async for out in stream]
