"""Soundness on real schemas, model-free: random walks through the masks of a seeded sample of the
SchemaStore development set (shared/schemas/schemastore-dev) produce only documents that validate under
each schema's own draft with format checking. bench/schema_coverage.py runs the same over the whole set."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from jsonschema.validators import validator_for

from loraplex.grammar import GrammarError, StructuredSpec
from loraplex.grammar.fuzz import random_walk
from tests.grammar.helpers import REPO

CORPUS = REPO.parent / "shared" / "schemas" / "schemastore-dev"
SAMPLE, WALKS, BUDGET = 30, 12, 160
REFUSED = {  # schema -> the start of its refusal message, so a schema that starts or stops compiling is noticed
    # draft-04 with `const` (not a draft-04 keyword: an annotation there) in its sqlBinding oneOf branches: they
    # are not apart under the schema's own draft, and the complements are too large (for llguidance too)
    "function": "schema cannot be enforced: more than 64 alternatives",
}


def test_format_checkers_are_installed():
    """jsonschema checks a format only when its checker's library is installed (the test extra's
    jsonschema[format-nongpl]); without them the walks below would pass any string."""
    from loraplex.grammar.schema.formats import FORMATS

    assert set(FORMATS) <= set(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
    draft7 = {
        "date-time",
        "date",
        "time",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
    assert draft7 <= set(jsonschema.Draft7Validator.FORMAT_CHECKER.checkers)
    assert {"date-time", "email", "hostname", "ipv4", "ipv6", "uri"} <= set(
        jsonschema.Draft4Validator.FORMAT_CHECKER.checkers
    )


def _sample() -> list[tuple[str, dict]]:
    entries = [json.loads(line) for line in (CORPUS / "index.jsonl").read_text().splitlines()]
    picked = random.Random(17).sample(entries, SAMPLE)
    return [(e["id"], json.loads((CORPUS / e["file"]).read_text())) for e in picked]


@pytest.mark.parametrize("case", _sample(), ids=lambda c: c[0])
def test_random_walks_validate(compiler, case):
    name, schema = case
    try:
        grammar = compiler.compile(StructuredSpec(json=schema))
    except GrammarError as e:
        assert name in REFUSED and str(e).startswith(REFUSED[name]), f"refused: {e}"
        return
    assert name not in REFUSED, "compiles now: unpin it"
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    check = cls(schema, format_checker=cls.FORMAT_CHECKER)
    rng = random.Random(name)
    budget = max(BUDGET, grammar.min_tokens + BUDGET // 2)  # a request below min_tokens is refused
    for _ in range(WALKS):
        walk = random_walk(grammar, compiler.vocab, rng, budget)
        assert walk.error is None, walk.error
        assert walk.closed, f"a walk did not close within {budget} tokens: {walk.text!r:.200}"
        doc = json.loads(walk.text)
        errors = [e.message for e in check.iter_errors(doc)]
        assert not errors, f"{walk.text!r:.300} is invalid: {errors[:2]} (narrowing: {grammar.narrowing})"


def test_patterns_dropped_when_llguidance_finds_a_required_property_unsatisfiable(compiler):
    """SchemaStore's `dein`: with its patternProperties llguidance calls a required property unsatisfiable; the
    compile falls back to declared keys only (required ones declared with their patterns' schemas), a narrowing
    that is reported, and what it generates validates."""
    entry = next(json.loads(line) for line in (CORPUS / "index.jsonl").read_text().splitlines() if '"dein"' in line)
    schema = json.loads((CORPUS / entry["file"]).read_text())
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert any(n.startswith("patternProperties at /properties/ftplugin") for n in grammar.narrowing), grammar.narrowing
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    check = cls(schema, format_checker=cls.FORMAT_CHECKER)
    rng = random.Random("dein")
    for _ in range(4):
        walk = random_walk(grammar, compiler.vocab, rng, max(BUDGET, grammar.min_tokens + BUDGET // 2))
        assert walk.error is None and walk.closed, walk
        assert not list(check.iter_errors(json.loads(walk.text))), walk.text
