"""N-gram speculation on the tiny random Llama: drafts verified one position after another keep the output
distribution exact (chi-square against the softmax transformers gives), greedy outputs equal plain decoding
also when sequences are preempted mid-speculation, rejected drafts give their KV blocks back, prefix-cache
hashes cover accepted tokens only, and the fair policy charges accepted tokens only.

The prompts cycle through three tokens and ``logit_bias`` lifts those three far above the rest, so the
n-gram drafts (the token that followed the last occurrence) are among the likely ones: accepted about a
third of the time, rejected otherwise, and both paths are exercised."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from loraplex.engine import LLMEngine, SamplingParams
from loraplex.engine.core.request_queue import OUTPUT_COST, PROMPT_COST
from loraplex.engine.core.share import Share
from loraplex.engine.spec.speculative import SpeculativeConfig, ngram_propose
from tests.conftest import make_tiny_llama

A, B, C = 100, 200, 300
CYCLE = [A, B, C] * 8
BIAS = {A: 30.0, B: 30.0, C: 30.0}  # far above any raw logit of this model: these three are always the top 3
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
    "disable_by_batch_size": 64,  # these tests speculate at every batch size
}
DRAWS = 5000
# The 0.9999 quantile of chi-square with 26 degrees of freedom (27 cells), by the Wilson-Hilferty
# approximation: a correct sampler exceeds it once in 10^4 runs; the seeds are fixed, so every run is the same.
CHI2_26_LIMIT = 26 * (1 - 2 / (9 * 26) + 3.719 * math.sqrt(2 / (9 * 26))) ** 3


@pytest.fixture(scope="module")
def small_vocab_dir(tmp_path_factory, smol_dir) -> Path:
    """The tiny random Llama with 512 tokens: 5000 sampled requests cost seconds, not minutes."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-512"), smol_dir, vocab=512)


def _engine(small_vocab_dir, **kw) -> LLMEngine:
    args = dict(model=str(small_vocab_dir), max_num_seqs=512, max_num_batched_tokens=8192, num_kv_blocks=2048)
    args.update(kw)
    return LLMEngine(**args)


def _run(
    engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]], on_step=None, share: Share | None = None
) -> dict[str, list[int]]:
    extra = {"share": share} if share is not None else {}
    ids = [engine.add_request(prompt, params, **extra) for prompt, params in requests]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                assert out.error is None, out.error
                done[out.request_id] = out.token_ids
        if on_step is not None:
            on_step(engine)
    return {i: done[i] for i in ids}


def test_config_follows_vllm_and_refuses_by_name():
    cfg = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max, cfg.num_speculative_tokens) == (5, 5, 4)
    cfg = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}')
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (3, 3)
    assert SpeculativeConfig.parse(None) is None
    with pytest.raises(ValueError, match="method must be 'ngram'"):
        SpeculativeConfig.parse({"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="unsupported key 'model'"):
        SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2, "model": "x"})
    with pytest.raises(ValueError, match="num_speculative_tokens must be a positive integer"):
        SpeculativeConfig.parse({"method": "ngram"})
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig.parse(
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}
        )
    with pytest.raises(ValueError, match="JSON object"):
        SpeculativeConfig.parse("{not json")


def test_ngram_proposes_what_followed_the_first_longest_match():
    ctx = [5, 6, 7, 8, 9, 5, 6, 1, 2, 5, 6]
    # suffix [5, 6] occurs at 0 and 5 (its own end excluded): the first is followed by 7, 8, 9
    assert ngram_propose(ctx, 1, 2, 3) == [7, 8, 9]
    # the 3-gram [2, 5, 6] never occurred before: the 2-gram is used
    assert ngram_propose(ctx, 2, 3, 2) == [7, 8]
    assert ngram_propose(ctx, 3, 3, 2) == []
    assert ngram_propose([1, 2, 3], 1, 2, 4) == []
    assert ngram_propose([4, 4, 4, 4], 2, 2, 5) == [4, 4]  # overlapping the suffix: what follows, up to the end


def _top3_probs(model, context: list[int]) -> dict[int, float]:
    with torch.no_grad():
        logits = model(torch.tensor([context])).logits[0, -1].double()
    for t, b in BIAS.items():
        logits[t] += b
    vals, idx = logits.topk(3)
    return dict(zip(idx.tolist(), torch.softmax(vals, -1).tolist()))


def test_seeded_sampling_keeps_the_distribution_exact(small_vocab_dir):
    """5000 seeded requests of three tokens (top_k 3): every second and third token is verified against a draft,
    and the 27 joint frequencies match transformers' softmax by a chi-square test."""
    model = AutoModelForCausalLM.from_pretrained(str(small_vocab_dir), dtype=torch.float64).eval()
    expected: dict[tuple[int, ...], float] = {}
    first = _top3_probs(model, CYCLE)
    for x1, p1 in first.items():
        for x2, p2 in _top3_probs(model, [*CYCLE, x1]).items():
            for x3, p3 in _top3_probs(model, [*CYCLE, x1, x2]).items():
                expected[(x1, x2, x3)] = p1 * p2 * p3
    assert len(expected) == 27 and abs(sum(expected.values()) - 1) < 1e-9
    eng = _engine(small_vocab_dir, speculative_config={**NGRAM, "disable_by_batch_size": DRAWS})
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=3, seed=i, logit_bias=BIAS) for i in range(DRAWS)]
    outs = _run(eng, [(CYCLE, p) for p in params])
    counts = Counter(tuple(t) for t in outs.values())
    assert set(counts) <= set(expected)
    chi2 = sum((counts.get(cell, 0) - DRAWS * p) ** 2 / (DRAWS * p) for cell, p in expected.items())
    stats = eng.stats()
    assert stats.spec_decode.num_draft_tokens >= DRAWS  # every request verified drafts
    assert 0 < stats.spec_decode.num_accepted_tokens < stats.spec_decode.num_draft_tokens
    assert chi2 < CHI2_26_LIMIT, (chi2, counts)
    eng.close()


def _greedy_requests(n: int, max_tokens: int) -> list[tuple[list[int], SamplingParams]]:
    out = []
    for i in range(n):
        prompt = [7 + i, *CYCLE[i % 3 :], 11 + i, *CYCLE]
        out.append((prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, logit_bias=BIAS)))
    return out


def test_rejected_drafts_release_blocks_and_only_accepted_tokens_are_hashed(small_vocab_dir):
    plain = _run(_engine(small_vocab_dir, num_kv_blocks=256), _greedy_requests(6, 40))
    eng = _engine(small_vocab_dir, num_kv_blocks=256, block_size=4, speculative_config=NGRAM)
    bs = 4

    def check(engine: LLMEngine) -> None:
        engine.check_invariants()
        for seq in engine.scheduler.running:
            assert seq.spec_token_ids == []
            # blocks hold exactly the computed (accepted) tokens: nothing left over from rejected drafts
            assert len(seq.block_table) == -(-seq.num_computed_tokens // bs)
            assert len(seq.block_hashes) == seq.num_computed_tokens // bs

    spec = _run(eng, _greedy_requests(6, 40), on_step=check)
    assert list(spec.values()) == list(plain.values())
    stats = eng.stats()
    assert 0 < stats.spec_decode.num_accepted_tokens < stats.spec_decode.num_draft_tokens
    # A new request whose prompt is an earlier request's prompt + output finds its blocks in the prefix cache:
    # the hashes registered were those of the tokens actually taken.
    prompt, _ = _greedy_requests(6, 40)[0]
    again = prompt + next(iter(plain.values()))
    before = eng.block_manager.hit_tokens
    eng.add_request(again, SamplingParams(max_tokens=1, temperature=0.0), request_id="again")
    while eng.has_unfinished():
        eng.step()
    assert eng.block_manager.hit_tokens - before == ((len(again) - 1) // bs) * bs
    eng.close()


def test_preemption_mid_speculation_recomputes_the_same_outputs(small_vocab_dir):
    requests = _greedy_requests(4, 40)
    plain = _run(_engine(small_vocab_dir, num_kv_blocks=48, block_size=4), requests)
    eng = _engine(small_vocab_dir, num_kv_blocks=48, block_size=4, speculative_config=NGRAM)
    preempted_with_drafts = []
    original = eng.scheduler._preempt

    def preempt(seq, batch):  # observe only: a sequence that speculated loses its blocks, or drafts are scheduled
        preempted_with_drafts.append(seq.num_draft_tokens > 0 or any(s.spec_token_ids for s in batch.seqs))
        original(seq, batch)

    eng.scheduler._preempt = preempt
    spec = _run(eng, requests, on_step=lambda e: e.check_invariants())
    assert list(spec.values()) == list(plain.values())
    assert eng.num_preemptions > 0 and any(preempted_with_drafts)
    assert eng.stats().spec_decode.num_accepted_tokens > 0
    eng.close()


def test_fair_policy_charges_accepted_tokens_only(small_vocab_dir):
    eng = _engine(small_vocab_dir, speculative_config=NGRAM, scheduling_policy="fair")
    prompt, params = _greedy_requests(1, 30)[0]

    def charged_so_far(engine: LLMEngine) -> None:  # after every step: exactly the tokens whose K/V was kept
        for seq in engine.scheduler.running:
            done = seq.num_computed_tokens
            prompt_part = min(done, len(prompt))
            cost = (PROMPT_COST * prompt_part + OUTPUT_COST * (done - prompt_part)) / 2.0
            assert engine.scheduler.waiting.counters["t"] == pytest.approx(cost)

    (tokens,) = _run(eng, [(prompt, params)], on_step=charged_so_far, share=Share(tenant="t", weight=2.0)).values()
    stats = eng.stats()
    assert stats.spec_decode.num_draft_tokens > stats.spec_decode.num_accepted_tokens > 0
    assert len(tokens) == 30  # max_tokens: greedy under the bias never picks EOS
    # every prompt token once, every output token but the last (never computed) as a generated token
    charged = (PROMPT_COST * len(prompt) + OUTPUT_COST * (len(tokens) - 1)) / 2.0
    assert eng.scheduler.waiting.counters["t"] == pytest.approx(charged)
    eng.close()
