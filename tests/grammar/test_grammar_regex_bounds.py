"""The token automaton's regex unrolls recursion and nests free-form values only so deep: a narrowing. It is
therefore used only where llguidance (exact there) cannot serve the schema, and then reported; a request that
refuses narrowing never gets it."""

from __future__ import annotations

import pytest

from loraplex.grammar import GrammarError, StructuredSpec
from tests.grammar.helpers import feed

LINKED = {
    "$defs": {
        "node": {
            "type": "object",
            # (bounded: an unbounded integer is itself a narrowing, test_grammar_number_bounds.py)
            "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9}, "next": {"$ref": "#/$defs/node"}},
            "required": ["v"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}
FREE = {"type": "object", "properties": {"extra": {}}, "required": ["extra"], "additionalProperties": False}


def _nested(depth: int) -> str:
    return '{"v":1' + "".join(',"next":{"v":1' for _ in range(depth)) + "}" * (depth + 1)


@pytest.mark.parametrize("schema, deep", [(LINKED, _nested(6)), (FREE, '{"extra":[[[[{"a":[1]}]]]]}')])
def test_recursion_and_free_values_are_exact_by_default(compiler, tokenizer, schema, deep):
    grammar = compiler.compile(StructuredSpec(json=schema, allow_narrowing=False))
    assert not grammar.narrowing
    matcher = grammar.new_matcher()
    assert feed(matcher, tokenizer.encode(deep, add_special_tokens=False)), deep
    assert matcher.is_accepting()


@pytest.mark.parametrize(
    "schema, cut",
    [
        (LINKED, "$ref at /$defs/node/properties/next: recursion to /$defs/node unrolled 3 times"),
        (FREE, "{} at /properties/extra: any JSON value, containers nested at most 2 deep"),
    ],
)
def test_the_automaton_reports_what_its_regex_cuts(dfa_compiler, tokenizer, schema, cut):
    grammar = dfa_compiler.compile(StructuredSpec(json=schema))
    assert cut in grammar.narrowing, grammar.narrowing
    with pytest.raises(GrammarError, match="the regex would narrow"):
        dfa_compiler.compile(StructuredSpec(json=schema, allow_narrowing=False))
