"""The complement of a schema, as a schema of keywords we enforce: what ``not`` and the else-branch of
``if`` need.

``negate(S)`` returns a schema whose language is a subset of everything S rejects, and says whether it is
the whole complement. A schema is the conjunction of its keywords, so its complement is the union of
each keyword's complement, and a type-specific keyword is violated only by values of its type (a string
satisfies ``minimum``). Where one keyword's complement cannot be written (``pattern``, ``multipleOf``,
``uniqueItems``, ...), that part of the union is left out: the result is then smaller than the complement
(narrow, never widen) and ``exact`` is False.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeAlias

from loraplex.grammar.schema.check import resolve_pointer
from loraplex.grammar.schema.normalize import kind_of
from loraplex.grammar.schema.strict import FRAGMENT
from loraplex.grammar.schema.strings import not_one_of_pattern

ALL_TYPES = ("null", "boolean", "object", "array", "number", "string")
MAX_DEPTH = 6


@dataclass(frozen=True)
class Negation:
    schema: Any  # a schema accepting only values the negated schema rejects
    exact: bool  # it accepts all of them


def _types(value: Any) -> set[str]:
    names = {value} if isinstance(value, str) else set(value)
    return names


def _union(parts: list[Any]) -> Any:
    parts = [p for p in parts if p is not False]
    if not parts:
        return False
    if any(p is True for p in parts):
        return True
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


class Negator:
    def __init__(self, root: Any) -> None:
        self.root = root

    def negate(self, schema: Any, depth: int = 0) -> Negation:
        if schema is True:
            return Negation(False, True)
        if schema is False:
            return Negation(True, True)
        if depth > MAX_DEPTH:
            return Negation(False, False)
        parts: list[Any] = []
        exact = True

        def add(negation: Negation | None) -> None:
            nonlocal exact
            if negation is None:
                exact = False
                return
            exact = exact and negation.exact
            parts.append(negation.schema)

        for key, value in schema.items():
            add(self._keyword(schema, key, value, depth))
        return Negation(_union(parts), exact)

    # ---- one keyword's complement ------------------------------------------------------------------
    def _keyword(self, schema: dict[str, Any], key: str, value: Any, depth: int) -> Negation | None:
        if key in ("$defs", "definitions"):
            return Negation(False, True)  # constrains nothing
        if key == "type":
            return self._type(value)
        if key in ("enum", "const"):
            return self._values([value] if key == "const" else list(value))
        handler = _SIMPLE.get(key)
        if handler is not None:
            return handler(value, schema)
        if key == "not":
            return Negation(value, True)
        if key == "$ref":
            target, _ = resolve_pointer(self.root, value)
            return self.negate(target, depth + 1)
        if key == "allOf":
            subs = [self.negate(s, depth + 1) for s in value]
            return Negation(_union([n.schema for n in subs]), all(n.exact for n in subs))
        if key in ("anyOf", "oneOf"):
            subs = [self.negate(s, depth + 1) for s in value]
            # oneOf is also violated when two branches match; only "none matches" is written here
            return Negation({"allOf": [n.schema for n in subs]}, all(n.exact for n in subs) and key == "anyOf")
        if key == "if":
            then, other = schema.get("then", True), schema.get("else", True)
            not_if, not_then, not_else = (self.negate(s, depth + 1) for s in (value, then, other))
            branches = [{"allOf": [value, not_then.schema]}, {"allOf": [not_if.schema, not_else.schema]}]
            return Negation(_union(branches), not_if.exact and not_then.exact and not_else.exact)
        if key in ("then", "else"):
            return Negation(False, True)  # part of "if" (alone, they constrain nothing)
        if key == "properties":
            out = []
            for name, sub in value.items():
                n = self.negate(sub, depth + 1)
                if n.schema is not False:
                    out.append((_object(required=[name], properties={name: n.schema}), n.exact))
            return Negation(_union([s for s, _ in out]), all(e for _, e in out))
        if key == "prefixItems":
            out = []
            for i, sub in enumerate(value):
                n = self.negate(sub, depth + 1)
                if n.schema is not False:
                    shape = {"type": "array", "minItems": i + 1, "prefixItems": [True] * i + [n.schema]}
                    out.append((shape, n.exact))
            return Negation(_union([s for s, _ in out]), all(e for _, e in out))
        if key == "items":
            n = self.negate(value, depth + 1)
            if n.schema is False:
                return Negation(False, n.exact)
            skip = len(schema.get("prefixItems", []))
            # only the first item after the prefix is written violating: a subset of the complement
            shape = {"type": "array", "minItems": skip + 1, "prefixItems": [True] * skip + [n.schema]}
            return Negation(shape, False)
        if key == "contains":
            if schema.get("minContains", 1) == 0:
                return Negation(False, True)
            n = self.negate(value, depth + 1)
            return Negation({"type": "array", "items": n.schema}, n.exact and "maxContains" not in schema)
        if key == "dependentRequired":
            shapes = [
                _object(required=[name], properties={other: False})
                for name, others in value.items()
                for other in others
            ]
            return Negation(_union(shapes), True)
        if key == "dependentSchemas":
            named = [(name, self.negate(sub, depth + 1)) for name, sub in value.items()]
            shapes = [_object(required=[name], allOf=[neg.schema]) for name, neg in named]
            return Negation(_union(shapes), all(neg.exact for _, neg in named))
        if key in ("minContains", "maxContains"):
            return Negation(False, key == "minContains" and "contains" in schema)
        return None  # no written complement (pattern, format, multipleOf, uniqueItems, additionalProperties, ...)

    @staticmethod
    def _type(value: Any) -> Negation:
        named = _types(value)
        others = [t for t in ALL_TYPES if t not in named and not (t == "number" and "integer" in named)]
        if "number" not in named and "integer" in named:
            # non-integral numbers are outside "integer" too, but cannot be written apart: left out
            return Negation({"type": others} if others else False, False)
        return Negation({"type": others} if others else False, True)

    @staticmethod
    def _values(values: list[Any]) -> Negation:
        """Everything but a finite set of values."""
        by_kind: dict[str, list[Any]] = {}
        for v in values:
            by_kind.setdefault(kind_of(v), []).append(v)
        parts: list[Any] = [{"type": [t for t in ALL_TYPES if t not in by_kind]}] if len(by_kind) < 6 else []
        exact = True
        if "boolean" in by_kind:
            rest = [b for b in (True, False) if b not in by_kind["boolean"]]
            if rest:
                parts.append({"const": rest[0]})
        if "number" in by_kind:
            numbers = sorted({Decimal(repr(v)) if isinstance(v, float) else Decimal(v) for v in by_kind["number"]})
            parts.append({"type": "number", "exclusiveMaximum": _num(numbers[0])})
            parts += [
                {"type": "number", "exclusiveMinimum": _num(a), "exclusiveMaximum": _num(b)}
                for a, b in zip(numbers, numbers[1:])
            ]
            parts.append({"type": "number", "exclusiveMinimum": _num(numbers[-1])})
        if "string" in by_kind:
            parts.append({"type": "string", "pattern": not_one_of_pattern(by_kind["string"])})
        if "array" in by_kind or "object" in by_kind:
            exact = False  # every other array / object: not written (a subset: none of them)
        return Negation(_union(parts), exact)


def _object(**keywords: Any) -> dict[str, Any]:
    """Objects meeting ``keywords``: a condition on the keys, which does not reopen a strict object."""
    return {"type": "object", **keywords, FRAGMENT: True}


def _num(d: Decimal) -> int | float:
    return int(d) if d == d.to_integral_value() else float(d)


# one keyword's complement from its value and its schema (None: no written complement)
_Handler: TypeAlias = Callable[[Any, dict[str, Any]], "Negation | None"]


def _bound(op: str, kind: str) -> _Handler:
    def handler(value: Any, schema: dict[str, Any]) -> Negation:
        return Negation({"type": kind, op: value}, True)

    return handler


def _length(op: str, kind: str, delta: int) -> _Handler:
    def handler(value: Any, schema: dict[str, Any]) -> Negation:
        bound = int(value) + delta
        if bound < 0:
            return Negation(False, True)  # minLength 0 / minItems 0 cannot be violated
        return Negation({"type": kind, op: bound}, True)

    return handler


_SIMPLE: dict[str, _Handler] = {
    "minimum": _bound("exclusiveMaximum", "number"),
    "exclusiveMinimum": _bound("maximum", "number"),
    "maximum": _bound("exclusiveMinimum", "number"),
    "exclusiveMaximum": _bound("minimum", "number"),
    "minLength": _length("maxLength", "string", -1),
    "maxLength": _length("minLength", "string", +1),
    "minItems": _length("maxItems", "array", -1),
    "maxItems": _length("minItems", "array", +1),
    "minProperties": _length("maxProperties", "object", -1),
    "maxProperties": _length("minProperties", "object", +1),
    "required": lambda value, schema: Negation(_union([_object(properties={name: False}) for name in value]), True),
    "uniqueItems": lambda value, schema: Negation(False, not value),
    "format": lambda value, schema: None,
    "pattern": lambda value, schema: None,
    "multipleOf": lambda value, schema: None,
    "additionalProperties": lambda value, schema: None,
    "patternProperties": lambda value, schema: None,
    "propertyNames": lambda value, schema: None,
    "unevaluatedProperties": lambda value, schema: None,
    "unevaluatedItems": lambda value, schema: None,
}
