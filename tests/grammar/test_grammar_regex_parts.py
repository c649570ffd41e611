"""The regex building blocks, checked exhaustively against Python (no tokenizer needed)."""

from __future__ import annotations

import json
import random
import re
from decimal import Decimal

import pytest

from loraplex.grammar.schema.json_text import UNIT, content_not_in, string_literal
from loraplex.grammar.schema.numeric import decimal_range, integer_range
from loraplex.grammar.schema.strict import close_schema

BOUNDS = [None, -300, -17, -5, -1, 0, 1, 5, 9, 10, 99, 100, 250]


@pytest.mark.parametrize("lo", BOUNDS)
@pytest.mark.parametrize("hi", BOUNDS)
def test_integer_range(lo, hi):
    rx = integer_range(lo, hi)
    for n in list(range(-400, 400)) + [10**7, -(10**7)]:
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert (rx is not None and re.fullmatch(rx, str(n)) is not None) == inside, (lo, hi, n, rx)
    if rx is not None:
        assert not any(re.fullmatch(rx, bad) for bad in ["01", "-0", "+1", "1.0", ""])


DEC = [None] + [
    Decimal(x) for x in ["-100.5", "-1.1", "-0.05", "0", "0.001", "0.105", "1", "1.1", "1.15", "9.99", "10"]
]


@pytest.mark.parametrize("lo", DEC)
@pytest.mark.parametrize("hi", DEC)
@pytest.mark.parametrize("strict", [(False, False), (True, False), (False, True), (True, True)])
def test_decimal_range(lo, hi, strict):
    lo_strict, hi_strict = strict
    rx = decimal_range(lo, lo_strict, hi, hi_strict)
    rng = random.Random(0)
    texts = {format(Decimal(rng.randint(-120000, 120000)) / 1000, "f") for _ in range(400)}
    texts |= {"0", "1.10", "1.100", "1.1000001", "0.0", "9.990", "10.0", "-1.1", "-0.05", "0.105", "0.1049"}
    for text in texts:
        x = Decimal(text)
        if text.startswith("-") and x == 0:
            continue
        inside = (lo is None or (x > lo if lo_strict else x >= lo)) and (
            hi is None or (x < hi if hi_strict else x <= hi)
        )
        assert (rx is not None and re.fullmatch(rx, text) is not None) == inside, (lo, strict, hi, text, rx)
    if rx is not None:
        assert not any(re.fullmatch(rx, bad) for bad in ["-0", "-0.0", "01", "1.", ".5", ""])


def test_string_units_and_excluded_keys():
    names = ["a", "ab", 'q"x', "tab\there", "é"]
    rx = content_not_in(names)
    for s in ["", "b", "abc", "a b", 'q"', "tab", "ée", "\n", "x\\y"]:
        assert re.fullmatch(rx, json.dumps(s, ensure_ascii=False)[1:-1]), s
    for s in names:
        assert not re.fullmatch(rx, json.dumps(s, ensure_ascii=False)[1:-1]), s
    assert re.fullmatch(f"{UNIT}*", json.dumps("ctrl\x01\x1f\u2028 ok", ensure_ascii=False)[1:-1])
    assert re.fullmatch(string_literal('say "hi"\n'), json.dumps('say "hi"\n'))


def test_close_schema_only_where_it_keeps_the_meaning():
    closed = close_schema({"type": "object", "properties": {"a": {"properties": {"b": {}}}}, "required": ["c"]})
    assert closed["additionalProperties"] is False and list(closed["properties"]) == ["a", "c"]
    assert closed["properties"]["a"]["additionalProperties"] is False
    merged = close_schema({"allOf": [{"properties": {"x": {}}}, {"properties": {"y": {}}}]})
    assert all("additionalProperties" not in m for m in merged["allOf"])  # would forbid each other's keys
    with_base = close_schema({"properties": {"x": {}}, "anyOf": [{"properties": {"y": {}}}, {"required": ["z"]}]})
    assert "additionalProperties" not in with_base and all("additionalProperties" not in b for b in with_base["anyOf"])
    assert close_schema({"type": "object"}) == {"type": "object"}  # any object stays any object
    assert close_schema({"prefixItems": [{}]})["items"] is False


def test_enum_values_are_kept_by_every_parts_other_keywords():
    """An enum met by other enums and keywords: the values in every enum (JSON equality: 1 == 1.0, true != 1)
    that the parts' other keywords accept, and no others."""
    from loraplex.grammar.schema.to_regex import SchemaRegex

    schema = {
        "allOf": [
            {"enum": ["a", "bb", "ccc", 1, True, {"k": 1}], "minLength": 2},
            {"enum": ["bb", "ccc", 1.0, 1, True, {"k": 1.0}], "maxLength": 2},
            {"not": {"const": "x"}, "enum": ["bb", "ccc", 1, True, {"k": 1}]},
        ]
    }
    rx = SchemaRegex(schema).build()
    kept = [v for v in ['"a"', '"bb"', '"ccc"', "1", "true", '{"k":1}'] if re.fullmatch(rx, v)]
    assert kept == ['"bb"', "1", "true", '{"k":1}'], rx
