"""A value's `pattern` is generated so that ECMA-262 and Python's `re` (jsonschema's engine, the fuzz's judge) both
match: their \\s differ both ways (\\ufeff is ECMA whitespace, \\x1c-\\x1f and \\x85 are Python's), Python's
\\d and \\w are Unicode-wide, so \\S, \\D, \\W and [^\\s] in ECMA's sense admitted strings Python rejects."""

from __future__ import annotations

import json
import re

import pytest
import regex

from loraplex.grammar import StructuredSpec
from loraplex.grammar.schema.ecma_pattern import pattern_to_content_regex, pattern_to_rust
from tests.grammar.helpers import feed

PATTERNS = [r"^\S+$", r"^\s+$", r"^[^\s]+$", r"^\D+$", r"^\W+$", r"^[^\W_]+$", r"^[\d\s]+$", r"^[^\d\S]+$", r"\w"]
# every character where the engines could differ, and a sample of the rest of the BMP
SAMPLE = [chr(c) for c in range(0x10000) if re.fullmatch(r"[\s\d\w]", chr(c)) or c % 97 == 0 or c < 0x100]
SAMPLE += ["\ufeff", "\u180e", "\x85", "\u2028", "\u3000", "\u0663", "\u00e9", "\u00b2", "\U0001d7d8"]


def _ecma(pattern: str):
    """ECMA's meaning, as our translation without the agreement (run by the `regex` module, V1 sets)."""
    return regex.compile(pattern_to_rust(pattern), regex.V1)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_character_the_translation_admits_matches_in_both_engines(pattern):
    ours = regex.compile(pattern_to_rust(pattern, agreeing=True), regex.V1)
    ecma = _ecma(pattern)
    admitted = [ch for ch in SAMPLE if ours.search(ch)]
    assert admitted  # the narrowing leaves something
    wrong = [ch for ch in admitted if not (re.search(pattern, ch) and ecma.search(ch))]
    assert not wrong, [hex(ord(ch)) for ch in wrong[:10]]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_json_content_regex_agrees_too(pattern):
    """The regex route's class over JSON text: raw characters and the escapes of control characters."""
    content = regex.compile(pattern_to_content_regex(pattern, agreeing=True), regex.V1)
    for ch in SAMPLE:
        text = json.dumps(ch)[1:-1]
        if content.fullmatch(text):
            assert re.search(pattern, ch) and _ecma(pattern).search(ch), hex(ord(ch))


def test_engine_differences_are_left_out_and_plain_strings_kept(llg_compiler, compiler, tokenizer):
    cases = [
        (r"^\S+$", ["\x1c", "\x85", "a\x1fb"], ["a", "ab-c"]),
        (r"^\s+$", ["\ufeff"], [" ", "\t\u3000"]),
        (r"^\D+$", ["\u0663", "x\u0966"], ["abc", "\u00e9"]),
        (r"^\W+$", ["\u00e9", "\u00b2"], ["-+", " !"]),
    ]
    for pattern, rejected, accepted in cases:
        schema = {"type": "string", "pattern": pattern}
        for c in (llg_compiler, compiler):
            grammar = c.compile(StructuredSpec(json=schema))
            for value, ok in [(v, False) for v in rejected] + [(v, True) for v in accepted]:
                # the rejected ones: ECMA takes them, Python does not; the accepted ones: both take them
                assert _ecma(pattern).search(value) and bool(re.search(pattern, value)) == ok
                matcher = grammar.new_matcher()
                ids = tokenizer.encode(json.dumps(value, ensure_ascii=False), add_special_tokens=False)
                assert (feed(matcher, ids) and matcher.is_accepting()) == ok, (pattern, value, grammar.backend)
