"""``unevaluatedProperties`` / ``unevaluatedItems`` rewritten into keywords the backends enforce.

Which keys (items) count as evaluated depends on which in-place subschemas the value satisfies: the keys
``properties`` / ``patternProperties`` / ``additionalProperties`` of the node itself, of every ``allOf``
member and ``$ref`` target, of the one ``oneOf`` branch that holds, of each ``anyOf`` branch that holds, of
``if`` and ``then`` (or ``else``), of the ``dependentSchemas`` whose key is present; ``not`` contributes none.

So the node is split into *shapes*: one per choice of branches, each a list of conditions that pin the
choice (the branches themselves, ``if`` or its complement, a dependent key present or absent) and the set
of keys that choice evaluates. The node becomes "one of the shapes holds, with its other keys satisfying
the unevaluated schema". An ``anyOf`` of up to MAX_ANY_OF branches is split into every non-empty subset of
branches that hold (the keys of all of them count), which is exact; larger ones into one branch at a time,
which is a narrowing (a value that needs two branches' keys is not generated). When a complement cannot be
written, or the shapes outnumber MAX_SHAPES, or ``$ref``s nest deeper than MAX_DEPTH, fewer keys count as
evaluated than might: again narrower, never wider, and said so.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loraplex.grammar.schema.check import resolve_pointer
from loraplex.grammar.schema.negate import Negation
from loraplex.grammar.schema.strict import FRAGMENT

MAX_ANY_OF = 3  # anyOf branches split into all their subsets (2**n - 1 shapes)
MAX_SHAPES = 16
MAX_DEPTH = 8


@dataclass(frozen=True)
class Evaluated:
    """What one shape evaluates: property names and patterns (or every key), a prefix of items (or all)."""

    names: frozenset[str] = frozenset()
    patterns: frozenset[str] = frozenset()
    every_key: bool = False
    prefix: int = 0
    every_item: bool = False

    def __or__(self, other: Evaluated) -> Evaluated:
        return Evaluated(
            self.names | other.names,
            self.patterns | other.patterns,
            self.every_key or other.every_key,
            max(self.prefix, other.prefix),
            self.every_item or other.every_item,
        )

    def __and__(self, other: Evaluated) -> Evaluated:
        return Evaluated(
            self.names & other.names,
            self.patterns & other.patterns,
            self.every_key and other.every_key,
            min(self.prefix, other.prefix),
            self.every_item and other.every_item,
        )


Shape = tuple[tuple[Any, ...], Evaluated]  # conditions that pin a choice of branches, what it evaluates


class _TooMany(Exception):
    pass


def _cross(left: list[Shape], right: list[Shape]) -> list[Shape]:
    out = [(lc + rc, la | ra) for (lc, la), (rc, ra) in itertools.product(left, right)]
    if len(out) > MAX_SHAPES:
        raise _TooMany
    return out


class UnevaluatedRewriter:
    """Rewrites one node's ``unevaluated*`` keywords; ``negate`` gives complements, ``note`` records a
    narrowing (its text)."""

    def __init__(self, root: Any, negate: Callable[[Any], Negation], note: Callable[[str, str], None]) -> None:
        self.root = root
        self.negate = negate
        self.note = note
        self._lossy: list[str] = []

    def rewrite(self, node: dict[str, Any]) -> None:
        props, items = node.pop("unevaluatedProperties", None), node.pop("unevaluatedItems", None)
        if props in (None, True) and items in (None, True):
            return  # nothing is constrained
        self._lossy = []
        keyword = "unevaluatedProperties" if props is not None else "unevaluatedItems"
        try:
            shapes = self.shapes(node, 0, top=True)
        except _TooMany:
            shapes = None
        if shapes is None:  # too many choices: what every choice evaluates counts
            flat = self._flat(node, 0, top=True)
            _conjoin(node, self._closure(flat, props, items))
            self.note(keyword, "too many branch combinations to track: only what every branch evaluates counts")
            return
        if not shapes:
            return  # no branch choice holds: the node is unsatisfiable as it is
        if len(shapes) == 1:
            ((conditions, evaluated),) = shapes
            for condition in conditions:
                _conjoin(node, condition)
            _conjoin(node, self._closure(evaluated, props, items))
        else:
            for key in ("anyOf", "if", "then", "else", "dependentSchemas"):  # each shape pins these
                node.pop(key, None)
            _conjoin(node, {"anyOf": [{"allOf": [*c, self._closure(e, props, items)]} for c, e in shapes]})
        for why in dict.fromkeys(self._lossy):
            self.note(keyword, why)

    # ---- the shapes of a schema -----------------------------------------------------------------------
    def shapes(self, schema: Any, depth: int, top: bool = False) -> list[Shape]:
        if schema is False:
            return []
        if not isinstance(schema, dict):
            return [((), Evaluated())]
        if depth > MAX_DEPTH:
            self._lossy.append("references nest too deep: keys evaluated below them do not count")
            return [((), Evaluated())]
        out: list[Shape] = [((), self._own(schema, top))]
        if "$ref" in schema:
            out = _cross(out, self.shapes(resolve_pointer(self.root, schema["$ref"])[0], depth + 1))
        for sub in schema.get("allOf", []):
            out = _cross(out, self.shapes(sub, depth + 1))
        if "anyOf" in schema:
            out = _cross(out, self._any_of(schema["anyOf"], depth))
        if "oneOf" in schema:
            out = _cross(out, [((b, *c), e) for b in schema["oneOf"] for c, e in self.shapes(b, depth + 1)])
        if "if" in schema:
            out = _cross(out, self._if(schema, depth))
        for name, sub in (schema.get("dependentSchemas") or {}).items():
            absent: Shape = ({"properties": {name: False}, FRAGMENT: True},), Evaluated()
            present = [(({"required": [name], FRAGMENT: True}, sub, *c), e) for c, e in self.shapes(sub, depth + 1)]
            out = _cross(out, [absent, *present])
        return out

    def _own(self, schema: dict[str, Any], top: bool) -> Evaluated:
        if "contains" in schema:
            self._lossy.append("items matched by contains do not count as evaluated")
        return Evaluated(
            names=frozenset(schema.get("properties") or {}),
            patterns=frozenset(schema.get("patternProperties") or {}),
            every_key="additionalProperties" in schema or (not top and "unevaluatedProperties" in schema),
            prefix=len(schema.get("prefixItems") or []),
            every_item="items" in schema or (not top and "unevaluatedItems" in schema),
        )

    def _any_of(self, branches: list[Any], depth: int) -> list[Shape]:
        per = [[((b, *c), e) for c, e in self.shapes(b, depth + 1)] for b in branches]
        per = [p for p in per if p]
        if not per:
            return []
        simple = all(len(p) == 1 and len(p[0][0]) == 1 for p in per)
        if simple and len({p[0][1] for p in per}) == 1:  # every branch evaluates the same: no split needed
            return [(({"anyOf": branches},), per[0][0][1])]
        if len(per) > MAX_ANY_OF:
            self._lossy.append("a value is generated under one anyOf branch's evaluated keys at a time")
            return [s for p in per for s in p]
        out: list[Shape] = []
        for k in range(1, len(per) + 1):
            for subset in itertools.combinations(per, k):
                combined: list[Shape] = [((), Evaluated())]
                for p in subset:
                    combined = _cross(combined, p)
                out += combined
                if len(out) > MAX_SHAPES:
                    raise _TooMany
        return out

    def _if(self, schema: dict[str, Any], depth: int) -> list[Shape]:
        cond, then, other = schema["if"], schema.get("then", True), schema.get("else", True)
        neg = self.negate(cond)
        if not neg.exact:
            self._lossy.append("the else branch applies only where the condition's complement can be written")
        when = _cross(self.shapes(cond, depth + 1), self.shapes(then, depth + 1))
        unless = self.shapes(other, depth + 1)
        return [((cond, then, *c), e) for c, e in when] + [((neg.schema, other, *c), e) for c, e in unless]

    def _flat(self, schema: Any, depth: int, top: bool = False) -> Evaluated:
        """What every branch choice evaluates (allOf and $ref members; branches add nothing for sure)."""
        if not isinstance(schema, dict) or depth > MAX_DEPTH:
            return Evaluated()
        out = self._own(schema, top)
        if "$ref" in schema:
            out = out | self._flat(resolve_pointer(self.root, schema["$ref"])[0], depth + 1)
        for sub in schema.get("allOf", []):
            out = out | self._flat(sub, depth + 1)
        branches = schema.get("anyOf", []) + schema.get("oneOf", [])
        if branches:
            common = self._flat(branches[0], depth + 1)
            for b in branches[1:]:
                common = common & self._flat(b, depth + 1)
            out = out | common
        return out

    @staticmethod
    def _closure(evaluated: Evaluated, props: Any, items: Any) -> Any:
        """The keys (items) a shape leaves unevaluated must satisfy the unevaluated* schema."""
        parts: list[Any] = []
        if props is not None and props is not True and not evaluated.every_key:
            parts.append(
                {
                    "properties": dict.fromkeys(sorted(evaluated.names), True),
                    **(
                        {"patternProperties": dict.fromkeys(sorted(evaluated.patterns), True)}
                        if evaluated.patterns
                        else {}
                    ),
                    "additionalProperties": copy.deepcopy(props),
                }
            )
        if items is not None and items is not True and not evaluated.every_item:
            parts.append({"prefixItems": [True] * evaluated.prefix, "items": copy.deepcopy(items)})
        if not parts:
            return True
        return parts[0] if len(parts) == 1 else {"allOf": parts}


def _conjoin(node: dict[str, Any], extra: Any) -> None:
    if extra is not True:
        node.setdefault("allOf", []).append(extra)
