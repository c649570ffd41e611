"""The JSON-Schema-Test-Suite for every draft and the keywords we narrow or rewrite (tests/grammar/data,
selected by scripts/select_schema_suite.py): an invalid instance is never produced (the masks reject it in
every key order), and a valid one is accepted wherever the compile says the schema is enforced exactly.

Schemas whose compile is refused are pinned below with their reason, so a schema that starts or stops
compiling is noticed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from loraplex.grammar import GrammarError, StructuredSpec
from loraplex.grammar.schema.dialect import to_internal
from loraplex.grammar.schema.strict import close_schema
from tests.grammar.helpers import feed
from tests.grammar.test_grammar_schema_suite import _orderings

DATA = Path(__file__).parent / "data" / "suite_extended.jsonl"
CASES = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
GROUPS: dict[str, list[dict]] = {}
for _case in CASES:
    GROUPS.setdefault(_case["id"].rsplit("/", 1)[0], []).append(_case)

_METASCHEMA = "unsupported $ref 'http"  # references to a draft's metaschema are never fetched
_EMPTY = "schema is unsatisfiable"
REFUSED: dict[str, str] = {  # group -> the start of the refusal message
    "draft2020-12/boolean_schema/1": "the schema is false",
    "draft2020-12/defs/0": _METASCHEMA,
    "draft2020-12/ref/6": _METASCHEMA,
    "draft4/definitions/0": _METASCHEMA,
    "draft4/ref/7": _METASCHEMA,
    "draft6/ref/7": _METASCHEMA,
    "draft7/ref/7": _METASCHEMA,
    "draft2020-12/minContains/5": "maxContains at /: below minContains",
    "draft2020-12/not/4": _EMPTY,  # not {}
    "draft4/not/4": _EMPTY,
    "draft2020-12/not/5": _EMPTY,  # not true
    "draft2020-12/oneOf/2": _EMPTY,  # oneOf [true, true, true]
    "draft2020-12/oneOf/4": _EMPTY,  # oneOf [true, true, false]
    "draft2020-12/oneOf/5": _EMPTY,  # oneOf [false, false, false]
    "draft2020-12/ref/10": _EMPTY,  # $ref to false
    "draft6/ref/11": _EMPTY,
    "draft7/ref/11": _EMPTY,
    # not {unevaluatedProperties: false, ...}: the complement of additionalProperties cannot be written, and
    # nothing else is left of it (the message lists that narrowing)
    "draft2020-12/not/8": _EMPTY + ": no JSON value can match it; after narrowing: not at /",
}


def _canonical(value):
    """Numbers in the one spelling we generate (an integral float has no fraction)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _accepted(grammar, tokenizer, data) -> bool:
    for variant in _orderings(_canonical(data)):
        text = json.dumps(variant, ensure_ascii=False, separators=(",", ":"))
        m = grammar.new_matcher()
        if feed(m, tokenizer.encode(text, add_special_tokens=False)) and m.is_accepting():
            return True
    return False


def _strict_valid(schema, data) -> bool:
    """Valid with undeclared keys and extra tuple items forbidden (the default strict objects)."""
    try:
        return Draft202012Validator(close_schema(to_internal(schema)[0])).is_valid(data)
    except Exception:  # Python's re cannot run some ECMA patterns: structure is not the question there
        return True


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_suite_group(compiler, tokenizer, group):
    cases = GROUPS[group]
    try:
        grammar = compiler.compile(StructuredSpec(json=cases[0]["schema"]))
    except GrammarError as e:
        assert group in REFUSED and str(e).startswith(REFUSED[group]), f"refused: {e}"
        return
    assert group not in REFUSED, "compiles now: unpin it"
    for case in cases:
        accepted = _accepted(grammar, tokenizer, case["data"])
        if not case["valid"]:
            assert not accepted, f"an invalid instance is accepted: {case['description']} ({grammar.narrowing})"
        elif not grammar.narrowing and _strict_valid(case["schema"], case["data"]):
            assert accepted, f"exact, yet a valid instance is rejected: {case['description']}"
