"""Presence, frequency and repetition penalties, logit bias and prompt logprobs inside the engine's batch.

The processed logits (engine probe) are compared with a reference written here per row and per token in
plain Python (vLLM's formulas), on the tiny random Llama, in one batch that mixes penalised rows with plain,
grammar-constrained and LoRA rows. Prompt logprobs are compared with transformers."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
from loraplex.grammar.spec import StructuredSpec
from tests.engine.helpers import TINY_LOGITS_ATOL, HFOracle, run_to_completion
from tests.platform.helpers import make_peft_adapter

PROMPT = [412, 9013, 77, 2044, 412, 318, 5001, 77, 12, 880, 412]  # repeats, so repetition counts the prompt
# float32 logits against a float64 reference: one rounding of values up to ~100 (biased) is within 1e-6 of them
REL = 1e-6


def reference(raw: list[float], prompt: list[int], output: list[int], p: SamplingParams) -> list[float]:
    """vLLM's penalties then logit_bias, one token at a time."""
    counts = Counter(output)
    seen = set(prompt) | set(output)
    bias = p.logit_bias or {}
    out = []
    for token, x in enumerate(raw):
        if token in seen:
            x = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
        c = counts.get(token, 0)
        x = x - p.frequency_penalty * c - p.presence_penalty * (1.0 if c else 0.0)
        out.append(x + bias.get(token, 0.0))
    return out


@pytest.fixture(scope="module")
def engine(tiny_llama_dir, tmp_path_factory):
    # jump-forward at any batch size: the mixed batch below runs 7 requests, and whether the constrained ones
    # are still among more than the default 4 when their forced tokens come depended on when their grammar's
    # compile finished (the test checks forced tokens are appended without sampling, so it needs some)
    eng = LLMEngine(
        model=str(tiny_llama_dir), num_kv_blocks=256, block_size=8, max_loras=2, jump_forward_max_running=64
    )
    eng.test_adapter = eng.add_adapter(make_peft_adapter(tiny_llama_dir, tmp_path_factory.mktemp("lp") / "a"))
    yield eng
    eng.close()


class Recorder:
    def __init__(self) -> None:
        self.raw: dict[tuple[str, int], torch.Tensor] = {}
        self.processed: dict[tuple[str, int], torch.Tensor] = {}

    def probe(self) -> EngineProbe:
        def keep(store):
            def cb(ids, positions, logits):
                for rid, pos, row in zip(ids, positions, logits):
                    store[(rid, pos)] = row.detach().to("cpu", copy=True)

            return cb

        return EngineProbe(on_logits=keep(self.raw), on_processed_logits=keep(self.processed))


def test_penalties_and_bias_match_the_reference_in_a_mixed_batch(engine):
    choice = StructuredSpec(choice=["yes", "no"])
    forbidden = engine.tokenizer.encode("maybe", add_special_tokens=False)[0]
    requests = {
        "pen": SamplingParams(
            max_tokens=8, temperature=0.8, seed=3, presence_penalty=0.7, frequency_penalty=0.4, repetition_penalty=1.3
        ),
        "neg": SamplingParams(max_tokens=8, temperature=0, presence_penalty=-0.5, repetition_penalty=0.7),
        "bias": SamplingParams(max_tokens=8, temperature=0, logit_bias={5: 9.5, 77: -30.0, 900: 100.0}),
        "plain": SamplingParams(max_tokens=8, temperature=0),
        "lora": SamplingParams(max_tokens=8, temperature=0, frequency_penalty=1.5, logit_bias={412: 4.0}),
        "grammar": SamplingParams(
            max_tokens=4, temperature=0, structured=choice, repetition_penalty=2.0, logit_bias={forbidden: 100.0}
        ),
        "grammar_plain": SamplingParams(max_tokens=4, temperature=0, structured=choice),
    }
    rec = Recorder()
    engine.probe = rec.probe()
    try:
        arrivals = [(PROMPT, p, rid, engine.test_adapter if rid == "lora" else None) for rid, p in requests.items()]
        done = run_to_completion(engine, {0: arrivals})
    finally:
        engine.probe = None
    assert set(done) == set(requests)
    assert done["bias"].token_ids[0] == 900  # +100 wins over a random model's logits
    assert done["grammar"].text in ("yes", "no")
    checked = 0
    for (rid, pos), processed in rec.processed.items():
        params = requests[rid]
        raw = rec.raw[(rid, pos)].tolist()
        want = reference(raw, PROMPT, done[rid].token_ids[:pos], params)
        got = processed.tolist()
        for token, (g, w) in enumerate(zip(got, want)):
            if params.structured is not None and g == -math.inf:
                continue  # masked by the grammar (checked below)
            assert abs(g - w) <= REL * max(1.0, abs(w)), (rid, pos, token, g, w)
        checked += 1
    # every sampled token was checked; tokens the grammar forced (jump-forward) are appended without sampling
    assert sum(o.num_forced_tokens for o in done.values()) > 0
    assert checked >= sum(len(o.token_ids) - o.num_forced_tokens for o in done.values())
    # The mask wins: +100 on a token the grammar forbids leaves it forbidden, and the penalised constrained
    # row allows exactly the tokens the unpenalised one does.
    masked = rec.processed[("grammar", 0)]
    assert masked[forbidden] == -math.inf
    assert torch.equal(torch.isfinite(masked), torch.isfinite(rec.processed[("grammar_plain", 0)]))
    # Greedy rows take the most likely processed token: sampling draws from the processed logits.
    for (rid, pos), processed in rec.processed.items():
        if requests[rid].greedy and pos < len(done[rid].token_ids):
            assert done[rid].token_ids[pos] == int(processed.argmax()), (rid, pos)
    # A row without penalties or bias is the raw logits.
    for (rid, pos), processed in rec.processed.items():
        if rid == "plain":
            assert torch.equal(processed, rec.raw[(rid, pos)])


def test_logit_bias_outside_the_vocabulary_is_refused(engine):
    from loraplex.engine import RequestError

    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine.add_request(PROMPT, SamplingParams(logit_bias={engine.shape.vocab_size: 1.0}))
    with pytest.raises(RequestError, match=r"\[-100, 100\]"):
        SamplingParams(logit_bias={3: 101.0})


def test_prompt_logprobs_match_transformers_and_skip_the_prefix_cache(engine, tiny_llama_dir):
    oracle = HFOracle(tiny_llama_dir)
    prompt = PROMPT * 3  # several KV blocks of 8
    # warm the prefix cache with the same prompt, then ask for prompt logprobs: the whole prompt is computed
    run_to_completion(engine, {0: [(prompt, SamplingParams(max_tokens=1, temperature=0), "warm")]})
    out = run_to_completion(
        engine, {0: [(prompt, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=2), "lp")]}
    )["lp"]
    assert out.num_cached_tokens == 0
    with torch.inference_mode():
        want = torch.log_softmax(oracle.model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    lps = out.prompt_logprobs
    assert lps is not None and len(lps) == len(prompt) and lps[0] is None
    for j in range(1, len(prompt)):
        lp = lps[j]
        assert lp.token_id == prompt[j]
        assert abs(lp.logprob - float(want[j - 1, prompt[j]])) <= TINY_LOGITS_ATOL
        above = want[j - 1] - float(want[j - 1, prompt[j]])  # ranks up to float rounding of near-ties
        assert int((above > TINY_LOGITS_ATOL).sum()) < lp.rank <= int((above > -TINY_LOGITS_ATOL).sum())
        assert {t for t, _, _ in lp.top} == set(want[j - 1].topk(2).indices.tolist())
