"""Metaschema validators with their references inlined: same verdicts, a fraction of the lookups.

jsonschema resolves every ``$ref`` (and ``$dynamicRef``) anew at each sub-schema it validates: the lookups
are most of the time of checking a large schema (bench/README.md, "Measurements behind design choices", has
the figures). The metaschemas are recursive only through their root (draft-04/06/07: ``$ref: "#"``; 2020-12's
vocabularies: ``$dynamicRef: "#meta"``; 2019-09's: ``$recursiveRef: "#"``), and when a schema is checked
against the standard metaschema every dynamic reference resolves to that root: the dynamic scope is the
metaschema's own evaluation path, which the instance cannot extend. So every other reference is replaced by
its target, and the dynamic ones by a plain ``$ref`` to the root (2019-09/2020-12's copies live under a
private base URI). Same language, same error messages and paths (tests/grammar/test_grammar_compile_bounds.py
compares them with jsonschema's own).
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import urldefrag, urljoin

import jsonschema
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Registry, Resource

from loraplex.grammar.schema.subschemas import SUB_LISTS, SUB_MAPS, SUB_ONE

# per dynamic draft: (its metaschemas' common URI prefix, its dynamic-reference keyword and value)
_DYNAMIC = {
    jsonschema.Draft202012Validator: ("https://json-schema.org/draft/2020-12/", "$dynamicRef", "#meta"),
    jsonschema.Draft201909Validator: ("https://json-schema.org/draft/2019-09/", "$recursiveRef", "#"),
}
_STATIC_BASE = "https://loraplex.invalid/static-metaschema/"
_ANCHORS = ("$dynamicAnchor", "$recursiveAnchor")
# the metaschemas are walked in their own drafts' form: draft-04..07 keywords that the internal form drops too
_SCHEMA_MAPS = (*SUB_MAPS, "dependencies")
_SCHEMA_LISTS = (*SUB_LISTS, "items")
_SCHEMA_ONE = (*SUB_ONE, "additionalItems")


@functools.cache
def fast_metaschema_validator(cls: type[Any]) -> Any:
    """jsonschema-rs's validator of the same metaschema, no format assertion: a verdict in a small fraction of
    the time (bench/README.md). Only its "valid" is used; an invalid schema is checked again by
    `metaschema_validator` for jsonschema's error message (best_match), so messages do not change."""
    import jsonschema_rs

    return jsonschema_rs.validator_for(cls.META_SCHEMA, validate_formats=False)


@functools.cache
def metaschema_validator(cls: type[Any]) -> Any:
    """A validator of schemas under `cls`'s draft (no format assertion, like ``cls.check_schema``)."""
    if cls not in _DYNAMIC:  # draft-04/06/07: one document, recursive only through "#"
        root_uri = urldefrag(cls.ID_OF(cls.META_SCHEMA))[0]
        root = _inline(cls.META_SCHEMA, root_uri, SPECIFICATIONS, root_uri, ref_alone=True)
        return cls({k: cls.META_SCHEMA[k] for k in ("$schema", "id", "$id") if k in cls.META_SCHEMA} | root)
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


def _inline(node: Any, base: str, registry: Registry, root_uri: str, ref_alone: bool = False) -> Any:
    """`node` with every ``$ref`` but those to the root replaced by its target (the metaschemas are not
    recursive otherwise), so validation looks up only the root (lookups are what it costs: bench/README.md).
    `ref_alone`:
    up to draft-07 a ``$ref``'s siblings are ignored, so the node is its target alone."""
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("$id"), str):
        base = urljoin(base, node["$id"])
    out: dict[str, Any] = {}

    def sub(n: Any) -> Any:
        return _inline(n, base, registry, root_uri, ref_alone)

    ref = node.get("$ref")
    inlined = isinstance(ref, str) and urldefrag(urljoin(base, ref)) != (root_uri, "")
    if inlined:
        uri = urldefrag(urljoin(base, ref))[0]  # every metaschema resource names itself: its base
        target = registry.resolver(uri).lookup(urljoin(base, ref)).contents
        target = _inline(target, uri, registry, root_uri, ref_alone)
        if ref_alone:
            return target
        out["allOf"] = [target]
    for k, v in node.items():
        if (k == "$ref" and inlined) or (ref_alone and isinstance(ref, str) and k != "$ref"):
            continue
        if k == "allOf":
            out.setdefault("allOf", []).extend(sub(m) for m in v)
        elif k in ("$defs", "$id", "$schema", "$vocabulary"):
            continue
        else:
            out[k] = _map_subschemas(k, v, sub)
    return out
