"""Reasoning before the answer (engine/reasoning.py, grammar/reasoning.py): the reasoning goes to its own field, a
constraint holds for the answer after it, and one max_tokens covers both, so a constrained answer is never cut or
missing because the model thought too long.

Models: a tiny random Qwen3 checkpoint (Qwen3's architecture, SmolLM2's tokenizer with Qwen3's two added tokens
``<think>`` and ``</think>``, and a chat template written to Qwen3's documented format: the model opens its own
block; ``enable_thinking=False`` writes an empty block into the prompt), and the bundled SmolLM2 with a template in
DeepSeek-R1's form (the prompt opens the block; the markers are several tokens there)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jsonschema
import pytest

from loraplex.engine import LLM, RequestError, SamplingParams
from loraplex.engine.reasoning import Phase, ReasoningFormat, ReasoningSplitter
from loraplex.grammar import StructuredSpec

R1_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Plan a short trip: which city, and for how many days? Answer as JSON."}]


@pytest.fixture(scope="module")
def qwen3_llm(tiny_qwen3_dir: Path):
    llm = LLM(str(tiny_qwen3_dir), reasoning_parser="qwen3", max_model_len=512, kv_cache_bytes=32 << 20)
    yield llm
    llm.engine.structured.close()


def think_id(llm: LLM, marker: str) -> int:
    (tid,) = llm.tokenizer.encode(marker, add_special_tokens=False)
    return tid


def prompt(llm: LLM, **template_kwargs: object) -> list[int]:
    ids = llm.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, **template_kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


# ---- the splitter and the phases, alone ---------------------------------------------------------------------------
def fmt() -> ReasoningFormat:
    return ReasoningFormat("qwen3", "<think>", "</think>", (1,), (2,))


@pytest.mark.parametrize("cut", range(1, 30))
def test_splitter_holds_back_markers_cut_across_deltas(cut):
    text = '<think>plan </thi it</think>\n\n{"a": 1}'
    s = ReasoningSplitter(fmt(), Phase.MAY_OPEN)
    r1, c1 = s.feed(text[:cut], final=False)
    r2, c2 = s.feed(text[cut:], final=True)
    assert (r1 + r2, c1 + c2) == ("plan </thi it", '{"a": 1}')
    assert "<" not in c1 + c2 and "think>" not in r1 + r2


def test_splitter_phases():
    s = ReasoningSplitter(fmt(), Phase.MAY_OPEN)
    assert s.feed("no thinking here", final=True) == ("", "no thinking here") and not s.reasoned
    s = ReasoningSplitter(fmt(), Phase.REASONING)
    assert s.feed("still thinking, cut by the budget", final=True) == ("still thinking, cut by the budget", "")
    assert s.reasoned and s.content == ""
    s = ReasoningSplitter(fmt(), Phase.ANSWER)
    assert s.feed("  <think>literal</think>", final=True) == ("", "  <think>literal</think>")


def test_initial_phase_reads_the_prompt():
    f = fmt()
    assert f.initial_phase("<|im_start|>assistant\n") == Phase.MAY_OPEN
    assert f.initial_phase("<|im_start|>assistant\n<think>\n") == Phase.REASONING
    assert f.initial_phase("<|im_start|>assistant\n<think>\n\n</think>\n\n") == Phase.ANSWER
    assert f.initial_phase("<think>old</think> user text <|im_start|>assistant\n") == Phase.MAY_OPEN


# ---- tiny Qwen3 -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_tokens", [24, 40, 90])
def test_a_model_that_keeps_thinking_still_answers_within_max_tokens(qwen3_llm, max_tokens):
    """logit_bias pushes ``<think>`` at every step: the model opens its block and never closes it by itself; the
    engine closes it where the shortest answer still fits, and the answer validates."""
    llm = qwen3_llm
    bias = {think_id(llm, "<think>"): 30.0}
    params = [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0,
            seed=s,
            logit_bias=bias,
            structured=StructuredSpec(json=SCHEMA),
            reasoning=True,
        )
        for s in range(4)
    ]
    for out in llm.generate([prompt(llm)] * 4, params):
        assert len(out.token_ids) <= max_tokens
        assert out.reasoning is not None and len(out.reasoning) > 0
        jsonschema.validate(json.loads(out.text), SCHEMA)
        assert out.finish_reason == "stop"
        assert out.token_ids.count(think_id(llm, "</think>")) == 1


def test_thinking_off_answers_at_once_and_a_budget_below_the_answer_is_refused(qwen3_llm):
    llm = qwen3_llm
    spec = StructuredSpec(json=SCHEMA)
    off = prompt(llm, enable_thinking=False)
    bias = {think_id(llm, "<think>"): 30.0}  # (may not open a block: the template closed it)
    (out,) = llm.generate(
        [off], [SamplingParams(max_tokens=40, temperature=0, logit_bias=bias, structured=spec, reasoning=True)]
    )
    assert out.reasoning is None and think_id(llm, "<think>") not in out.token_ids
    jsonschema.validate(json.loads(out.text), SCHEMA)
    shortest = llm.engine.structured.compiler.compile(spec).min_tokens
    refused = llm.engine.precheck(prompt(llm), SamplingParams(max_tokens=shortest - 1, structured=spec, reasoning=True))
    assert "too small" in str(refused.exception(timeout=60))  # (the server's 400)
    fits = llm.engine.precheck(prompt(llm), SamplingParams(max_tokens=shortest, structured=spec, reasoning=True))
    assert fits.exception(timeout=60) is None  # the model may answer at once


def test_unconstrained_reasoning_is_split_and_without_the_parser_nothing_is(qwen3_llm, tiny_qwen3_dir):
    llm = qwen3_llm
    bias = {think_id(llm, "<think>"): 30.0}
    (out,) = llm.generate(
        [prompt(llm)], [SamplingParams(max_tokens=12, temperature=0, logit_bias=bias, reasoning=True)]
    )
    assert out.reasoning is not None and out.text == ""  # cut by max_tokens while thinking: all of it is reasoning
    with pytest.raises(RequestError, match="reasoning_parser"):
        plain = LLM(str(tiny_qwen3_dir), max_model_len=256, kv_cache_bytes=16 << 20)
        try:
            plain.generate([prompt(plain)], [SamplingParams(max_tokens=4, reasoning=True)])
        finally:
            plain.engine.structured.close()


# ---- the bundled model with a template that thinks -------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol_r1(tmp_path_factory: pytest.TempPathFactory, smol_dir: Path):
    dest = tmp_path_factory.mktemp("smol-r1")
    for f in smol_dir.iterdir():
        if f.name == "model.safetensors":
            os.symlink(f, dest / f.name)
        elif f.is_file() and f.name != "chat_template.jinja":
            shutil.copy(f, dest / f.name)
    (dest / "chat_template.jinja").write_text(R1_TEMPLATE)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    llm = LLM(str(dest), reasoning_parser="deepseek_r1", max_model_len=1024, kv_cache_bytes=64 << 20)
    yield llm
    llm.engine.structured.close()


@pytest.mark.slow
@pytest.mark.parametrize("max_tokens", [20, 48])
def test_bundled_model_thinks_then_answers_within_one_budget(smol_r1, max_tokens):
    llm = smol_r1
    ids = llm.chat_prompt(MESSAGES)
    assert llm.tokenizer.decode(ids).endswith("<think>\n")
    (out,) = llm.generate(
        [ids],
        [SamplingParams(max_tokens=max_tokens, temperature=0, structured=StructuredSpec(json=SCHEMA), reasoning=True)],
    )
    assert len(out.token_ids) <= max_tokens and out.finish_reason == "stop"
    assert out.reasoning  # it thought (its own words, or at least up to the forced end)
    spec = StructuredSpec(json=SCHEMA)
    shortest = llm.engine.structured.compiler.compile(spec).min_tokens
    closing = len(llm.tokenizer.encode("</think>", add_special_tokens=False))
    tight = llm.engine.precheck(ids, SamplingParams(max_tokens=shortest + closing - 1, structured=spec, reasoning=True))
    assert "after the" in str(tight.exception(timeout=60))  # the prompt opened the block: closing it counts
    jsonschema.validate(json.loads(out.text), SCHEMA)
    full = llm.tokenizer.decode(out.token_ids)
    assert full.count("</think>") == 1 and full.index("</think>") > 0
