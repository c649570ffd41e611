"""The real SmolLM2 model in one running engine agrees with Hugging Face on every prompt alone."""

from __future__ import annotations

import pytest

from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
from tests.engine.helpers import SMOLLM2_LOGITS_ATOL, HFOracle, LogitsRecorder, run_to_completion

pytestmark = pytest.mark.slow

LONG_SYSTEM = (
    "You are a meticulous assistant for a regional library. Answer briefly and politely, cite the "
    "relevant shelf when you can, and never invent opening hours. The library has three floors: "
    "fiction on the ground floor, science and history on the first, and archives on the second."
)
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "List three prime numbers.",
    "Explain photosynthesis in one sentence.",
    "Translate 'good morning' into Spanish.",
    "What is 17 times 3?",
    "Give me a name for a grey cat.",
    "Where are the history books?",
    "Can I borrow a map from the archives?",
    "Summarise the plot of Cinderella.",
    "What colour is the sky on Mars?",
    "Name a famous physicist.",
    "Is a tomato a fruit?",
    "How many legs does a spider have?",
    "Write one line of Python that prints hello.",
    "Où se trouve la bibliothèque ?",
    "日本の首都はどこですか？",  # noqa: RUF001 - the full-width question mark is Japanese text
    "Suggest a healthy breakfast.",
    "What does HTTP stand for?",
    "Describe the ocean in five words.",
    "Which floor has fiction?",
    "What is the boiling point of water?",
    "Tell me a joke about computers.",
    "Why do leaves fall?",
    "Who wrote Hamlet?",
    "Recommend a book for a long train ride.",
]


def build_prompts(tok) -> list[list[int]]:
    out = []
    for i, q in enumerate(QUESTIONS):
        msgs = [{"role": "user", "content": q}]
        if i % 2 == 0:  # half share a long system prompt (a long common prefix)
            msgs.insert(0, {"role": "system", "content": LONG_SYSTEM})
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def test_staggered_continuous_batch_matches_hf_alone(smol_dir):
    eng = LLMEngine(
        model=None, max_num_batched_tokens=64, max_num_seqs=16, num_kv_blocks=400, enable_prefix_caching=True
    )
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    prompts = build_prompts(eng.tokenizer)
    assert len(prompts) >= 24
    eos = eng.tokenizer.eos_token_id
    arrivals: dict[int, list] = {}
    for i, p in enumerate(prompts):
        arrivals.setdefault(i * 3 // 2, []).append(
            (p, SamplingParams(max_tokens=10 + (i % 4) * 4, temperature=0.0), f"q{i}")
        )
    done = run_to_completion(eng, arrivals)
    assert len(done) == len(prompts)
    assert eng.stats().kv_cache.prefix_cache_hits > 0
    oracle = HFOracle(smol_dir)
    for i, p in enumerate(prompts):
        out = done[f"q{i}"]
        ref = oracle.greedy(p, 10 + (i % 4) * 4, eos=eos)
        assert out.token_ids == ref, f"prompt {i}: {out.text!r}"
        diff = (rec.first[f"q{i}"] - oracle.last_logits(p)).abs().max().item()
        assert diff < SMOLLM2_LOGITS_ATOL, f"prompt {i}: last-position logits differ by {diff}"
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
