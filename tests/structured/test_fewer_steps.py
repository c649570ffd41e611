"""Jump-forward and n-gram speculation on the real SmolLM2 change no output: one mixed batch (base model and
four peft adapters; JSON schemas, a regex, a choice and free text; greedy, seeded sampling, logprobs,
penalties, stop strings, min_tokens) gives token for token what plain decoding gives, while the engine
did take forced tokens and accepted drafts."""

from __future__ import annotations

import pytest

from loraplex.engine import LLM, SamplingParams
from loraplex.grammar.spec import StructuredSpec
from tests.lora.helpers import load_hf, save_adapter
from tests.structured.schemas import PERSON, messages

pytestmark = pytest.mark.slow

INVOICE = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string", "maxLength": 20},
        "customer": {"type": "string", "maxLength": 30},
        "total": {"type": "number"},
        "paid": {"type": "boolean"},
    },
    "required": ["invoice_number", "customer", "total", "paid"],
    "additionalProperties": False,
}
DOC = (
    "Invoice INV-20931 was issued to Northwind Traders on 2024-03-02 for a total of 1520.75 EUR. "
    "Northwind Traders paid invoice INV-20931 in full."
)
ADAPTERS = {
    "r8-all": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "r4-qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "r2-mlp": dict(r=2, lora_alpha=4, target_modules=["gate_proj", "up_proj", "down_proj"]),
    "r6-o": dict(r=6, lora_alpha=12, target_modules=["o_proj"]),
}
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def adapter_dirs(smol_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fewer-steps-adapters")
    base = load_hf(smol_dir)
    dirs = {}
    for i, (name, cfg) in enumerate(ADAPTERS.items()):
        base = save_adapter(base, root / name, seed=300 + i, **cfg)
        dirs[name] = str(root / name)
    return dirs


def _jobs(llm: LLM) -> list[tuple[list[int], SamplingParams, str | None]]:
    invoice = llm.chat_prompt(messages(DOC, INVOICE))
    person = llm.chat_prompt(messages("Maria Gonzalez is 34 years old and lives in Lyon.", PERSON))
    copy = llm.chat_prompt([{"role": "user", "content": f"Repeat this text exactly: {DOC}"}])
    json_ = StructuredSpec(json=INVOICE)
    names = [None, *ADAPTERS]
    jobs = []
    for name in names:  # every adapter and the base model with a schema and with free text
        jobs.append((invoice, SamplingParams(max_tokens=48, temperature=0.0, structured=json_), name))
        jobs.append((copy, SamplingParams(max_tokens=32, temperature=0.0), name))
    jobs += [
        (person, SamplingParams(max_tokens=32, temperature=1.0, seed=5, structured=StructuredSpec(json=PERSON)), None),
        (invoice, SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=11, structured=json_), "r4-qv"),
        (copy, SamplingParams(max_tokens=24, temperature=1.0, seed=3), "r8-all"),
        (invoice, SamplingParams(max_tokens=40, temperature=0.0, logprobs=2, structured=json_), None),
        (copy, SamplingParams(max_tokens=24, temperature=0.0, logprobs=1, repetition_penalty=1.3), "r2-mlp"),
        (copy, SamplingParams(max_tokens=32, temperature=0.0, frequency_penalty=0.5, stop=["paid"]), None),
        (copy, SamplingParams(max_tokens=12, temperature=0.0, min_tokens=12), "r6-o"),
        (
            invoice,
            SamplingParams(max_tokens=24, temperature=0.0, structured=StructuredSpec(regex=r"INV-[0-9]{5}")),
            None,
        ),
        (
            person,
            SamplingParams(max_tokens=8, temperature=0.0, structured=StructuredSpec(choice=["Lyon", "Paris"])),
            None,
        ),
    ]
    return jobs


def _generate(adapter_dirs, **engine_args):
    llm = LLM(max_num_seqs=32, max_num_batched_tokens=2048, num_kv_blocks=600, **engine_args)
    refs = {name: llm.add_adapter(path, name) for name, path in adapter_dirs.items()}
    jobs = _jobs(llm)
    outs = llm.generate([j[0] for j in jobs], [j[1] for j in jobs], adapters=[refs.get(j[2]) for j in jobs])
    llm.engine.check_invariants()
    stats = llm.engine.stats()
    llm.engine.close()
    return outs, stats


def test_outputs_identical_to_plain_decoding(adapter_dirs):
    plain, _ = _generate(adapter_dirs, enable_jump_forward=False)
    fast, stats = _generate(adapter_dirs, speculative_config={**SPEC, "disable_by_batch_size": 64})
    for p, f in zip(plain, fast):
        assert p.error is None and f.error is None
        assert f.token_ids == p.token_ids, (p.text, f.text)
        assert (f.text, f.finish_reason) == (p.text, p.finish_reason)
        if p.logprobs is not None:
            # the same positions computed in differently shaped batches: equal up to float32 summation order
            assert [lp.logprob for lp in f.logprobs] == pytest.approx([lp.logprob for lp in p.logprobs], abs=1e-4)
            assert [[t for t, _, _ in lp.top] for lp in f.logprobs] == [[t for t, _, _ in lp.top] for lp in p.logprobs]
    assert stats.spec_decode.num_forced_tokens > 0
    assert 0 < stats.spec_decode.num_accepted_tokens <= stats.spec_decode.num_draft_tokens
    assert sum(o.num_accepted_tokens for o in fast) == stats.spec_decode.num_accepted_tokens
    assert sum(o.num_forced_tokens for o in fast) == stats.spec_decode.num_forced_tokens
