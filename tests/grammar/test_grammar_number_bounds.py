"""Runaway numbers are closed off: a number or integer without a bound on a side is kept within ±10^16 there (at
most 16 integer digits, what a double carries exactly), reported per JSON pointer like any narrowing, refused
when the request refuses narrowing, and enforced by both backends alike."""

from __future__ import annotations

import json
import random
import re

import pytest

from loraplex.grammar import GrammarError, StructuredSpec
from loraplex.grammar.fuzz import random_walk

ABOVE = "no bound given: values are kept above -10^16 (at most 16 integer digits)"
BELOW = "no bound given: values are kept below 10^16 (at most 16 integer digits)"
FRACTION = "type at /: number: a fraction is written with at most 17 digits (a double's)"


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "integer"}, [f"exclusiveMinimum at /: {ABOVE}", f"exclusiveMaximum at /: {BELOW}"]),
        ({"type": "number", "minimum": 0}, [f"exclusiveMaximum at /: {BELOW}", FRACTION]),
        ({"type": ["number", "null"], "exclusiveMaximum": 5}, [f"exclusiveMinimum at /: {ABOVE}", FRACTION]),
        ({"type": "number", "minimum": 0, "maximum": 1}, [FRACTION]),  # bounded, yet 0.333... could run on
        (
            {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}},
            [f"exclusiveMinimum at /properties/n: {ABOVE}"],
        ),
        ({"type": "integer", "minimum": -5, "maximum": 5}, []),
        ({"type": "integer", "minimum": 10**20}, []),  # its bound is past 16 digits already: no upper bound added
        ({"type": "string"}, []),
        ({"enum": [1, 2]}, []),
    ],
)
def test_unbounded_sides_are_bounded_and_reported(compiler, schema, expected) -> None:
    assert list(compiler.compile(StructuredSpec(json=schema)).narrowing) == expected


def test_a_request_refusing_narrowing_is_refused_by_name(compiler) -> None:
    with pytest.raises(GrammarError, match="exclusiveMaximum at /properties/n") as err:
        compiler.compile(StructuredSpec(json={"properties": {"n": {"type": "integer"}}}, allow_narrowing=False))
    assert err.value.code == "narrowing_refused"


@pytest.mark.parametrize("backend", ["dfa_compiler", "llg_compiler"])
def test_walks_never_write_more_than_16_integer_or_17_fraction_digits(request, backend) -> None:
    schema = {"type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 3}
    compiler = request.getfixturevalue(backend)
    grammar = compiler.compile(StructuredSpec(json=schema))
    rng = random.Random(backend)
    longest = longest_fraction = 0
    for _ in range(12):
        walk = random_walk(grammar, compiler.vocab, rng, 400)
        assert walk.closed and walk.text is not None
        for value in json.loads(walk.text):
            assert -(10**16) < value < 10**16
            longest = max(longest, len(str(abs(int(value)))))
        for fraction in re.findall(r"\.([0-9]+)", walk.text):  # (the text as written: no exponents either)
            longest_fraction = max(longest_fraction, len(fraction))
        assert not re.search("[eE]", walk.text)
    assert longest > 8  # (the walks do write long numbers: the bound is what stops them)
    assert 8 < longest_fraction <= 17
