"""Normalise a checked JSON schema into alternatives of single-type nodes.

A sub-schema becomes a disjunction (anyOf, type arrays, oneOf with provably disjoint branches) of
conjunctions (allOf, sibling keywords, $ref targets) of applicator-free schema parts; each
conjunction is then split by JSON type into nodes whose constraints are merged exactly (tightest
bounds, per-schema additionalProperties/items semantics, enum values filtered by validating
them). Children (properties, items) stay as lists of sub-schemas and are normalised on demand,
so recursive `$ref`s unroll only as deep as the output nests, up to a bound.

What a regex cannot express exactly (two patterns on one string, a pattern with a length,
overlapping oneOf branches, ...) raises NotRegular and the schema goes to llguidance instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import jsonschema
import referencing.exceptions

from loraplex.grammar.schema.check import ANNOTATIONS, LLGUIDANCE_ONLY, resolve_pointer

APPLICATORS = frozenset({"$ref", "allOf", "anyOf", "oneOf"})
_NOT_ASSERTIONS = ANNOTATIONS | {"$defs", "definitions"}
GROUNDED = "x-loraplex-grounded"  # our keyword: a string value must be a span of the source text (grammar/grounding.py)
FRACTION_DIGITS_KEY = (
    "x-loraplex-fraction-digits"  # internal (narrow.py): most digits a number's fraction is written with
)
KINDS = frozenset({"null", "boolean", "integer", "fraction", "string", "array", "object"})
MAX_TERMS = 64


class NotRegular(Exception):
    """Enforceable, but not by our regex translation (the message says why)."""


Sub = tuple[Any, str]  # (schema, JSON pointer of that schema)


@dataclass(frozen=True)
class Ctx:
    """How often each $ref target was expanded on the path from the root to here."""

    refs: tuple[tuple[str, int], ...] = ()

    def bump(self, ptr: str, limit: int) -> Ctx | None:
        counts = dict(self.refs)
        counts[ptr] = counts.get(ptr, 0) + 1
        if counts[ptr] > limit:
            return None
        return Ctx(tuple(sorted(counts.items())))


@dataclass
class Term:
    parts: list[tuple[dict[str, Any], str]]
    ctx: Ctx


@dataclass
class Node:
    """One JSON type's slice of a conjunction; `kind` is null, boolean, number, string, array,
    object or const."""

    kind: str
    term: Term
    integer_only: bool = False
    lo: Decimal | None = None
    lo_strict: bool = False
    hi: Decimal | None = None
    hi_strict: bool = False
    min_len: int = 0
    max_len: int | None = None
    patterns: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    positions: list[list[Sub]] = field(default_factory=list)
    rest: list[Sub] = field(default_factory=list)
    min_items: int = 0
    max_items: int | None = None
    keys: list[tuple[str, list[Sub], bool]] = field(default_factory=list)
    extra: list[Sub] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    grounded: bool = False  # a string (or string const) whose value must be a span of the request's source text
    fraction_digits: int | None = None  # a number's fraction is written with at most this many digits


def json_key(v: Any) -> Any:
    """Hashable value with JSON-schema equality (1 == 1.0, true != 1, key order ignored)."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", Decimal(repr(v)) if isinstance(v, float) else Decimal(v))
    if isinstance(v, str):
        return ("s", v)
    if v is None:
        return ("z",)
    if isinstance(v, list):
        return ("l", tuple(json_key(x) for x in v))
    return ("d", frozenset((k, json_key(x)) for k, x in v.items()))


def kind_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    names: dict[type[Any], str] = {str: "string", list: "array", dict: "object"}
    return names[type(v)]


def _dec(v: Any) -> Decimal:
    return Decimal(repr(v)) if isinstance(v, float) else Decimal(v)


def _has_assertions(part: dict[str, Any]) -> bool:
    return any(
        (k not in _NOT_ASSERTIONS and not k.startswith("x-")) or (k == GROUNDED and part[k] is True) for k in part
    )


def is_grounded(part: dict[str, Any]) -> bool:
    return part.get(GROUNDED) is True


def _esc(name: Any) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


class Normalizer:
    def __init__(self, root: Any, max_ref_depth: int) -> None:
        self.root = root
        self.max_ref_depth = max_ref_depth
        self.cuts: set[str] = set()  # where recursion was cut at its bound (a narrowing of the regex)
        cls = jsonschema.Draft202012Validator
        self._validator = cls(root if isinstance(root, (dict, bool)) else {}, format_checker=cls.FORMAT_CHECKER)

    # ---- disjunctive normal form -------------------------------------------------------------
    def dnf(self, subs: list[Sub], ctx: Ctx) -> list[Term]:
        terms = [Term([], ctx)]
        for schema, ptr in subs:
            terms = [t2 for t in terms for t2 in self._conjoin(t, schema, ptr)]
            if len(terms) > MAX_TERMS:
                raise NotRegular(f"more than {MAX_TERMS} alternatives at {ptr or '/'}")
        return terms

    def _conjoin(self, term: Term, schema: Any, ptr: str) -> list[Term]:
        if schema is True:
            return [term]
        if schema is False:
            return []
        local = {k: v for k, v in schema.items() if k not in APPLICATORS}
        for key in LLGUIDANCE_ONLY & local.keys():
            raise NotRegular(f"{key} at {ptr or '/'}")
        out = [Term(term.parts + [(local, ptr)], term.ctx)] if _has_assertions(local) else [term]
        if "$ref" in schema:
            target, tptr = resolve_pointer(self.root, schema["$ref"])
            expanded = []
            for t in out:
                ctx = t.ctx.bump(tptr, self.max_ref_depth)
                if ctx is not None:
                    expanded += self._conjoin(Term(t.parts, ctx), target, tptr)
                else:  # past the recursion bound this alternative is cut off
                    self.cuts.add(
                        f"$ref at {ptr or '/'}: recursion to {tptr or '/'} unrolled {self.max_ref_depth} times"
                    )
            out = expanded
        for i, sub in enumerate(schema.get("allOf", [])):
            out = _bounded([t2 for t in out for t2 in self._conjoin(t, sub, f"{ptr}/allOf/{i}")], ptr)
        if "anyOf" in schema:
            expanded = []
            for t in out:
                for i, sub in enumerate(schema["anyOf"]):
                    expanded = _bounded(expanded + self._conjoin(t, sub, f"{ptr}/anyOf/{i}"), ptr)
            out = expanded
        if "oneOf" in schema:
            out = self._one_of(out, schema["oneOf"], f"{ptr}/oneOf")
        return _bounded(out, ptr)

    def _one_of(self, terms: list[Term], branches: list[Any], ptr: str) -> list[Term]:
        """oneOf is a union when its branches cannot overlap (given what they are combined with);
        prove that or give up."""
        out: list[Term] = []
        for t in terms:
            per_branch = [self._conjoin(t, sub, f"{ptr}/{i}") for i, sub in enumerate(branches)]
            nodes = [[n for bt in bts for n in self.nodes(bt)] for bts in per_branch]
            live = [i for i, ns in enumerate(nodes) if ns]
            for x in range(len(live)):
                for y in range(x + 1, len(live)):
                    if not all(self.disjoint(n, m, 2) for n in nodes[live[x]] for m in nodes[live[y]]):
                        raise NotRegular(
                            f"oneOf at {ptr}: cannot prove branches {live[x]} and {live[y]} are mutually exclusive"
                        )
            out = _bounded(out + [bt for i in live for bt in per_branch[i]], ptr)
        return out

    # ---- split a conjunction by type ---------------------------------------------------------
    def nodes(self, term: Term) -> list[Node]:
        parts = [p for p, _ in term.parts]
        kinds = set(KINDS)
        values: list[Any] | None = None
        for p in parts:
            if "type" in p:
                kinds &= _kinds(p["type"])
            if "const" in p or "enum" in p:
                listed = [p["const"]] if "const" in p else list(p["enum"])
                if values is None:
                    values = listed
                else:
                    keys = {json_key(v) for v in listed}
                    values = [v for v in values if json_key(v) in keys]
        if values is not None:
            # every value is in every part's enum/const already: checked against the parts' other keywords only
            # (checking each value through every enum again is quadratic on large enums: bench/README.md)
            rest = [q for p in parts if (q := {k: v for k, v in p.items() if k not in ("enum", "const")})]
            kept: dict[Any, Any] = {}
            for v in values:
                if json_key(v) not in kept and all(self.valid(v, q) for q in rest):
                    kept[json_key(v)] = v
            grounded = any(is_grounded(p) for p in parts)
            return [Node("const", term, values=list(kept.values()), grounded=grounded)] if kept else []
        out = []
        if "null" in kinds:
            out.append(Node("null", term))
        if "boolean" in kinds:
            out.append(Node("boolean", term))
        if kinds & {"integer", "fraction"}:
            out.append(self._number(term, parts, integer_only="fraction" not in kinds))
        if "string" in kinds:
            out.append(self._string(term, parts))
        if "array" in kinds:
            out.append(self._array(term))
        if "object" in kinds:
            out.append(self._object(term))
        return out

    def valid(self, value: Any, part: dict[str, Any]) -> bool:
        try:
            return bool(self._validator.evolve(schema=part).is_valid(value))
        except (re.error, referencing.exceptions.Unresolvable) as e:  # exotic patterns
            raise NotRegular(f"cannot check enum/const values: {e}") from None

    @staticmethod
    def _number(term: Term, parts: list[dict[str, Any]], integer_only: bool) -> Node:
        node = Node("number", term, integer_only=integer_only)
        for p in parts:
            cap = p.get(FRACTION_DIGITS_KEY)
            if isinstance(cap, int):
                node.fraction_digits = cap if node.fraction_digits is None else min(cap, node.fraction_digits)
            for key, strict in (("minimum", False), ("exclusiveMinimum", True)):
                if key in p:
                    v = _dec(p[key])
                    if node.lo is None or v > node.lo or (v == node.lo and strict):
                        node.lo, node.lo_strict = v, strict
            for key, strict in (("maximum", False), ("exclusiveMaximum", True)):
                if key in p:
                    v = _dec(p[key])
                    if node.hi is None or v < node.hi or (v == node.hi and strict):
                        node.hi, node.hi_strict = v, strict
        return node

    @staticmethod
    def _string(term: Term, parts: list[dict[str, Any]]) -> Node:
        node = Node("string", term, grounded=any(is_grounded(p) for p in parts))
        for p in parts:
            if "minLength" in p:
                node.min_len = max(node.min_len, int(p["minLength"]))
            if "maxLength" in p:
                v = int(p["maxLength"])
                node.max_len = v if node.max_len is None else min(node.max_len, v)
            if "pattern" in p and p["pattern"] not in node.patterns:
                node.patterns.append(p["pattern"])
            if "format" in p and p["format"] not in node.formats:
                node.formats.append(p["format"])
        return node

    @staticmethod
    def _array(term: Term) -> Node:
        node = Node("array", term)
        width = max((len(p.get("prefixItems", [])) for p, _ in term.parts), default=0)
        for i in range(width):
            subs: list[Sub] = []
            for p, ptr in term.parts:
                prefix = p.get("prefixItems", [])
                if i < len(prefix):
                    subs.append((prefix[i], f"{ptr}/prefixItems/{i}"))
                elif "items" in p:
                    subs.append((p["items"], f"{ptr}/items"))
            node.positions.append(subs)
        node.rest = [(p["items"], f"{ptr}/items") for p, ptr in term.parts if "items" in p]
        for p, _ in term.parts:
            if "minItems" in p:
                node.min_items = max(node.min_items, int(p["minItems"]))
            if "maxItems" in p:
                v = int(p["maxItems"])
                node.max_items = v if node.max_items is None else min(node.max_items, v)
        return node

    @staticmethod
    def _object(term: Term) -> Node:
        node = Node("object", term)
        names: list[str] = []
        required: set[str] = set()
        for p, _ in term.parts:
            names += [n for n in p.get("properties", {}) if n not in names]
            required |= set(p.get("required", []))
        for p, _ in term.parts:
            names += [n for n in p.get("required", []) if n not in names]
        for name in names:
            subs: list[Sub] = []
            for p, ptr in term.parts:
                if name in p.get("properties", {}):
                    subs.append((p["properties"][name], f"{ptr}/properties/{_esc(name)}"))
                elif "additionalProperties" in p:
                    subs.append((p["additionalProperties"], f"{ptr}/additionalProperties"))
            node.keys.append((name, subs, name in required))
        node.extra = [
            (p["additionalProperties"], f"{ptr}/additionalProperties")
            for p, ptr in term.parts
            if "additionalProperties" in p
        ]
        return node

    # ---- disjointness (for oneOf) --------------------------------------------------------------
    def disjoint(self, a: Node, b: Node, depth: int) -> bool:
        if a.kind == "const" or b.kind == "const":
            if a.kind == "const" and b.kind == "const":
                return not ({json_key(v) for v in a.values} & {json_key(v) for v in b.values})
            c, other = (a, b) if a.kind == "const" else (b, a)
            return not any(
                kind_of(v) == other.kind and all(self.valid(v, p) for p, _ in other.term.parts) for v in c.values
            )
        if a.kind != b.kind:
            return True
        if a.kind == "number":
            return _ranges_disjoint(a, b)
        if a.kind == "object" and depth > 0:
            return self._objects_disjoint(a, b, depth) or self._objects_disjoint(b, a, depth)
        return False

    def _objects_disjoint(self, a: Node, b: Node, depth: int) -> bool:
        b_keys = {name: (subs, req) for name, subs, req in b.keys}
        for name, subs, req in a.keys:
            if not req:
                continue
            b_subs, b_req = b_keys.get(name, (b.extra, False))
            b_nodes = [n for t in self.dnf(b_subs, b.term.ctx) for n in self.nodes(t)]
            if not b_nodes:
                return True  # a requires a key that b forbids
            if b_req:
                a_nodes = [n for t in self.dnf(subs, a.term.ctx) for n in self.nodes(t)]
                if all(self.disjoint(x, y, depth - 1) for x in a_nodes for y in b_nodes):
                    return True
        return False


def _bounded(terms: list[Term], ptr: str) -> list[Term]:
    """Terms only multiply as a conjunction is expanded (allOf of anyOfs is a product), so the bound is
    checked at every step: checking only the finished list let a product grow exponentially first."""
    if len(terms) > MAX_TERMS:
        raise NotRegular(f"more than {MAX_TERMS} alternatives at {ptr or '/'}")
    return terms


def _kinds(t: Any) -> set[str]:
    out: set[str] = set()
    for name in [t] if isinstance(t, str) else t:
        out |= {"integer", "fraction"} if name == "number" else {name}
    return out


def _ranges_disjoint(a: Node, b: Node) -> bool:
    def below(x: Node, y: Node) -> bool:  # every x < every y
        if x.hi is None or y.lo is None:
            return False
        return x.hi < y.lo or (x.hi == y.lo and (x.hi_strict or y.lo_strict))

    return below(a, b) or below(b, a)
