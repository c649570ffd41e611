"""Our span automaton for grounded values (grammar/span_automaton.py, grammar/span_grammar.py): its symbols, its C
build and walk against the plain-Python reference, and its language against llguidance's grounded grammar, mask by
mask under a token budget (the same request must get the same tokens whichever of the two binds it)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch

from loraplex.grammar import GrammarError, StructuredSpec
from loraplex.grammar.grounding import SourceText
from loraplex.grammar.span_automaton import (
    ReferenceSpans,
    SpanAutomaton,
    SpanMatcher,
    SpanRequest,
    TemplateDFA,
    TokenTrie,
    reference_mask,
    source_symbols,
)
from tests.c_kernels import needs_c_kernels
from tests.grammar.helpers import EOS, allowed_ids
from tests.grammar.test_grammar_grounded import random_schema, random_source

G = {"type": "string", "x-loraplex-grounded": True}


def test_symbols_are_the_canonical_spelling_with_escapes_marked():
    sources = [SourceText(0, 'a"\\\n\x01é😀\U00100001x'), SourceText(2, "z")]
    expected = [97, 92, 34 + 256, 92, 92 + 256, 92, 110 + 256]  # a \" \\ \n
    expected += [92, 117 + 256, 48 + 256, 48 + 256, 48 + 256, 49 + 256]  # \u0001
    expected += [0xC3, 0xA9, 0xF0, 0x9F, 0x98, 0x80]  # é 😀 as UTF-8
    expected += [512, 120, 512, 122]  # a plane-16 character splits a message; messages never join
    assert source_symbols(sources).tolist() == expected


def substrings(symbols: list[int]) -> set[tuple[int, ...]]:
    return {tuple(symbols[i:j]) for i in range(len(symbols)) for j in range(i, len(symbols) + 1)}


@pytest.mark.parametrize("seed", range(4))
def test_the_suffix_automaton_reads_exactly_the_substrings(seed):
    rng = random.Random(seed)
    symbols = [rng.choice([97, 98, 99, 92 + 256]) for _ in range(rng.randint(1, 40))]
    reference = ReferenceSpans(symbols)
    subs = substrings(symbols)
    for length in range(1, 7):  # every string over the alphabet up to 6 symbols: read iff a substring
        for _ in range(60):
            probe = tuple(rng.choice([97, 98, 99, 92 + 256]) for _ in range(length))
            s: int | None = 0
            for c in probe:
                s = reference.next(s, c) if s is not None else None
            assert (s is not None) == (probe in subs), probe


@pytest.fixture(scope="module")
def trie(compiler) -> TokenTrie:
    return TokenTrie.of(compiler.vocab.token_bytes)


def template_of(compiler, schema: dict[str, Any]) -> TemplateDFA:
    from loraplex.grammar.workers.job import CompileOptions, translate

    tr = translate(StructuredSpec(json=schema), CompileOptions())
    assert tr.grounded_regex is not None
    return TemplateDFA.of_regex(tr.grounded_regex, [slot.content for slot in tr.grounded])


@needs_c_kernels
@pytest.mark.parametrize("seed", range(3))
def test_the_c_masks_equal_the_python_reference(compiler, trie, seed):
    rng = random.Random(seed)
    sources = [SourceText(1, random_source(rng)), SourceText(3, random_source(rng))]
    template = template_of(compiler, {"type": "object", "properties": {"a": G, "b": {"type": "array", "items": G}}})
    reference = ReferenceSpans(source_symbols(sources).tolist())
    matcher = SpanMatcher(SpanRequest(SpanAutomaton(sources), template), trie)
    token_bytes = compiler.vocab.token_bytes
    words = np.zeros(compiler.vocab.words, dtype=np.uint32)
    for _ in range(14):
        words[:] = 0
        matcher.mask(words)
        ours = set(allowed_ids(torch.from_numpy(words.view(np.int32))))
        t, s, d, q = matcher.key()
        assert q == -1  # (no other keyword: the reference has no content DFA)
        assert ours == reference_mask(reference, template, token_bytes, (t, s, d))
        if not ours:
            break
        inside = [t for t in sorted(ours) if b'"' not in token_bytes[t]]  # mostly stay inside a value
        assert matcher.consume(token_bytes[rng.choice(inside if inside and rng.random() < 0.8 else sorted(ours))])


def random_plain_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """Grounded strings without other keywords (what the span automaton serves) among other values."""
    kinds = ["g", "g", "obj", "arr", "int", "plain", "any_of"] if depth < 2 else ["g", "int", "plain"]
    kind = rng.choice(kinds)
    if kind == "g":
        return dict(G)
    if kind == "obj":
        props = {f"k{i}": random_plain_schema(rng, depth + 1) for i in range(rng.randint(1, 3))}
        return {"type": "object", "properties": props, "required": [k for k in props if rng.random() < 0.7]}
    if kind == "arr":
        return {"type": "array", "items": random_plain_schema(rng, depth + 1), "maxItems": 3}
    if kind == "any_of":
        return {"anyOf": [random_plain_schema(rng, depth + 1), {"type": "integer", "minimum": 0, "maximum": 9}]}
    if kind == "int":
        return {"type": "integer", "minimum": -5, "maximum": 500}
    return {"type": "string", "maxLength": 4}


def llguidance_binding(compiler, schema: dict[str, Any], sources: list[SourceText]):
    """The request bound by llguidance: the compiler's template with the span automaton switched off."""
    template = compiler.prepare(StructuredSpec(json=schema)).result()
    assert template.spans is not None, "a grounded response format is the span automaton's"
    by_llguidance = copy.copy(template)
    by_llguidance.spans = None
    return by_llguidance.bind(sources)


def both_bindings(compiler, schema: dict[str, Any], sources: list[SourceText]):
    """The request bound by the span automaton (what the compiler serves) and by llguidance."""
    return compiler.compile(StructuredSpec(json=schema), sources), llguidance_binding(compiler, schema, sources)


@needs_c_kernels
@pytest.mark.parametrize("keywords", [False, True], ids=["grounded only", "with other keywords"])
@pytest.mark.parametrize("seed", range(16))
def test_masks_equal_llguidance_token_by_token_under_a_budget(compiler, seed, keywords):
    rng = random.Random(seed)
    schema = random_schema(rng, 0, [], "") if keywords else random_plain_schema(rng)
    if "x-loraplex-grounded" not in json.dumps(schema):
        schema = {"type": "object", "properties": {"g": G, "other": schema}, "required": ["g"]}
    # several requests of one schema (the completions every request shares are found by one, used by the next),
    # one of them with no text at all
    for sources in (
        [SourceText(i * 2 + 1, random_source(rng)) for i in range(rng.randint(1, 3))],
        [SourceText(1, "")],
        [SourceText(1, random_source(rng))],
    ):
        compare_with_llguidance(compiler, schema, sources, rng)


def compare_with_llguidance(compiler, schema: dict[str, Any], sources: list[SourceText], rng: random.Random) -> None:
    """Random walks under random budgets, every mask, forced run and budget decision of the two bindings equal."""
    try:
        ours, theirs = both_bindings(compiler, schema, sources)
    except GrammarError as e:  # a required grounded string no span satisfies: refused by both, in the same words
        with pytest.raises(GrammarError) as theirs_error:
            llguidance_binding(compiler, schema, sources)
        assert (e.code, str(e)) == (theirs_error.value.code, str(theirs_error.value))
        return
    assert (ours.backend, theirs.backend) == ("span", "llguidance")
    assert ours.min_tokens == theirs.min_tokens and ours.narrowing == theirs.narrowing
    for _ in range(3):
        budget = rng.randint(ours.min_tokens, ours.min_tokens + 30)
        a, b = ours.new_matcher(), theirs.new_matcher()
        mask_a = torch.zeros(a.bitmask_words(), dtype=torch.int32)
        mask_b = torch.zeros_like(mask_a)
        out: list[int] = []
        for step in range(budget + 1):
            a.fill_bitmask(mask_a, budget - step)
            b.fill_bitmask(mask_b, budget - step)
            assert torch.equal(mask_a, mask_b), (step, out)
            assert a.native_forced_bytes() == b.native_forced_bytes()
            assert a.needs_budget_check() == b.needs_budget_check()
            ids = allowed_ids(mask_a)
            token = rng.choice(ids)
            if a.needs_budget_check():  # the engine's rule: a sampled token must fit, else the fallback
                fits = a.fits_budget(token, budget - step - 1)
                assert fits == b.fits_budget(token, budget - step - 1)
                if not fits:
                    token = a.budget_fallback()
                    assert token == b.budget_fallback()
            assert a.accept_token(token) and b.accept_token(token)
            if token == EOS:
                break
            out.append(token)
        assert a.is_accepting() and b.is_accepting()
        text = b"".join(compiler.vocab.token_bytes[t] or b"" for t in out).decode()
        json.loads(text)
        for v in ours.grounding.locate(text):  # where they came from: spans of the message each names
            source = next(s for s in sources if s.message == v.message)
            assert 0 <= v.start <= v.end <= len(source.text)


def budgeted_walk(compiler, grammar, rng: random.Random, budget: int) -> Any:
    """A random output within ``budget`` tokens under the engine's rule (a sampled token that does not fit the budget
    gives way to the fallback), parsed."""
    m = grammar.new_matcher()
    mask = torch.zeros(m.bitmask_words(), dtype=torch.int32)
    out: list[int] = []
    for step in range(budget):
        m.fill_bitmask(mask, budget - step)
        token = rng.choice(allowed_ids(mask))
        if m.needs_budget_check() and not m.fits_budget(token, budget - step - 1):
            token = m.budget_fallback()
        assert m.accept_token(token)
        if token == EOS:
            break
        out.append(token)
    return json.loads(b"".join(compiler.vocab.token_bytes[t] or b"" for t in out).decode())


@needs_c_kernels
def test_keywords_beside_grounding_are_intersected_by_the_span_automaton(compiler):
    sources = [SourceText(1, "order ABC-12, code XY, ticket 7")]
    for extra, values in (
        ({"maxLength": 3}, None),
        ({"pattern": "^[A-Z]+$"}, {"A", "AB", "ABC", "B", "BC", "C", "X", "XY", "Y"}),
        ({"enum": ["ABC", "x", "XY"]}, {"ABC", "XY"}),
        ({"minLength": 6, "pattern": "^[A-Z]{3}-[0-9]+$"}, {"ABC-12"}),
    ):
        grammar = compiler.compile(StructuredSpec(json={**G, **extra}), sources)
        assert grammar.backend == "span", extra
        rng = random.Random(0)
        seen = set()
        for _ in range(25):
            value = budgeted_walk(compiler, grammar, rng, 12)
            assert value in sources[0].text and jsonschema.Draft202012Validator({**G, **extra}).is_valid(value)
            seen.add(value)
        if values is not None:
            assert seen <= values, extra


@needs_c_kernels
def test_a_large_source_is_served_and_every_value_is_a_span(compiler):
    rng = random.Random(9)
    text = "".join(rng.choices('abcdefgh ijklm\n"\\é', k=100_000))
    grammar = compiler.compile(StructuredSpec(json={"type": "array", "items": G, "maxItems": 4}), [SourceText(1, text)])
    assert grammar.backend == "span"
    for _ in range(4):
        values = budgeted_walk(compiler, grammar, rng, 40)
        assert all(v in text for v in values)


@needs_c_kernels
def test_completions_that_hold_for_every_source_are_shared_and_others_are_not(compiler):
    free = {"type": "object", "properties": {"a": G, "n": {"type": "integer"}}, "required": ["a", "n"]}
    needs_text = {"type": "object", "properties": {"a": {**G, "minLength": 1}}, "required": ["a"]}
    for schema, shared in ((free, True), (needs_text, False)):
        spec = StructuredSpec(json=schema)
        template = compiler.prepare(spec).result()
        first = compiler.compile(spec, [SourceText(1, "Ada Lovelace")])
        brace = compiler.vocab.token_bytes.index(b"{")
        m = first.new_matcher()
        assert m.accept_token(brace)  # (off the start's plan, which the worker made)
        m.fill_bitmask(torch.zeros(m.bitmask_words(), dtype=torch.int32), 1)  # a tight budget: a plan is made
        paths = template.spans.shared.paths
        assert bool(paths) == shared, schema
        for key, (path, _) in paths.items():  # a shared completion reads no grounded string's content
            assert key[1] == -1 and path is not None
        second = compiler.compile(spec, [SourceText(1, "Grace Hopper")])
        n = second.new_matcher()
        assert n.accept_token(brace)
        if shared:  # the second request finds the first one's completion without searching
            before = second.search.masks_computed
            assert n.min_tokens_to_accept() == m.min_tokens_to_accept()
            assert second.search.masks_computed == before
