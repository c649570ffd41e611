r"""llguidance grammar texts for each kind of constraint, validated with clear errors.

JSON schemas go to llguidance's own JSON compiler in strict mode (no lenient keyword skipping,
no oneOf-as-anyOf, compact separators). String formats are rewritten into our exact format
regexes as patterns, so both backends enforce the same formats (llguidance's own `date` does not
check days per month), and patterns are rewritten with ECMA's meaning of \d, \w, \s and `.`
(Rust's, which llguidance would use, match all Unicode digits, letters and spaces).
"""

from __future__ import annotations

import copy
from typing import Any

from loraplex.grammar.schema.ecma_pattern import pattern_to_rust
from loraplex.grammar.schema.formats import DECODED_FORMATS

_JSON_OPTIONS = {"whitespace_flexible": False, "coerce_one_of": False, "lenient": False}
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties")


_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")


def _prepare(node: Any) -> Any:
    """Formats as our regexes, patterns (and patternProperties' keys) with ECMA semantics, integral counts
    (2.0) as integers, vendor keys (x-...) dropped."""
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if not k.startswith("x-")}
    for key in _COUNTS:
        if isinstance(out.get(key), float):
            out[key] = int(out[key])
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _prepare(sub) for name, sub in out[key].items()}
    if isinstance(out.get("patternProperties"), dict):  # the keys are patterns too
        rewritten: dict[str, Any] = {}
        for name, sub in out["patternProperties"].items():
            rust = pattern_to_rust(name)
            rewritten[rust] = {"allOf": [rewritten[rust], sub]} if rust in rewritten else sub
        out["patternProperties"] = rewritten
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_prepare(sub) for sub in out[key]]
    for key in _SUBSCHEMA_ONE:
        if key in out:
            out[key] = _prepare(out[key])
    if isinstance(out.get("pattern"), str):
        out["pattern"] = pattern_to_rust(out["pattern"])
    fmt = out.pop("format", None)
    if fmt is not None:
        pattern = f"^(?:{DECODED_FORMATS[fmt]})$"
        if "pattern" in out:
            out = {"allOf": [out, {"pattern": pattern}]}
        else:
            out["pattern"] = pattern
    return out


def json_schema_grammar(schema: Any) -> str:
    """llguidance grammar for a checked JSON schema (formats enforced via our regexes)."""
    from llguidance import LLMatcher

    prepared = _prepare(copy.deepcopy(schema))
    return LLMatcher.grammar_from_json_schema(prepared, overrides=_JSON_OPTIONS)


def tagged_json_grammar(schema: Any, open_tag: str, close_tag: str, parallel: bool, text: Any = None) -> str:
    """Free text without `open_tag`, or text ending in `open_tag`, a value of `schema`, `close_tag`, and
    with `parallel` more newline-separated tagged values. The two text terminals part at the tag: text
    may not contain it, the head must end at its first occurrence (llguidance's `&` and `~`). With a
    `text` schema, the answer is a value of it instead of free text, and calls start with the tag."""
    import json

    from llguidance import LLMatcher

    inner = json.loads(json_schema_grammar(schema))["grammars"][0]["json_schema"]  # keeps the JSON options
    tag, close = json.dumps(open_tag), json.dumps(close_tag)
    more = f' ("\\n" {tag} call)*' if parallel else ""
    if text is not None:
        answer = json.loads(json_schema_grammar(text))["grammars"][0]["json_schema"]
        lark = (
            f"start: answer | {tag} call{more}\n"
            f"answer: %json {json.dumps(answer)}\n"
            f"call: %json {json.dumps(inner)} {close}\n"
        )
        return LLMatcher.grammar_from_lark(lark)
    lark = (
        f"start: TEXT | HEAD call{more}\n"
        f"TEXT: /(?s:.*)/ & ~/(?s:.*){_rx(open_tag)}(?s:.*)/\n"
        f"HEAD: /(?s:.*){_rx(open_tag)}/ & ~/(?s:.*){_rx(open_tag)}(?s:.+)/\n"
        f"call: %json {json.dumps(inner)} {close}\n"
    )
    return LLMatcher.grammar_from_lark(lark)


def _rx(literal: str) -> str:
    """`literal` as a regex inside Lark's /.../ (slashes escaped too)."""
    from loraplex.grammar.schema.json_text import rx_escape

    return rx_escape(literal).replace("/", "\\/")


def regex_grammar(regex: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_regex(regex)


def lark_grammar(text: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_lark(text)


def regex_error(regex: str) -> str | None:
    """llguidance's (regex-syntax's) message for an invalid regex, or None if it parses."""
    from llguidance import LLMatcher

    msg = LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(regex))
    return msg.strip() or None
