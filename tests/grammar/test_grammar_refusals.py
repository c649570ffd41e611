"""Every kind of refusal is a GrammarError whose message names the problem."""

from __future__ import annotations

import re

import pytest

from loraplex.grammar import GrammarError, StructuredSpec

SCHEMA_REFUSALS = [
    ({"type": "object", "properties": {"x": {"multipleOf": 2}}}, "unsupported keyword 'multipleOf' at /properties/x"),
    ({"not": {"type": "null"}}, "unsupported keyword 'not' at /"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "unsupported keyword 'uniqueItems' at /"),
    (
        {"$defs": {"p": {"patternProperties": {"^a": {}}}}, "$ref": "#/$defs/p"},
        "unsupported keyword .patternProperties. at /\\$defs/p",
    ),
    ({"anyOf": [{"type": "string"}, {"if": {}, "then": {}}]}, "unsupported keyword 'if' at /anyOf/1"),
    ({"type": "string", "format": "ipv4"}, "unsupported format 'ipv4' at /format"),
    ({"type": "strin"}, "invalid schema: .* at /type"),
    ({"type": "string", "minLength": -1}, "invalid schema: .* at /minLength"),
    ({"type": "integer", "minimum": 5, "maximum": 3}, "unsatisfiable"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "unsatisfiable"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "unsatisfiable"),
    ({"$ref": "https://example.com/other.json"}, "only local references"),
    ({"$ref": "#/$defs/missing"}, "does not resolve"),
    ({"oneOf": [{"type": "integer"}, {"minimum": 2}]}, "oneOf at /oneOf: cannot prove"),
    ({"type": "string", "pattern": "(?=a)b"}, "look-around"),
    ({"type": "string", "pattern": "(a)\\1"}, "back-references"),
    ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "string"}, "unsupported \\$schema dialect"),
]


@pytest.mark.parametrize("schema, message", SCHEMA_REFUSALS, ids=[m[:40] for _, m in SCHEMA_REFUSALS])
def test_schema_refusals(compiler, schema, message):
    with pytest.raises(GrammarError, match=message):
        compiler.compile(StructuredSpec(json=schema))


def test_refusal_through_llguidance_too(llg_compiler):
    with pytest.raises(GrammarError, match="unsupported keyword 'multipleOf' at /properties/x"):
        llg_compiler.compile(StructuredSpec(json={"properties": {"x": {"multipleOf": 2}}}))


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
