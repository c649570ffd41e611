"""Metaschema validators, with the dynamic references of 2019-09 and 2020-12 made static.

The 2020-12 metaschema is the union of seven vocabulary metaschemas whose sub-schema slots say
``$dynamicRef: "#meta"``; 2019-09's say ``$recursiveRef: "#"``. Validating a schema (the instance) against
the standard metaschema, every such reference resolves to the standard metaschema's root: the dynamic
scope is the metaschema's own evaluation path, which the instance cannot extend. Resolving them again at
every sub-schema is most of the time of checking a large schema (the enonic-xp schemas of the dev set:
~280 ms each), so here each vocabulary is copied under a private base URI with those references written as
plain ``$ref``s to the root. Same language, same error messages and paths; only the lookups are cheaper.
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import urldefrag, urljoin

import jsonschema
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Registry, Resource

# per dynamic draft: (its metaschemas' common URI prefix, its dynamic-reference keyword and value)
_DYNAMIC = {
    jsonschema.Draft202012Validator: ("https://json-schema.org/draft/2020-12/", "$dynamicRef", "#meta"),
    jsonschema.Draft201909Validator: ("https://json-schema.org/draft/2019-09/", "$recursiveRef", "#"),
}
_STATIC_BASE = "https://loraplex.invalid/static-metaschema/"
_ANCHORS = ("$dynamicAnchor", "$recursiveAnchor")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "dependentSchemas", "definitions", "dependencies")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_ONE = (
    "additionalProperties",
    "items",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "not",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)


@functools.cache
def metaschema_validator(cls: type) -> Any:
    """A validator of schemas under `cls`'s draft (no format assertion, like ``cls.check_schema``)."""
    if cls not in _DYNAMIC:
        return cls(cls.META_SCHEMA)
    prefix, keyword, value = _DYNAMIC[cls]
    base = _STATIC_BASE + prefix.split("/")[-2] + "/"
    root_uri = cls.META_SCHEMA["$id"].replace(prefix, base)

    def rewrite(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == keyword and v == value:
                out["$ref"] = root_uri
            elif k in _ANCHORS:
                continue
            elif k == "$id" and isinstance(v, str) and v.startswith(prefix):
                out[k] = v.replace(prefix, base)
            else:
                out[k] = _map_subschemas(k, v, rewrite)
        return out

    resources = []
    for uri in SPECIFICATIONS:
        if uri.startswith(prefix):
            contents = rewrite(SPECIFICATIONS.contents(uri))
            resources.append((uri.replace(prefix, base), Resource.from_contents(contents)))
    registry = Registry().with_resources(resources)
    root = _inline(registry.contents(root_uri), root_uri, registry, root_uri)
    root = {"$schema": cls.META_SCHEMA["$schema"], "$id": root_uri, **root}
    return cls(root, registry=Registry().with_resource(root_uri, Resource.from_contents(root)))


def _map_subschemas(keyword: str, value: Any, fn: Any) -> Any:
    """`value` of `keyword` with `fn` applied to the sub-schemas it holds (names of a map are not schemas)."""
    if keyword in _SCHEMA_MAPS and isinstance(value, dict):
        return {name: fn(sub) for name, sub in value.items()}
    if keyword in _SCHEMA_LISTS and isinstance(value, list):
        return [fn(sub) for sub in value]
    if keyword in _SCHEMA_ONE:
        return fn(value)
    return value


def _inline(node: Any, base: str, registry: Registry, root_uri: str) -> Any:
    """`node` with every ``$ref`` but those to the root replaced by its target (the metaschemas are not
    recursive otherwise), so validation looks up only the root: each lookup costs ~60 us."""
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("$id"), str):
        base = urljoin(base, node["$id"])
    out: dict[str, Any] = {}

    def sub(n: Any) -> Any:
        return _inline(n, base, registry, root_uri)

    for k, v in node.items():
        if k == "$ref" and isinstance(v, str) and urljoin(base, v) != root_uri:
            uri = urldefrag(urljoin(base, v))[0]  # every metaschema resource names itself: its base
            target = _inline(registry.resolver(uri).lookup(urljoin(base, v)).contents, uri, registry, root_uri)
            out.setdefault("allOf", []).append(target)
        elif k == "allOf":
            out.setdefault("allOf", []).extend(sub(m) for m in v)
        elif k in ("$defs", "$id", "$schema", "$vocabulary"):
            continue
        else:
            out[k] = _map_subschemas(k, v, sub)
    return out
