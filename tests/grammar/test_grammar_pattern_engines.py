"""A value's `pattern` is generated so that ECMA-262 and Python's `re` (jsonschema's engine, the fuzz's judge) both
match: their \\s differ both ways (\\ufeff is ECMA whitespace, \\x1c-\\x1f and \\x85 are Python's), Python's
\\d and \\w are Unicode-wide, so \\S, \\D, \\W and [^\\s] in ECMA's sense admitted strings Python rejects.
A patternProperties key decides which schema a value answers to, both when it matches and when it does not, so
keys holding a character the engines could judge differently (also Python's `.` on \\r, its `$` before a final
newline) are not generated at all."""

from __future__ import annotations

import json
import re

import pytest
import regex

from loraplex.grammar import StructuredSpec
from loraplex.grammar.schema.ecma_pattern import (
    key_disagreements,
    pattern_to_content_regex,
    pattern_to_rust,
    pattern_to_rust_key,
)
from tests.grammar.helpers import feed, walks_validate

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


KEY_PATTERNS = [r"^a.$", r"^\d+$", r"^[a-z]+$", r"\s", r"^x-", r"^\w+$", r"foo|^bar$", r"^[^.]+\.json$", r"\S\W"]


def test_which_characters_keys_may_not_hold():
    """Written out by hand from the two engines' documentation (the test does not ask the code under test)."""
    assert key_disagreements([r"^x-", r"^[a-z.$]+"]) == ()  # no construct the engines read differently
    assert key_disagreements([r"^[a-z]+$"]) == (("\n", "\n"),)  # Python's $ also matches before a final \n
    assert set(key_disagreements([r"^a.b"])) == {(c, c) for c in "\r\u2028\u2029"}  # Python's . takes them
    assert set(key_disagreements([r"\s"])) == {(c, c) for c in "\x1c\x1d\x1e\x1f\x85\ufeff"}
    assert key_disagreements([r"\d"]) == (("\x80", "\U0010ffff"),)  # Unicode-wide \d, \w (and \b) in Python


@pytest.mark.parametrize("pattern", KEY_PATTERNS)
def test_a_key_is_matched_exactly_where_both_engines_match_it(pattern):
    """Over keys built from every character where the engines could differ: the key regex matches a key iff it
    holds no excluded character and both engines find the pattern in it; on the keys it keeps they agree."""
    outside = key_disagreements([pattern])
    ours = regex.compile(pattern_to_rust_key(pattern, outside), regex.V1)
    matches = ours.fullmatch if outside else ours.search  # (anchored where restricted, else a search as written)
    ecma = _ecma(pattern)
    rng = __import__("random").Random(pattern)
    pools = [SAMPLE, [chr(c) for c in range(0x20, 0x7F)] + ["x-", "foo", "bar", ".json", "\n", "\r", "\t"]]
    keys = {"".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 4))) for _ in range(4000)}
    keys |= {"ab", "a\r", "12", "\u0663", "abc\n", "bar", "x.json", "foo\n"}
    kept = 0
    for key in keys:
        clean = not any(lo <= ch <= hi for lo, hi in outside for ch in key)
        both = bool(re.search(pattern, key)) and bool(ecma.search(key))
        assert bool(matches(key)) == (clean and both), (pattern, key)
        if clean:
            kept += 1
            assert bool(re.search(pattern, key)) == bool(ecma.search(key)), (pattern, key)
    assert kept > 100


KEY_SCHEMAS = {  # (schema, keys ECMA and Python judge differently, keys kept)
    "dot": ({"patternProperties": {"^a.$": {"type": "integer"}}}, ["a\r", "a\u2028"], ["ab", "b", "\u00fc"]),
    "digits": ({"patternProperties": {"^\\d+$": {"type": "integer"}}}, ["\u0663", "1\u0966"], ["12", "ab"]),
    "end": ({"patternProperties": {"^[a-z]+$": {"type": "integer"}}}, ["ab\n"], ["ab", "a-b", "\u00e9"]),
}


@pytest.mark.parametrize("name", sorted(KEY_SCHEMAS))
def test_keys_the_engines_judge_differently_are_not_generated(compiler, tokenizer, name):
    import jsonschema

    base, different, kept = KEY_SCHEMAS[name]
    schema = {"type": "object", **base, "additionalProperties": {"type": "string"}}
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert any(n.startswith("patternProperties at ") for n in grammar.narrowing), grammar.narrowing
    pattern = next(iter(base["patternProperties"]))
    for key in different:
        document = {key: "x"}  # an additional property to ECMA, a pattern property to Python (and jsonschema)
        assert not jsonschema.Draft202012Validator(schema).is_valid(document)
        matcher = grammar.new_matcher()
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        assert not (feed(matcher, tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting()), key
    for key in kept:
        document = {key: 1 if re.search(pattern, key) else "x"}
        matcher = grammar.new_matcher()
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        assert feed(matcher, tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting(), key
    walks_validate(compiler, schema, grammar, name, walks=20, budget=80)


def test_a_declared_name_holding_such_a_character_keeps_the_patterns_as_they_were(compiler, tokenizer):
    """llguidance holds declared names to the patterns too; leaving out non-ASCII keys would leave out
    "größe" itself, so this object keeps ECMA's key patterns (the known gap) and says nothing about keys."""
    schema = {
        "type": "object",
        "properties": {"größe": {"type": "integer"}},
        "patternProperties": {"^\\w+$": {"type": "integer"}},
        "required": ["größe"],
    }
    grammar = compiler.compile(StructuredSpec(json=schema))
    assert not [n for n in grammar.narrowing if n.startswith("patternProperties")], grammar.narrowing
    matcher = grammar.new_matcher()
    ids = tokenizer.encode('{"größe":3}', add_special_tokens=False)
    assert feed(matcher, ids) and matcher.is_accepting()
