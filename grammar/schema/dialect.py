"""Any JSON Schema draft into one internal form: draft 2020-12 keywords, local JSON-pointer references.

Each draft (04, 06, 07, 2019-09, 2020-12; none named: 2020-12; another named: refused) is first validated
against its own metaschema, then rewritten with the same meaning:

* draft-04's boolean ``exclusiveMinimum``/``exclusiveMaximum`` become the numeric form;
* array-form ``items`` (up to 2019-09) becomes ``prefixItems``, and ``additionalItems`` the ``items`` after it;
* ``dependencies`` (up to draft-07) becomes ``dependentRequired`` and ``dependentSchemas``;
* up to draft-07, the keywords beside a ``$ref`` are ignored (as those drafts say);
* ``id``/``$id`` scoping, ``$anchor`` (and draft-07's plain-name ``$id`` fragments) are resolved: every
  ``$ref`` becomes a pointer from the root (``#/...``), so nothing later needs base URIs;
* ``$recursiveRef`` and ``$dynamicRef`` are resolved statically, as they resolve when the schema is used on
  its own (the root's anchor, else the lexical one);
* a keyword no draft defines is an annotation and is dropped, and so are annotations and formats whose
  names no draft defines (the specification makes unknown formats annotations).

A keyword that only a later draft defines (``const`` or ``if`` in a draft-04 schema) is an annotation under
the schema's own draft, and is dropped like one. Enforcing it would narrow where it stands positively but
widen under negation: a draft-04 ``oneOf`` of two ``{"const": ...}`` branches accepts nothing (both branches
match anything), and generating either constant would produce documents the draft rejects. References that
leave the document are refused: nothing is fetched.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any
from urllib.parse import quote, unquote, urldefrag, urljoin

import jsonschema
from jsonschema.validators import validator_for

from loraplex.grammar.schema.check import pointer
from loraplex.grammar.schema.metaschema import fast_metaschema_validator, metaschema_validator
from loraplex.grammar.schema.subschemas import SUB_LISTS, SUB_MAPS, SUB_ONE
from loraplex.grammar.spec import GrammarError

_POINTER_SAFE = "/~!$&'()*+,;=:@-._"  # a pointer's characters that stay as they are in a URI fragment
_ROOT_URI = "https://loraplex.invalid/schema.json"  # a base for relative references when the root names none

DRAFTS = {
    jsonschema.Draft4Validator: "draft-04",
    jsonschema.Draft6Validator: "draft-06",
    jsonschema.Draft7Validator: "draft-07",
    jsonschema.Draft201909Validator: "2019-09",
    jsonschema.Draft202012Validator: "2020-12",
}
_ORDER = ["draft-04", "draft-06", "draft-07", "2019-09", "2020-12"]

# Every keyword some draft defines as an assertion or applicator, in the internal (2020-12) form.
ASSERTIONS = frozenset(
    {
        "type",
        "enum",
        "const",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "format",
        "maxItems",
        "minItems",
        "uniqueItems",
        "maxContains",
        "minContains",
        "maxProperties",
        "minProperties",
        "required",
        "dependentRequired",
        "$ref",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "prefixItems",
        "items",
        "contains",
        "properties",
        "patternProperties",
        "additionalProperties",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
# The draft that first defines each assertion or applicator newer than draft-04 (in its 2020-12 spelling).
INTRODUCED_IN = {
    "const": "draft-06",
    "contains": "draft-06",
    "propertyNames": "draft-06",
    "if": "draft-07",
    "then": "draft-07",
    "else": "draft-07",
    "dependentRequired": "2019-09",
    "dependentSchemas": "2019-09",
    "maxContains": "2019-09",
    "minContains": "2019-09",
    "unevaluatedItems": "2019-09",
    "unevaluatedProperties": "2019-09",
    "prefixItems": "2020-12",
}
DEFINITIONS = ("$defs", "definitions")  # kept: references point into them
COUNTS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)

# Formats some draft defines; any other name is an annotation.
DEFINED_FORMATS = frozenset(
    {
        "date-time",
        "date",
        "time",
        "duration",
        "email",
        "idn-email",
        "hostname",
        "idn-hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "iri",
        "iri-reference",
        "uuid",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
        "regex",
    }
)


def draft_of(schema: Any) -> tuple[str, type]:
    """The schema's draft name and jsonschema validator class (2020-12 when it names none)."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return DRAFTS[jsonschema.Draft202012Validator], jsonschema.Draft202012Validator
    cls = validator_for(schema, default=None)
    if cls not in DRAFTS:
        raise GrammarError(
            f"unsupported $schema dialect {schema['$schema']!r} (supported: "
            + ", ".join(f"{c.META_SCHEMA['$schema']}" for c in DRAFTS)
            + ")",
            code="unsupported_schema",
        )
    return DRAFTS[cls], cls


def check_against_metaschema(schema: Any, cls: type) -> None:
    if fast_metaschema_validator(cls).is_valid(schema):
        return
    errors = list(metaschema_validator(cls).iter_errors(schema))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        raise GrammarError(f"invalid schema: {err.message} at {pointer(list(err.absolute_path)) or '/'}")


def to_internal(schema: Any) -> tuple[Any, str]:
    """Validate ``schema`` under its own draft and return it in the internal form, with the draft's name."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"invalid schema: a schema is an object or a boolean, not {type(schema).__name__}")
    draft, cls = draft_of(schema)
    check_against_metaschema(schema, cls)
    if isinstance(schema, bool):
        return schema, draft
    root = copy.deepcopy(schema)
    return _Rewriter(root, draft, _Index(root, draft)).rewrite(), draft


def _before(draft: str, other: str) -> bool:
    return _ORDER.index(draft) < _ORDER.index(other)


_INDEXED = frozenset(("id", "$id", "$anchor", "$dynamicAnchor", "$recursiveAnchor"))
_CHILD_KEYS = frozenset(SUB_MAPS + SUB_LISTS + SUB_ONE + ("additionalItems", "dependencies"))


def _children(node: dict[str, Any]) -> list[tuple[list[Any], Any]]:
    """(relative path, sub-schema) of every sub-schema directly under ``node`` (any draft's keywords)."""
    out: list[tuple[list[Any], Any]] = []
    if _CHILD_KEYS.isdisjoint(node):  # most nodes are leaves: no keyword-by-keyword look
        return out
    for key in SUB_MAPS:
        if isinstance(node.get(key), dict):
            out += [([key, name], sub) for name, sub in node[key].items()]
    for key in SUB_LISTS:
        if isinstance(node.get(key), list):
            out += [([key, i], sub) for i, sub in enumerate(node[key])]
    for key in SUB_ONE:
        value = node.get(key)
        if isinstance(value, list) and key == "items":
            out += [([key, i], sub) for i, sub in enumerate(value)]
        elif isinstance(value, (dict, bool)):
            out.append(([key], value))
    for key in ("additionalItems",):
        if isinstance(node.get(key), (dict, bool)):
            out.append(([key], node[key]))
    deps = node.get("dependencies")
    if isinstance(deps, dict):
        out += [(["dependencies", name], sub) for name, sub in deps.items() if isinstance(sub, (dict, bool))]
    return out


class _Index:
    """Where each schema resource (by absolute URI) and each anchor sits in the document, as pointers."""

    def __init__(self, root: dict[str, Any], draft: str) -> None:
        self.draft = draft
        self.resources: dict[str, str] = {}
        self.anchors: dict[str, str] = {}
        self.dynamic: dict[str, str] = {}  # $dynamicAnchor / $recursiveAnchor names of the root resource
        self.dynamic_names: dict[str, str] = {}  # pointer -> the $dynamicAnchor name defined there
        self.recursive: set[str] = set()  # pointers of resources with "$recursiveAnchor": true
        self._walk(root, [], _ROOT_URI, is_root=True)

    def _walk(self, node: Any, path: list[Any], base: str, is_root: bool = False) -> None:
        if not isinstance(node, dict):
            return
        ptr = pointer(path) if is_root or not _INDEXED.isdisjoint(node) else ""  # (only what is indexed needs it)
        id_key = "id" if self.draft == "draft-04" else "$id"
        ident = node.get(id_key)
        ignored_id = "$ref" in node and _before(self.draft, "2019-09")  # $ref siblings are ignored there
        if isinstance(ident, str) and not ignored_id:
            uri, fragment = urldefrag(urljoin(base, ident))
            if uri and not (ident.startswith("#") and _before(self.draft, "2019-09")):
                base = uri
                self.resources[uri] = ptr
            if fragment and not fragment.startswith("/"):  # draft-04..07 plain-name fragment: an anchor
                self.anchors[f"{uri or base}#{fragment}"] = ptr
        if is_root:
            self.resources.setdefault(base, ptr)
            self.resources[_ROOT_URI] = ptr
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(key), str):
                self.anchors[f"{base}#{node[key]}"] = ptr
                if key == "$dynamicAnchor":
                    self.dynamic_names[ptr] = node[key]
                    if is_root:
                        self.dynamic[node[key]] = ptr
        if node.get("$recursiveAnchor") is True:
            self.recursive.add(ptr)
            if is_root:
                self.dynamic[""] = ptr
        for rel, sub in _children(node):
            self._walk(sub, path + rel, base)

    def resolve(self, ref: str, base: str, where: str) -> str:
        """The pointer from the root that ``ref`` (written in a resource with URI ``base``) names."""
        if ref.startswith("#"):  # a fragment of the current resource (also where urljoin cannot help: urn:...)
            uri, fragment = urldefrag(base)[0], ref[1:]
        else:
            uri, fragment = urldefrag(urljoin(base, ref))
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            target = self.anchors.get(f"{uri}#{fragment}")
            if target is None:
                raise GrammarError(f"$ref {ref!r} at {where or '/'} names an anchor this schema does not define")
            return target
        resource = self.resources.get(uri)
        if resource is None:
            raise GrammarError(
                f"unsupported $ref {ref!r} at {where or '/'}: it points outside this schema, and references are "
                "never fetched (inline the referenced schema under $defs)",
                code="unsupported_schema",
            )
        return resource + fragment


_REFS = frozenset(("$ref", "$recursiveRef", "$dynamicRef"))


class _Rewriter:
    """Builds the internal form. References are resolved to pointers in the original document first, then
    mapped to where those places moved (array-form items, additionalItems and dependencies change paths)."""

    def __init__(self, root: dict[str, Any], draft: str, index: _Index) -> None:
        self.root = root
        self.draft = draft
        self.index = index
        self.moved: dict[str, str] = {}  # pointer of a sub-schema in the original -> in the internal form
        self.refs: list[dict[str, Any]] = []  # output nodes whose "$ref" still holds an original pointer

    def rewrite(self) -> Any:
        self.targets = self._ref_targets(self.root, [])
        out = self.node(self.root, [], [], _ROOT_URI)
        for node in self.refs:
            node["$ref"] = "#" + quote(self._map(node["$ref"]), safe=_POINTER_SAFE)
        return out

    def _ref_targets(self, value: Any, path: list[Any]) -> set[str]:
        """Original pointers of every reference target, wherever the reference stands (even under a keyword no
        draft defines, where schemas may still be kept for others to point at)."""
        found: set[str] = set()
        if isinstance(value, dict):
            ref = value.get("$ref")
            if isinstance(ref, str):
                with contextlib.suppress(GrammarError):  # reported where the reference is rewritten, if it counts
                    found.add(self.index.resolve(ref, _ROOT_URI, pointer(path)))
            for key, sub in value.items():
                if key not in ("enum", "const", "default", "examples"):
                    found |= self._ref_targets(sub, path + [key])
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                found |= self._ref_targets(sub, path + [i])
        return found

    def _kept(self, value: Any, path: list[Any], new_path: list[Any], base: str) -> Any:
        """The parts of a value under an unknown keyword that references point into (the rest is dropped)."""
        if pointer(path) in self.targets:
            return self.node(value, path, new_path, base)
        if isinstance(value, dict):
            return {
                k: self._kept(v, path + [k], new_path + [k], base)
                for k, v in value.items()
                if self._holds_target(path + [k])
            }
        if isinstance(value, list):
            return [self._kept(v, path + [i], new_path + [i], base) for i, v in enumerate(value)]
        return value

    def _holds_target(self, path: list[Any]) -> bool:
        prefix = pointer(path)
        return any(t == prefix or t.startswith(prefix + "/") for t in self.targets)

    def _map(self, original: str) -> str:
        """The internal pointer of an original pointer: its longest moved prefix, moved, plus the rest."""
        parts = original.split("/")
        for cut in range(len(parts), 0, -1):
            prefix = "/".join(parts[:cut])
            if prefix in self.moved:
                return self.moved[prefix] + "".join("/" + p for p in parts[cut:])
        return original

    def node(self, node: Any, path: list[Any], new_path: list[Any], base: str) -> Any:
        if path != new_path:  # (_map maps a pointer through its longest moved prefix: the rest stay as they are)
            self.moved[pointer(path)] = pointer(new_path)
        if not isinstance(node, dict):
            return node
        where = "" if _REFS.isdisjoint(node) else pointer(path)  # (only messages about references name it)
        id_key = "id" if self.draft == "draft-04" else "$id"
        if isinstance(node.get(id_key), str) and not ("$ref" in node and _before(self.draft, "2019-09")):
            uri, _ = urldefrag(urljoin(base, node[id_key]))
            if uri and not (node[id_key].startswith("#") and _before(self.draft, "2019-09")):
                base = uri
        if "$ref" in node and _before(self.draft, "2019-09"):
            # draft-07 and earlier: everything beside $ref is ignored (definitions stay reachable by pointer)
            node = {k: v for k, v in node.items() if k == "$ref" or k in DEFINITIONS}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                out["$ref"] = self.index.resolve(value, base, where)
            elif key == "$recursiveRef" and isinstance(value, str):
                # dynamic only when the resource it first resolves to has "$recursiveAnchor": true
                initial = self.index.resolve(value, base, where)
                dynamic = initial in self.index.recursive and "" in self.index.dynamic
                out["$ref"] = self.index.dynamic[""] if dynamic else initial
            elif key == "$dynamicRef" and isinstance(value, str):
                # dynamic only when it first resolves to a $dynamicAnchor of that name
                name, initial = urldefrag(value)[1], self.index.resolve(value, base, where)
                dynamic = self.index.dynamic_names.get(initial) == name and name in self.index.dynamic
                out["$ref"] = self.index.dynamic[name] if dynamic else initial
            elif (
                key in DEFINITIONS
                or key in ("additionalItems", "dependencies")
                or (key in ASSERTIONS and not _before(self.draft, INTRODUCED_IN.get(key, "draft-04")))
            ):
                out[key] = value
            elif key.startswith(LORAPLEX_PREFIX):
                out[key] = _loraplex_keyword(key, value, path, node)
            elif self._holds_target(path + [key]):  # an unknown keyword that references point into
                out[key] = self._kept(value, path + [key], new_path + [key], base)
        if "$ref" in out:
            self.refs.append(out)
        renames = self._convert(out)
        for key in COUNTS:  # 2.0 is the integer 2 in every draft
            if isinstance(out.get(key), float) and out[key].is_integer():
                out[key] = int(out[key])
        if out.get("format") not in DEFINED_FORMATS:
            out.pop("format", None)  # an unknown format is an annotation
        for rel, sub in _children(out):
            original = list(renames.get(tuple(rel), rel))
            _set(out, rel, self.node(sub, path + original, new_path + rel, base))
        return out

    def _convert(self, node: dict[str, Any]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        """The draft's own keyword forms into 2020-12's; returns where moved sub-schemas came from."""
        renames: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        if self.draft == "draft-04":
            for bound, exclusive in (("maximum", "exclusiveMaximum"), ("minimum", "exclusiveMinimum")):
                flag = node.get(exclusive)
                if isinstance(flag, bool):
                    del node[exclusive]
                    if flag and bound in node:
                        node[exclusive] = node.pop(bound)
        additional = node.pop("additionalItems", None)
        if _before(self.draft, "2020-12") and isinstance(node.get("items"), list):
            node["prefixItems"] = node.pop("items")
            renames.update({("prefixItems", i): ("items", i) for i in range(len(node["prefixItems"]))})
            if additional is not None:  # (beside a schema-form items, additionalItems is ignored)
                node["items"] = additional
                renames[("items",)] = ("additionalItems",)
        deps = node.pop("dependencies", None)
        if isinstance(deps, dict) and _before(self.draft, "2019-09"):
            required = {k: v for k, v in deps.items() if isinstance(v, list)}
            schemas = {k: v for k, v in deps.items() if isinstance(v, (dict, bool))}
            if required:
                node["dependentRequired"] = {**node.get("dependentRequired", {}), **required}
            if schemas:
                node["dependentSchemas"] = {**node.get("dependentSchemas", {}), **schemas}
                renames.update({("dependentSchemas", k): ("dependencies", k) for k in schemas})
        return renames


LORAPLEX_PREFIX = "x-loraplex-"
# Our own keywords a request may write (every draft leaves x- keywords to their users). Any other name with our
# prefix is refused: a misspelt "x-loraplex-grounded" must not pass as an annotation and generate ungrounded text.
REQUEST_KEYWORDS = frozenset({"x-loraplex-grounded"})


def _loraplex_keyword(key: str, value: Any, path: list[Any], node: dict[str, Any]) -> Any:
    where = pointer(path + [key])
    if key not in REQUEST_KEYWORDS:
        raise GrammarError(
            f"unknown keyword {key!r} at {where}: the x-loraplex- keywords are {', '.join(sorted(REQUEST_KEYWORDS))}",
            code="unsupported_schema",
        )
    if not isinstance(value, bool):
        raise GrammarError(f"{key} at {where} must be true or false, not {value!r}")
    if value and not _may_be_string(node):  # grounding holds strings only: here it would hold nothing, silently
        raise GrammarError(
            f"{key} at {where} grounds string values, and this schema allows none (its type, const or enum)",
            code="unsupported_schema",
        )
    return value


def _may_be_string(node: dict[str, Any]) -> bool:
    """Whether the schema's own type, const and enum leave room for a string value."""
    types = node.get("type")
    names = [types] if isinstance(types, str) else types
    if isinstance(names, list) and "string" not in names:
        return False
    if "const" in node and not isinstance(node["const"], str):
        return False
    return not (isinstance(node.get("enum"), list) and not any(isinstance(v, str) for v in node["enum"]))


def _set(node: dict[str, Any], rel: list[Any], value: Any) -> None:
    target: Any = node
    for part in rel[:-1]:
        target = target[part]
    target[rel[-1]] = value
