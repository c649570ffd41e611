"""What a request asks its output to look like, and the one error type for every refusal."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

GRAMMAR_ERROR_CODES = (
    "invalid_schema",  # not a valid constraint (bad schema, regex, grammar, or spec shape)
    "unsupported_schema",  # valid, but uses something we cannot enforce exactly nor narrow
    "unsatisfiable_schema",  # no output can satisfy it (possibly after narrowing)
    "narrowing_refused",  # enforceable only narrowed, and the request asked to refuse instead
    "compile_timeout",  # the compile ran past its time limit (not cached: a retry may succeed)
    "compile_failed",  # the compile worker crashed or ran out of memory
)


class GrammarError(ValueError):
    """A constraint that cannot be compiled; the message names the problem.

    Examples: an unsupported keyword with its JSON pointer, an invalid schema, an unsatisfiable
    schema, a regex or grammar syntax error, a compile that ran past its time limit. ``code`` is a short
    stable tag for API error bodies (as ``AdapterError`` and the engine's errors carry), one of
    ``GRAMMAR_ERROR_CODES``; it survives the trip from a compile worker process.
    """

    def __init__(self, message: str, *, code: str = "invalid_schema") -> None:
        super().__init__(message)
        assert code in GRAMMAR_ERROR_CODES, code
        self.code = code


_KINDS = ("json", "regex", "choice", "grammar", "json_object", "tagged_json")

# Where a schema holds sub-schemas (so their keys can be sorted) versus plain values (enum, const,
# default, ...) whose key order is kept: a const object is generated in the order it is written.
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_ONE = frozenset(
    {
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "propertyNames",
        "additionalItems",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)


def canonical_schema(node: Any) -> Any:
    """The schema with keyword order sorted but `properties` order kept (it fixes output order)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key in sorted(node):
        value = node[key]
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            value = {name: canonical_schema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            value = [canonical_schema(sub) for sub in value]
        elif key in _SCHEMA_ONE:
            value = [canonical_schema(s) for s in value] if isinstance(value, list) else canonical_schema(value)
        out[key] = value
    return out


@dataclass(frozen=True)
class StructuredSpec:
    """Exactly one constraint on a request's output.

    `json` is a JSON schema (a dict or its JSON text), `regex` must match the whole output,
    `choice` makes the output exactly one of the strings, `grammar` is a Lark grammar
    (llguidance's dialect), `json_object` asks for any JSON object. `tagged_json` is free text or JSON
    in tags: {"schema": S, "open": "<tool_call>", "close": "</tool_call>", "parallel": bool} allows any
    text that does not contain `open`, or text ending in `open`, a value of S, `close` (with
    parallel, more `\n` `open` S `close` blocks may follow); tool calls in `auto` mode. With a "text" key
    holding a schema T, the answer that is not a call must be a value of T instead of free text. `close_within_budget`
    makes the matcher steer onto a shortest completion once the token budget gets tight.
    `allow_narrowing=False` refuses a schema that cannot be enforced exactly instead of generating a
    narrower (still valid) language.
    """

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    tagged_json: dict[str, Any] | None = None
    close_within_budget: bool = True
    allow_narrowing: bool = True

    def __post_init__(self) -> None:
        set_kinds = [k for k in _KINDS if self._is_set(k)]
        if len(set_kinds) != 1:
            named = ", ".join(set_kinds) if set_kinds else "none"
            raise GrammarError(f"exactly one constraint of {', '.join(_KINDS)} must be set (got: {named})")
        if self.json is not None and not isinstance(self.json, (dict, str, bool)):
            raise GrammarError(
                f"json must be a schema (an object or a boolean) or its JSON text, not {type(self.json).__name__}"
            )
        if self.regex is not None and not isinstance(self.regex, str):
            raise GrammarError("regex must be a string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise GrammarError("grammar must be a non-empty Lark grammar string")
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice:
                raise GrammarError("choice must be a non-empty list of strings")
            if not all(isinstance(c, str) for c in self.choice):
                raise GrammarError("choice must contain only strings")
            if isinstance(self.choice, tuple):
                object.__setattr__(self, "choice", list(self.choice))
        if self.tagged_json is not None:
            _check_tagged(self.tagged_json)

    def _value(self, kind: str) -> Any:
        return getattr(self, kind)

    @property
    def kind(self) -> str:
        """Which constraint is set: json, regex, choice, grammar or json_object."""
        return next(k for k in _KINDS if self._is_set(k))

    def _is_set(self, kind: str) -> bool:
        value = self._value(kind)
        return value is not None if kind == "json" else value not in (None, False)  # json=False: a schema

    def schema(self) -> Any:
        """The JSON schema as a Python value (parses JSON text); GrammarError if it is not JSON."""
        if self.tagged_json is not None:
            return self.tagged_json["schema"]
        if isinstance(self.json, str):
            try:
                return json.loads(self.json)
            except json.JSONDecodeError as e:
                raise GrammarError(f"json schema is not valid JSON: {e}") from None
        return self.json

    def cache_key(self) -> str:
        """Canonical text of the constraint: equal constraints give equal keys."""
        kind = self.kind
        value: Any = canonical_schema(self.schema()) if kind == "json" else self._value(kind)
        if kind == "tagged_json":
            value = {**self._value(kind), "schema": canonical_schema(self.schema())}
            if "text" in value:
                value["text"] = canonical_schema(value["text"])
        try:
            body = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise GrammarError(f"{kind} constraint is not JSON-serialisable: {e}") from None
        return f"{kind}:{int(self.close_within_budget)}{int(self.allow_narrowing)}:{body}"


_TAGGED_KEYS = frozenset({"schema", "open", "close", "parallel", "text"})


def _check_tagged(value: Any) -> None:
    if not isinstance(value, dict) or not {"schema", "open", "close", "parallel"} <= set(value) <= _TAGGED_KEYS:
        raise GrammarError("tagged_json must be {schema, open, close, parallel} and optionally text")
    for key in ("schema", "text"):
        if key in value and not isinstance(value[key], (dict, bool)):
            raise GrammarError(f"tagged_json.{key} must be a JSON schema (an object or a boolean)")
    for key in ("open", "close"):
        if not isinstance(value[key], str) or not value[key]:
            raise GrammarError(f"tagged_json.{key} must be a non-empty string")
    if not isinstance(value["parallel"], bool):
        raise GrammarError("tagged_json.parallel must be a boolean")
