"""Byte-level jump-forward (opt-in, EngineArgs.jump_forward_bytes) on the real SmolLM2: in one batch with
LoRA adapters, JSON schemas, a regex, a Lark grammar (llguidance) and free text, every constrained output is
valid, each took fewer sampling steps than plain decoding needed for the same request, outputs close within a
tight max_tokens, and the free-text rows are token for token plain decoding's (byte mode leaves them alone)."""

from __future__ import annotations

import json
import re
from collections import Counter

import jsonschema
import pytest

from loraplex.engine import LLM, EngineArgs, SamplingParams
from loraplex.engine.probe import EngineProbe
from loraplex.grammar.spec import StructuredSpec
from loraplex.platform.settings import engine_arg_specs
from tests.lora.helpers import load_hf, save_adapter
from tests.structured.schemas import ORDER, PERSON, SENTIMENT, messages
from tests.structured.test_fewer_steps import DOC, INVOICE

pytestmark = pytest.mark.slow

ADAPTERS = {
    "r8-all": dict(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "r4-qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
}
ANSWER = 'start: "Answer: " ("yes" | "no") "."'  # Lark: llguidance serves it
ANSWER_RE = r"Answer: (yes|no)\."
INVOICE_RE = r"INV-[0-9]{5}"


@pytest.fixture(scope="module")
def adapter_dirs(smol_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bytes-adapters")
    base = load_hf(smol_dir)
    for i, (name, cfg) in enumerate(ADAPTERS.items()):
        base = save_adapter(base, root / name, seed=500 + i, **cfg)
    return {name: str(root / name) for name in ADAPTERS}


def _jobs(llm: LLM) -> list[tuple[list[int], SamplingParams, str | None, object]]:
    """(prompt, params, adapter, check) where check is a schema, a regex, or None for free text."""
    invoice = llm.chat_prompt(messages(DOC, INVOICE))
    person = llm.chat_prompt(messages("Maria Gonzalez is 34 years old and lives in Lyon.", PERSON))
    order = llm.chat_prompt(messages("Please send 2 boxes of apples and 1 crate of pears, express.", ORDER))
    mood = llm.chat_prompt(messages("I love this phone, the battery lasts for days!", SENTIMENT))
    answer = llm.chat_prompt([{"role": "user", "content": "Is Lyon in France? Answer yes or no."}])
    copy = llm.chat_prompt([{"role": "user", "content": f"Repeat this text exactly: {DOC}"}])
    compiler = llm.engine.structured.compiler
    tight = compiler.compile(StructuredSpec(json=INVOICE)).min_tokens + 2

    def params(spec: StructuredSpec | None, max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, structured=spec)

    return [
        (invoice, params(StructuredSpec(json=INVOICE), 64), None, INVOICE),
        (invoice, params(StructuredSpec(json=INVOICE), 64), "r4-qv", INVOICE),
        (person, params(StructuredSpec(json=PERSON), 40), "r8-all", PERSON),
        (order, params(StructuredSpec(json=ORDER), 80), None, ORDER),
        (mood, params(StructuredSpec(json=SENTIMENT), 40), None, SENTIMENT),
        (invoice, params(StructuredSpec(regex=INVOICE_RE), 16), "r8-all", INVOICE_RE),
        (answer, params(StructuredSpec(grammar=ANSWER), 16), None, ANSWER_RE),
        (invoice, params(StructuredSpec(json=INVOICE), tight), "r4-qv", INVOICE),  # closes within the budget
        (copy, params(None, 24), None, None),
        (copy, params(None, 24), "r8-all", None),
        (copy, params(None, 24), "r4-qv", None),
    ]


def _generate(adapter_dirs, **engine_args):
    llm = LLM(max_num_seqs=16, max_num_batched_tokens=2048, num_kv_blocks=400, **engine_args)
    refs = {name: llm.add_adapter(path, name) for name, path in adapter_dirs.items()}
    jobs = _jobs(llm)
    sampled: Counter[str] = Counter()  # sampling rows per request: the steps in which it drew a token
    llm.engine.probe = EngineProbe(on_logits=lambda ids, positions, logits: sampled.update(ids))
    outs = llm.generate([j[0] for j in jobs], [j[1] for j in jobs], adapters=[refs.get(j[2]) for j in jobs])
    llm.engine.check_invariants()
    stats = llm.engine.stats()
    llm.engine.close()
    return jobs, outs, [sampled[o.request_id] for o in outs], stats


def test_byte_mode_is_opt_in():
    assert EngineArgs().jump_forward_bytes is False
    spec = {s.name: s for s in engine_arg_specs()}["jump_forward_bytes"]
    assert (spec.flag, spec.env, spec.default) == ("--jump-forward-bytes", "LORAPLEX_JUMP_FORWARD_BYTES", False)


def test_valid_outputs_in_fewer_steps_in_a_mixed_batch(adapter_dirs):
    _, plain, plain_sampled, _ = _generate(adapter_dirs, enable_jump_forward=False)
    # the whole batch jumps forward (by default only batches of at most 4 running requests do)
    jobs, fast, fast_sampled, stats = _generate(adapter_dirs, jump_forward_bytes=True, jump_forward_max_running=16)
    for (_, params, adapter, check), p, f, p_steps, f_steps in zip(jobs, plain, fast, plain_sampled, fast_sampled):
        assert p.error is None and f.error is None, (p.error, f.error)
        assert p_steps == len(p.token_ids)  # plain decoding samples every token
        if check is None:  # free text: untouched by byte mode
            assert f.token_ids == p.token_ids and f.num_forced_tokens == 0
            continue
        assert f.finish_reason == "stop", (adapter, f.text, f.finish_reason)
        assert len(f.token_ids) <= params.max_tokens
        if isinstance(check, str):
            assert re.fullmatch(check, f.text), f.text
        else:
            jsonschema.validate(json.loads(f.text), check)
        assert f.num_forced_tokens > 0, f.text
        assert f_steps == len(f.token_ids) - f.num_forced_tokens
        assert f_steps < p_steps, (f.text, p.text)
    assert sum(o.num_forced_tokens for o in fast) == stats.spec_decode.num_forced_tokens
