"""Always finished, always valid: budget mode closes the output in exactly the promised tokens.

A random walk (random allowed tokens, no EOS) goes some way into the output, then the budget is
set to min_tokens_to_accept() and random allowed tokens are taken in budget mode: the output must
be complete after exactly that many tokens, and (for JSON) validate with jsonschema.

With slack (a budget of 1.5x the shortest output from the start), tokens are drawn freely the way the
engine's sampler does: a token the matcher wants checked must pass fits_budget, else a runner-up,
else the matcher's fallback. The output must still end complete within the budget.
"""

from __future__ import annotations

import json
import math
import random

import jsonschema
import pytest
import torch

from loraplex.grammar import StructuredSpec
from tests.grammar.helpers import EOS, VOCAB, allowed_ids

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "born": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    },
    "required": ["name", "age", "role", "born", "tags"],
}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v"],
        }
    },
    "$ref": "#/$defs/node",
}
SPECS = {
    "person": StructuredSpec(json=PERSON),
    "tree": StructuredSpec(json=TREE),
    "json_object": StructuredSpec(json_object=True),
    "email": StructuredSpec(
        json={"type": "object", "properties": {"to": {"type": "string", "format": "email"}}, "required": ["to"]}
    ),
    "regex": StructuredSpec(regex=r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8}){0,2}\."),
    "choice": StructuredSpec(choice=["alpha", "beta", "gamma delta"]),
    # one token ("when") commits to an optional key whose value alone takes ~20 tokens
    "optional_long": StructuredSpec(
        json={
            "type": "object",
            "additionalProperties": False,
            "required": ["people"],
            "properties": {
                "when": {"type": "string", "format": "date-time"},
                "people": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            },
        }
    ),
    "grammar": StructuredSpec(
        grammar='start: expr\nexpr: term (("+" | "-") term)*\nterm: NUMBER | "(" expr ")"\n%import common.NUMBER\n'
    ),
}


def _schema(spec: StructuredSpec):
    if spec.json_object:
        return {"type": "object"}
    return spec.schema() if spec.json is not None else None


def _walk(grammar, rng: random.Random, steps: int):
    m = grammar.new_matcher()
    out = torch.zeros((VOCAB + 31) // 32, dtype=torch.int32)
    tokens: list[int] = []
    for _ in range(steps):
        m.fill_bitmask(out)
        choices = [t for t in allowed_ids(out) if t != EOS]
        if not choices:
            break
        t = rng.choice(choices)
        assert m.accept_token(t)
        tokens.append(t)
    budget = m.min_tokens_to_accept()
    for used in range(budget):
        m.fill_bitmask(out, remaining_tokens=budget - used)
        choices = allowed_ids(out)
        assert choices and EOS not in choices
        t = rng.choice(choices)
        assert m.accept_token(t)
        tokens.append(t)
        assert m.min_tokens_to_accept() == budget - used - 1  # every allowed token was one step closer
    assert m.is_accepting()
    m.fill_bitmask(out, remaining_tokens=0)
    assert allowed_ids(out) == [EOS]
    assert m.accept_token(EOS) and m.is_terminated()
    return tokens


@pytest.mark.parametrize("backend", ["compiler", "llg_compiler"])
@pytest.mark.parametrize("name", list(SPECS))
def test_random_walk_then_budget_ends_complete(request, tokenizer, backend, name):
    grammar = request.getfixturevalue(backend).compile(SPECS[name])
    rng = random.Random(f"{backend}-{name}")
    schema = _schema(SPECS[name])
    for _ in range(6):
        tokens = _walk(grammar, rng, steps=rng.randint(0, 25))
        text = tokenizer.decode(tokens)
        if schema is not None:
            jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("backend", ["compiler", "llg_compiler"])
def test_min_tokens_from_the_start_is_achieved(request, backend):
    grammar = request.getfixturevalue(backend).compile(SPECS["person"])
    tokens = _walk(grammar, random.Random(0), steps=0)
    assert len(tokens) == grammar.min_tokens


def test_without_close_within_budget_the_mask_is_never_narrowed(compiler, tokenizer):
    loose = StructuredSpec(regex="[a-z]{1,20}", close_within_budget=False)
    m = compiler.compile(loose).new_matcher()
    assert m.accept_token(tokenizer.encode("a", add_special_tokens=False)[0])
    a, b = torch.zeros(1536, dtype=torch.int32), torch.zeros(1536, dtype=torch.int32)
    m.fill_bitmask(a)
    m.fill_bitmask(b, remaining_tokens=0)
    assert torch.equal(a, b)


def _draw_like_the_sampler(m, choices: list[int], remaining: int, rng: random.Random) -> int:
    candidates = rng.sample(choices, min(8, len(choices)))
    if not m.needs_budget_check():
        return candidates[0]
    return next((t for t in candidates if m.fits_budget(t, remaining - 1)), None) or m.budget_fallback()


@pytest.mark.parametrize("backend", ["compiler", "llg_compiler"])
@pytest.mark.parametrize("name", ["person", "optional_long", "email", "tree", "grammar"])
def test_free_draws_under_one_and_a_half_times_the_shortest_budget_end_complete(request, tokenizer, backend, name):
    grammar = request.getfixturevalue(backend).compile(SPECS[name])
    budget = math.ceil(1.5 * grammar.min_tokens)
    schema = _schema(SPECS[name])
    out = torch.zeros((VOCAB + 31) // 32, dtype=torch.int32)
    for seed in range(12):
        rng = random.Random(f"{backend}-{name}-{seed}")
        m = grammar.new_matcher()
        tokens: list[int] = []
        while not m.is_terminated() and len(tokens) < budget:
            m.fill_bitmask(out, remaining_tokens=budget - len(tokens))
            t = _draw_like_the_sampler(m, allowed_ids(out), budget - len(tokens), rng)
            assert m.accept_token(t)
            tokens.append(t)
        assert m.is_accepting(), (seed, tokenizer.decode(tokens))
        text = tokenizer.decode([t for t in tokens if t != EOS])
        if schema is not None:
            jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("backend", ["compiler", "llg_compiler"])
@pytest.mark.parametrize("name", ["person", "optional_long", "tree", "regex"])
def test_eos_is_never_allowed_before_the_output_is_complete(request, backend, name):
    """At every incomplete state of random walks, under every budget from none to past the shortest completion:
    EOS is neither in the mask nor passes the budget check (a leaked EOS ends an output that does not parse)."""
    grammar = request.getfixturevalue(backend).compile(SPECS[name])
    out = torch.zeros((VOCAB + 31) // 32, dtype=torch.int32)
    checked = 0
    for seed in range(4):
        rng = random.Random(f"eos-{backend}-{name}-{seed}")
        m = grammar.new_matcher()
        for _ in range(rng.randint(3, 30)):
            if not m.is_accepting():
                shortest = m.min_tokens_to_accept()
                for remaining in (None, 0, 1, shortest, shortest + 1, 2 * shortest + 4):
                    m.fill_bitmask(out, remaining_tokens=remaining)
                    assert EOS not in allowed_ids(out), (seed, remaining)
                    if remaining is not None:
                        assert not m.fits_budget(EOS, remaining - 1), (seed, remaining)
                    checked += 1
            m.fill_bitmask(out)
            choices = [t for t in allowed_ids(out) if t != EOS]
            if not choices:
                break
            assert m.accept_token(rng.choice(choices))
    assert checked >= 20
