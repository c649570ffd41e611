"""multipleOf with a divisor that has no exact binary value: jsonschema divides in floating point (2.47 / 0.01 is
246.99999999999997, "not a multiple"), so generating every decimal multiple produced documents it rejects.
The divisor is narrowed to multiples jsonschema accepts, and jsonschema is the judge in every test here. A divisor
with too many digits for llguidance's divisibility automaton (123456: ~1 s, 123456789: never) is narrowed to
values the same way instead of timing the compile out."""

from __future__ import annotations

import random
from fractions import Fraction

import jsonschema
import pytest

from loraplex.grammar import StructuredSpec
from loraplex.grammar.schema.multiple_of import MAX_VALUES, narrowed_multiple, passes
from tests.grammar.helpers import feed, walks_validate

# divisors seen in real schemas, with a double within 2**-54 of them (integer multiples) or not (values)
WHOLE = [0.1, 0.01, 0.001, 0.0001, 1e-6, 1e-8, 0.05, 0.02, 0.2, 0.3, 0.015, 0.6, 0.9, 0.123]
SCATTERED = [1e-5, 0.07, 0.7, 1.1]


def _valid(value, divisor, **bounds) -> bool:
    return jsonschema.Draft202012Validator({"multipleOf": divisor, **bounds}).is_valid(value)


def test_passes_is_jsonschemas_own_verdict():
    rng = random.Random(3)
    for divisor in WHOLE + SCATTERED + [0.25, 2.5]:
        for _ in range(300):
            value = rng.choice([rng.randint(-(10**6), 10**6), round(rng.uniform(-1e4, 1e4), rng.randint(0, 6))])
            assert passes(value, divisor) == _valid(value, divisor), (value, divisor)
    assert not passes(2.47, 0.01) and not _valid(2.47, 0.01)  # the case this is about


def test_exact_divisors_are_left_as_they_are():
    for divisor in (0.5, 0.25, 2.0, 1.0, 0.125, 3, 12345, 7000000, 7e7):
        assert narrowed_multiple(divisor, {}) is None, divisor


@pytest.mark.parametrize("divisor", WHOLE)
def test_integer_multiples_pass_jsonschema_wherever_they_are(divisor):
    """Every integer multiple, including those whose quotient sits just below and above each power of two up to
    2**53 (where the rounding of the division matters), is valid to jsonschema."""
    (kind, unit), how = narrowed_multiple(divisor, {})
    assert kind == "integer" and "integer multiples" in how
    denominator = Fraction(repr(divisor)).denominator
    quotients = set(range(3000))
    for e in range(1, 54):
        quotients |= set(range(max(0, 2**e // denominator - 40), 2**e // denominator + 40))
    bad = [n * unit for n in sorted(quotients) if not _valid(n * unit, divisor) or not _valid(-n * unit, divisor)]
    assert not bad, bad[:5]


@pytest.mark.parametrize("divisor", [123456, 1234567, 10**9, 7e8, 4.9e11, 0.0009765625, 0.123456789, 1e300, 10**300])
def test_long_divisors_keep_values_that_pass(divisor):
    """Too many digits for an automaton: multiples nearest zero (inside the bounds), each valid to jsonschema,
    integers where the schema wants integers."""
    bounded = [{"minimum": 5 * divisor, "maximum": 10**13}] if 5 * divisor < 10**12 else []  # 2**53 at most
    for node in [{}, {"type": "integer"}, *bounded]:
        (kind, values), how = narrowed_multiple(divisor, node)
        assert kind == "values" and "too many digits" in how and values, (divisor, node, how)
        assert all(_valid(v, divisor, **{k: b for k, b in node.items() if k != "type"}) for v in values), values
        if node.get("type") == "integer":
            assert all(isinstance(v, int) for v in values), values
    assert min(abs(v) for v in narrowed_multiple(divisor, {})[0][1]) == 0  # nearest zero first


@pytest.mark.parametrize("divisor", SCATTERED)
def test_scattered_divisors_keep_values_that_pass_within_the_bounds(divisor):
    bounds = {"minimum": 3, "exclusiveMaximum": 9}
    (kind, values), how = narrowed_multiple(divisor, bounds)
    assert kind == "values" and 0 < len(values) <= MAX_VALUES and "pass" in how
    assert all(_valid(v, divisor, **bounds) for v in values), values
    assert all((Fraction(repr(v)) / Fraction(repr(divisor))).denominator == 1 for v in values)  # decimal too


SCHEMAS = {
    "cents": {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}}, "required": ["price"]},
    "thirds": {"type": "array", "items": {"type": "number", "multipleOf": 0.3, "maximum": 30}, "minItems": 2},
    "sevens": {"type": ["number", "string"], "multipleOf": 0.07, "minimum": 1, "maximum": 5},
    "integers": {"type": "integer", "multipleOf": 1e-5},
    "many digits": {"type": "integer", "multipleOf": 123456, "minimum": -(10**7)},
    "many fraction digits": {"type": "number", "multipleOf": 0.123456789},
    "ten digits": {"type": "number", "multipleOf": 1e10, "exclusiveMinimum": 0},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_compiled_walks_validate_and_the_narrowing_is_said(compiler, name):
    schema = SCHEMAS[name]
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert [n for n in grammar.narrowing if n.startswith("multipleOf at ")], grammar.narrowing
    walks_validate(compiler, schema, grammar, name, walks=25, budget=60)


def test_a_decimal_multiple_jsonschema_rejects_is_never_generated(compiler, tokenizer):
    grammar = compiler.compile(StructuredSpec(json=SCHEMAS["cents"]))
    for text, ok in (('{"price":2.47}', False), ('{"price":2}', True), ('{"price":-17}', True)):
        matcher = grammar.new_matcher()
        assert (feed(matcher, tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting()) == ok
        assert _valid(2.47, 0.01) is False
