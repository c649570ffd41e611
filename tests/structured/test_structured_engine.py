"""Structured output inside the engine's batch, on the real SmolLM2 model."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from loraplex.engine import LLM, SamplingParams
from loraplex.grammar.spec import GrammarError, StructuredSpec
from tests.structured.schemas import TASKS, messages

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm():
    return LLM(max_num_seqs=64, max_num_batched_tokens=2048, num_kv_blocks=1500)


def prompts(llm) -> list[list[int]]:
    return [llm.chat_prompt(messages(text, schema)) for text, schema in TASKS]


def assert_all_valid(outs, finish_reasons=("stop",)) -> None:
    for (text, schema), out in zip(TASKS, outs):
        assert out.finish_reason in finish_reasons, (text, out.text, out.finish_reason, out.error)
        jsonschema.validate(json.loads(out.text), schema)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_extraction_parses_and_validates(llm, temperature):
    assert len(TASKS) >= 30
    params = [
        SamplingParams(max_tokens=200, temperature=temperature, seed=i, structured=StructuredSpec(json=schema))
        for i, (_, schema) in enumerate(TASKS)
    ]
    assert_all_valid(llm.generate(prompts(llm), params))


def test_budget_of_one_and_a_half_times_the_shortest_document_still_closes(llm):
    compiler = llm.engine.structured.compiler
    params = []
    for i, (_, schema) in enumerate(TASKS):
        shortest = compiler.compile(StructuredSpec(json=schema)).min_tokens
        params.append(
            SamplingParams(
                max_tokens=math.ceil(1.5 * shortest),
                temperature=1.0,
                seed=100 + i,
                structured=StructuredSpec(json=schema),
            )
        )
    outs = llm.generate(prompts(llm), params)
    assert_all_valid(outs)
    assert all(len(o.token_ids) <= p.max_tokens for o, p in zip(outs, params))


@pytest.mark.parametrize("constrained_first", [True, False], ids=["constrained-first", "constrained-second"])
def test_unconstrained_neighbour_is_unchanged(llm, constrained_first):
    """The mask lands on the constrained request's logits row wherever it sits in the batch."""
    free = llm.chat_prompt([{"role": "user", "content": "Name three rivers in Europe."}])
    alone = llm.generate([free], SamplingParams(max_tokens=24, temperature=0.0))[0].token_ids
    text, schema = TASKS[0]
    constrained = (
        llm.chat_prompt(messages(text, schema)),
        SamplingParams(max_tokens=60, temperature=0.0, structured=StructuredSpec(json=schema)),
    )
    unconstrained = (free, SamplingParams(max_tokens=24, temperature=0.0))
    batch = [constrained, unconstrained] if constrained_first else [unconstrained, constrained]
    outs = llm.generate([p for p, _ in batch], [params for _, params in batch])
    out_constrained, out_free = outs if constrained_first else outs[::-1]
    assert out_free.token_ids == alone
    jsonschema.validate(json.loads(out_constrained.text), schema)


def test_a_model_that_wants_to_stop_still_closes_the_document(llm):
    """EOS favoured by +30 on every step, under budgets from the shortest document to twice it: EOS is taken
    only once the document is complete, never earlier (free steps, checked steps, the plan's steps)."""
    compiler = llm.engine.structured.compiler
    eos = sorted(llm.engine.eos_token_ids)
    batch, params, schemas = [], [], []
    for i, (text, schema) in enumerate(TASKS[:8]):
        shortest = compiler.compile(StructuredSpec(json=schema)).min_tokens
        for budget in (shortest, math.ceil(1.3 * shortest), 2 * shortest):
            batch.append(llm.chat_prompt(messages(text, schema)))
            schemas.append(schema)
            params.append(
                SamplingParams(
                    max_tokens=budget,
                    temperature=1.0,
                    seed=i,
                    logit_bias=dict.fromkeys(eos, 30.0),
                    structured=StructuredSpec(json=schema),
                )
            )
    outs = llm.generate(batch, params)
    for out, p, schema in zip(outs, params, schemas):
        assert out.finish_reason == "stop", (out.text, out.finish_reason, out.error)
        assert len(out.token_ids) <= p.max_tokens
        jsonschema.validate(json.loads(out.text), schema)


def test_regex_and_choice_constraints(llm):
    p = llm.chat_prompt([{"role": "user", "content": "Give me a date."}])
    outs = llm.generate(
        [p, p],
        [
            SamplingParams(
                max_tokens=20, temperature=0.0, structured=StructuredSpec(regex=r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
            ),
            SamplingParams(max_tokens=20, temperature=0.0, structured=StructuredSpec(choice=["yes", "no", "maybe"])),
        ],
    )
    import re

    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", outs[0].text) and outs[0].finish_reason == "stop"
    assert outs[1].text in ("yes", "no", "maybe") and outs[1].finish_reason == "stop"


def test_too_small_budget_is_refused_with_the_number(llm):
    eng = llm.engine
    shortest = eng.structured.compiler.compile(StructuredSpec(json=TASKS[0][1])).min_tokens
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=2, structured=StructuredSpec(json=TASKS[0][1])), "tiny")
    eng.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0), "other")
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    assert done["tiny"].finish_reason == "error"
    assert f"needs {shortest} tokens" in done["tiny"].error
    assert done["other"].finish_reason == "length"


@pytest.mark.parametrize(
    "spec, message",
    [
        (dict(json={"type": "object", "properties": {"a": {"type": "strng"}}}), "strng"),
        (dict(json={"$ref": "https://example.com/s.json"}), "points outside this schema"),
        (dict(json={"type": "integer", "minimum": 5, "maximum": 2}), "schema is unsatisfiable"),
        (dict(regex="([a-z"), "unclosed character class"),
        (dict(grammar="start: ( 'a' "), "grammar syntax error"),
    ],
)
def test_bad_constraints_fail_only_their_request(llm, spec, message):
    eng = llm.engine
    try:
        structured = StructuredSpec(**spec)
    except GrammarError as exc:  # refused while building the spec: the clearest possible error
        assert message in str(exc)
        return
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=30, structured=structured), "bad")
    eng.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0), "neighbour")
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    assert done["bad"].finish_reason == "error" and message in done["bad"].error, done["bad"].error
    assert done["neighbour"].finish_reason == "length"
    eng.check_invariants()
