"""The last check before translation: every keyword left is one a backend enforces exactly.

Runs on a schema that ``dialect`` put into the internal form (and validated under its own draft) and that
``narrow`` rewrote. Walks every sub-schema reachable from the root (through ``$ref``), never into values
such as ``enum`` or ``const``; anything else still present is a GrammarError naming the keyword and its
JSON pointer, e.g. "unsupported keyword 'x' at /properties/a".
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from loraplex.grammar.schema.formats import FORMATS
from loraplex.grammar.spec import GrammarError

ENFORCED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minItems",
        "maxItems",
    }
)
# Enforced exactly by llguidance only: the regex translation leaves schemas with these to it.
LLGUIDANCE_ONLY = frozenset({"patternProperties", "minProperties", "maxProperties", "multipleOf"})
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
    }
)
_SUB_MAPS = ("properties", "patternProperties")  # $defs are reached through $ref: unused ones constrain nothing
_SUB_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUB_ONE = ("items", "additionalProperties")


def pointer(parts: list[Any] | tuple[Any, ...]) -> str:
    """RFC 6901 JSON pointer for a path ('' is the root)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def resolve_pointer(root: Any, ref: str) -> tuple[Any, str]:
    """Resolve a local `$ref` ("#", "#/$defs/x"); returns (target, its pointer)."""
    if not ref.startswith("#"):
        raise GrammarError(
            f"unsupported $ref {ref!r}: only local references ('#/...') are supported", code="unsupported_schema"
        )
    frag = unquote(ref[1:])
    if frag and not frag.startswith("/"):
        raise GrammarError(
            f"unsupported $ref {ref!r}: anchors are not supported, use a JSON pointer", code="unsupported_schema"
        )
    node = root
    parts: list[str] = []
    for raw in frag.split("/")[1:] if frag else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        parts.append(part)
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise GrammarError(f"$ref {ref!r} does not resolve")
    return node, frag if "~" not in frag else pointer(parts)  # (without escapes, the fragment is the pointer)


def check_schema(schema: Any) -> None:
    """Raise GrammarError unless `schema` uses only keywords a backend enforces exactly."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"invalid schema: a schema is an object or a boolean, not {type(schema).__name__}")
    seen: set[int] = set()  # each sub-schema once, however many paths reach it (pointers only for messages)
    todo: list[tuple[Any, list[Any]]] = [(schema, [])]
    while todo:
        node, path = todo.pop()
        if isinstance(node, bool) or id(node) in seen:
            continue
        seen.add(id(node))
        for key, value in node.items():
            if not (key in ENFORCED or key in LLGUIDANCE_ONLY or key in ANNOTATIONS or key.startswith("x-loraplex-")):
                raise GrammarError(f"unsupported keyword {key!r} at {pointer(path) or '/'}", code="unsupported_schema")
            if key == "format" and value not in FORMATS:
                raise GrammarError(
                    f"unsupported format {value!r} at {pointer(path + [key])} (supported: {', '.join(FORMATS)})",
                    code="unsupported_schema",
                )
            if key == "$ref":
                target, target_ptr = resolve_pointer(schema, value)
                todo.append((target, _parts(target_ptr)))
            elif key in _SUB_MAPS:
                todo += [(sub, path + [key, name]) for name, sub in value.items()]
            elif key in _SUB_LISTS:
                todo += [(sub, path + [key, i]) for i, sub in enumerate(value)]
            elif key in _SUB_ONE:
                todo.append((value, path + [key]))


def _parts(ptr: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in ptr.split("/")[1:]] if ptr else []
