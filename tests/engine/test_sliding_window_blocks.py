"""Sliding-window models free the blocks their window no longer needs (engine.core.block_manager), on a tiny random
Mistral whose every layer slides (window 11, shorter than prompt + output): greedy tokens still equal Hugging
Face, each sequence holds at most the blocks touching its window, and every block returns to the pool."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine import LLMEngine, SamplingParams
from loraplex.engine.core.block_manager import NULL_BLOCK
from loraplex.kernels.backend import torch_backend
from tests.engine.family_models import FAMILY_CONFIGS, make_family_model
from tests.engine.helpers import HFOracle, run_to_completion

W = FAMILY_CONFIGS["mistral"]["sliding_window"]
BS = 4
GREEDY = dict(temperature=0.0, ignore_eos=True)


def bound(n: int) -> int:
    """The most blocks a sequence holds during a step computing n tokens: those touching c - W + 1 .. c + n - 1."""
    return -(-(W + n - 2) // BS) + 1


@pytest.fixture(scope="module")
def mistral(tmp_path_factory, smol_dir):
    d = make_family_model(tmp_path_factory.mktemp("mistral"), smol_dir, "mistral")
    return d, HFOracle(d)


def random_prompts(lengths: list[int], seed: int, prefix: list[int] | None = None) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [(prefix or []) + torch.randint(3, 40000, (n,), generator=g).tolist() for n in lengths]


class HeldBlocks:
    """Wraps the runner: before each forward, every scheduled sequence's held blocks (against the bound when
    ``bounded``)."""

    def __init__(self, eng: LLMEngine, bounded: bool = True) -> None:
        self.eng = eng
        self.bounded = bounded
        self.run = eng.runner.run
        self.max_released = 0
        self.decode_peak = 0
        eng.runner.run = self

    def __call__(self, batch, lora=None):
        bm = self.eng.block_manager
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            held = bm.num_held_blocks(seq)
            assert not self.bounded or held <= bound(n), f"{seq.request_id} holds {held} blocks computing {n} tokens"
            assert seq.block_table[seq.num_released_blocks :].count(NULL_BLOCK) == 0
            self.max_released = max(self.max_released, seq.num_released_blocks)
            if n == 1:
                self.decode_peak = max(self.decode_peak, held)
        return self.run(batch, lora)


def engine(model_dir, **kw) -> LLMEngine:
    args = dict(
        model=str(model_dir), block_size=BS, num_kv_blocks=64, max_num_batched_tokens=8, enable_prefix_caching=True
    )
    args.update(kw)
    return LLMEngine(**args)


@pytest.mark.parametrize("backend", ["default", "torch"])
def test_sliding_window_frees_blocks_and_matches_hf(mistral, backend, monkeypatch):
    """Chunked prefill (8 tokens a step) then decode well past the window; the torch paths gather the released
    entries' stand-in block and mask it, the C / Triton kernels start at the window."""
    model_dir, oracle = mistral
    if backend == "torch":
        monkeypatch.setattr("loraplex.engine.model.runner.select_backend", lambda *a: torch_backend())
    eng = engine(model_dir)
    assert eng.block_manager.sliding_window == W
    assert backend == "default" or eng.runner.backend.name == "torch"
    probe = HeldBlocks(eng)
    ps = random_prompts([30, 23, 37], seed=3)
    arrivals = {i: [(p, SamplingParams(max_tokens=18, **GREEDY), f"r{i}")] for i, p in enumerate(ps)}
    done = run_to_completion(eng, arrivals)  # check_invariants after every step
    for i, p in enumerate(ps):
        assert done[f"r{i}"].token_ids == oracle.greedy_ignore_eos(p, 18), f"request {i}"
    assert probe.max_released >= (37 + 18 - W) // BS - 1  # blocks really were released
    assert probe.decode_peak == bound(1) <= -(-W // BS) + 1
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    eng.close()


def test_shared_prefix_longer_than_the_window_matches_hf(mistral):
    """Two requests share a 40-token prefix (longer than the window): the second hits the prefix cache,
    the first's released blocks included, and still gives Hugging Face's tokens; so does one arriving while
    the first still runs."""
    model_dir, oracle = mistral
    eng = engine(model_dir)
    probe = HeldBlocks(eng)
    shared = random_prompts([40], seed=11)[0]
    ps = random_prompts([5, 9, 6], seed=12, prefix=shared)
    arrivals = {0: [(ps[0], SamplingParams(max_tokens=12, **GREEDY), "a")]}
    arrivals[3] = [(ps[1], SamplingParams(max_tokens=12, **GREEDY), "b")]  # a still in prefill
    arrivals[40] = [(ps[2], SamplingParams(max_tokens=12, **GREEDY), "c")]  # a and b done
    done = run_to_completion(eng, arrivals)
    assert eng.stats().kv_cache.prefix_cache_hits >= 2 * 40 - 2 * BS
    for rid, p in zip("abc", ps):
        assert done[rid].token_ids == oracle.greedy_ignore_eos(p, 12), rid
    assert probe.max_released > 0
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    eng.close()


def test_preemption_and_abort_with_released_blocks(mistral):
    """A cache too small for four sequences' windows preempts; recomputed sequences still give Hugging Face's
    tokens. An aborted sequence's remaining blocks return to the pool."""
    model_dir, oracle = mistral
    eng = engine(model_dir, num_kv_blocks=10, max_num_batched_tokens=16)
    # a lone sequence never holds more than ceil((11 + 16 - 2) / 4) + 1 = 8 blocks: its length is not capped by
    # the cache's 40 tokens, only by the model's positions
    assert eng.max_model_len == 1024
    HeldBlocks(eng)
    ps = random_prompts([22, 19, 23, 20], seed=5)
    arrivals = {0: [(p, SamplingParams(max_tokens=16, **GREEDY), f"r{i}") for i, p in enumerate(ps)]}
    done = run_to_completion(eng, arrivals)
    assert eng.num_preemptions > 0
    for i, p in enumerate(ps):
        assert done[f"r{i}"].token_ids == oracle.greedy_ignore_eos(p, 16), f"request {i}"
    assert eng.block_manager.num_free_blocks == 10

    eng.add_request(ps[0], SamplingParams(max_tokens=16, **GREEDY), "x")
    seq = eng.requests["x"].seq
    while seq.num_released_blocks == 0:
        eng.step()
    eng.abort("x")
    eng.check_invariants()
    assert eng.block_manager.num_free_blocks == 10
    eng.close()


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [
        ("mistral", {"sliding_window": None}),
        ("mistral", {"sliding_window": 4096}),  # no shorter than max_model_len: no layer slides in practice
    ],
)
def test_models_with_a_global_layer_keep_every_block(model_type, overrides, tmp_path, smol_dir):
    """Without a window shorter than max_model_len every layer is global: one group, every block kept. (Models
    that mix sliding and global layers: tests/engine/test_hybrid_kv_groups.py.)"""
    d = make_family_model(tmp_path / model_type, smol_dir, model_type, **overrides)
    eng = LLMEngine(model=str(d), block_size=BS, num_kv_blocks=32, max_model_len=128)
    assert eng.block_manager.sliding_window is None
    probe = HeldBlocks(eng, bounded=False)
    done = run_to_completion(eng, {0: [(list(range(5, 45)), SamplingParams(max_tokens=4, **GREEDY), "r")]})
    assert len(done["r"].token_ids) == 4
    assert probe.max_released == 0 and probe.decode_peak == -(-43 // BS)  # the whole context's blocks
    eng.close()


def test_speculative_drafts_with_released_blocks_match_hf(mistral):
    """n-gram drafts past the window: rejected drafts' tail blocks go back (truncate) while the released head
    stays released; the tokens are still Hugging Face's."""
    model_dir, oracle = mistral
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    eng = engine(model_dir, max_num_batched_tokens=32, speculative_config={**spec, "disable_by_batch_size": 64})
    probe = HeldBlocks(eng)
    cycle = random_prompts([3], seed=8)[0] * 9  # 27 tokens repeating: the proposer always finds a draft
    arrivals = {0: [(cycle, SamplingParams(max_tokens=20, **GREEDY), "s")]}
    done = run_to_completion(eng, arrivals)
    assert done["s"].token_ids == oracle.greedy_ignore_eos(cycle, 20)
    assert eng.stats().spec_decode.num_draft_tokens > 0
    assert probe.max_released >= (27 + 20 - W) // BS - 1
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    eng.close()


def test_released_entries_read_a_reserved_zero_block(mistral, monkeypatch):
    """The torch paths gather the released entries' stand-in and only mask it (0 x NaN would still poison the
    sum), so the stand-in is the runner's own zero block, outside the allocator's range: never a block another
    request holds. The tokens stay Hugging Face's and that block stays zero."""
    import loraplex.engine.model.runner as model_runner

    model_dir, oracle = mistral
    monkeypatch.setattr("loraplex.engine.model.runner.select_backend", lambda *a: torch_backend())
    eng = engine(model_dir)
    runner = eng.runner
    assert runner.null_block == eng.block_manager.num_blocks  # the allocator hands out 0 .. num_blocks - 1
    stand_ins: set[int] = set()
    to_kernel = model_runner._kernel_table

    def spy(table: list[int], null_block: int) -> list[int]:
        out = to_kernel(table, null_block)
        stand_ins.update(o for t, o in zip(table, out) if t == NULL_BLOCK)
        return out

    monkeypatch.setattr(model_runner, "_kernel_table", spy)
    ps = random_prompts([30, 23, 37], seed=5)
    arrivals = {i: [(p, SamplingParams(max_tokens=18, **GREEDY), f"r{i}")] for i, p in enumerate(ps)}
    done = run_to_completion(eng, arrivals)
    assert stand_ins == {runner.null_block}
    for i, p in enumerate(ps):
        assert done[f"r{i}"].token_ids == oracle.greedy_ignore_eos(p, 18), f"request {i}"
    for k, v in runner.kv_caches:
        assert not k[runner.null_block].any() and not v[runner.null_block].any()
    eng.close()
