r"""llguidance grammar texts for each kind of constraint, validated with clear errors.

JSON schemas go to llguidance's own JSON compiler in strict mode (no lenient keyword skipping,
no oneOf-as-anyOf, compact separators). String formats are rewritten into our exact format
regexes as patterns, so both backends enforce the same formats (llguidance's own `date` does not
check days per month), and patterns are rewritten with ECMA's meaning of \d, \w, \s and `.`
(Rust's, which llguidance would use, match all Unicode digits, letters and spaces).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loraplex.grammar.schema.ecma_pattern import (
    key_restriction,
    pattern_to_rust,
    pattern_to_rust_key,
    ranges_class_body,
)
from loraplex.grammar.schema.formats import DECODED_FORMATS
from loraplex.grammar.schema.subschemas import SUB_LISTS, SUB_MAPS, SUB_ONE

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # (a TypedDict of llguidance's stubs)

_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "coerce_one_of": False, "lenient": False}
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
        patterns = out["patternProperties"]
        outside = key_restriction(patterns, out.get("properties") or {})
        rewritten: dict[str, Any] = {}
        for name, sub in patterns.items():
            rust = pattern_to_rust_key(name, outside)
            rewritten[rust] = {"allOf": [rewritten[rust], sub]} if rust in rewritten else sub
        if outside:  # keys ECMA and Python's re could judge differently are not generated (narrow.py says so)
            rewritten[f"[{ranges_class_body(outside)}]"] = False
        out["patternProperties"] = rewritten
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_prepare(sub) for sub in out[key]]
    for key in _SUBSCHEMA_ONE:
        if key in out:
            out[key] = _prepare(out[key])
    if isinstance(out.get("pattern"), str):
        out["pattern"] = pattern_to_rust(out["pattern"], agreeing=True)  # (a value must match it)
    fmt = out.pop("format", None)
    if fmt is not None:
        pattern = f"^(?:{DECODED_FORMATS[fmt]})$"
        if "pattern" in out:
            out = {"allOf": [out, {"pattern": pattern}]}
        else:
            out["pattern"] = pattern
    return out


ROOT_DEFINITION = "__loraplex_root"


def json_schema_grammar(schema: Any, root_as_definition: bool = False) -> str:
    """llguidance grammar for a checked JSON schema (formats enforced via our regexes). ``root_as_definition``:
    the schema as a definition that a bare root reference names, every reference rewritten to match (the same
    language; see ``user_pointers`` for llguidance's messages)."""
    from llguidance import LLMatcher

    prepared = _prepare(schema)  # (new dicts all the way down: the schema is left as it is)
    if root_as_definition:
        prepared = {"$ref": f"#/$defs/{ROOT_DEFINITION}", "$defs": {ROOT_DEFINITION: _under_root(prepared)}}
    return LLMatcher.grammar_from_json_schema(prepared, overrides=_JSON_OPTIONS)


def _under_root(node: Any) -> Any:
    """Every local reference ("#...", all of them after translation) pointed into the root's new place (only
    in sub-schemas: an enum or const value holding a "$ref" key is data)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = f"#/$defs/{ROOT_DEFINITION}{ref[1:]}"
    for key in SUB_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _under_root(sub) for name, sub in out[key].items()}
    for key in (*SUB_LISTS, "items"):  # (array-form items never reach here, but a list is walked either way)
        if isinstance(out.get(key), list):
            out[key] = [_under_root(sub) for sub in out[key]]
    for key in SUB_ONE:
        if isinstance(out.get(key), dict):
            out[key] = _under_root(out[key])
    return out


def user_pointers(message: str) -> str:
    """An llguidance message with the pointers of a ``root_as_definition`` grammar as the user's schema has them."""
    return message.replace(f"#/$defs/{ROOT_DEFINITION}", "#")


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
    return LLMatcher.grammar_from_lark(tagged_lark(f"%json {json.dumps(inner)}", open_tag, close_tag, parallel))


def tagged_lark(call: str, open_tag: str, close_tag: str, parallel: bool) -> str:
    """The Lark text of free text or tagged calls, each call being ``call`` (a %json value, or a terminal)."""
    import json

    tag, close = json.dumps(open_tag), json.dumps(close_tag)
    more = f' ("\\n" {tag} call)*' if parallel else ""
    return (
        f"start: TEXT | HEAD call{more}\n"
        f"TEXT: /(?s:.*)/ & ~/(?s:.*){_rx(open_tag)}(?s:.*)/\n"
        f"HEAD: /(?s:.*){_rx(open_tag)}/ & ~/(?s:.*){_rx(open_tag)}(?s:.+)/\n"
        f"call: {call} {close}\n"
    )


def _rx(literal: str) -> str:
    """`literal` as a regex inside Lark's /.../ (slashes escaped too)."""
    from loraplex.grammar.schema.json_text import rx_escape

    return rx_escape(literal).replace("/", "\\/")


def regex_grammar(regex: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_regex(regex)


def automaton_language_grammar(regex: str) -> str:
    """llguidance grammar serving `regex` token for token as its token automaton does: every token whose bytes keep
    the text a prefix of a match is allowed. (By default llguidance allows only the first token of the canonical
    tokenization where the grammar forces bytes; ``no_forcing`` turns that off. The 0xF4 tokens the automaton
    cannot hold are masked by the grammar object: LLGuidanceGrammar's ``automaton_language``.)"""
    import json

    grammar = json.loads(regex_grammar(regex))
    lark = grammar["grammars"][0]["lark_grammar"]
    grammar["grammars"][0]["lark_grammar"] = '%llguidance {"no_forcing": true}\n' + lark
    return json.dumps(grammar)


def lark_grammar(text: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_lark(text)


def regex_error(regex: str) -> str | None:
    """llguidance's (regex-syntax's) message for an invalid regex, or None if it parses."""
    from llguidance import LLMatcher

    msg = LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(regex))
    return msg.strip() or None
