"""Engine behaviour on a tiny random Llama (fast): HF parity, continuous batching, preemption, aborts."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
from tests.engine.helpers import TINY_LOGITS_ATOL, HFOracle, LogitsRecorder, run_to_completion

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def oracle(tiny_llama_dir):
    return HFOracle(tiny_llama_dir)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 40000, (37,), generator=g).tolist()
    out = []
    for i in range(n):
        length = int(torch.randint(1, 60, (1,), generator=g))
        tail = torch.randint(3, 40000, (length,), generator=g).tolist()
        out.append(shared + tail if i % 3 == 0 else tail)
    return out


def test_staggered_chunked_batch_matches_hf(tiny_llama_dir, oracle):
    eng = LLMEngine(
        model=str(tiny_llama_dir),
        max_num_batched_tokens=48,
        max_num_seqs=6,
        num_kv_blocks=200,
        block_size=8,
        enable_prefix_caching=True,
    )
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    ps = prompts(14)
    arrivals = {}
    for i, p in enumerate(ps):
        arrivals.setdefault(i * 2, []).append((p, SamplingParams(max_tokens=6 + i % 5, **GREEDY), f"r{i}"))
    done = run_to_completion(eng, arrivals)
    assert len(done) == len(ps)
    for i, p in enumerate(ps):
        out = done[f"r{i}"]
        assert out.token_ids == oracle.greedy(p, len(out.token_ids)), f"request {i}"
        torch.testing.assert_close(rec.first[f"r{i}"], oracle.last_logits(p), atol=TINY_LOGITS_ATOL, rtol=1e-4)
    assert eng.stats().kv_cache.prefix_cache_hits > 0
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_preemption_gives_the_same_greedy_output(tiny_llama_dir):
    ps = prompts(8, seed=1)
    params = [SamplingParams(max_tokens=30, **GREEDY) for _ in ps]
    roomy = LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=400, block_size=8)
    ref = run_to_completion(roomy, {0: [(p, sp, f"r{i}") for i, (p, sp) in enumerate(zip(ps, params))]})
    tight = LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=24, block_size=8, max_num_batched_tokens=64)
    got = run_to_completion(tight, {0: [(p, sp, f"r{i}") for i, (p, sp) in enumerate(zip(ps, params))]})
    assert tight.num_preemptions > 0
    for rid in ref:
        assert got[rid].token_ids == ref[rid].token_ids, rid
    tight.check_invariants()
    assert tight.block_manager.num_free_blocks == 24


def test_abort_frees_blocks_and_others_continue(tiny_llama_dir):
    eng = LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=100, block_size=8)
    ps = prompts(4, seed=2)
    for i, p in enumerate(ps):
        eng.add_request(p, SamplingParams(max_tokens=20, **GREEDY), f"r{i}")
    eng.step()
    eng.step()
    out = eng.abort("r1")
    assert out.finish_reason == "abort"
    eng.check_invariants()
    done = run_to_completion(eng, {})
    assert set(done) == {"r0", "r2", "r3"}
    assert all(len(o.token_ids) == 20 for o in done.values())
    assert eng.block_manager.num_free_blocks == 100


def test_seeded_sampling_is_independent_of_the_batch(tiny_llama_dir):
    eng = LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=200, block_size=8)
    p = prompts(1, seed=3)[0]
    sp = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True)
    alone = run_to_completion(eng, {0: [(p, sp, "alone")]})["alone"].token_ids
    others = [
        (q, SamplingParams(max_tokens=9, temperature=0.8, ignore_eos=True), f"o{i}")
        for i, q in enumerate(prompts(5, seed=4))
    ]
    batched = run_to_completion(eng, {0: others + [(p, sp, "again")]})["again"].token_ids
    assert alone == batched
    other_seed = run_to_completion(
        eng, {0: [(p, SamplingParams(max_tokens=12, temperature=1.0, seed=8, ignore_eos=True), "x")]}
    )["x"].token_ids
    assert other_seed != alone


def test_max_num_seqs_and_budget_are_respected(tiny_llama_dir):
    eng = LLMEngine(
        model=str(tiny_llama_dir), num_kv_blocks=300, block_size=8, max_num_seqs=3, max_num_batched_tokens=20
    )
    for i, p in enumerate(prompts(7, seed=5)):
        eng.add_request(p, SamplingParams(max_tokens=5, **GREEDY), f"r{i}")
    finished = 0
    while eng.has_unfinished():
        outs = eng.step()
        assert eng.last_step.num_tokens <= 20
        assert eng.scheduler.num_running() <= 3
        finished += sum(o.finished for o in outs)
    assert finished == 7
