"""StructuredSpec validation and cache keys (no tokenizer needed)."""

from __future__ import annotations

import pytest

from loraplex.grammar import GrammarError, StructuredSpec


@pytest.mark.parametrize("kwargs", [{}, {"regex": "a", "choice": ["a"]}, {"json": {}, "json_object": True}])
def test_exactly_one_constraint(kwargs):
    with pytest.raises(GrammarError, match="exactly one constraint"):
        StructuredSpec(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"choice": []}, "non-empty list"),
        ({"choice": ["a", 1]}, "only strings"),
        ({"grammar": "   "}, "non-empty Lark grammar"),
        ({"json": 3}, "json must be a schema \\(an object or a boolean\\)"),
    ],
)
def test_bad_values(kwargs, message):
    with pytest.raises(GrammarError, match=message):
        StructuredSpec(**kwargs)


def test_kind_and_schema_parsing():
    assert StructuredSpec(json='{"type": "integer"}').schema() == {"type": "integer"}
    assert StructuredSpec(json_object=True).kind == "json_object"
    with pytest.raises(GrammarError, match="not valid JSON"):
        StructuredSpec(json="{nope").cache_key()


def test_cache_key_ignores_keyword_order_but_keeps_property_order():
    a = StructuredSpec(json={"type": "object", "properties": {"x": {"type": "string", "maxLength": 3}}})
    b = StructuredSpec(json='{"properties": {"x": {"maxLength": 3, "type": "string"}}, "type": "object"}')
    assert a.cache_key() == b.cache_key()
    swapped = StructuredSpec(json={"type": "object", "properties": {"y": {}, "x": {}}})
    straight = StructuredSpec(json={"type": "object", "properties": {"x": {}, "y": {}}})
    assert swapped.cache_key() != straight.cache_key()  # property order is output order
    assert StructuredSpec(regex="a").cache_key() != StructuredSpec(regex="a", close_within_budget=False).cache_key()
