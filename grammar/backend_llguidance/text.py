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
from loraplex.grammar.spec import GrammarError

_JSON_OPTIONS = {"whitespace_flexible": False, "coerce_one_of": False, "lenient": False}
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties")


_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")


def _prepare(node: Any) -> Any:
    """Formats as our regexes, patterns with ECMA semantics, integral counts (2.0) as integers,
    vendor keys (x-...) dropped."""
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if not k.startswith("x-")}
    for key in _COUNTS:
        if isinstance(out.get(key), float):
            out[key] = int(out[key])
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _prepare(sub) for name, sub in out[key].items()}
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


def regex_grammar(regex: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_regex(regex)


def lark_grammar(text: str) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_lark(text)


def validate(grammar: str, tokenizer: Any, what: str) -> None:
    """GrammarError naming `what` (e.g. 'grammar syntax error') if llguidance rejects `grammar`."""
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:
        raise GrammarError(f"{what}: {messages[0].strip()}")


def regex_error(regex: str) -> str | None:
    """llguidance's (regex-syntax's) message for an invalid regex, or None if it parses."""
    from llguidance import LLMatcher

    msg = LLMatcher.validate_grammar(LLMatcher.grammar_from_regex(regex))
    return msg.strip() or None
