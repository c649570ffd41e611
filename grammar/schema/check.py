"""Validate a JSON schema and refuse, by keyword and JSON pointer, whatever we cannot enforce.

Walks every sub-schema reachable from the root (through `$ref`), never into values such as
`enum`, `const` or `default`. Annotations are allowed; any other keyword we do not enforce is a
GrammarError such as "unsupported keyword 'multipleOf' at /properties/x".
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import jsonschema
from jsonschema.validators import validator_for

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
        "$schema",
        "$id",
        "$anchor",
        "$vocabulary",
        "contentMediaType",
        "contentEncoding",
        "discriminator",
    }
)
_SUPPORTED_DIALECTS = (
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft-07/schema",
)
_SUB_MAPS = ("properties",)  # $defs are reached through $ref: unused ones constrain nothing
_SUB_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUB_ONE = ("items", "additionalProperties")


def pointer(parts: list[Any] | tuple[Any, ...]) -> str:
    """RFC 6901 JSON pointer for a path ('' is the root)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def resolve_pointer(root: Any, ref: str) -> tuple[Any, str]:
    """Resolve a local `$ref` ("#", "#/$defs/x"); returns (target, its pointer)."""
    if not ref.startswith("#"):
        raise GrammarError(f"unsupported $ref {ref!r}: only local references ('#/...') are supported")
    frag = unquote(ref[1:])
    if frag and not frag.startswith("/"):
        raise GrammarError(f"unsupported $ref {ref!r}: anchors are not supported, use a JSON pointer")
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
    return node, pointer(parts)


def _check_metaschema(schema: Any) -> None:
    dialect = schema.get("$schema") if isinstance(schema, dict) else None
    if dialect is not None and not any(str(dialect).rstrip("#") == d for d in _SUPPORTED_DIALECTS):
        raise GrammarError(f"unsupported $schema dialect {dialect!r}: use draft 2020-12 (or 2019-09, draft-07)")
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = list(cls(cls.META_SCHEMA).iter_errors(schema))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        raise GrammarError(f"invalid schema: {err.message} at {pointer(list(err.absolute_path)) or '/'}")


def check_schema(schema: Any) -> None:
    """Raise GrammarError unless `schema` is valid and uses only keywords we enforce."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"invalid schema: a schema is an object or a boolean, not {type(schema).__name__}")
    _check_metaschema(schema)
    seen: set[str] = set()
    todo: list[tuple[Any, list[Any]]] = [(schema, [])]
    while todo:
        node, path = todo.pop()
        ptr = pointer(path)
        if ptr in seen or isinstance(node, bool):
            continue
        seen.add(ptr)
        for key, value in node.items():
            where = pointer(path + [key])
            if key in ENFORCED or key in ANNOTATIONS or key.startswith("x-"):
                pass
            else:
                raise GrammarError(f"unsupported keyword {key!r} at {ptr or '/'}")
            if key == "$id" and path:
                raise GrammarError(f"unsupported keyword '$id' in a sub-schema at {ptr}: it changes how $ref resolves")
            if key == "format" and value not in FORMATS:
                raise GrammarError(f"unsupported format {value!r} at {where} (supported: {', '.join(FORMATS)})")
            if key == "items" and isinstance(value, list):
                raise GrammarError(f"unsupported keyword 'items' in array form at {where}: use prefixItems")
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
