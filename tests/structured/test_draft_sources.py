"""Draft sources beyond vLLM's token n-gram (engine.spec.drafts) on the real SmolLM2: the grammar's forced text, the
model's own tokenization of it learned per tenant and adapter, and prompt lookup over text. Outputs stay those of
plain decoding; the step counts show the drafts are taken."""

from __future__ import annotations

import pytest

from loraplex.engine import LLM, SamplingParams
from loraplex.engine.config import EngineArgs
from loraplex.engine.core.share import Share
from loraplex.engine.spec.settle import DraftProposer
from loraplex.engine.spec.speculative import SpeculativeConfig
from loraplex.grammar.spec import StructuredSpec
from tests.structured.schemas import messages

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string", "maxLength": 20},
        "vendor": {"type": "string", "maxLength": 30},
        "currency": {"type": "string", "maxLength": 5},
        "po_number": {"type": "string", "maxLength": 20},
    },
    "required": ["invoice_number", "vendor", "currency", "po_number"],
    "additionalProperties": False,
}
DOCS = [
    "Invoice Number: INV-48213\nVendor: Litware Systems\nCurrency: GBP\nPo Number: PO-7534-F\n",
    "Invoice Number: INV-90417\nVendor: Tailspin Toys\nCurrency: EUR\nPo Number: PO-1182-C\n",
]
SPEC = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
PARAMS = SamplingParams(max_tokens=80, temperature=0.0, structured=StructuredSpec(json=SCHEMA))


def _llm(**engine_args) -> LLM:
    """An engine with the schema compiled and its background automaton built: every engine of these tests masks
    with the same backend (two exact backends may still differ in what their budget checks allow)."""
    llm = LLM(max_num_seqs=4, **engine_args)
    llm.engine.structured.compiler.compile(PARAMS.structured)
    assert llm.engine.structured.compiler.wait_for_upgrades(300)
    return llm


def _run(llm: LLM, prompts: list[list[int]], tenant: str = "") -> tuple[list[list[int]], int]:
    """Each prompt alone (as a single user waits for it): its tokens, and the engine steps all of them took."""
    eng, outs, steps = llm.engine, [], 0
    for p in prompts:
        eng.add_request(p, PARAMS, share=Share(tenant))
        while eng.has_unfinished():
            last = eng.last_step
            for out in eng.step():
                if out.finished:
                    assert out.error is None, out.error
                    outs.append(out.token_ids)
            steps += eng.last_step is not last  # a step that computed something
    return outs, steps


@pytest.fixture(scope="module")
def plain_and_prompts():
    llm = _llm(enable_jump_forward=False)
    prompts = [llm.chat_prompt(messages(d, SCHEMA)) for d in DOCS]
    outs, steps = _run(llm, prompts)
    llm.engine.close()
    return outs, steps, prompts


def test_grammar_drafts_and_text_lookup_take_fewer_steps_with_the_same_outputs(plain_and_prompts):
    plain, plain_steps, prompts = plain_and_prompts
    vllm_like = _llm(speculative_config={**SPEC, "grammar_drafts": False, "text_lookup": False})
    ours = _llm(speculative_config=SPEC)
    (outs_v, steps_v), (outs_o, steps_o) = _run(vllm_like, prompts), _run(ours, prompts)
    vllm_like.engine.close()
    ours.engine.check_invariants()
    ours.engine.close()
    assert outs_v == plain and outs_o == plain
    # every value is copied from the document and every key is forced text: at least 3 tokens per step on
    # average, and clearly fewer steps than token n-grams alone
    assert steps_o * 3 <= sum(len(o) for o in plain), (steps_o, plain_steps)
    assert steps_o < steps_v < plain_steps


def test_the_model_tokenization_of_forced_text_is_learned_per_tenant(plain_and_prompts, monkeypatch):
    plain, _, prompts = plain_and_prompts
    llm = _llm(speculative_config=SPEC)
    tok = llm.tokenizer
    drafts: list[tuple[str, list[int]]] = []
    propose = DraftProposer.__call__

    def recording(self, seq, budget):
        out = propose(self, seq, budget)
        drafts.append((seq.share.tenant, out))
        return out

    monkeypatch.setattr(DraftProposer, "__call__", recording)  # (the scheduler got its proposer at construction)
    assert _run(llm, prompts[:1], tenant="acme")[0] == plain[:1]
    # SmolLM2 writes `":` then `"` after a key where its tokenizer has the one token `":"`; drafted canonically
    # at first, then as the model wrote it: the later keys of the same request already draft `":`, `"`
    colon_quote = tok.encode('":"', add_special_tokens=False)
    assert len(colon_quote) == 1
    split = tok.encode('":', add_special_tokens=False) + tok.encode('"', add_special_tokens=False)
    acme_first = [d for _, d in drafts]
    assert any(d[-1:] == colon_quote for d in acme_first[:3] if d)
    later_keys = [d for d in acme_first if tok.decode(d).startswith(("currency", "po_number"))]
    assert later_keys and all(d[-2:] == split for d in later_keys), [tok.decode(d) for d in later_keys]
    # another tenant starts from the tokenizer's tokenization; the same tenant drafts the whole key as written
    drafts.clear()
    assert _run(llm, prompts[1:], tenant="globex")[0] == plain[1:]
    globex = [d for _, d in drafts if tok.decode(d).startswith("invoice_number")]
    assert globex and globex[0][-1:] == colon_quote
    drafts.clear()
    assert _run(llm, prompts[1:], tenant="acme")[0] == plain[1:]
    acme = [d for _, d in drafts if tok.decode(d).startswith("invoice_number")]
    assert acme and acme[0][-2:] == split
    llm.engine.close()


def test_text_lookup_drafts_the_document_continuation_of_a_value():
    llm = LLM(max_num_seqs=1, speculative_config=SPEC)
    drafter = llm.engine.drafter
    prompt = "Vendor: Litware Systems\nCurrency: GBP\n"
    got = drafter._text_drafts(prompt, '{"vendor":"Lit', 8)
    assert llm.tokenizer.decode(got).startswith("ware Systems\nCurrency")
    # the longest suffix wins: "GB" alone would also match, after "Currency" only one place does
    assert llm.tokenizer.decode(drafter._text_drafts(prompt, '"currency":"GB', 2)) == "P\n"
    assert drafter._text_drafts(prompt, '{"total":1', 8) == []  # "1" is shorter than the 2-character minimum
    llm.engine.close()


def test_config_switches_are_ours_and_checked():
    cfg = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4})
    assert cfg.grammar_drafts and cfg.text_lookup
    cfg = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4, "text_lookup": False})
    assert cfg.grammar_drafts and not cfg.text_lookup
    with pytest.raises(ValueError, match="grammar_drafts must be true or false"):
        SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4, "grammar_drafts": "yes"})
    with pytest.raises(ValueError, match="jump_forward_max_running must be >= 1"):
        EngineArgs(jump_forward_max_running=0)


def test_jump_forward_waits_until_few_requests_run(plain_and_prompts):
    """A compute-bound batch saves nothing by jumping forward: forced tokens are taken only while at most
    jump_forward_max_running requests run, and outputs stay plain decoding's either way."""
    plain, _, prompts = plain_and_prompts
    llm = _llm(jump_forward_max_running=2)
    third = llm.chat_prompt(
        messages("Invoice Number: INV-7\nVendor: Contoso\nCurrency: USD\nPo Number: PO-1\n", SCHEMA)
    )
    running_at_jump: list[int] = []
    jump = llm.engine.jump_forward.tokens

    def recording(seq):
        running_at_jump.append(len(llm.engine.scheduler.running))
        return jump(seq)

    llm.engine.jump_forward.tokens = recording
    outs = llm.generate([*prompts, third], PARAMS)
    llm.engine.close()
    assert [o.token_ids for o in outs[:2]] == plain
    assert running_at_jump and max(running_at_jump) <= 2 < 3
    assert sum(o.num_forced_tokens for o in outs) > 0
