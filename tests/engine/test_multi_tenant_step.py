"""The multi-tenant step cap (EngineArgs.multi_tenant_step_ms) on a real engine (tiny random Llama): the budget
shrinks only while two tenants are live, and outputs stay those of Hugging Face greedy decoding."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine import EngineArgs, LLMEngine, SamplingParams, Share
from tests.engine.helpers import HFOracle

GREEDY = dict(temperature=0.0, ignore_eos=True)


def test_bad_values_are_refused_by_name():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="multi_tenant_step_ms"):
            EngineArgs(multi_tenant_step_ms=bad)


def test_defaults_cut_on_cpu_only_and_zero_switches_it_off():
    assert EngineArgs().resolved_multi_tenant_step_s(torch.device("cpu")) == pytest.approx(0.12)
    assert EngineArgs().resolved_multi_tenant_step_s(torch.device("cuda")) is None
    assert EngineArgs(multi_tenant_step_ms=0).resolved_multi_tenant_step_s(torch.device("cpu")) is None
    assert EngineArgs(multi_tenant_step_ms=50).resolved_multi_tenant_step_s(torch.device("cuda")) == 0.05


def _floor_capped_engine(tiny_llama_dir) -> LLMEngine:
    """A step target far below any real step: when the cut applies it falls to its floor, running sequences +
    one block."""
    return LLMEngine(
        model=str(tiny_llama_dir),
        max_num_batched_tokens=256,
        num_kv_blocks=200,
        block_size=8,
        multi_tenant_step_ms=1e-6,
        scheduling_policy="fair",
    )


def test_two_live_tenants_get_small_steps_with_unchanged_outputs(tiny_llama_dir):
    eng = _floor_capped_engine(tiny_llama_dir)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 40000, (n,), generator=g).tolist() for n in (200, 50, 45)]
    eng.add_request(prompts[0], SamplingParams(max_tokens=12, **GREEDY), "a0", share=Share("A"))
    eng.step()  # alone: the whole budget
    assert eng.last_step.num_tokens == 200 and eng.scheduler.token_cap.value == 1
    eng.add_request(prompts[1], SamplingParams(max_tokens=12, **GREEDY), "b0", share=Share("B"))
    eng.add_request(prompts[2], SamplingParams(max_tokens=12, **GREEDY), "a1", share=Share("A"))
    outputs: dict[str, list[int]] = {}
    sizes = []
    while eng.has_unfinished():
        running = len(eng.scheduler.running)
        live = len(list(eng.scheduler.waiting.live_tenants()))
        for out in eng.step():
            if out.finished:
                outputs[out.request_id] = out.token_ids
        sizes.append((live, running, eng.last_step.num_tokens))
    assert any(live > 1 for live, _, _ in sizes)
    for live, running, tokens in sizes:
        if live > 1:
            assert tokens <= max(1, running + 8) + 1, sizes  # +1: a sequence admitted this step
    oracle = HFOracle(tiny_llama_dir)
    for rid, prompt in zip(("a0", "b0", "a1"), prompts):
        assert outputs[rid] == oracle.greedy(prompt, 12), rid
    eng.check_invariants()


def test_internal_work_beside_one_tenant_does_not_cut_steps(tiny_llama_dir):
    """Requests without a tenant (the server's start-up warm-up) are no tenant: one tenant's work right after
    them keeps the whole budget (a batch job after start-up was admitted one sequence per step before)."""
    eng = _floor_capped_engine(tiny_llama_dir)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 40000, (n,), generator=g).tolist() for n in (200, 60, 60, 60)]
    eng.add_request(prompts[0], SamplingParams(max_tokens=2, **GREEDY), "warm-up")  # the default share
    while eng.has_unfinished():
        eng.step()
    assert eng.scheduler.token_cap.value == 1  # the cut would fall to its floor if it applied
    for i, prompt in enumerate(prompts[1:]):
        eng.add_request(prompt, SamplingParams(max_tokens=4, **GREEDY), f"t{i}", share=Share("T"))
    eng.step()
    assert eng.last_step.num_tokens == 180  # all three prompts in one step, as with no cut
    while eng.has_unfinished():
        eng.step()
    eng.check_invariants()
