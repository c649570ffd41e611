"""On the real SmolLM2: one continuous batch of base requests and nine different adapters agrees, request by
request, with peft running that adapter alone (greedy tokens identical, last-position logits within
SMOLLM2_LOGITS_ATOL)."""

from __future__ import annotations

import pytest

from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
from tests.engine.helpers import SMOLLM2_LOGITS_ATOL, LogitsRecorder
from tests.lora.helpers import PeftOracle, assert_no_leaks, drive, load_hf, save_adapter

pytestmark = pytest.mark.slow

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Ranks 2..16, rslora, per-module rank / alpha patterns, a subset of layers, subsets of projections.
ADAPTERS = {
    "r8-all": dict(r=8, lora_alpha=16, target_modules=ALL),
    "r16-rslora": dict(r=16, lora_alpha=8, use_rslora=True, target_modules=ALL),
    "r4-qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "patterns": dict(
        r=16,
        lora_alpha=16,
        target_modules=ALL,
        rank_pattern={"down_proj": 4, "o_proj": 8},
        alpha_pattern={"gate_proj": 48},
    ),
    "every-3rd-layer": dict(r=8, lora_alpha=32, target_modules=ALL, layers_to_transform=list(range(0, 30, 3))),
    "r2-mlp": dict(r=2, lora_alpha=4, target_modules=["gate_proj", "up_proj", "down_proj"]),
    "r12-ko-rslora": dict(r=12, lora_alpha=6, use_rslora=True, target_modules=["k_proj", "o_proj"]),
    "layer-pattern": dict(
        r=8,
        lora_alpha=8,
        target_modules=ALL,
        rank_pattern={"model.layers.1.self_attn.q_proj": 2},
        alpha_pattern={"model.layers.2.mlp.up_proj": 32},
    ),
    "r6-up-down-o": dict(r=6, lora_alpha=24, target_modules=["up_proj", "down_proj", "o_proj"]),
}
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about rain.",
    "Name three colours.",
    "What is 12 plus 7?",
    "Give me a name for a dog.",
    "Why is the sea salty?",
]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def setup(smol_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("smol-adapters")
    base = load_hf(smol_dir)
    dirs = {}
    for i, (name, cfg) in enumerate(ADAPTERS.items()):
        dirs[name] = root / name
        base = save_adapter(base, dirs[name], seed=100 + i, **cfg)
    return dirs, PeftOracle(base, dirs)


def test_mixed_batch_matches_peft_per_adapter(smol_dir, setup):
    dirs, oracle = setup
    eng = LLMEngine(
        model=None,
        max_loras=16,
        max_cpu_loras=16,
        max_lora_rank=16,
        max_num_seqs=32,
        max_num_batched_tokens=1024,
        num_kv_blocks=256,
    )
    rec = LogitsRecorder()
    eng.probe = EngineProbe(on_logits=rec)
    tok = eng.tokenizer
    eos = tok.eos_token_id
    refs = {name: eng.add_adapter(str(path), name) for name, path in dirs.items()}
    assert len({r.content_hash for r in refs.values()}) == len(refs)
    prompts = [_chat(tok, q) for q in QUESTIONS]
    # every adapter once, two adapters twice, and base requests in between: all in one batch
    jobs = [(name, prompts[i % len(prompts)]) for i, name in enumerate(ADAPTERS)]
    jobs += [(None, prompts[0]), ("r8-all", prompts[1]), (None, prompts[2]), ("patterns", prompts[3])]
    batches = []
    eng.runner.run = _spy(eng.runner.run, batches)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    arrivals = {
        0: [
            dict(prompt_token_ids=p, params=params, request_id=f"j{i}", adapter=refs[name] if name else None)
            for i, (name, p) in enumerate(jobs)
        ]
    }
    done = drive(eng, arrivals)
    assert max(len({s.adapter_hash for s in b.seqs if s.adapter_hash}) for b in batches) == len(ADAPTERS)

    base_out = {tuple(p): oracle.greedy(None, p, MAX_TOKENS, eos) for p in prompts[:4]}
    changed = 0
    for i, (name, prompt) in enumerate(jobs):
        out = done[f"j{i}"]
        assert out.finish_reason in ("stop", "length") and out.error is None
        ref = oracle.greedy(name, prompt, MAX_TOKENS, eos)
        assert out.token_ids == ref, f"{name}: {out.text!r} != {tok.decode(ref)!r}"
        diff = (rec.first[f"j{i}"] - oracle.last_logits(name, prompt)).abs().max().item()
        assert diff < SMOLLM2_LOGITS_ATOL, f"{name}: last-position logits differ by {diff}"
        if name is not None and tuple(prompt) in base_out:
            changed += ref != base_out[tuple(prompt)]
    assert changed >= 6, f"only {changed} adapter outputs differ from the base model's: too weak to catch a lost delta"
    assert_no_leaks(eng)


def _chat(tok, question: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _spy(run, batches):
    def wrapped(batch, lora=None):
        batches.append(batch)
        return run(batch, lora=lora)

    return wrapped
