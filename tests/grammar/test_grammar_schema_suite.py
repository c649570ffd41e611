"""Token-level acceptance over the JSON-Schema-Test-Suite subset (shared/schemas/suite.jsonl).

Each valid instance, serialised compactly, must be accepted token by token and end accepting;
each invalid one must be rejected at some token or not accept at the end. Nothing is skipped:
refused schemas assert their GrammarError, and every deliberate difference from the suite's
label is listed below with its reason. Key order: our output lists declared properties in
schema order, so an instance counts as accepted if some ordering of its object keys is (JSON
objects are unordered); an invalid instance must be rejected in every ordering.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest
from jsonschema import Draft202012Validator

from loraplex.grammar import GrammarError, StructuredSpec
from loraplex.grammar.schema.strict import close_schema
from tests.grammar.helpers import feed, load_suite

CASES = load_suite()

# Schemas no value can satisfy: refusing them is right (the suite marks every instance invalid).
UNSATISFIABLE = {"allOf/4", "allOf/5", "anyOf/4", "enum/14", "oneOf/2", "oneOf/4", "oneOf/5", "ref/10"}
# Narrowed, and the compile reports it: leap seconds are not generated (common validators reject them);
# oneOf [integer, minimum 2] keeps its second branch to integers (the complement of "integer" among numbers,
# the fractions, cannot be written), so 2.5 is not generated.
NARROWED = {"optional/format/date-time/0/10", "optional/format/date-time/0/11", "oneOf/0/1"}
# Numbers are generated in canonical spelling only: an integral value has no fraction, so these
# valid spellings of integral values ("1.0", "-2.0", ...) are rejected on purpose.
NON_CANONICAL_NUMBERS = {
    "type/0/1",
    "const/10/2",
    "const/11/2",
    "const/12/2",
    "const/13/2",
    "enum/9/2",
    "enum/10/2",
    "enum/11/2",
    "enum/12/2",
}
# Strict objects (the default): keys a schema does not declare, and items after prefixItems,
# are not generated unless the schema allows them explicitly. These valid instances have such
# keys/items, so they are rejected on purpose (computed below from the closed schema, and pinned).
STRICT_NARROWED = {"additionalProperties/4/0", "anyOf/5/2", "prefixItems/0/3", "prefixItems/2/0", "properties/0/3"}


def _group(case_id: str) -> str:
    return case_id.rsplit("/", 1)[0]


def _strict_valid(case: dict) -> bool:
    """The suite label under strict objects (jsonschema on the closed schema)."""
    if not case["valid"]:
        return False
    try:
        return Draft202012Validator(close_schema(case["schema"])).is_valid(case["data"])
    except re.error:  # Python's re lacks \p{..}: structure is not the question there
        return True


def _orderings(value, limit: int = 240):
    """The value with its objects' keys in every order (bounded)."""
    if isinstance(value, dict):
        keys = list(value)
        options = []
        for perm in itertools.permutations(keys):
            for combo in itertools.product(*[_orderings(value[k], 4) for k in perm]):
                options.append(dict(zip(perm, combo)))
                if len(options) >= limit:
                    return options
        return options or [{}]
    if isinstance(value, list):
        return [list(c) for c in itertools.islice(itertools.product(*[_orderings(x, 4) for x in value]), limit)]
    return [value]


def _accepted(grammar, tokenizer, data) -> bool:
    for variant in _orderings(data):
        text = json.dumps(variant, ensure_ascii=False, separators=(",", ":"))
        m = grammar.new_matcher()
        if feed(m, tokenizer.encode(text, add_special_tokens=False)) and m.is_accepting():
            return True
    return False


def test_pinned_strict_narrowing_matches_closed_schemas():
    computed = {c["id"] for c in CASES if c["valid"] and not _strict_valid(c)}
    assert computed == STRICT_NARROWED


@pytest.mark.parametrize("backend", ["compiler", "llg_compiler"])
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_suite_case(request, tokenizer, backend, case):
    compiler = request.getfixturevalue(backend)
    group = _group(case["id"])
    if group in UNSATISFIABLE:
        assert not case["valid"]
        with pytest.raises(GrammarError, match="unsatisfiable"):
            compiler.compile(StructuredSpec(json=case["schema"]))
        return
    grammar = compiler.compile(StructuredSpec(json=case["schema"]))
    expected = _strict_valid(case) and case["id"] not in NON_CANONICAL_NUMBERS | NARROWED
    if case["id"] in NARROWED:
        assert grammar.narrowing, "a narrowed case must say so"
    assert _accepted(grammar, tokenizer, case["data"]) == expected, (case["description"], grammar.backend)
