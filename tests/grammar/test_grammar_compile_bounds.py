"""Compile-time bounds (issue 17's speed targets) that change no language: the inlined metaschemas give
jsonschema's own verdicts, the regex DNF stops at its term bound instead of expanding a product first, and
the completion search gives up a looping greedy walk for the bounded search."""

from __future__ import annotations

import contextlib
import json

import jsonschema
import pytest
from jsonschema.validators import validator_for

from loraplex.grammar import StructuredSpec
from loraplex.grammar import search as search_module
from loraplex.grammar.schema.metaschema import fast_metaschema_validator, metaschema_validator
from loraplex.grammar.schema.normalize import MAX_TERMS, Ctx, Normalizer, NotRegular
from tests.grammar.helpers import REPO, besides_number_bounds, load_suite, walks_validate

CORPUS = REPO.parent / "shared" / "schemas" / "schemastore-dev"
DRAFTS = [
    jsonschema.Draft202012Validator,
    jsonschema.Draft201909Validator,
    jsonschema.Draft7Validator,
    jsonschema.Draft6Validator,
    jsonschema.Draft4Validator,
]
INVALID = [
    {"type": 3},
    {"properties": {"a": {"minLength": -1}}},
    {"items": [{"type": "x"}]},
    {"$defs": {"a": {"enum": 5}}},
    {"allOf": [{"required": [1]}]},
    {"anyOf": []},
    {"properties": {"a": {"items": {"not": {"type": 7}}}}},
    {"dependentSchemas": {"a": {"maxProperties": "2"}}},
    {"$dynamicAnchor": 3, "prefixItems": [{"const": 1}, {"contains": {"minContains": -2}}]},
    {"if": {"$anchor": "no spaces allowed"}},
    {"properties": {"$ref": 5}, "$vocabulary": {"x": 1}},
    {"definitions": {"a": {"type": 5}}},
    {"dependencies": {"a": 3}},
    {"items": [{"type": "q"}], "additionalItems": {"enum": []}},
    {"properties": {"a": {"exclusiveMinimum": True}}},
]


def _corpus(ids: set[str] | None) -> list[dict]:
    """The dev corpus's schemas named by `ids` (None: all)."""
    out = []
    for line in (CORPUS / "index.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if ids is None or entry["id"] in ids:
            out.append(json.loads((CORPUS / entry["file"]).read_text()))
    assert len(out) == (304 if ids is None else len(ids))
    return out


def _errors(validator, schema) -> list:
    return sorted(
        (e.message, list(e.absolute_path), list(e.schema_path)[-1:], e.validator) for e in validator.iter_errors(schema)
    )


@pytest.mark.parametrize("cls", DRAFTS, ids=lambda c: c.__name__)
def test_static_metaschema_gives_jsonschemas_verdicts(cls):
    """Valid and invalid schemas: the same errors (message, instance path, keyword) as jsonschema's own
    metaschema validator with its references (dynamic ones for 2019-09 and 2020-12)."""
    schemas = [c["schema"] for c in load_suite()[:300] if isinstance(c.get("schema"), (dict, bool))]
    schemas += _corpus({"enonic-xp-cms-8.0.0", "gitea-issue-forms"}) + INVALID
    invalid = 0  # among INVALID (the last ones): some keywords are one draft's only
    for schema in schemas:
        if isinstance(schema, dict):
            schema = {k: v for k, v in schema.items() if k != "$schema"}
        expected = _errors(cls(cls.META_SCHEMA), schema)
        assert _errors(metaschema_validator(cls), schema) == expected, schema
        invalid += bool(expected) and any(schema is s or schema == s for s in INVALID)
    assert invalid >= 6  # errors are compared, not only their absence


@pytest.mark.parametrize("cls", DRAFTS, ids=lambda c: c.__name__)
def test_fast_metaschema_check_gives_jsonschemas_verdicts(cls):
    """jsonschema-rs decides "valid" for the compile (jsonschema explains an invalid one): on the suite's
    schemas, the whole dev corpus and the invalid ones, its verdict is jsonschema's under every draft."""
    schemas = [c["schema"] for c in load_suite() if isinstance(c.get("schema"), (dict, bool))]
    schemas += _corpus(None) + INVALID
    rejected = 0
    for schema in schemas:
        if isinstance(schema, dict):
            schema = {k: v for k, v in schema.items() if k != "$schema"}
        expected = cls(cls.META_SCHEMA).is_valid(schema)
        assert fast_metaschema_validator(cls).is_valid(schema) == expected, schema
        rejected += not expected
    assert rejected >= 6


def test_dnf_stops_at_its_bound_before_expanding_a_product():
    """allOf of 24 two-way anyOfs is a product of 2**24 terms: the bound is met after a few factors (before,
    the whole product was built before checking it, ~the hang SchemaStore's `function` showed)."""
    factors = [
        {"anyOf": [{"type": "string", "minLength": i}, {"type": "string", "maxLength": 100 + i}]} for i in range(24)
    ]
    norm = Normalizer({"allOf": factors}, max_ref_depth=3)
    calls = 0
    conjoin = norm._conjoin

    def counted(*args):
        nonlocal calls
        calls += 1
        return conjoin(*args)

    norm._conjoin = counted  # type: ignore[method-assign]  # (a counting wrapper, for this test)
    with pytest.raises(NotRegular, match=f"more than {MAX_TERMS} alternatives"):
        norm.dnf([({"allOf": factors}, "")], Ctx())
    assert calls < 4 * MAX_TERMS * 8, calls


def test_product_schema_compiles_through_llguidance_and_validates(compiler):
    """The same product as a real request: refused by the regex route at its bound, served exactly by
    llguidance, and every walk validates."""
    factors = [{"anyOf": [{"minLength": i}, {"maxLength": 30 - i}]} for i in range(7)]
    schema = {"type": "object", "properties": {"s": {"type": "string", "allOf": factors}}, "required": ["s"]}
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert grammar.backend == "llguidance" and not besides_number_bounds(grammar.narrowing)
    walks_validate(compiler, schema, grammar, 7, walks=8, budget=80)


def test_looping_greedy_walk_gives_way_to_the_search(compiler, monkeypatch):
    """SchemaStore's lefthook: the greedy completion walk loops (before: ~1000 searches for a way out, seconds,
    then failed) while the bounded search finds `{}`; the first walk now stops after GREEDY_LOOP_EXITS."""
    schema = _corpus({"lefthook"})[0]
    exits = 0
    leave_loop = search_module.CompletionSearch._leave_loop

    def counted(self, *args):
        nonlocal exits
        exits += 1
        return leave_loop(self, *args)

    monkeypatch.setattr(search_module.CompletionSearch, "_leave_loop", counted)
    from llguidance import LLMatcher

    from loraplex.grammar.workers.job import CompileOptions, WorkerContext, translate

    ctx = WorkerContext(compiler.vocab, CompileOptions())
    tr = translate(StructuredSpec(json=schema), ctx.options)
    matcher = LLMatcher(ctx.ll_tokenizer, tr.llg, log_level=0)
    plan = ctx.search.plan(matcher)
    assert plan is not None and exits <= search_module.GREEDY_LOOP_EXITS
    assert b"".join(compiler.vocab.token_bytes[t] for t in plan) == b"{}"
    check = validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    assert check.is_valid({})


def test_greedy_walk_without_its_bound_is_the_last_resort(compiler, monkeypatch):
    """With no loop exit allowed and no search, the unbounded greedy walk still finds a completion."""
    monkeypatch.setattr(search_module, "GREEDY_LOOP_EXITS", 0)
    from llguidance import LLMatcher

    from loraplex.grammar.workers.job import CompileOptions, WorkerContext, translate

    ctx = WorkerContext(compiler.vocab, CompileOptions())
    monkeypatch.setattr(ctx.search, "_shortest", lambda matcher, limit: None)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "e": {"type": "string", "format": "email"}}}
    schema["required"] = ["n", "e"]
    tr = translate(StructuredSpec(json=schema), ctx.options)
    matcher = LLMatcher(ctx.ll_tokenizer, tr.llg, log_level=0)
    assert ctx.search._greedy(matcher, 0) is None  # the bounded walk meets a loop (the integer's digits)
    plan = ctx.search.plan(matcher)
    assert plan is not None
    text = b"".join(compiler.vocab.token_bytes[t] for t in plan).decode()
    assert jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).is_valid(json.loads(text))


def test_greedy_walk_closes_each_string_once_its_length_is_met(compiler):
    """The second and third strings of an object repeat the first one's masks, but a forced key lies between
    them: no loop. (Before, each later string was walked through an escape and UTF-8 lead bytes, each a new
    mask, before it closed: `"\\"\\""` for a two-character string, and on elm 1800 masks, 250 ms.)"""
    from llguidance import LLMatcher

    from loraplex.grammar.workers.job import CompileOptions, WorkerContext, translate

    ctx = WorkerContext(compiler.vocab, CompileOptions())
    schema = {"type": "object", "properties": {k: {"type": "string", "minLength": 2} for k in "abc"}}
    schema["required"] = list("abc")
    tr = translate(StructuredSpec(json=schema), ctx.options)
    path = ctx.search.completion_bytes(LLMatcher(ctx.ll_tokenizer, tr.llg, log_level=0))
    assert path is not None and len(path) == len(b'{"a":"xx","b":"xx","c":"xx"}') and b"\\" not in path, path
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(path))


SECTIONS = {  # sourcemap-v3's shape: the root recurs through a reference that an allOf intersects
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "sections": {
            "type": "array",
            "maxItems": 2,
            "items": {"allOf": [{"$ref": "#/$defs/section"}, {"properties": {"offset": {"type": "integer"}}}]},
        },
    },
    "required": ["name"],
    "$defs": {
        "section": {
            "type": "object",
            "properties": {"map": {"$ref": "#"}, "tag": {"const": {"$ref": "#/data, not a reference"}}},
        }
    },
}


def test_root_recurring_through_an_intersected_reference_compiles_in_llguidance(llg_compiler, tokenizer):
    """llguidance compiled the root twice and refused ("circular references with sibling keys"); the retry
    makes the root a definition. Nested documents are accepted (exact), every walk validates, and a const
    value holding a "$ref" key is left as it is (it is data, not a reference)."""
    grammar = llg_compiler.compile(StructuredSpec(json=SECTIONS))
    assert grammar.backend == "llguidance" and not besides_number_bounds(grammar.narrowing)
    check = jsonschema.Draft202012Validator(SECTIONS)
    nested = {"name": "a", "sections": [{"map": {"name": "b", "sections": [{"offset": 3}]}, "offset": 1}]}
    tagged = {"name": "c", "sections": [{"tag": {"$ref": "#/data, not a reference"}}]}
    for doc in (nested, tagged):
        assert check.is_valid(doc)
        text = json.dumps(doc, separators=(",", ":"))
        ids = tokenizer.encode(text, add_special_tokens=False)
        matcher = grammar.new_matcher()
        assert all(matcher.accept_token(t) for t in ids) and matcher.is_accepting(), text
    walks_validate(llg_compiler, SECTIONS, grammar, 3, walks=20, budget=120)


def test_budget_checks_are_bounded_where_the_greedy_walk_cannot_finish_a_pattern(llg_compiler, monkeypatch):
    """BizTalk's path pattern: from inside the string the greedy completion never writes `.dll`, and one budget
    check computed ~120k masks (16 s in a decode step) before failing. Now a check stops at CHECK_MAX_MASKS and
    says "does not fit", at most one search per position runs out, and every walk still validates and closes."""
    schema = {
        "type": "object",
        "properties": {"Path": {"type": "string", "pattern": r"\w+[\\](\w+\.)*\w+\.dll"}},
    }  # (optional, as there: the plan is `{}`)
    grammar = llg_compiler.compile(StructuredSpec(json=schema))
    assert grammar.backend == "llguidance"
    masks, per_check, ran_out = 0, [], 0
    mask, check = search_module.CompletionSearch._mask, search_module.CompletionSearch.check

    def counted_mask(self, m):
        nonlocal masks
        out = mask(self, m)  # (raises, computing nothing, once the allowance is spent)
        masks += 1
        return out

    def counted_check(self, matcher, budget):
        nonlocal masks, ran_out
        masks = 0
        out = check(self, matcher, budget)
        per_check.append(masks)
        ran_out += out[1] is None
        return out

    monkeypatch.setattr(search_module.CompletionSearch, "_mask", counted_mask)
    monkeypatch.setattr(search_module.CompletionSearch, "check", counted_check)
    walks_validate(llg_compiler, schema, grammar, 5, walks=6, budget=96)
    assert per_check and max(per_check) <= search_module.CHECK_MAX_MASKS
    assert ran_out >= 1, per_check  # the bound was reached: the case this test is about happened


def test_plan_is_spelled_with_the_fewest_tokens_and_the_matcher_asked_only_when_it_refuses(compiler):
    """The plan's bytes are spelled over the vocabulary alone and checked once (before: a matcher copy per
    byte, 16 ms on knowledge-unit's 564-byte plan); where the matcher refuses that spelling, the search asks
    it at every position."""
    from llguidance import LLMatcher

    from loraplex.grammar.workers.job import CompileOptions, WorkerContext, translate

    ctx = WorkerContext(compiler.vocab, CompileOptions())
    words = {"type": "string", "enum": ["alpha beta gamma", "delta"]}
    schema = {"type": "object", "properties": {"k": words, "n": {"type": "integer"}}, "required": ["k", "n"]}
    matcher = LLMatcher(ctx.ll_tokenizer, translate(StructuredSpec(json=schema), ctx.options).llg, log_level=0)
    path = ctx.search.completion_bytes(matcher)
    spell = compiler.vocab.token_bytes
    fast, asked = ctx.search.tokenize(matcher, path), ctx.search._fewest_tokens(path, matcher)
    assert b"".join(spell[t] for t in fast) == path == b"".join(spell[t] for t in asked)
    assert len(fast) == len(asked) < len(path)  # multi-byte tokens, as few as the matcher-checked search
    assert matcher.deep_copy().validate_tokens(fast) == len(fast)

    class OneByteTokensOnly:
        """A matcher that refuses every token of more than one byte."""

        def __init__(self, inner) -> None:
            self.inner = inner

        def deep_copy(self):
            return OneByteTokensOnly(self.inner.deep_copy())

        def consume_token(self, token: int) -> bool:
            return len(spell[token]) == 1 and self.inner.consume_token(token)

        def validate_tokens(self, tokens: list[int]) -> int:
            ok = 0
            while ok < len(tokens) and len(spell[tokens[ok]]) == 1:
                ok += 1
            return self.inner.validate_tokens(tokens[:ok])

    slow = ctx.search.tokenize(OneByteTokensOnly(matcher), path)
    assert len(slow) == len(path) and b"".join(spell[t] for t in slow) == path
    copies = 0

    class Counted(OneByteTokensOnly):
        def deep_copy(self):
            nonlocal copies
            copies += 1
            return Counted(self.inner.deep_copy())

        def consume_token(self, token: int) -> bool:
            return self.inner.consume_token(token)

        def validate_tokens(self, tokens: list[int]) -> int:
            return self.inner.validate_tokens(tokens)

    assert ctx.search.tokenize(Counted(matcher), path) == fast and copies == 1  # one check, no copy per byte


def test_a_retry_flag_that_changes_nothing_builds_nothing(compiler, monkeypatch):
    """bundleconfig: llguidance finds a required property unsatisfiable (its oneOf's complements meet the closed
    objects around them). The schema has no patternProperties, so dropping them is not tried, and a retry whose
    translation is one already refused is not built again (before: three builds of one text, ~60 ms each)."""
    from loraplex.grammar import GrammarError
    from loraplex.grammar.workers import job

    ctx = job.WorkerContext(compiler.vocab, job.CompileOptions())
    schema = _corpus({"bundleconfig"})[0]
    flags, built = [], []
    translate, build = job.translate, job._build
    monkeypatch.setattr(job, "translate", lambda *a, **k: (flags.append(k), translate(*a, **k))[1])
    monkeypatch.setattr(job, "_build", lambda c, tr: (built.append((tr.llg, tr.regex)), build(c, tr))[1])
    with contextlib.suppress(GrammarError):  # (refused today; the test is about what was built on the way)
        job.compile_spec(ctx, StructuredSpec(json=schema))
    assert '"patternProperties"' not in json.dumps(schema)
    assert not any(k.get("drop_pattern_properties") for k in flags), flags
    assert built and len(built) == len(set(built)), len(built)
