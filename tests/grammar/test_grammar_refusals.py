"""Every kind of refusal is a GrammarError whose message names the problem."""

from __future__ import annotations

import json
import re

import pytest

from loraplex.grammar import GrammarError, StructuredSpec
from tests.grammar.helpers import besides_number_bounds

_EXTERNAL = "unsupported \\$ref 'https://example.com/other.json' at /: it points outside this schema"
SCHEMA_REFUSALS = [  # schema, what the message says, the error's code
    ({"type": "strin"}, "invalid schema: .* at /type", "invalid_schema"),
    ({"type": "string", "minLength": -1}, "invalid schema: .* at /minLength", "invalid_schema"),
    (
        {"$schema": "http://json-schema.org/draft-04/schema#", "exclusiveMinimum": 3},
        "invalid schema: .* at /",
        "invalid_schema",
    ),
    ({"type": "integer", "minimum": 5, "maximum": 3}, "unsatisfiable", "unsatisfiable_schema"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "unsatisfiable", "unsatisfiable_schema"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "unsatisfiable", "unsatisfiable_schema"),
    # both branches always match: never exactly one
    ({"oneOf": [{"type": "integer"}, {"type": "integer"}]}, "unsatisfiable", "unsatisfiable_schema"),
    ({"not": {}}, "unsatisfiable", "unsatisfiable_schema"),
    (False, "the schema is false", "unsatisfiable_schema"),
    ({"$ref": "https://example.com/other.json"}, _EXTERNAL, "unsupported_schema"),
    ({"$ref": "#/$defs/missing"}, "does not resolve", "invalid_schema"),
    ({"type": "string", "pattern": "(?<=q)(?=z)"}, "look-aheads and look-behinds", "unsupported_schema"),
    # a back-reference, no witness
    ({"type": "string", "pattern": "(q)\\1z"}, "no known value satisfies it", "unsupported_schema"),
    (
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2},
        "cannot guarantee 2 distinct",
        "unsupported_schema",
    ),
    (
        {"type": "array", "contains": {"type": "string"}, "minContains": 3, "maxContains": 2},
        "below minContains",
        "unsatisfiable_schema",
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^q[0-9]{5}$": True},
            "additionalProperties": False,
            "minProperties": 2,
        },
        "minProperties at /: 2 properties .* no known names are admitted",
        "unsupported_schema",
    ),
    (
        {"$schema": "http://json-schema.org/draft-03/schema#", "type": "string"},
        "unsupported \\$schema dialect",
        "unsupported_schema",
    ),
]


@pytest.mark.parametrize("schema, message, code", SCHEMA_REFUSALS, ids=[m[:40] for _, m, _ in SCHEMA_REFUSALS])
def test_schema_refusals(compiler, schema, message, code):
    """Refused in a compile worker process: the message and the code both come back to the caller."""
    with pytest.raises(GrammarError, match=message) as refused:
        compiler.compile(StructuredSpec(json=schema))
    assert refused.value.code == code


def test_refusal_through_llguidance_too(llg_compiler):
    with pytest.raises(GrammarError, match=_EXTERNAL):
        llg_compiler.compile(StructuredSpec(json={"$ref": "https://example.com/other.json"}))


NARROWED = [  # schema -> a narrowing it must report (keyword and pointer first)
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems at /: at most one item"),
    ({"type": "string", "format": "date-time"}, "format at /: date-time: leap seconds"),
    ({"type": "string", "pattern": "^a\\b"}, "pattern at /: pattern '^a\\\\b': word boundary \\b cannot be enforced"),
    ({"type": "array", "contains": {"const": 1}}, "contains at /: the first 1 item(s)"),
    (
        {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1},
        "minProperties at /: met by requiring a",
    ),
    ({"type": "string", "format": "idn-email"}, "format at /: idn-email narrowed to ASCII addresses only"),
    # a map that must hold 3 keys (JSONSchemaBench's Handwritten dep6): written as the grammar counts, `{"a":..,
    # "b":..,"b":..}` has three keys, a JSON parser keeps two; the missing keys are named and required instead
    (
        {
            "type": "object",
            "patternProperties": {"^[a-e]$": True},
            "additionalProperties": False,
            "required": ["a"],
            "minProperties": 3,
        },
        "minProperties at /: met by requiring the keys b, c",
    ),
]


@pytest.mark.parametrize("schema, how", NARROWED, ids=[h[:40] for _, h in NARROWED])
def test_narrowings_are_reported_or_refused_on_request(compiler, schema, how):
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert any(n.startswith(how) for n in grammar.narrowing), grammar.narrowing
    with pytest.raises(GrammarError, match="can only be enforced narrowed, and the request asked to refuse") as err:
        compiler.compile(StructuredSpec(json=schema, allow_narrowing=False))
    assert how in str(err.value)


EXACT = [  # rewritten into enforced keywords with the same meaning: no narrowing (but the bounds on numbers)
    {"not": {"type": "null"}},
    {"oneOf": [{"type": "string"}, {"maxLength": 3}]},
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "if": {"required": ["a"]},
        "then": {"required": ["b"]},
    },
    {"type": "object", "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False},
    {"type": "object", "properties": {"x": {"multipleOf": 2}}},
    {
        "type": "object",
        "properties": {"a": {}},
        "unevaluatedProperties": False,
        "anyOf": [{"properties": {"b": {}}}, {}],
    },
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 1, "exclusiveMinimum": True},
    {"type": "string", "format": "ipv4"},
]


@pytest.mark.parametrize("schema", EXACT, ids=[json.dumps(s)[:40] for s in EXACT])
def test_exact_rewrites_report_no_narrowing(compiler, schema):
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert not besides_number_bounds(grammar.narrowing), grammar.narrowing


@pytest.mark.parametrize(
    "regex, message",
    [
        ("(ab", "(?s)invalid regex: .*unclosed group"),
        ("a(?=b)", "(?s)invalid regex: .*look-around"),
        ("x{3,1}", "(?s)invalid regex: .*repetition"),
    ],
)
def test_bad_regex(compiler, regex, message):
    with pytest.raises(GrammarError, match=message):
        compiler.compile(StructuredSpec(regex=regex))


def test_grammar_syntax_error_names_line(compiler):
    with pytest.raises(GrammarError, match="grammar syntax error") as err:
        compiler.compile(StructuredSpec(grammar='start: item+\nitem: "a" | undefined_rule\n'))
    assert "undefined_rule" in str(err.value)
    assert re.search(r"\b2\(\d+\)", str(err.value)), str(err.value)  # line 2, with its column


def test_schema_text_that_is_not_json(compiler):
    fut = compiler.submit(StructuredSpec(json="{'single': 'quotes'}"))
    assert fut.done()
    with pytest.raises(GrammarError, match="not valid JSON"):
        fut.result()


def test_regex_without_any_match(compiler):
    with pytest.raises(GrammarError, match="matches no output"):
        compiler.compile(StructuredSpec(regex="[a&&b]"))


def test_a_required_name_only_a_pattern_admits_stays_generable(compiler):
    """When patternProperties cannot be enforced and only declared names are generated, a required name that
    only a pattern (or additionalProperties) admits is declared with that schema: the object stays
    satisfiable (it was refused as unsatisfiable before) and the name keeps the pattern's constraint."""
    import random

    from jsonschema import Draft202012Validator

    from loraplex.grammar.fuzz import random_walk

    schema = {
        "type": "object",
        "required": ["ab", "zz"],
        "patternProperties": {"^a\\B": {"type": "integer", "minimum": 3}},
        "additionalProperties": {"type": "boolean"},
    }
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert any(n.startswith("patternProperties at /") for n in grammar.narrowing), grammar.narrowing
    rng = random.Random(0)
    for _ in range(5):
        walk = random_walk(grammar, compiler.vocab, rng, 64)
        assert walk.closed and walk.error is None, walk
        doc = json.loads(walk.text)
        assert not list(Draft202012Validator(schema).iter_errors(doc)), doc
        assert isinstance(doc["ab"], int) and doc["ab"] >= 3 and isinstance(doc["zz"], bool)


def test_a_map_needing_one_key_still_compiles_and_walks_validate(compiler):
    """minProperties 1 on a map: a repeated key still leaves one, so the count is enforced as written."""
    import random

    from jsonschema import Draft202012Validator

    from loraplex.grammar.fuzz import random_walk

    schema = {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1}
    grammar = compiler.compile(StructuredSpec(json=schema))
    rng = random.Random(1)
    for _ in range(8):
        walk = random_walk(grammar, compiler.vocab, rng, 64)
        assert walk.closed and walk.error is None, walk
        assert not list(Draft202012Validator(schema).iter_errors(json.loads(walk.text))), walk.text


def test_a_map_needing_three_keys_gets_them_named_and_distinct(compiler):
    """minProperties 3 where only a pattern admits keys: the missing keys are named and required, so every
    document a JSON parser reads has at least 3 distinct keys."""
    import random

    from jsonschema import Draft202012Validator

    from loraplex.grammar.fuzz import random_walk

    schema = {
        "type": "object",
        "patternProperties": {"^[a-e]$": {"type": "integer"}},
        "additionalProperties": False,
        "required": ["a"],
        "minProperties": 3,
    }
    grammar = compiler.compile(StructuredSpec(json=schema))
    rng = random.Random(3)
    for _ in range(8):
        walk = random_walk(grammar, compiler.vocab, rng, 96)
        assert walk.closed and walk.error is None, walk
        doc = json.loads(walk.text)
        assert len(doc) >= 3 and not list(Draft202012Validator(schema).iter_errors(doc)), walk.text
