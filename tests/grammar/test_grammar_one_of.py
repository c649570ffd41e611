"""oneOf as anyOf of branches proven apart (schema.exclusive), and the narrowings around it: the shapes of
SchemaStore's enonic-xp family (twenty object shapes told apart by a required ``type`` constant, inside a
oneOf with allOf-composed shapes) compile small and exact; a required-property discriminator only holds for
objects (a string matches every such branch, so oneOf rejects it); a oneOf whose complements would be too
large is narrowed to its branches' apart types, said so with its pointer; Java's Long bounds are narrowed."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from loraplex.grammar import StructuredSpec
from loraplex.grammar.fuzz import random_walk
from loraplex.grammar.schema import narrow as narrow_module
from loraplex.grammar.schema.dialect import to_internal
from loraplex.grammar.schema.exclusive import KINDS, Exclusivity
from loraplex.grammar.schema.narrow import narrow
from tests.grammar.helpers import REPO, besides_number_bounds, walks_validate

CORPUS = REPO.parent / "shared" / "schemas" / "schemastore-dev"
NAMES = [f"Kind{i}" for i in range(21)]


def _shape(name: str) -> dict:
    """One enonic-like input: no "type": "object", told apart from the others only by its required "type"."""
    return {
        "properties": {
            "name": {"type": "string"},
            "type": {"const": name},
            "label": {"$ref": "#/$defs/text"},
            "max": {"type": "integer", "minimum": 0},
        },
        "required": ["type", "name"],
        "additionalProperties": False,
    }


ENONIC_LIKE = {
    "$defs": {
        "text": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"text": {"type": "string"}}}]},
        **{name: _shape(name) for name in NAMES},
        "inputs": {"oneOf": [{"$ref": f"#/$defs/{name}"} for name in NAMES]},
        "item": {"type": "object", "properties": {"type": {"type": "string"}}, "required": ["type"]},
        "fieldSet": {
            "allOf": [
                {"$ref": "#/$defs/item"},
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "FieldSet"},
                        "items": {"type": "array", "items": {"$ref": "#/$defs/formItems"}},
                    },
                    "additionalProperties": False,
                },
            ]
        },
        "formItems": {"oneOf": [{"$ref": "#/$defs/inputs"}, {"$ref": "#/$defs/fieldSet"}]},
    },
    "type": "object",
    "properties": {"form": {"type": "array", "items": {"$ref": "#/$defs/formItems"}}},
    "required": ["form"],
}


# ---- the proofs ------------------------------------------------------------------------------------------
def test_proofs_by_type_constant_and_required_property():
    root = {"$defs": {"a": {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}}}
    ex = Exclusivity(root)
    assert ex.disjoint({"type": "string"}, {"type": ["object", "integer"]})
    assert ex.disjoint({"const": "a"}, {"enum": ["b", 1]})
    assert not ex.disjoint({"type": "integer"}, {"type": "number"})  # 1 is both
    other = {"type": "object", "properties": {"k": {"const": 2}}}  # k optional here, but then not 1 when present
    assert ex.disjoint({"$ref": "#/$defs/a"}, other)
    untyped = [{"properties": {"k": {"const": v}}, "required": ["k"]} for v in (1, 2)]
    assert not ex.disjoint(*untyped)  # "x" matches both: only objects are told apart
    assert ex.disjoint(*untyped, frozenset({"object"}))
    assert ex.disjoint({"required": ["k"]}, {"type": "object", "properties": {"k": False}})
    assert ex.disjoint({"required": ["k"]}, {"type": "object", "not": {"required": ["k"]}})


def test_split_keeps_untyped_shapes_to_objects_exactly():
    """Two or more branches accept every string: no string matches exactly one, so keeping each branch to
    objects loses nothing (exact). With one typed branch beside them, strings are lost: not exact."""
    untyped = [{"properties": {"k": {"const": v}}, "required": ["k"]} for v in (1, 2, 3)]
    split = Exclusivity({}).split(untyped)
    assert split.kinds == [frozenset({"object"})] * 3 and split.exact
    assert split.restricted(0) and split.domains[0] == KINDS
    split = Exclusivity({}).split([{"properties": {"k": {"const": 1}}, "required": ["k"]}, {"minLength": 2}])
    assert not split.exact  # "ab" matches both; "a" only the first one, and is lost


def test_split_tries_no_proof_for_a_type_two_branches_accept_whole(monkeypatch):
    """enonic's 21 untyped shapes: strings, numbers, ... match every shape, so no proof is tried for them (it
    cannot succeed); only objects are proved apart, pair by pair, and the split is what it was."""
    ex = Exclusivity(ENONIC_LIKE)
    branches = [{"$ref": f"#/$defs/{name}"} for name in NAMES]
    proved: list[frozenset[str]] = []
    disjoint = Exclusivity.disjoint

    def counted(self, a, b, within=KINDS, *args):
        proved.append(within)
        return disjoint(self, a, b, within, *args)

    monkeypatch.setattr(Exclusivity, "disjoint", counted)
    split = ex.split(branches)
    assert split.kinds == [frozenset({"object"})] * len(NAMES) and split.exact
    assert frozenset({"object"}) in proved
    assert not [within for within in proved if within != {"object"}]  # (before: every shape, every other type)


# ---- compiled ------------------------------------------------------------------------------------------
def test_required_discriminator_generates_objects_only(compiler):
    """Before: the anyOf rewrite let any string through (every walk invalid). Now only objects, exactly."""
    schema = {"oneOf": [{"required": ["k"], "properties": {"k": {"const": v}}} for v in (1, 2)]}
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert grammar.narrowing == ()
    texts = walks_validate(compiler, schema, grammar, "discriminator", walks=12)
    assert {json.loads(t)["k"] for t in texts} == {1, 2}


def test_enonic_shapes_compile_exactly(compiler):
    """Was refused (llguidance: "more than 64 alternatives", ~345k characters of complements)."""
    grammar = compiler.compile(StructuredSpec(json=ENONIC_LIKE))
    assert besides_number_bounds(grammar.narrowing) == []
    walks_validate(compiler, ENONIC_LIKE, grammar, "enonic")


def test_a_type_field_shared_by_two_shapes_is_not_told_apart():
    """Two shapes with the same constant overlap: the complement route stays (small here), so a document
    matching both is never generated."""
    same = {"type": "object", "properties": {"t": {"const": "A"}, "u": {"type": "string"}}, "required": ["t"]}
    schema = {"oneOf": [same, {**same, "required": ["t", "u"]}]}
    narrowed, rules = narrow(schema)
    assert "oneOf" not in json.dumps(narrowed) and besides_number_bounds(rules) == []
    assert any("x-loraplex-fragment" in json.dumps(b) for b in narrowed["allOf"][0]["anyOf"])


def test_too_large_complements_narrow_to_apart_types(compiler, monkeypatch):
    """Objects told apart by "type", strings not (minLength overlaps): past MAX_COMPLEMENT the branches are
    generated as objects only, a narrowing named with its pointer; what is generated validates."""
    shapes = [{**_shape(name), "type": ["object", "string"], "minLength": i} for i, name in enumerate(NAMES[:4])]
    schema = {
        "type": "object",
        "properties": {"x": {"oneOf": shapes}},
        "required": ["x"],
        "$defs": ENONIC_LIKE["$defs"],
    }
    _, rules = narrow(schema)
    assert not [r for r in rules if "too large" in r.how]  # small enough for the complement route
    monkeypatch.setattr(narrow_module, "MAX_COMPLEMENT", 10)
    narrowed, rules = narrow(schema)
    assert [(r.keyword, r.pointer) for r in besides_number_bounds(rules)] == [("oneOf", "/properties/x")]
    assert "too large" in rules[0].how
    branches = narrowed["properties"]["x"]["anyOf"]
    assert [b["allOf"][1] for b in branches] == [{"type": ["object"]}] * 4
    grammar = compiler.compile(StructuredSpec(json=narrowed))
    texts = walks_validate(compiler, schema, grammar, "apart-types")
    assert all(isinstance(json.loads(t)["x"], dict) for t in texts)


def test_java_long_bounds_are_narrowed(compiler):
    """llguidance cannot build a range bounded at -2**63 (it rounds to a double): was refused."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}},
        "required": ["n"],
    }
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert [n.split(":")[0] for n in grammar.narrowing] == ["minimum at /properties/n", "maximum at /properties/n"]
    walks_validate(compiler, schema, grammar, "long")


@pytest.mark.parametrize("name", ["enonic-xp-macro-8.0.0", "enonic-xp-layout-8.0.0-B5"])
def test_enonic_schemas_compile(compiler, name):
    entry = next(json.loads(line) for line in (CORPUS / "index.jsonl").read_text().splitlines() if f'"{name}"' in line)
    schema = json.loads((CORPUS / entry["file"]).read_text())
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert not [n for n in grammar.narrowing if n.startswith("oneOf")], grammar.narrowing
    walks_validate(compiler, schema, grammar, name, walks=6)


def test_only_overlapping_branches_are_complemented(compiler):
    """A branch proven apart from every other is used as it is; two that may overlap (both 2-item arrays of
    a string first) each carry only the other's complement, not every branch's."""
    single = {"type": "array", "prefixItems": [{"type": "string"}], "minItems": 1, "maxItems": 1}
    pair = {"type": "array", "prefixItems": [{"type": "string"}, {}], "minItems": 2, "maxItems": 2}
    typed = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2, "maxItems": 2}
    schema = {"type": "object", "properties": {"p": {"oneOf": [single, pair, typed]}}, "required": ["p"]}
    narrowed, _ = narrow(schema)
    alternatives = narrowed["properties"]["p"]["allOf"][0]["anyOf"]
    assert alternatives[0] == single
    assert [len(a["allOf"]) for a in alternatives[1:]] == [2, 2]  # the branch and one complement
    grammar = compiler.compile(StructuredSpec(json=schema))
    walks_validate(compiler, schema, grammar, "overlap", walks=12)


def test_small_one_of_is_the_retry_when_llguidance_finds_the_grammar_too_large():
    shapes = [{**_shape(name), "type": ["object", "string"], "minLength": i} for i, name in enumerate(NAMES[:4])]
    schema = {"type": "object", "properties": {"x": {"oneOf": shapes}}, "$defs": ENONIC_LIKE["$defs"]}
    _, rules = narrow(schema, small_one_of=True)
    rules = besides_number_bounds(rules)
    assert [(r.keyword, r.pointer) for r in rules] == [("oneOf", "/properties/x")] and "too large" in rules[0].how


def test_bun_lock_compiles(compiler):
    """Was refused (llguidance: schema too large) when every branch carried every other's complement."""
    entry = next(json.loads(line) for line in (CORPUS / "index.jsonl").read_text().splitlines() if '"bun-lock"' in line)
    schema = json.loads((CORPUS / entry["file"]).read_text())
    grammar = compiler.compile(StructuredSpec(json=schema))
    keys = "patternProperties at "  # (map keys the regex engines judge differently: test_grammar_pattern_engines)
    assert tuple(n for n in besides_number_bounds(grammar.narrowing) if not n.startswith(keys)) == (
        "oneOf at /definitions/BunLockFilePackageArray: each branch is generated only where the others' "
        "complements can be written",
    )
    check = jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    rng = random.Random("bun-lock")
    for _ in range(6):
        walk = random_walk(grammar, compiler.vocab, rng, max(200, grammar.min_tokens + 100))
        assert walk.error is None and walk.closed, walk
        assert not list(check.iter_errors(json.loads(walk.text))), walk.text


def test_branches_told_apart_by_a_property_the_surrounding_schema_requires(compiler):
    """SchemaStore's `function`: binding shapes differ in "type", which only the schema around the oneOf
    (and around the oneOf that holds it) requires. Inside, the shapes are apart: exact, no complements.
    (The `not` branch beside them is apart from them too, but matches strings the nested oneOf rejects.)"""
    shapes = [{"properties": {"type": {"enum": [t]}, "x": {"type": "integer"}}} for t in ("a", "b", "c")]
    other = {"properties": {"type": {"not": {"enum": ["a", "b", "c"]}}}}
    base = {"type": "object", "properties": {"type": {"type": "string"}}, "required": ["type"]}
    schema = {"oneOf": [{"oneOf": shapes}, other], "allOf": [base]}
    narrowed, rules = narrow(schema)
    assert besides_number_bounds(rules) == []
    assert "not" not in json.dumps(narrowed["anyOf"][0])  # the inner oneOf: no complement
    grammar = compiler.compile(StructuredSpec(json=schema))
    texts = walks_validate(compiler, schema, grammar, "context", walks=12)
    assert len({json.loads(t)["type"] for t in texts}) > 1


def test_function_narrows_its_bindings_oneof():
    """Was ~575k characters of complements. The binding shapes are told apart by their "type" constants, and
    those oneOf branches are narrowed to what is proven apart. (The schema is draft-04, whose sqlBinding and
    mySqlBinding branches use `const`, which draft-04 does not define: under the schema's own draft those
    branches are not apart, their complements stay large, and the whole schema still times out:
    test_grammar_soundness_fuzz pins that refusal.)"""
    entry = next(json.loads(line) for line in (CORPUS / "index.jsonl").read_text().splitlines() if '"function"' in line)
    schema = json.loads((CORPUS / entry["file"]).read_text())
    _, rules = narrow(to_internal(schema)[0])
    assert sorted((r.keyword, r.pointer) for r in besides_number_bounds(rules)) == [
        ("oneOf", "/properties/bindings/items"),
        ("oneOf", "/properties/bindings/items/allOf/1/anyOf/1/allOf/0"),
    ]


def test_a_catch_all_branch_that_negates_the_known_kinds_is_apart(compiler):
    """SchemaStore's `aspire-8.0`: known resource kinds by a "type" constant, and a catch-all branch "not one
    of the known types". Was a compile timeout (every branch carried every other's complement)."""
    value = {"type": "integer", "minimum": 0, "maximum": 99}  # (bounded: else narrow.py bounds it, a change)
    known = [
        {"type": "object", "properties": {"type": {"const": k}, "v": value}, "additionalProperties": False}
        for k in ("a.v0", "b.v0")
    ]
    rest = {
        "type": "object",
        "required": ["type"],
        "not": {"properties": {"type": {"type": "string", "enum": ["a.v0", "b.v0"]}}},
    }
    schema = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}
    schema["oneOf"] = [*known, rest]
    ex = Exclusivity(schema)
    assert ex.disjoint(rest, known[0])
    unknown = {"type": "object", "properties": {"type": {"const": "c.v0"}}}
    assert not ex.disjoint(rest, unknown)  # {"type": "c.v0"} matches both
    narrowed, rules = narrow(schema)
    assert besides_number_bounds(rules) == []
    assert narrowed["anyOf"][:2] == known  # no complements added to the known kinds
    grammar = compiler.compile(StructuredSpec(json=schema))
    walks_validate(compiler, schema, grammar, "catch-all", walks=12)


def test_keywords_a_later_draft_defines_are_annotations_under_the_schemas_own_draft(compiler):
    """SchemaStore's web-manifest (draft-04): `orientation` is a oneOf of `const` branches. draft-04 has no
    `const`, so each branch matches anything and the oneOf accepts nothing: enforcing `const` there (as a
    later draft would) generated "portrait", which the schema's own draft rejects."""
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {
            "orientation": {"oneOf": [{"const": "any"}, {"const": "portrait"}]},
            "name": {"type": "string", "maxLength": 8},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    assert to_internal(schema)[0]["properties"]["orientation"] == {"oneOf": [{}, {}]}
    grammar = compiler.compile(StructuredSpec(json=schema))
    check = jsonschema.Draft4Validator(schema)
    rng = random.Random("web-manifest")
    for _ in range(12):
        walk = random_walk(grammar, compiler.vocab, rng, max(200, grammar.min_tokens + 100))
        assert walk.error is None and walk.closed, walk
        doc = json.loads(walk.text)
        assert "orientation" not in doc and not list(check.iter_errors(doc)), walk.text
