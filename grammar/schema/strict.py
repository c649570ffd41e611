"""Strict objects: no undeclared keys unless the schema asks for them (the default, as xgrammar's).

JSON Schema allows any extra property unless `additionalProperties` says otherwise, and extra
array items after `prefixItems` unless `items` says otherwise. For generation that invites a model
to invent keys, so by default we add `additionalProperties: false` to every schema that declares
`properties` or `required` without saying anything about extras, and `items: false` after a
`prefixItems` without `items`. This only narrows what is generated.

A schema is closed only where that keeps its meaning as a shape: not when its object keywords
are combined with another schema's (an allOf member, a branch under a parent that declares
properties, a $ref with sibling keywords, a $ref target used in such places), because
`additionalProperties` does not see the other schema's properties.
"""

from __future__ import annotations

import copy
from typing import Any

from loraplex.grammar.schema.check import resolve_pointer

_OBJECT_KEYS = ("properties", "required", "additionalProperties")
_ARRAY_KEYS = ("prefixItems", "items")


# Marks the conditions a rewrite adds to an object ("a is absent", "a and b are present"): they only name keys
# the object declares, so they neither keep it open nor get closed themselves (see schema.narrow).
FRAGMENT = "x-loraplex-fragment"


def _shapes(node: Any, keys: tuple[str, ...], root: Any, seen: set[int]) -> bool:
    """Whether `node` (through its applicators) constrains objects/arrays with `keys`."""
    if not isinstance(node, dict) or id(node) in seen or node.get(FRAGMENT):
        return False
    seen.add(id(node))
    if any(k in node for k in keys):
        return True
    subs = list(node.get("allOf", [])) + list(node.get("anyOf", [])) + list(node.get("oneOf", []))
    if "$ref" in node:
        subs.append(resolve_pointer(root, node["$ref"])[0])
    return any(_shapes(s, keys, root, seen) for s in subs)


class _Closer:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.unsafe: dict[str, set[int]] = {"obj": set(), "arr": set()}  # ids of nodes that must stay open
        self.nodes: list[dict[str, Any]] = []
        self._visited: set[tuple[int, bool, bool]] = set()

    def walk(self, node: Any, obj_conj: bool, arr_conj: bool) -> None:
        """Record every schema dict and whether its shape is combined with another schema's."""
        if not isinstance(node, dict):
            return
        key = (id(node), obj_conj, arr_conj)
        if key in self._visited:
            return
        self._visited.add(key)
        self.nodes.append(node)
        if obj_conj:
            self.unsafe["obj"].add(id(node))
        if arr_conj:
            self.unsafe["arr"].add(id(node))
        applicators = [s for k in ("allOf", "anyOf", "oneOf") for s in node.get(k, [])]
        target = resolve_pointer(self.root, node["$ref"])[0] if "$ref" in node else None
        siblings = applicators + ([target] if target is not None else [])
        own_obj = any(k in node for k in _OBJECT_KEYS)
        own_arr = any(k in node for k in _ARRAY_KEYS)
        # this node's own shape is combined with what its applicators add
        if own_obj and any(_shapes(s, _OBJECT_KEYS, self.root, set()) for s in siblings):
            self.unsafe["obj"].add(id(node))
        if own_arr and any(_shapes(s, _ARRAY_KEYS, self.root, set()) for s in siblings):
            self.unsafe["arr"].add(id(node))
        for k in ("allOf", "anyOf", "oneOf"):
            members = node.get(k, [])
            for i, sub in enumerate(members):
                others = [m for j, m in enumerate(members) if j != i] if k == "allOf" else []
                others_obj = any(_shapes(m, _OBJECT_KEYS, self.root, set()) for m in others)
                others_arr = any(_shapes(m, _ARRAY_KEYS, self.root, set()) for m in others)
                self.walk(
                    sub,
                    obj_conj
                    or own_obj
                    or others_obj
                    or (target is not None and _shapes(target, _OBJECT_KEYS, self.root, set())),
                    arr_conj or own_arr or others_arr,
                )
        if target is not None:
            self.walk(
                target,
                obj_conj or own_obj or any(_shapes(s, _OBJECT_KEYS, self.root, set()) for s in applicators),
                arr_conj or own_arr or any(_shapes(s, _ARRAY_KEYS, self.root, set()) for s in applicators),
            )
        for name in ("properties", "patternProperties", "$defs", "definitions"):
            for sub in (node.get(name) or {}).values():
                self.walk(sub, False, False)
        for name in ("items", "additionalProperties"):
            self.walk(node.get(name), False, False)
        for sub in node.get("prefixItems", []):
            self.walk(sub, False, False)


def close_schema(schema: Any, in_place: bool = False) -> Any:
    """A copy of `schema` with undeclared object keys and extra tuple items forbidden where safe (``in_place``:
    the caller hands the schema over, and it is closed without a copy)."""
    if not isinstance(schema, dict):
        return schema
    root = schema if in_place else copy.deepcopy(schema)
    closer = _Closer(root)
    closer.walk(root, False, False)
    done: set[int] = set()
    for node in closer.nodes:
        if id(node) in done:
            continue
        done.add(id(node))
        if (
            ("properties" in node or "required" in node)
            and not node.get(FRAGMENT)
            and "additionalProperties" not in node
            and id(node) not in closer.unsafe["obj"]
        ):
            declared = dict(node.get("properties", {}))
            for name in node.get("required", []):
                declared.setdefault(name, True)  # a required key stays allowed (with any value)
            node["properties"] = declared
            node["additionalProperties"] = False
        if "prefixItems" in node and "items" not in node and id(node) not in closer.unsafe["arr"]:
            node["items"] = False
    return root
