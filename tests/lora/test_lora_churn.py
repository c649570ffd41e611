"""Eviction churn on a tiny random Llama: 40 adapters through 4 device slots and 8 host slots, requests for
them interleaved with base requests; every output matches peft with that adapter alone."""

from __future__ import annotations

import random

import torch

from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
from tests.engine.helpers import TINY_LOGITS_ATOL, LogitsRecorder
from tests.lora.helpers import assert_no_leaks, drive

NUM_ADAPTERS = 40


def test_forty_adapters_through_four_slots(tiny_llama_dir, tiny_adapters):
    dirs, oracle = tiny_adapters
    eng = LLMEngine(
        model=str(tiny_llama_dir),
        max_loras=4,
        max_cpu_loras=8,
        max_lora_rank=8,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        num_kv_blocks=96,
        block_size=8,
    )
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    refs = {name: eng.add_adapter(str(path)) for name, path in dirs.items()}
    g = torch.Generator().manual_seed(7)
    shared = torch.randint(3, 40000, (19,), generator=g).tolist()
    rng = random.Random(3)
    # two passes over all adapters in different orders, one base request every fourth
    order = rng.sample(range(NUM_ADAPTERS), NUM_ADAPTERS) + rng.sample(range(NUM_ADAPTERS), NUM_ADAPTERS)
    jobs: list[tuple[str | None, list[int], int]] = []
    for k, i in enumerate(order):
        tail = torch.randint(3, 40000, (int(torch.randint(2, 24, (1,), generator=g)),), generator=g).tolist()
        jobs.append((f"a{i}", shared + tail if k % 2 else tail, 4 + k % 5))
        if k % 4 == 0:
            jobs.append((None, shared + tail[:3], 6))
    arrivals: dict[int, list[dict]] = {}
    for j, (name, prompt, n) in enumerate(jobs):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        arrivals.setdefault(j // 3, []).append(
            dict(prompt_token_ids=prompt, params=params, request_id=f"j{j}", adapter=refs[name] if name else None)
        )
    widest = []
    run = eng.runner.run

    def spy(batch, lora=None):
        widest.append(len({s.adapter_hash for s in batch.seqs if s.adapter_hash}))
        return run(batch, lora=lora)

    eng.runner.run = spy
    done = drive(eng, arrivals)

    assert len(done) == len(jobs) and max(widest) <= 4
    for j, (name, prompt, n) in enumerate(jobs):
        out = done[f"j{j}"]
        assert out.error is None and out.finish_reason == "length"
        assert out.token_ids == oracle.greedy(name, prompt, n, None), f"request {j} ({name})"
        diff = (rec.first[f"j{j}"] - oracle.last_logits(name, prompt)).abs().max().item()
        assert diff < TINY_LOGITS_ATOL, f"request {j} ({name}): last-position logits differ by {diff}"
    stats = eng.stats()
    assert stats.lora.evictions > NUM_ADAPTERS and stats.lora.cpu_evictions > NUM_ADAPTERS
    assert stats.lora.disk_loads > NUM_ADAPTERS  # second pass had to reload from disk
    assert stats.lora.load_failures == 0 and len(stats.lora.resident_adapters) == 4
    assert_no_leaks(eng)
