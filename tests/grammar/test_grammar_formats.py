"""String formats and ECMA patterns, token by token through the automaton backend."""

from __future__ import annotations

import json

import pytest

from loraplex.grammar import StructuredSpec
from tests.grammar.helpers import feed, load_suite

# Suite labels wider than our formats (deliberate subsets, reported as narrowings): leap seconds are not
# generated, because common validators (Python's rfc3339-validator, jsonschema's date-time check) reject them.
LEAP_SECONDS = {"optional/format/date-time/0/10", "optional/format/date-time/0/11"}
FORMAT_CASES = [
    c
    for c in load_suite()
    if c["source"].endswith("/format/" + c["source"].rsplit("/", 1)[-1]) and isinstance(c["data"], str)
]

EXTRA = {
    "time": [
        ("08:30:06Z", True),
        ("23:59:60Z", False),  # a leap second: narrowed out
        ("23:59:60+01:00", False),
        ("22:59:60Z", False),
        ("08:30:06", False),
        ("24:00:00Z", False),
        ("08:30:06.5-05:30", True),
    ],
    "uri": [
        ("https://example.com/a/b?x=1#frag", True),
        ("urn:isbn:0451450523", True),
        ("mailto:a@b.c", True),
        ("http://[::1]:8080/", True),
        ("//no-scheme", False),
        ("http://a b", False),
        ("1http://x", False),
    ],
}


def _accepts(compiler, tokenizer, schema, value: str) -> bool:
    m = compiler.compile(StructuredSpec(json=schema)).new_matcher()
    text = json.dumps(value, ensure_ascii=False)
    return feed(m, tokenizer.encode(text, add_special_tokens=False)) and m.is_accepting()


@pytest.mark.parametrize("case", FORMAT_CASES, ids=[c["id"] for c in FORMAT_CASES])
def test_suite_formats_exact(dfa_compiler, tokenizer, case):
    schema = {"type": "string", "format": case["schema"]["format"]}
    expected = case["valid"] and case["id"] not in LEAP_SECONDS
    assert _accepts(dfa_compiler, tokenizer, schema, case["data"]) == expected, case["description"]


@pytest.mark.parametrize("fmt, value, ok", [(f, v, ok) for f, vs in EXTRA.items() for v, ok in vs])
def test_time_and_uri(dfa_compiler, tokenizer, fmt, value, ok):
    assert _accepts(dfa_compiler, tokenizer, {"type": "string", "format": fmt}, value) == ok


PATTERNS = [
    ("^a*$", [("aaa", True), ("", True), ("ab", False)]),
    ("b+", [("abba", True), ("aaa", False)]),  # not anchored: a match anywhere
    ('^say "(hi|yo)"$', [('say "hi"', True), ('say "yo"', True), ("say hi", False)]),
    ("^[^a]$", [("\n", True), ('"', True), ("\\", True), ("a", False)]),
    ("^\\d{2}-\\w+$", [("12-ab_c", True), ("1-ab", False), ("12-", False)]),
    ("^\\p{Letter}+$", [("Πλάτων", True), ("abc1", False)]),
    ("^.$", [("x", True), ("\n", False), ("💩", True)]),
    ("^\\u00e9|x$", [("é...", True), ("...x", True), ("e", False)]),
    ("^[\\s]+$", [(" \t\n", True), ("a", False)]),
]


@pytest.mark.parametrize("pattern, values", PATTERNS, ids=[p for p, _ in PATTERNS])
def test_patterns(dfa_compiler, tokenizer, pattern, values):
    schema = {"type": "string", "pattern": pattern}
    for value, ok in values:
        assert _accepts(dfa_compiler, tokenizer, schema, value) == ok, value


def test_length_counts_code_points(dfa_compiler, tokenizer):
    schema = {"type": "string", "minLength": 2, "maxLength": 2}
    assert _accepts(dfa_compiler, tokenizer, schema, "💩💩")
    assert _accepts(dfa_compiler, tokenizer, schema, '\n"')
    assert not _accepts(dfa_compiler, tokenizer, schema, "💩")
