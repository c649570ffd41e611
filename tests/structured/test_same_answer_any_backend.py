"""Same request, same answer: a greedy constrained request gives the same tokens whichever backend serves its
constraint (llguidance, the token automaton, "auto" before and after the background build), and reports the same
narrowing. The tiny random Llama writes anything its mask allows, so any difference between the backends' masks or
budget logic shows in its outputs; the real SmolLM2 model checks the extraction tasks a customer sends."""

from __future__ import annotations

from typing import Any

import pytest

from loraplex.engine import LLM, SamplingParams
from loraplex.grammar.spec import StructuredSpec
from loraplex.grammar.workers.job import CompileOptions, translate
from tests.structured.schemas import TASKS, messages

BACKENDS = ("outlines", "llguidance")
# constraints with an exact regex (both backends can serve them; the others only ever have llguidance)
SHARED = [
    (text, schema)
    for text, schema in TASKS
    if translate(StructuredSpec(json=schema), CompileOptions()).automaton_language
]


def _requests(llm: LLM, tasks, slack: list[int]) -> tuple[list[list[int]], list[SamplingParams]]:
    """Greedy requests, each with a budget of the grammar's shortest output plus some slack (0: as tight as a
    request may be, so the budget logic decides the end)."""
    compiler = llm.engine.structured.compiler
    prompts, params = [], []
    for i, (text, schema) in enumerate(tasks):
        spec = StructuredSpec(json=schema)
        shortest = compiler.compile(spec).min_tokens
        prompts.append(llm.chat_prompt(messages(text, schema)))
        params.append(SamplingParams(max_tokens=shortest + slack[i % len(slack)], temperature=0.0, structured=spec))
    return prompts, params


def _answers(llm: LLM, prompts, params) -> list[tuple[list[int], str | None]]:
    return [(list(o.token_ids), o.finish_reason) for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def tiny_engines(tiny_llama_dir):
    engines = {b: LLM(model=str(tiny_llama_dir), grammar_backend=b, num_kv_blocks=512) for b in (*BACKENDS, "auto")}
    yield engines
    for llm in engines.values():
        llm.engine.structured.compiler.close()


def test_enough_tasks_are_served_by_both_backends() -> None:
    assert len(SHARED) >= 20


def test_tiny_model_gives_the_same_tokens_on_every_backend(tiny_engines) -> None:
    slack = [0, 1, 3, 8, 40, 150]
    answers = {}
    for backend, llm in tiny_engines.items():
        answers[backend] = _answers(llm, *_requests(llm, SHARED, slack))
        narrowing = [llm.engine.structured.compiler.compile(StructuredSpec(json=s)).narrowing for _, s in SHARED]
        answers[backend + " narrowing"] = narrowing
    assert answers["outlines"] == answers["llguidance"] == answers["auto"]
    assert answers["outlines narrowing"] == answers["llguidance narrowing"] == answers["auto narrowing"]


def test_auto_gives_the_same_tokens_before_and_after_the_background_build(tiny_llama_dir) -> None:
    # (no prefix cache: the second pass must differ from the first only in the backend that serves it)
    llm = LLM(model=str(tiny_llama_dir), num_kv_blocks=512, enable_prefix_caching=False)
    compiler = llm.engine.structured.compiler
    try:
        prompts, params = _requests(llm, SHARED, [0, 2, 30])
        before = [compiler.compile(p.structured).backend for p in params]
        first = _answers(llm, prompts, params)
        assert compiler.wait_for_upgrades(600)
        after = [compiler.compile(p.structured).backend for p in params]
        switched = [i for i, (b, a) in enumerate(zip(before, after)) if (b, a) == ("llguidance", "outlines")]
        assert switched, "no constraint was upgraded: the test would not cover a switch of backends"
        assert _answers(llm, prompts, params) == first
    finally:
        compiler.close()


@pytest.mark.slow
def test_smollm2_extractions_are_the_same_on_both_backends() -> None:
    answers = []
    for backend in BACKENDS:
        llm = LLM(grammar_backend=backend, max_num_seqs=16, num_kv_blocks=800)
        try:
            answers.append(_answers(llm, *_requests(llm, SHARED[:12], [0, 200])))
        finally:
            llm.engine.structured.compiler.close()
    assert answers[0] == answers[1]


GROUNDED = {"type": "string", "x-loraplex-grounded": True}
GROUNDED_SCHEMAS = [
    GROUNDED,
    {"type": "object", "properties": {"name": GROUNDED, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "array", "items": GROUNDED, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "properties": {"who": {"anyOf": [GROUNDED, {"type": "null"}]}, "tags": {"type": "array", "items": GROUNDED}},
    },
    {  # other keywords beside the grounding: intersected
        "type": "object",
        "properties": {
            "short": {**GROUNDED, "maxLength": 6},
            "word": {**GROUNDED, "pattern": "^[A-Za-z]+$", "minLength": 2},
            "pick": {**GROUNDED, "enum": ["nurse", "nowhere-in-the-text", "Valencia"]},
            "absent": {**GROUNDED, "pattern": "^[0-9]{5}$"},  # no span fits: narrowed, said so
        },
        "required": ["short", "word"],
    },
]


def test_grounded_values_give_the_same_tokens_from_our_span_automaton_and_llguidance(tiny_llama_dir, monkeypatch):
    """A grounded response format is bound to our span automaton; the same requests bound by llguidance (the span
    automaton switched off) must give the same tokens and narrowing, budgets tight and loose."""
    from loraplex.grammar.compiler import GrammarCompiler
    from loraplex.grammar.grounding import SourceText

    text, _ = TASKS[0]
    sources = (SourceText(1, text),)

    def run() -> tuple[list[Any], list[str]]:
        llm = LLM(model=str(tiny_llama_dir), num_kv_blocks=512, enable_prefix_caching=False)
        compiler = llm.engine.structured.compiler
        try:
            prompts, params, served, narrowings = [], [], [], []
            for schema in GROUNDED_SCHEMAS:
                spec = StructuredSpec(json=schema)
                grammar = compiler.compile(spec, sources)
                served.append(grammar.backend)
                narrowings.append(grammar.narrowing)
                for slack in (0, 2, 12, 60):
                    prompts.append(llm.chat_prompt(messages(text, schema)))
                    params.append(
                        SamplingParams(
                            max_tokens=grammar.min_tokens + slack,
                            temperature=0.0,
                            structured=spec,
                            grounding_sources=sources,
                        )
                    )
            return [*_answers(llm, prompts, params), narrowings], served
        finally:
            compiler.close()

    ours, served = run()
    assert set(served) == {"span"}
    monkeypatch.setattr(GrammarCompiler, "_span_parts", lambda self, template: None)
    theirs, served = run()
    assert set(served) == {"llguidance"}
    assert ours == theirs
    assert any("/properties/absent" in n for n in ours[-1][-1])  # (the narrowing is said, by both)
