"""Which branches of a ``oneOf`` can never match together, so that ``oneOf`` may be generated as ``anyOf``.

Writing "this branch and none of the others" with complements is exact but can grow a schema by orders of
magnitude (bench/README.md has an example). Most
real ``oneOf`` branches are apart by construction: different JSON types, different constants, or a required
property whose values differ. This module proves that, per JSON type: ``split`` says, for each branch, the
types of value for which no other branch can match too. A branch generated only with those types yields
only documents that match exactly one branch (sound). The proofs are conservative: "not shown apart" never
means "overlapping", so a missed proof only narrows or leaves the complement route in place.

Everything here reads the schema as written (before narrowing), with ``$ref`` resolved against that root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraplex.grammar.schema.check import resolve_pointer
from loraplex.grammar.schema.normalize import json_key, kind_of

KINDS = frozenset({"null", "boolean", "object", "array", "number", "string"})
MAX_DEPTH = 12  # deeper (or cyclic) structures are not examined: "not shown apart"

# keywords that only constrain values of one type (every other value satisfies them)
_FOR_TYPE = {
    **dict.fromkeys(
        (
            "properties",
            "required",
            "additionalProperties",
            "patternProperties",
            "propertyNames",
            "minProperties",
            "maxProperties",
            "dependentRequired",
            "dependentSchemas",
            "unevaluatedProperties",
        ),
        "object",
    ),
    **dict.fromkeys(
        (
            "items",
            "prefixItems",
            "contains",
            "minContains",
            "maxContains",
            "minItems",
            "maxItems",
            "uniqueItems",
            "unevaluatedItems",
        ),
        "array",
    ),
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), "string"),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), "number"),
}
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment"}
    | {"$defs", "definitions"}
)


@dataclass(frozen=True)
class OneOfSplit:
    kinds: list[frozenset[str]]  # per branch: the JSON types for which it is apart from every other branch
    domains: list[frozenset[str]]  # per branch: the JSON types it may accept at all (an over-approximation)
    exact: bool  # the branches, each kept to its kinds, generate every value the oneOf accepts

    def restricted(self, i: int) -> bool:
        """Whether branch i must be held to its kinds (it may accept other types)."""
        return self.kinds[i] != self.domains[i]


def _types(value: Any) -> frozenset[str]:
    names = {value} if isinstance(value, str) else set(value)
    return frozenset("number" if n == "integer" else n for n in names) & KINDS


class Exclusivity:
    """Disjointness proofs over one root (the schema as written)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._disjoint: dict[tuple[int, int, frozenset[str], frozenset[str]], bool] = {}
        self._domain: dict[int, frozenset[str]] = {}
        self._keep: list[Any] = []  # the schemas memoized by id stay alive (ids are never reused)
        self._targets: dict[int, Any] = {}
        self._conjunct_lists: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self._ranges: dict[tuple[int, int, str], tuple[Bound, Bound]] = {}
        self._tag_maps: dict[tuple[int, int], dict[str, set[Any]]] = {}  # schemas kept alive by _conjuncts' memo
        self._value_sets: dict[int, set[Any] | None] = {}

    # ---- resolution ----------------------------------------------------------------------------------
    def target(self, schema: Any) -> Any:
        """A bare ``$ref`` followed to its target (a ``$ref`` with siblings stays: it is a conjunction)."""
        if not (isinstance(schema, dict) and len(schema) == 1 and "$ref" in schema):
            return schema
        key = id(schema)
        if key not in self._targets:  # the proofs follow the same references thousands of times
            self._keep.append(schema)
            for _ in range(MAX_DEPTH):
                if not (isinstance(schema, dict) and set(schema) == {"$ref"}):
                    break
                schema, _ = resolve_pointer(self.root, schema["$ref"])
            self._targets[key] = schema
        return self._targets[key]

    def _values(self, schema: dict[str, Any]) -> set[Any] | None:
        """``_values`` once per schema (an enum of hundreds of values is compared with every other branch)."""
        key = id(schema)
        if key not in self._value_sets:
            self._keep.append(schema)
            self._value_sets[key] = _values(schema)
        return self._value_sets[key]

    def _members(self, schema: dict[str, Any]) -> list[Any]:
        """Schemas that every value matching ``schema`` also matches (allOf members, a sibling $ref's target)."""
        out = list(schema.get("allOf", []))
        if "$ref" in schema:
            out.append(resolve_pointer(self.root, schema["$ref"])[0])
        return out

    # ---- what types a schema may accept ----------------------------------------------------------------
    def domain(self, schema: Any, depth: int = 0) -> frozenset[str]:
        schema = self.target(schema)
        if schema is True or not isinstance(schema, dict) or depth > MAX_DEPTH:
            return frozenset() if schema is False else KINDS
        key = id(schema)
        if key in self._domain:
            return self._domain[key]
        self._domain[key] = KINDS  # a cycle back here assumes nothing
        self._keep.append(schema)
        out = KINDS
        if "type" in schema:
            out &= _types(schema["type"])
        if "const" in schema:
            out &= {kind_of(schema["const"])}
        if "enum" in schema:
            out &= {kind_of(v) for v in schema["enum"]}
        for member in self._members(schema):
            out &= self.domain(member, depth + 1)
        if "not" in schema:  # types the negated schema accepts whole are rejected here
            out = frozenset(kind for kind in out if not self.vacuous(schema["not"], kind, depth + 1))
        for key_word in ("anyOf", "oneOf"):
            if key_word in schema:
                union: frozenset[str] = frozenset()
                for branch in schema[key_word]:
                    union |= self.domain(branch, depth + 1)
                out &= union
        self._domain[key] = out
        return out

    # ---- no value of the given types matches both ------------------------------------------------------
    def disjoint(
        self, a: Any, b: Any, within: frozenset[str] = KINDS, depth: int = 0, present: frozenset[str] = frozenset()
    ) -> bool:
        """No value of the types ``within`` matches both (``present``: property names every object considered
        has, required by a schema the two are part of)."""
        a, b = self.target(a), self.target(b)
        if a is False or b is False:
            return True
        if depth > MAX_DEPTH:
            return False
        within = within & self.domain(a) & self.domain(b)
        if not within:
            return True
        if not isinstance(a, dict) or not isinstance(b, dict):
            return False  # True (or a non-schema) against a schema that admits these types
        if a is b:
            return False  # one schema that admits these types (a shared $ref target, say): no proof can follow
        if len(within) > 1:  # apart on every type they share: each type has its own proofs
            return all(self.disjoint(a, b, frozenset({kind}), depth + 1, present) for kind in sorted(within))
        if within != {"object"}:
            present = frozenset()
        key = (min(id(a), id(b)), max(id(a), id(b)), within, present)  # symmetric: proved either way round
        if key not in self._disjoint:
            self._disjoint[key] = False  # a cycle back here proves nothing
            self._keep += [a, b]
            proof = False
            if within == {"object"}:  # a value in both has every key either requires
                present = present | _required(self._conjuncts(a, depth)) | _required(self._conjuncts(b, depth))
                proof = _tags_apart(self._tags(a, depth), self._tags(b, depth), present)
            proof = (
                proof or self._prove(a, b, within, depth + 1, present) or self._prove(b, a, within, depth + 1, present)
            )
            self._disjoint[key] = proof
        return self._disjoint[key]

    def _prove(
        self, a: dict[str, Any], b: dict[str, Any], within: frozenset[str], depth: int, present: frozenset[str]
    ) -> bool:
        va, vb = self._values(a), self._values(b)
        if va is not None and vb is not None and not (va & vb):
            return True
        if "not" in a and self._inside(b, self.target(a["not"]), within, depth):
            return True  # b inside what a negates
        if any(self.disjoint(m, b, within, depth, present) for m in self._members(a)):
            return True  # a is inside m, and m is apart from b
        for key in ("anyOf", "oneOf"):
            if key in a and all(self.disjoint(branch, b, within, depth, present) for branch in a[key]):
                return True  # a is inside the union of its branches
        kind = next(iter(within)) if len(within) == 1 else None
        if kind is not None and self._ranges_apart(a, b, kind, depth):
            return True
        if kind == "object":
            return self._discriminated(a, b, depth, present)
        if kind == "array":
            return self._items_apart(a, b, depth)
        return False

    def _ranges_apart(self, a: dict[str, Any], b: dict[str, Any], kind: str, depth: int) -> bool:
        """Sizes (lengths, item or property counts) or numeric ranges that do not meet."""
        keys = _RANGES.get(kind)
        if keys is None:
            return False
        low_a, high_a = self._range(a, depth, kind)
        low_b, high_b = self._range(b, depth, kind)
        return _below(high_a, low_b) or _below(high_b, low_a)

    def _range(self, schema: dict[str, Any], depth: int, kind: str) -> tuple[Bound, Bound]:
        key = (id(schema), depth, kind)  # the schema is kept alive by _conjuncts' memo
        if key not in self._ranges:
            self._ranges[key] = _range(self._conjuncts(schema, depth), *_RANGES[kind])
        return self._ranges[key]

    def _items_apart(self, a: dict[str, Any], b: dict[str, Any], depth: int) -> bool:
        """Arrays: an item both must have (at a position below either's minItems) that they hold apart."""
        ours, theirs = self._conjuncts(a, depth), self._conjuncts(b, depth)
        present = max(_range(ours, *_RANGES["array"])[0][0], _range(theirs, *_RANGES["array"])[0][0])
        for i in range(min(int(max(present, 0)), 16)):
            mine = [s for c in ours if (s := _item_schema(c, i)) is not None]
            other = [s for c in theirs if (s := _item_schema(c, i)) is not None]
            if any(self.disjoint(x, y, KINDS, depth) for x in mine for y in other):
                return True
        return False

    def _inside(self, b: Any, negated: Any, within: frozenset[str], depth: int) -> bool:
        """Every value of b (of the types ``within``) matches ``negated``: b is ``negated`` itself, or b's
        constants satisfy a type/enum, or (objects) each of ``negated``'s properties holds b's values."""
        if negated is b or negated is True or b is False:
            return True
        if not isinstance(negated, dict) or not isinstance(b, dict) or depth > MAX_DEPTH:
            return False
        keys = set(negated) - _ANNOTATIONS
        conjuncts = self._conjuncts(b, depth)
        if keys <= {"type", "enum", "const"}:
            values = next((v for c in conjuncts if (v := _raw_values(c)) is not None), None)
            return values is not None and all(_satisfies(v, negated) for v in values)
        if (
            keys <= {"type", "properties"}
            and within == {"object"}
            and _types(negated.get("type", "object")) == {"object"}
        ):
            for name, sub in (negated.get("properties") or {}).items():
                held = [t for c in conjuncts if (t := _property_schema(c, name)) is not None]
                if not any(self._inside(t, self.target(sub), KINDS, depth + 1) for t in held):
                    return False
            return True
        return False

    def _conjuncts(self, schema: dict[str, Any], depth: int) -> list[dict[str, Any]]:
        """``schema`` and every schema it is the conjunction of (allOf members, $ref targets, recursively)."""
        key = (id(schema), depth)
        if key in self._conjunct_lists:
            return self._conjunct_lists[key]
        self._keep.append(schema)
        out: dict[int, dict[str, Any]] = {}
        todo = [(schema, 0)]
        while todo:
            node, level = todo.pop()
            node = self.target(node)
            if not isinstance(node, dict) or id(node) in out or depth + level > MAX_DEPTH:
                continue
            out[id(node)] = node
            todo += [(m, level + 1) for m in self._members(node)]
        self._conjunct_lists[key] = list(out.values())
        return self._conjunct_lists[key]

    def _tags(self, schema: dict[str, Any], depth: int) -> dict[str, set[Any]]:
        """Properties that ``schema`` holds to constants (const/enum, in any conjunct): name -> the values an
        object matching it can have there. Tagged unions are the common oneOf, and this proof of theirs costs a
        dictionary lookup where the general one (``_discriminated``) walks every shared property."""
        key = (id(schema), depth)
        if key not in self._tag_maps:
            tags: dict[str, set[Any]] = {}
            for conjunct in self._conjuncts(schema, depth):
                for name, sub in (conjunct.get("properties") or {}).items():
                    values = self._values(sub_) if isinstance(sub_ := self.target(sub), dict) else None
                    if values is not None:
                        tags[name] = tags[name] & values if name in tags else values
            self._tag_maps[key] = tags
        return self._tag_maps[key]

    def _discriminated(self, a: dict[str, Any], b: dict[str, Any], depth: int, present: frozenset[str]) -> bool:
        """Objects only: a property every object here has (required by either, or by the schema around
        them) that b forbids, or that a and b hold to values that never meet."""
        ours_all, theirs_all = self._conjuncts(a, depth), self._conjuncts(b, depth)
        held = []
        for name in sorted(present):
            theirs = [t for c in theirs_all if (t := _property_schema(c, name)) is not None]
            if any(t is False for t in theirs) or any(name in _forbidden(c) for c in theirs_all):
                return True
            ours = [o for c in ours_all if (o := _property_schema(c, name)) is not None]
            tagged = any(isinstance(s, dict) and ("const" in s or "enum" in s) for s in ours + theirs)
            held.append((not tagged, name, ours, theirs))
        # a tag property (const or enum) first: it usually decides, where the others recurse into shared shapes
        for _, _, ours, theirs in sorted(held, key=lambda h: h[:2]):
            if any(self.disjoint(o, t, KINDS, depth) for o in ours for t in theirs):
                return True
        return False

    # ---- every value of a type matches ---------------------------------------------------------------
    def vacuous(self, schema: Any, kind: str, depth: int = 0) -> bool:
        """Whether every value of JSON type ``kind`` matches ``schema`` (judged conservatively)."""
        schema = self.target(schema)
        if schema is True:
            return True
        if not isinstance(schema, dict) or depth > MAX_DEPTH:
            return False
        for key, value in schema.items():
            if key in _ANNOTATIONS:
                continue
            if key == "type":
                names = {value} if isinstance(value, str) else set(value)
                if kind not in _types(value) or (kind == "number" and "number" not in names):
                    return False  # "integer" alone rejects 1.5
            elif key == "allOf":
                if not all(self.vacuous(m, kind, depth + 1) for m in value):
                    return False
            elif key == "anyOf":
                if not any(self.vacuous(m, kind, depth + 1) for m in value):
                    return False
            elif key == "$ref":
                if not self.vacuous(resolve_pointer(self.root, value)[0], kind, depth + 1):
                    return False
            elif _FOR_TYPE.get(key, kind) == kind:
                return False  # a keyword that constrains this type (or one we do not judge)
        return True

    # ---- oneOf ------------------------------------------------------------------------------------------
    def in_context(self, branches: list[Any], context: dict[str, Any] | None) -> list[Any]:
        """The branches as the values they judge: those that also match the schema the oneOf sits in."""
        if not context:
            return branches
        out = [{"allOf": [b, context]} for b in branches]
        self._keep.append(out)
        return out

    def split(self, branches: list[Any]) -> OneOfSplit:
        """Per branch, the types for which no other branch can match as well; and whether keeping each
        branch to those types loses nothing: a type left out of some branch must be one that two branches
        accept whole (then no value of it matches exactly one branch)."""
        domains = [self.domain(b) for b in branches]
        # a type two branches accept whole matches both: no branch holds it alone, and no proof is tried
        whole = {kind: sum(self.vacuous(b, kind) for b in branches) for kind in set().union(*domains)}
        shared = frozenset(kind for kind, count in whole.items() if count >= 2)
        kinds = []
        for i, branch in enumerate(branches):
            ok = {
                kind
                for kind in domains[i] - shared
                if all(self.disjoint(branch, other, frozenset({kind})) for j, other in enumerate(branches) if j != i)
            }
            kinds.append(frozenset(ok))
        lost = set().union(*(domains[i] - kinds[i] for i in range(len(branches)))) if branches else set()
        exact = lost <= shared
        return OneOfSplit(kinds, domains, exact)


def _tags_apart(ours: dict[str, set[Any]], theirs: dict[str, set[Any]], present: frozenset[str]) -> bool:
    """A property every object considered has, held to constants by both that never meet."""
    return any(name in present and name in theirs and not (values & theirs[name]) for name, values in ours.items())


def _required(conjuncts: list[dict[str, Any]]) -> frozenset[str]:
    return frozenset(n for c in conjuncts for n in c.get("required", []) if isinstance(n, str))


def _raw_values(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    if "enum" in schema:
        return list(schema["enum"])
    return None


def _satisfies(value: Any, schema: dict[str, Any]) -> bool:
    """A constant against a schema of only type / enum / const."""
    if "type" in schema:
        names = {schema["type"]} if isinstance(schema["type"], str) else set(schema["type"])
        kind = kind_of(value)
        integral = kind == "number" and (isinstance(value, int) or float(value).is_integer())
        if kind not in names and not (kind == "number" and "integer" in names and integral):
            return False
    if "const" in schema and json_key(schema["const"]) != json_key(value):
        return False
    return "enum" not in schema or json_key(value) in {json_key(v) for v in schema["enum"]}


def _values(schema: dict[str, Any]) -> set[Any] | None:
    if "const" in schema:
        return {json_key(schema["const"])}
    if "enum" in schema:
        return {json_key(v) for v in schema["enum"]}
    return None


def _property_schema(schema: dict[str, Any], name: str) -> Any:
    """The schema a property's value is held to by this object schema alone (None: cannot tell)."""
    properties = schema.get("properties")
    if isinstance(properties, dict) and name in properties:
        return properties[name]
    if "patternProperties" in schema:
        return None
    return schema.get("additionalProperties", True)


def _forbidden(schema: dict[str, Any]) -> set[str]:
    """Property names an object matching ``schema`` cannot have, from ``not: {required: [name]}`` or
    ``not: {anyOf: [{required: [name]}, ...]}`` (closed objects and false properties: ``_property_schema``)."""
    negated = schema.get("not")
    if not isinstance(negated, dict):
        return set()
    parts = negated.get("anyOf", []) if set(negated) == {"anyOf"} else [negated]
    out = set()
    for part in parts:
        if isinstance(part, dict) and set(part) == {"required"} and len(part["required"]) == 1:
            out.add(part["required"][0])
    return out


# per type: the keywords of its lower bound (inclusive, exclusive) and upper bound (inclusive, exclusive)
_RANGES = {
    "number": ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"),
    "string": ("minLength", None, "maxLength", None),
    "array": ("minItems", None, "maxItems", None),
    "object": ("minProperties", None, "maxProperties", None),
}
Bound = tuple[float, bool]  # a value, and whether the bound excludes it


def _range(
    conjuncts: list[dict[str, Any]], low: str, low_ex: str | None, high: str, high_ex: str | None
) -> tuple[Bound, Bound]:
    """The tightest bounds all conjuncts set ((-inf, inclusive) / (inf, inclusive) where none)."""
    lo: Bound = (float("-inf"), False)
    hi: Bound = (float("inf"), False)
    for c in conjuncts:
        for key, excl in ((low, False), (low_ex, True)):
            v = c.get(key) if key else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (v, excl) > lo:
                lo = (v, excl)
        for key, excl in ((high, False), (high_ex, True)):
            v = c.get(key) if key else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (v, not excl) < (hi[0], not hi[1]):
                hi = (v, excl)
    return lo, hi


def _below(high: Bound, low: Bound) -> bool:
    """Every value under ``high`` is below every value over ``low``."""
    return high[0] < low[0] or (high[0] == low[0] and (high[1] or low[1]))


def _item_schema(schema: dict[str, Any], i: int) -> Any:
    """The schema item i is held to by this array schema alone (None: unconstrained)."""
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list) and i < len(prefix):
        return prefix[i]
    return schema.get("items")
