"""Models that mix sliding and global layers (tiny random Gemma 2 and Gemma 3) run with one block table per
KV-cache group (engine.core.kv_groups): at every step each sliding group holds only the blocks its window needs
while the global group holds the whole context, and the greedy tokens and logits still equal Hugging Face's
through continuous batching with chunked prefill, prefix caching (a shared prefix longer than the window),
preemption and speculative drafts, on the C kernels and the torch paths."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine import LLMEngine, SamplingParams
from loraplex.engine.core.block_manager import NULL_BLOCK
from loraplex.engine.probe import EngineProbe
from loraplex.kernels.backend import torch_backend
from tests.engine.family_models import make_family_model
from tests.engine.helpers import HFOracle, LogitsRecorder, run_to_completion

BS = 4
GREEDY = dict(temperature=0.0, ignore_eos=True)
LOGITS_ATOL = 1e-3
# Gemma 3 with 6 layers, 4 sliding and 2 global: groups of 2 layers (two share each cache tensor); Gemma 2's
# 3 alternating layers: groups of 1.
MODELS = {
    "gemma2": {},
    "gemma3_text": {
        "num_hidden_layers": 6,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    },
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def hybrid(request, tmp_path_factory, smol_dir):
    model_type = request.param
    d = make_family_model(tmp_path_factory.mktemp(model_type), smol_dir, model_type, **MODELS[model_type])
    return model_type, d, HFOracle(d)


def random_prompts(lengths: list[int], seed: int, prefix: list[int] | None = None) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [(prefix or []) + torch.randint(3, 40000, (n,), generator=g).tolist() for n in lengths]


class GroupProbe:
    """Wraps the runner: before each forward, checks every scheduled sequence's tables against the bounds."""

    def __init__(self, eng: LLMEngine) -> None:
        self.eng = eng
        self.run = eng.runner.run
        self.max_released = 0
        self.sliding_decode_peak = 0
        eng.runner.run = self

    def __call__(self, batch, lora=None):
        bm = self.eng.block_manager
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            c = seq.num_computed_tokens
            assert len(seq.block_tables) == bm.num_groups
            for g, w in enumerate(bm.group_windows):
                held = bm.num_held_blocks(seq, g)
                table = seq.block_tables[g]
                assert NULL_BLOCK not in table[seq.released_blocks[g] :]
                if w is None:
                    assert held == len(table) == -(-(c + n) // BS), f"{seq.request_id} global group {g}"
                else:  # the blocks touching c - W + 1 .. c + n - 1, at most ceil((W + n - 2) / BS) + 1
                    lo = max(c - w + 1, 0)
                    assert held == (c + n - 1) // BS - lo // BS + 1, f"{seq.request_id} group {g} at {c}+{n}"
                    assert held <= -(-(w + n - 2) // BS) + 1
                    if n == 1:
                        assert held <= -(-w // BS) + 1
                        self.sliding_decode_peak = max(self.sliding_decode_peak, held)
                    self.max_released = max(self.max_released, seq.released_blocks[g])
        return self.run(batch, lora)


def engine(model_dir, **kw) -> LLMEngine:
    args = dict(
        model=str(model_dir), block_size=BS, num_kv_blocks=160, max_num_batched_tokens=8, enable_prefix_caching=True
    )
    args.update(kw)
    return LLMEngine(**args)


def window(eng: LLMEngine) -> int:
    (w,) = {w for w in eng.block_manager.group_windows if w is not None}
    return w


@pytest.mark.parametrize("backend", ["default", "torch"])
def test_hybrid_model_frees_sliding_blocks_and_matches_hf(hybrid, backend, monkeypatch):
    """Chunked prefill (8 tokens a step), several requests in one batch, decoding far past the window."""
    model_type, model_dir, oracle = hybrid
    if backend == "torch":
        monkeypatch.setattr("loraplex.engine.model.runner.select_backend", lambda *a: torch_backend())
    eng = engine(model_dir)
    groups = eng.runner.kv_groups
    assert None in groups.windows and len(set(groups.windows)) == 2 and eng.block_manager.sliding_window is None
    if backend == "default" and eng.runner.device.type == "cpu":
        assert eng.runner.backend.name == "cpu-c"
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    probe = GroupProbe(eng)
    ps = random_prompts([30, 23, 37], seed=3)
    arrivals = {i: [(p, SamplingParams(max_tokens=18, **GREEDY), f"r{i}")] for i, p in enumerate(ps)}
    done = run_to_completion(eng, arrivals)  # check_invariants after every step
    for i, p in enumerate(ps):
        assert done[f"r{i}"].token_ids == oracle.greedy_ignore_eos(p, 18), f"{model_type} request {i}"
        torch.testing.assert_close(rec.first[f"r{i}"], oracle.last_logits(p), atol=LOGITS_ATOL, rtol=0)
    w = window(eng)
    assert probe.max_released >= (37 + 18 - w) // BS - 1  # sliding blocks really were released
    assert probe.sliding_decode_peak == -(-(w - 1) // BS) + 1
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    eng.close()


def test_shared_prefix_longer_than_the_window_matches_hf(hybrid):
    """Requests sharing a 40-token prefix hit the cache in every group (the sliding group only for its window)
    and still give Hugging Face's tokens, one arriving while the first is in prefill, one after it ended."""
    model_type, model_dir, oracle = hybrid
    eng = engine(model_dir)
    GroupProbe(eng)
    shared = random_prompts([40], seed=11)[0]
    ps = random_prompts([5, 9, 6], seed=12, prefix=shared)
    arrivals = {0: [(ps[0], SamplingParams(max_tokens=12, **GREEDY), "a")]}
    arrivals[3] = [(ps[1], SamplingParams(max_tokens=12, **GREEDY), "b")]
    arrivals[40] = [(ps[2], SamplingParams(max_tokens=12, **GREEDY), "c")]
    done = run_to_completion(eng, arrivals)
    assert eng.stats().kv_cache.prefix_cache_hits >= 2 * 40 - 2 * BS
    for rid, p in zip("abc", ps):
        assert done[rid].token_ids == oracle.greedy_ignore_eos(p, 12), f"{model_type} {rid}"
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    eng.close()


def test_preemption_recomputes_and_abort_frees_every_group(hybrid):
    """A cache too small for four sequences preempts; recomputed sequences still give Hugging Face's tokens.
    An aborted sequence's blocks return to the pool from every group."""
    model_type, model_dir, oracle = hybrid
    groups = 3  # Gemma 2: 3 groups of 1 layer; Gemma 3 (6 layers): 3 groups of 2
    eng = engine(model_dir, num_kv_blocks=40, max_num_batched_tokens=16)
    assert eng.block_manager.num_groups == groups
    # the global group holds the whole context, each sliding group at most ceil((W + 16 - 2) / 4) + 1 blocks
    w = window(eng)
    assert eng.max_model_len == (40 - 2 * (-(-(w + 14) // BS) + 1)) * BS
    GroupProbe(eng)
    ps = random_prompts([22, 19, 23, 20], seed=5)
    arrivals = {0: [(p, SamplingParams(max_tokens=16, **GREEDY), f"r{i}") for i, p in enumerate(ps)]}
    done = run_to_completion(eng, arrivals)
    assert eng.num_preemptions > 0
    for i, p in enumerate(ps):
        assert done[f"r{i}"].token_ids == oracle.greedy_ignore_eos(p, 16), f"{model_type} request {i}"
    assert eng.block_manager.num_free_blocks == 40

    eng.add_request(ps[0], SamplingParams(max_tokens=16, **GREEDY), "x")
    seq = eng.requests["x"].seq
    while max(seq.released_blocks) == 0:
        eng.step()
    eng.abort("x")
    eng.check_invariants()
    assert eng.block_manager.num_free_blocks == 40
    eng.close()


def test_speculative_drafts_release_per_group_and_match_hf(hybrid):
    """n-gram drafts past the window: rejected drafts' tail blocks go back in every group while the sliding
    groups' released heads stay released; the tokens are still Hugging Face's."""
    _, model_dir, oracle = hybrid
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    eng = engine(model_dir, max_num_batched_tokens=32, speculative_config={**spec, "disable_by_batch_size": 64})
    probe = GroupProbe(eng)
    cycle = random_prompts([3], seed=8)[0] * 9  # 27 tokens repeating: the proposer always finds a draft
    done = run_to_completion(eng, {0: [(cycle, SamplingParams(max_tokens=20, **GREEDY), "s")]})
    assert done["s"].token_ids == oracle.greedy_ignore_eos(cycle, 20)
    assert eng.stats().spec_decode.num_draft_tokens > 0
    assert probe.max_released >= (27 + 20 - window(eng)) // BS - 1
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    eng.close()


def test_sliding_layers_read_their_own_tables(hybrid, monkeypatch):
    """The layers of different groups get different block tables: each layer's attention metadata is its
    group's (checked on the slot mapping of the step's new tokens)."""
    import loraplex.engine.model.llama as llama

    _, model_dir, oracle = hybrid
    eng = engine(model_dir)
    groups = eng.runner.kv_groups
    seen: dict[int, set[tuple[int, ...]]] = {}
    real = llama.attention
    calls = iter(range(10**9))

    def spy(inputs, k, v, meta):
        layer = next(calls) % len(groups.layer_group)
        assert inputs.window == (groups.windows[groups.layer_group[layer]])
        seen.setdefault(groups.layer_group[layer], set()).add(tuple(meta.slot_mapping.tolist()))
        return real(inputs, k, v, meta)

    monkeypatch.setattr(llama, "attention", spy)
    p = random_prompts([20], seed=1)[0]
    done = run_to_completion(eng, {0: [(p, SamplingParams(max_tokens=3, **GREEDY), "r")]})
    assert done["r"].token_ids == oracle.greedy_ignore_eos(p, 3)
    slots = [seen[g] for g in range(groups.num_groups)]
    assert all(a.isdisjoint(b) for i, a in enumerate(slots) for b in slots[i + 1 :])  # distinct blocks per group
    eng.close()


def test_triton_kernel_reads_each_groups_tables(hybrid, monkeypatch):
    """The Triton paged-attention kernel (interpreted on the CPU, compiled on a GPU) through the engine: a
    chunked prompt and a decode past the window, the sliding groups' released entries included."""
    from loraplex.kernels.backend import triton_backend

    _, model_dir, oracle = hybrid
    monkeypatch.setattr("loraplex.engine.model.runner.select_backend", lambda *a: triton_backend())
    eng = engine(model_dir)
    assert eng.runner.backend.name == "triton"
    probe = GroupProbe(eng)
    p = random_prompts([21], seed=4)[0]
    done = run_to_completion(eng, {0: [(p, SamplingParams(max_tokens=10, **GREEDY), "t")]})
    assert done["t"].token_ids == oracle.greedy_ignore_eos(p, 10)
    assert probe.max_released >= (21 + 10 - window(eng)) // BS - 1 > 0
    eng.close()


def test_cache_budget_is_shared_by_the_groups(hybrid):
    """A block id holds one group's layers, so a byte budget buys num_layers / layers_per_group times as many
    ids as one table for all layers would; a budget below one id per group is refused by name."""
    _, model_dir, _ = hybrid
    eng = engine(model_dir, num_kv_blocks=None, kv_cache_bytes=3 << 20)
    runner = eng.runner
    k, _ = runner.kv_slots[0]
    per_layer_block = 2 * k[0].numel() * k.element_size()  # K and V of one block of one layer
    layers = runner.kv_groups.layers_per_group
    assert len(runner.kv_slots) == layers < runner.shape.num_layers
    assert runner.num_blocks == (3 << 20) // (per_layer_block * layers)
    assert len({id(c) for c in runner.kv_caches}) == layers  # the i-th layer of every group shares a tensor
    eng.close()
    with pytest.raises(ValueError, match="needs one in each of the model's 3 KV-cache groups"):
        engine(model_dir, num_kv_blocks=2)
