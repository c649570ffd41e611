"""Rewrite every keyword into ones the backends enforce exactly; where that is impractical, into a narrower
schema (never a wider one), and record each narrowing with its keyword and JSON pointer.

Runs on the internal form (``dialect``). Exact rewrites (same language):

* ``not S`` -> the complement of S (``negate``), ``if/then/else`` -> ``(if and then) or (not-if and else)``,
  ``dependentRequired``/``dependentSchemas`` -> "the key is absent, or the rest holds",
  ``propertyNames`` with a finite set of names or a pattern -> declared names / ``patternProperties``,
  ``oneOf`` -> ``anyOf`` of its branches where they are proven apart (``exclusive``: by type, constants, a
  required property's values; each branch held to the types where it is apart, when two or more branches
  accept the other types whole), else of each branch minus the others,
  ``unevaluatedProperties``/``unevaluatedItems`` -> one shape per choice of branches (``unevaluated``);

and narrowings (a subset, said so):

* a ``oneOf`` whose complements would exceed MAX_COMPLEMENT characters -> its branches held to the types
  where they are proven apart (a value of another type that matches one branch is not generated);
* a number bound at +-2**63 (Java's Long limits), which llguidance cannot build -> +-SAFE_BOUND;
* a number or integer without a bound on a side -> kept within +-10**16 there (at most 16 integer digits, what a
  double carries exactly), so a value cannot run to digits until the budget closes it (as runaway whitespace
  cannot); bounded numbers are written without an exponent;
* a complement that cannot be written whole (``not {pattern: ...}``) keeps only the part that can;
* ``uniqueItems`` -> at most one item, or for a few enumerated values, distinct values in their listed order;
* ``contains`` -> the first items match; ``minProperties``/``maxProperties`` on declared properties ->
  that many of them required / allowed; other ``propertyNames`` -> only declared names that satisfy it;
* ``format`` ``regex``, ``idn-email``, ``idn-hostname``, ``iri``, ``iri-reference`` -> a safe subset
  (plain-character regexes; the ASCII forms), and formats whose regex is narrower than the format
  (``formats.NARROWED``: no leap seconds, short host names, ...) are reported;
* a ``pattern`` with look-around, ``\\b`` or a back-reference -> known values that satisfy it;
* ``dependentRequired``/``dependentSchemas`` beyond MAX_CONDITIONALS per object -> trigger keys not generated;
* ``multipleOf`` with a divisor that has no exact binary value (0.01) or too many digits (123456) -> multiples
  that validators dividing in floating point accept as well and an automaton can state (``multiple_of``).

``patternProperties``, other ``multipleOf`` and ``minProperties``/``maxProperties`` on objects used as maps stay
as they are: llguidance enforces them exactly.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from loraplex.grammar.schema import formats
from loraplex.grammar.schema.check import pointer, resolve_pointer
from loraplex.grammar.schema.ecma_pattern import describe_ranges, key_restriction, pattern_to_content_regex
from loraplex.grammar.schema.exclusive import Exclusivity
from loraplex.grammar.schema.multiple_of import NON_NUMBERS, narrowed_multiple
from loraplex.grammar.schema.negate import Negation, Negator
from loraplex.grammar.schema.normalize import FRACTION_DIGITS_KEY, json_key, kind_of
from loraplex.grammar.schema.strict import FRAGMENT
from loraplex.grammar.schema.subschemas import SUB_LISTS, SUB_MAPS, SUB_ONE
from loraplex.grammar.schema.unevaluated import UnevaluatedRewriter
from loraplex.grammar.spec import GrammarError

MAX_ENUM_UNIQUE = 4  # distinct-in-order arrays of up to this many enumerated values are listed out
MAX_CONDITIONALS = 2  # dependencies per object written exactly (each doubles the object shapes to track)
NARROWED_FORMATS = {
    "idn-email": ("email", "ASCII addresses only"),
    "idn-hostname": ("hostname", "ASCII host names only"),
    "iri": ("uri", "ASCII URIs only"),
    "iri-reference": ("uri-reference", "ASCII URI references only"),
}
_BOUND_KEYS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
DIGITS_BOUND = 10**16  # |x| below it: at most 16 integer digits, the digits a double carries exactly
FRACTION_DIGITS = 17  # a number's fraction is written with at most this many digits (a double's significant digits)
SAFE_BOUND = 2**63 - 1024  # the widest number bound llguidance builds (2**63 - 1 rounds to 2**63 as a double)
MAX_COMPLEMENT = 20_000  # characters of complements a oneOf may add before it is narrowed instead
SAFE_REGEX = "^[A-Za-z0-9 _,:;=@#%&'\"<>!~`-]*$"  # strings of these characters are valid regexes, literally


_SUB_KEYS = frozenset(SUB_MAPS + SUB_LISTS + SUB_ONE)
# how a oneOf written with the other branches' complements is reported (``small_one_of`` would change it)
COMPLEMENTED_ONE_OF = "each branch is generated only where the others' complements can be written"


@dataclass(frozen=True)
class Narrowing:
    keyword: str
    pointer: str
    how: str

    def __str__(self) -> str:
        return f"{self.keyword} at {self.pointer or '/'}: {self.how}"


def narrow(
    schema: Any, drop_pattern_properties: bool = False, small_one_of: bool = False, in_place: bool = False
) -> tuple[Any, list[Narrowing]]:
    """The schema with every keyword in an enforceable form, and the narrowings applied.

    ``drop_pattern_properties``: generate no key through ``patternProperties`` (only declared properties),
    for when llguidance refuses the schema's patterns (overlapping ones). ``small_one_of``: no ``oneOf``
    through complements where its branches' apart types can be generated instead, for when llguidance finds
    the grammar too large. ``in_place``: the caller hands the schema over, and it is rewritten without a copy.
    """
    if not isinstance(schema, dict):
        return schema, []
    root = schema if in_place else copy.deepcopy(schema)
    n = _Narrower(root, drop_pattern_properties, small_one_of)
    n.walk(root, [])
    return root, n.rules


def _pair(node: Any, written: Any, out: dict[int, tuple[Any, Any]]) -> None:
    """Map every dict of ``node`` to its counterpart in ``written`` (a deep copy made before any rewrite)."""
    if isinstance(node, dict) and isinstance(written, dict):
        out[id(node)] = (node, written)
        for key, value in node.items():
            _pair(value, written.get(key), out)
    elif isinstance(node, list) and isinstance(written, list):
        for value, other in zip(node, written):
            _pair(value, other, out)


def _fragment(**keywords: Any) -> dict[str, Any]:
    """A condition on an object's keys, added by a rewrite (strict.FRAGMENT: it does not reopen the object)."""
    return {**keywords, FRAGMENT: True}


def _conjoin(node: dict[str, Any], extra: Any) -> None:
    """node := node AND extra."""
    node.setdefault("allOf", []).append(extra)


class _Narrower:
    def __init__(self, root: dict[str, Any], drop_pattern_properties: bool = False, small_one_of: bool = False) -> None:
        self.root = root
        self.drop_pattern_properties = drop_pattern_properties
        self.small_one_of = small_one_of
        # complements are taken of the schema as written: a narrowed subschema's complement would be wider
        self.negator = Negator(copy.deepcopy(root))
        self.exclusivity = Exclusivity(self.negator.root)
        self._originals: dict[int, tuple[Any, Any]] = {}  # id of a node -> (the node, the node as written)
        # id of an inline oneOf branch -> (the branch, schemas as written that every value it judges matches)
        self._contexts: dict[int, tuple[Any, list[dict[str, Any]]]] = {}
        _pair(root, self.negator.root, self._originals)
        self.rules: list[Narrowing] = []
        self._seen: set[int] = set()

    def note(self, keyword: str, path: list[Any], how: str) -> None:
        self.rules.append(Narrowing(keyword, pointer(path), how))

    def negate(self, schema: Any) -> Negation:
        neg = self.negator.negate(schema)
        return Negation(copy.deepcopy(neg.schema), neg.exact)  # the walk rewrites it in place later

    # ---- traversal -------------------------------------------------------------------------------
    def walk(self, node: Any, path: list[Any]) -> None:
        if not isinstance(node, dict) or id(node) in self._seen:
            return
        self._seen.add(id(node))
        self.rewrite(node, path)
        if "$ref" in node:  # targets outside the schema keywords (under an unknown keyword) are narrowed too
            target, target_ptr = resolve_pointer(self.root, node["$ref"])
            self.walk(target, [p.replace("~1", "/").replace("~0", "~") for p in target_ptr.split("/")[1:]])
        if _SUB_KEYS.isdisjoint(node):  # a leaf (most nodes)
            return
        for key in SUB_MAPS:
            for name, sub in (node.get(key) or {}).items():
                self.walk(sub, path + [key, name])
        for key in SUB_LISTS:
            for i, sub in enumerate(node.get(key) or []):
                self.walk(sub, path + [key, i])
        for key in SUB_ONE:
            if key in node:
                self.walk(node[key], path + [key])

    # ---- one node ----------------------------------------------------------------------------------
    def rewrite(self, node: dict[str, Any], path: list[Any]) -> None:
        # first: which keys count as evaluated depends on the applicators as written
        if "unevaluatedProperties" in node or "unevaluatedItems" in node:
            note = lambda keyword, how: self.note(keyword, path, how)  # noqa: E731
            UnevaluatedRewriter(self.root, self.negate, note).rewrite(node)
        if "not" in node:
            sub = node.pop("not")
            neg = self.negate(sub)
            if not neg.exact:
                self.note("not", path, "only the part of the complement that can be written is generated")
            _conjoin(node, neg.schema)
        if "if" in node:
            cond, then, other = node.pop("if"), node.pop("then", True), node.pop("else", True)
            neg = self.negate(cond)
            if not neg.exact:
                self.note("if", path, "the else branch applies only where the condition's complement can be written")
            _conjoin(node, {"anyOf": [{"allOf": [cond, then]}, {"allOf": [neg.schema, other]}]})
        else:
            node.pop("then", None)
            node.pop("else", None)
        self._dependencies(node, path)
        if "oneOf" in node:
            self._one_of(node, path)
        self._huge_bounds(node, path)
        self._runaway_numbers(node, path)
        if "multipleOf" in node:
            self._multiple_of(node, path)
        if "propertyNames" in node:
            self._property_names(node, path)
        if "minProperties" in node or "maxProperties" in node:
            self._property_counts(node, path)
        if "uniqueItems" in node:
            self._unique_items(node, path)
        if "contains" in node or "minContains" in node or "maxContains" in node:
            self._contains(node, path)
        if "patternProperties" in node:
            self._pattern_properties(node, path)
        if isinstance(node.get("pattern"), str) and not _enforceable(node["pattern"]):
            self._pattern_witnesses(node, path)
        fmt = node.get("format")
        if fmt in NARROWED_FORMATS:
            node["format"], how = NARROWED_FORMATS[fmt]
            self.note("format", path, f"{fmt} narrowed to {how}")
        elif fmt == "regex":
            del node["format"]
            _conjoin(node, {"pattern": SAFE_REGEX})
            self.note("format", path, "regex narrowed to literal patterns of plain characters")
        elif fmt in formats.NARROWED and "string" in (_type_set(node.get("type")) or {"string"}):
            self.note("format", path, f"{fmt}: {formats.NARROWED[fmt]}")

    def _dependencies(self, node: dict[str, Any], path: list[Any]) -> None:
        """ "If key a is present, b must be too" (and dependent schemas): written exactly as "a is absent or all
        hold" while an object has few of them; each such alternative doubles the shapes a parser tracks, so
        beyond MAX_CONDITIONALS the trigger key is simply not generated (or, for required triggers, the
        dependents are required)."""
        required = node.pop("dependentRequired", None) or {}
        schemas = node.pop("dependentSchemas", None) or {}
        exact = len(required) + len(schemas) <= MAX_CONDITIONALS
        for name, others in required.items():
            if exact:
                _conjoin(node, {"anyOf": [_fragment(properties={name: False}), _fragment(required=[name, *others])]})
            elif name in node.get("required", []):
                node["required"] = list(dict.fromkeys([*node["required"], *others]))
            else:
                node.setdefault("properties", {})[name] = False
        for name, sub in schemas.items():
            if exact:
                _conjoin(
                    node, {"anyOf": [_fragment(properties={name: False}), _fragment(required=[name], allOf=[sub])]}
                )
            elif name in node.get("required", []):
                _conjoin(node, sub)
            else:
                node.setdefault("properties", {})[name] = False
        if not exact:
            triggers = ", ".join([*required, *schemas])
            self.note(
                "dependentRequired" if required else "dependentSchemas",
                path,
                f"with {len(required) + len(schemas)} dependencies, optional trigger keys ({triggers}) are not "
                "generated and required ones bring their dependents",
            )

    # ---- oneOf ---------------------------------------------------------------------------------------
    def _target(self, sub: Any, depth: int = 0, root: Any = None) -> Any:
        while isinstance(sub, dict) and set(sub) == {"$ref"} and depth < 8:
            sub, _ = resolve_pointer(self.root if root is None else root, sub["$ref"])
            depth += 1
        return sub

    def _written(self, sub: Any) -> Any:
        """A sub-schema as written (before any rewrite): proofs about the rewritten one would not hold for
        the original, which is what a document must satisfy. Nodes a rewrite created are their own."""
        entry = self._originals.get(id(sub))
        return entry[1] if entry is not None and entry[0] is sub else sub

    def _one_of(self, node: dict[str, Any], path: list[Any]) -> None:
        """``oneOf`` as ``anyOf`` of branches that cannot match together. Branches apart from each other
        (by type, constants, a required property's values, sizes or ranges; ``exclusive``) are used as they
        are, each held to the types where it is apart, when that loses no value. Otherwise each branch is
        generated minus the complements of the branches it is not proven apart from (exact where those can
        be written), while those stay under MAX_COMPLEMENT characters (and llguidance builds them: else
        ``small_one_of``); past that, only the branches' apart types are generated, a narrowing said so."""
        branches = node["oneOf"]
        around = self._written(node)  # its other keywords hold for every value the branches judge
        entry = self._contexts.get(id(node))
        context = list(entry[1]) if entry is not None and entry[0] is node else []
        if around is not node:
            context.append({k: v for k, v in around.items() if k not in ("oneOf", "$defs", "definitions")})
        for b in branches:  # and for the values of an inline branch's own oneOf
            if isinstance(b, dict) and "$ref" not in b:
                self._contexts[id(b)] = (b, context)
        written = self.exclusivity.in_context(
            [self._written(b) for b in branches], {"allOf": context} if context else None
        )
        split = self.exclusivity.split(written)
        kept = [i for i, kinds in enumerate(split.kinds) if kinds]
        if not split.exact or not kept:
            overlaps = [
                [j for j in range(len(branches)) if j != i and not self.exclusivity.disjoint(written[i], written[j])]
                for i in range(len(branches))
            ]
            used = sorted({j for o in overlaps for j in o})
            negs = {j: self.negate(branches[j]) for j in used}
            small = sum(len(json.dumps(n.schema)) for n in negs.values()) <= MAX_COMPLEMENT
            if not kept or (small and not self.small_one_of):
                self._complement_one_of(node, path, overlaps, negs)
                return
            left_out = [i for i in range(len(branches)) if i not in kept or split.restricted(i)]
            self.note(
                "oneOf",
                path,
                "the others' complements would be too large: only branches (or their types) apart from every "
                f"other are generated (not all of branch(es) {', '.join(map(str, left_out))})",
            )
        del node["oneOf"]
        alternatives = [
            {"allOf": [branches[i], {"type": sorted(split.kinds[i])}]} if split.restricted(i) else branches[i]
            for i in kept
        ]
        if "anyOf" in node:
            _conjoin(node, {"anyOf": alternatives})
        else:
            node["anyOf"] = alternatives

    def _complement_one_of(
        self, node: dict[str, Any], path: list[Any], overlaps: list[list[int]], negs: dict[int, Negation]
    ) -> None:
        """Each branch and the complements of the branches it may overlap (the others it is apart from)."""
        branches = node.pop("oneOf")
        alternatives = [
            {"allOf": [b] + [negs[j].schema for j in overlaps[i]]} if overlaps[i] else b for i, b in enumerate(branches)
        ]
        if not all(negs[j].exact for o in overlaps for j in o):
            self.note("oneOf", path, COMPLEMENTED_ONE_OF)
        _conjoin(node, {"anyOf": alternatives})

    # ---- numbers -------------------------------------------------------------------------------------
    def _huge_bounds(self, node: dict[str, Any], path: list[Any]) -> None:
        """llguidance cannot build a number range whose bound is +-2**63 as a double (Java's Long.MIN_VALUE
        as an int64 minimum is common): such a lower (upper) bound is raised (lowered) to +-SAFE_BOUND."""
        for key, sign in (("minimum", -1), ("exclusiveMinimum", -1), ("maximum", 1), ("exclusiveMaximum", 1)):
            value = node.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or sign * float(value) < 2.0**63:
                continue
            del node[key]
            bound = "minimum" if sign < 0 else "maximum"
            tighter = max if sign < 0 else min
            node[bound] = tighter(node.get(bound, sign * SAFE_BOUND), sign * SAFE_BOUND)
            self.note(key, path, f"{value} is out of reach: {bound} {node[bound]} is generated instead")

    def _runaway_numbers(self, node: dict[str, Any], path: list[Any]) -> None:
        """A number or integer with no bound on a side is kept within DIGITS_BOUND there (exclusive): the text of a
        value is then at most 16 integer digits, not a run of digits that only the token budget ends."""
        types = _type_set(node.get("type"))
        if types is None or not types & {"number", "integer"}:
            return
        given: dict[str, float] = {k: node[k] for k in _BOUND_KEYS if _is_number(node.get(k))}
        for sign, keys, others in ((-1, _BOUND_KEYS[:2], _BOUND_KEYS[2:]), (1, _BOUND_KEYS[2:], _BOUND_KEYS[:2])):
            if any(k in given for k in keys):
                continue
            if any(sign * given[k] >= DIGITS_BOUND for k in others if k in given):
                continue  # the bound on the other side is already past 16 digits: this side stays as written
            node[keys[1]] = sign * DIGITS_BOUND
            side = "below 10^16" if sign > 0 else "above -10^16"
            self.note(keys[1], path, f"no bound given: values are kept {side} (at most 16 integer digits)")
        written = node.get("type")
        names = [written] if isinstance(written, str) else list(written or [])
        if "number" in names and node.get(FRACTION_DIGITS_KEY) is None:
            node[FRACTION_DIGITS_KEY] = FRACTION_DIGITS
            self.note("type", path, f"number: a fraction is written with at most {FRACTION_DIGITS} digits (a double's)")

    def _multiple_of(self, node: dict[str, Any], path: list[Any]) -> None:
        """A divisor without an exact binary value or with too many digits for an automaton, narrowed to
        multiples that validators dividing in floating point accept too (schema.multiple_of)."""
        safe = narrowed_multiple(node["multipleOf"], node)
        if safe is None:
            return
        (kind, value), how = safe
        if kind == "integer":
            node["multipleOf"] = value
        else:
            del node["multipleOf"]  # numbers: these values only (other types as they were)
            _conjoin(node, {"anyOf": [{"type": NON_NUMBERS}, {"enum": value}]} if value else {"type": NON_NUMBERS})
        self.note("multipleOf", path, how)

    # ---- objects -------------------------------------------------------------------------------------
    def _property_names(self, node: dict[str, Any], path: list[Any]) -> None:
        names = self._target(node.pop("propertyNames"))
        if names is True or (isinstance(names, dict) and not _asserts(names)):
            return
        declared = node.setdefault("properties", {})
        extra = node.get("additionalProperties", True)
        if names is False:
            node["properties"] = dict.fromkeys(declared, False)
            node["additionalProperties"] = False
            return
        for name in list(declared):
            if not _valid_name(names, name):
                declared[name] = False
        allowed = _finite_strings(names)
        if allowed is not None:  # exactly these names
            for name in allowed:
                declared.setdefault(name, extra)
            node["additionalProperties"] = False
            return
        pattern = names.get("pattern") if set(names) <= {"type", "pattern"} else None
        if pattern is not None and "patternProperties" not in node:
            if extra is not False:
                node["patternProperties"] = {pattern: extra}
            node["additionalProperties"] = False
            return
        node["additionalProperties"] = False
        self.note("propertyNames", path, "only declared property names that satisfy it are generated")

    def _property_counts(self, node: dict[str, Any], path: list[Any]) -> None:
        declared = node.get("properties", {})
        required = list(node.get("required", []))
        optional = [n for n in declared if n not in required and declared[n] is not False]
        if not optional:
            low = node.get("minProperties", 0)
            extra = bool(node.get("patternProperties")) or node.get("additionalProperties", True) is not False
            if low >= 2 and low > len(required) and extra:
                # llguidance counts keys as written and lets a pattern or additional key appear twice; a JSON
                # parser keeps one of two equal keys, so the document could have fewer properties than counted:
                # the missing ones are named instead (distinct by construction) and required
                self._name_unnamed_keys(node, path, low - len(required))
            return  # a map with at most one unnamed key needed (or every key required): counted exactly
        low, high = node.pop("minProperties", 0), node.pop("maxProperties", None)
        if low > len(required):
            need = low - len(required)
            if need > len(optional):
                raise GrammarError(
                    f"minProperties at {pointer(path) or '/'}: asks for {low} properties, more than "
                    "can be generated from the declared ones",
                    code="unsupported_schema",
                )
            node["required"] = required + optional[:need]
            required, optional = node["required"], optional[need:]
            self.note("minProperties", path, f"met by requiring {', '.join(node['required'][-need:])}")
        if high is not None:
            room = high - len(required)
            if room < 0:
                raise GrammarError(
                    f"maxProperties at {pointer(path) or '/'}: fewer than the required properties",
                    code="unsatisfiable_schema",
                )
            closed = node.get("additionalProperties") is False
            for name in optional[room:]:
                declared[name] = False
            node["additionalProperties"] = False
            if optional[room:] or not closed:
                self.note("maxProperties", path, f"met by generating at most {high} of the declared properties")

    def _name_unnamed_keys(self, node: dict[str, Any], path: list[Any], need: int) -> None:
        """Declare and require `need` more distinct property names that the object admits (through a pattern
        or additionalProperties, and propertyNames), each with the schema such a key has."""
        declared = node.setdefault("properties", {})
        patterns = node.get("patternProperties") or {}
        extra = node.get("additionalProperties", True)
        names = node.get("propertyNames")
        chosen: list[str] = []
        for name in KEY_SEEDS:
            if len(chosen) == need:
                break
            taken = name in declared or name in node.get("required", [])
            if taken or (names is not None and not _valid_name(names, name)):
                continue
            matching = [sub for pattern, sub in patterns.items() if _search(pattern, name)]
            schema = {"allOf": matching} if matching else extra
            if schema is False or (matching and any(sub is False for sub in matching)):
                continue
            declared[name] = schema
            chosen.append(name)
        if len(chosen) < need:
            raise GrammarError(
                f"minProperties at {pointer(path) or '/'}: {need + len(node.get('required', []))} properties where "
                "all but the required ones come from patternProperties or additionalProperties cannot be enforced: "
                "the grammar cannot keep such keys distinct, and no known names are admitted to name them",
                code="unsupported_schema",
            )
        node["required"] = list(node.get("required", [])) + chosen
        self.note("minProperties", path, f"met by requiring the keys {', '.join(chosen)}")

    def _pattern_properties(self, node: dict[str, Any], path: list[Any]) -> None:
        """Keys through patternProperties are generated only where every pattern can be enforced (and, when
        llguidance found them overlapping, not at all): otherwise only declared properties are, each also
        held to the schema of every pattern its name matches. A required name that only a pattern (or
        additionalProperties) admits is declared first, with that schema, so it stays satisfiable."""
        patterns = node["patternProperties"]
        unenforceable = [p for p in patterns if not _enforceable(p)]
        if not unenforceable and not self.drop_pattern_properties:
            outside = key_restriction(patterns, node.get("properties") or {})
            if outside:  # (the llguidance text leaves such keys out: backend_llguidance.text)
                self.note(
                    "patternProperties",
                    path,
                    f"keys holding characters that ECMA and Python regexes judge differently under these patterns "
                    f"({describe_ranges(outside)}) are not generated",
                )
            return
        del node["patternProperties"]
        declared = node.setdefault("properties", {})
        extra = node.get("additionalProperties", True)
        for name in node.get("required", []):
            if isinstance(name, str) and name not in declared:
                matching = [sub for pattern, sub in patterns.items() if _search(pattern, name)]
                if matching:  # held to the matching patterns' schemas below
                    declared[name] = True
                elif extra is not False:
                    declared[name] = extra
        for name in list(declared):
            matching = [sub for pattern, sub in patterns.items() if _search(pattern, name)]
            if matching and declared[name] is not False:
                declared[name] = {"allOf": [declared[name], *matching]}
        node["additionalProperties"] = False
        why = _why_unenforceable(unenforceable[0]) if unenforceable else "its patterns overlap"
        self.note("patternProperties", path, f"{why}: only declared properties are generated")

    def _pattern_witnesses(self, node: dict[str, Any], path: list[Any]) -> None:
        """A pattern that cannot be enforced (\\b, back-references, look-arounds whose body repeats without
        bound) narrows the string to known values that satisfy it and the node's other string keywords."""
        pattern = node.pop("pattern")
        why = _why_unenforceable(pattern)
        rules: dict[str, Any] = {k: node[k] for k in ("minLength", "maxLength", "format") if k in node}
        cls = jsonschema.Draft202012Validator
        check = cls({**rules, "pattern": pattern}, format_checker=cls.FORMAT_CHECKER)
        seen = [v for k in ("examples", "default") for v in (node.get(k) if k == "examples" else [node.get(k)]) or []]
        candidates = [*[v for v in seen if isinstance(v, str)], *WITNESS_SEEDS]
        witnesses = []
        for value in candidates:
            try:
                ok = check.is_valid(value)
            except Exception:  # Python's re cannot run the pattern either
                ok = False
            if ok and value not in witnesses:
                witnesses.append(value)
        if not witnesses:
            raise GrammarError(
                f"pattern at {pointer(path + ['pattern'])} cannot be enforced ({why}) and no known value satisfies "
                "it to narrow to",
                code="unsupported_schema",
            )
        node["enum"] = witnesses[:8] if "enum" not in node else [v for v in node["enum"] if v in witnesses]
        self.note("pattern", path, f"{why}: narrowed to the values {node['enum']!r}")

    # ---- arrays --------------------------------------------------------------------------------------
    def _unique_items(self, node: dict[str, Any], path: list[Any]) -> None:
        if not node.pop("uniqueItems"):
            return
        low, high = node.get("minItems", 0), node.get("maxItems")
        values = _finite_values(self._target(node.get("items", True))) if "prefixItems" not in node else None
        if values is not None and len(values) <= MAX_ENUM_UNIQUE:
            count_hi = len(values) if high is None else min(high, len(values))
            choices = [
                {"prefixItems": [{"const": v} for v in combo], "items": False, "minItems": k, "maxItems": k}
                for k in range(low, count_hi + 1)
                for combo in itertools.combinations(values, k)
            ]
            if not choices:
                raise GrammarError(
                    f"uniqueItems at {pointer(path) or '/'}: no array of distinct values fits",
                    code="unsatisfiable_schema",
                )
            _conjoin(node, {"anyOf": choices})
            self.note("uniqueItems", path, "distinct values are generated in the order the schema lists them")
            return
        if low > 1:
            raise GrammarError(
                f"uniqueItems at {pointer(path) or '/'}: cannot guarantee {low} distinct items",
                code="unsupported_schema",
            )
        node["maxItems"] = 1 if high is None else min(high, 1)
        self.note("uniqueItems", path, "at most one item is generated")

    def _contains(self, node: dict[str, Any], path: list[Any]) -> None:
        if "contains" not in node:  # minContains / maxContains alone constrain nothing
            node.pop("minContains", None)
            node.pop("maxContains", None)
            return
        sub = node.pop("contains")
        low, high = node.pop("minContains", 1), node.pop("maxContains", None)
        if high is not None and high < low:
            raise GrammarError(f"maxContains at {pointer(path) or '/'}: below minContains", code="unsatisfiable_schema")
        prefix = list(node.get("prefixItems", []))
        for i in range(low):  # the first `low` items are the ones that match
            spot = {"allOf": [prefix[i] if i < len(prefix) else node.get("items", True), sub]}
            if i < len(prefix):
                prefix[i] = spot
            else:
                prefix.append(spot)
        if prefix:
            node["prefixItems"] = prefix
        node["minItems"] = max(node.get("minItems", 0), low)
        if high is not None:  # no more items than may match
            node["maxItems"] = min(node.get("maxItems", high), high)
        self.note(
            "contains",
            path,
            f"the first {low} item(s) are generated to match it"
            + ("" if high is None else f", and at most {high} items in all"),
        )


WITNESS_SEEDS = (
    "a",
    "A",
    "x",
    "abc",
    "Abc",
    "example",
    "Example",
    "a1",
    "A1",
    "1",
    "0",
    "a.b",
    "a_b",
    "a-b",
    "test",
    "value",
    "https://example.com",
    "http://example.com",
    "example.com",
    "a/b",
    "aa",
    "",
)


# names tried for keys that only patternProperties or additionalProperties admit (minProperties)
KEY_SEEDS = (
    *[w for w in WITNESS_SEEDS if w],
    *"abcdefghijklmnopqrstuvwxyz",
    *[f"key{i}" for i in range(1, 17)],
    *[f"x-{w}" for w in ("a", "b", "c", "d")],
)


def _enforceable(pattern: str) -> bool:
    """Whether our pattern translation takes ``pattern`` (no \\b, back-reference or unbounded look-around)."""
    return _why_unenforceable(pattern) is None


def _why_unenforceable(pattern: str) -> str | None:
    """What our pattern translation says it cannot enforce in ``pattern``; None when it takes it."""
    try:
        pattern_to_content_regex(pattern)
    except GrammarError as exc:
        return str(exc)
    return None


def _search(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return True  # cannot tell: hold the name to that pattern's schema too (narrower)


def _valid_name(names: Any, name: str) -> bool:
    """Whether a property name satisfies a propertyNames schema (unresolvable parts count as not)."""
    cls = jsonschema.Draft202012Validator
    try:
        return bool(cls(names, format_checker=cls.FORMAT_CHECKER).is_valid(name))
    except Exception:  # a reference the validator cannot follow: leave the name out (narrower)
        return False


def _asserts(schema: dict[str, Any]) -> bool:
    return bool(set(schema) - {"title", "description", "$comment", "examples", "default"})


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_set(t: Any) -> set[str] | None:
    if t is None:
        return None
    names = {t} if isinstance(t, str) else set(t)
    return names | ({"number"} if "integer" in names else set()) | ({"integer"} if "number" in names else set())


def _finite_values(schema: Any) -> list[Any] | None:
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    if "enum" in schema:
        out: dict[Any, Any] = {}
        for v in schema["enum"]:
            out.setdefault(json_key(v), v)
        return list(out.values())
    if schema.get("type") == "boolean" and len(schema) == 1:
        return [False, True]
    return None


def _finite_strings(schema: Any) -> list[str] | None:
    values = _finite_values(schema) if isinstance(schema, dict) else None
    if values is None:
        return None
    return [v for v in values if kind_of(v) == "string"]
