"""`tagged_json`: free text without the tag, or text, the tag, a value of the schema, the closing tag (more
blocks with parallel). What tool_choice auto compiles to; only llguidance holds it (text is a complement)."""

from __future__ import annotations

import pytest

from loraplex.grammar import GrammarError, StructuredSpec
from tests.grammar.helpers import EOS, feed

CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "day": {"type": "string", "format": "date"}},
            "required": ["city", "day"],
        },
    },
    "required": ["name", "arguments"],
}
GOOD = '{"name":"get_weather","arguments":{"city":"Paris","day":"2024-02-29"}}'
BAD_DATE = '{"name":"get_weather","arguments":{"city":"Paris","day":"2023-02-29"}}'
WRONG_NAME = '{"name":"get_time","arguments":{"city":"Paris","day":"2024-02-29"}}'


def _spec(parallel: bool, schema=CALL, **kwargs) -> StructuredSpec:
    tagged = {"schema": schema, "open": "<tool_call>", "close": "</tool_call>", "parallel": parallel}
    return StructuredSpec(tagged_json=tagged, **kwargs)


def _complete(tokenizer, grammar, text: str) -> bool:
    """Whether `text` followed by EOS is a whole output of the grammar."""
    m = grammar.new_matcher()
    return feed(m, tokenizer.encode(text, add_special_tokens=False)) and m.accept_token(EOS)


@pytest.mark.parametrize(
    ("text", "parallel", "ok"),
    [
        ("It is sunny in Paris.", False, True),
        ("", False, True),
        ("a half-written tag <tool_ is still text", False, True),
        (f"<tool_call>{GOOD}</tool_call>", False, True),
        (f"Let me check.\n<tool_call>{GOOD}</tool_call>", False, True),
        (f"<tool_call>{GOOD}</tool_call>\n<tool_call>{GOOD}</tool_call>", True, True),
        (f"<tool_call>{GOOD}</tool_call>\n<tool_call>{GOOD}</tool_call>", False, False),
        (f"<tool_call>{GOOD}</tool_call> and more text", True, False),
        (f"<tool_call>{GOOD}", False, False),
        (f"<tool_call>{BAD_DATE}</tool_call>", False, False),
        (f"<tool_call>{WRONG_NAME}</tool_call>", False, False),
        ("<tool_call>not json</tool_call>", False, False),
        ('<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>', False, False),
    ],
)
def test_text_or_tagged_calls(tokenizer, compiler, text: str, parallel: bool, ok: bool) -> None:
    grammar = compiler.compile(_spec(parallel))
    assert grammar.backend == "llguidance"
    assert _complete(tokenizer, grammar, text) is ok


def test_text_ends_anywhere_and_the_tag_commits(tokenizer, compiler) -> None:
    grammar = compiler.compile(_spec(False))
    assert grammar.min_tokens == 0  # an empty answer is text
    m = grammar.new_matcher()
    assert feed(m, tokenizer.encode("Sure.", add_special_tokens=False)) and m.is_accepting()
    assert feed(m, tokenizer.encode(" <tool_call>", add_special_tokens=False))
    assert not m.is_accepting() and m.min_tokens_to_accept() > 0  # once tagged, only a whole call ends it
    assert not m.accept_token(EOS)


def test_a_json_answer_instead_of_text(tokenizer, compiler) -> None:
    answer = {"type": "object", "properties": {"temp": {"type": "integer"}}, "required": ["temp"]}
    tagged = {"schema": CALL, "open": "<tool_call>", "close": "</tool_call>", "parallel": False, "text": answer}
    grammar = compiler.compile(StructuredSpec(tagged_json=tagged))
    for text, ok in [
        ('{"temp":21}', True),
        (f"<tool_call>{GOOD}</tool_call>", True),
        ("It is 21 degrees.", False),
        ('{"temp":"warm"}', False),
        (f"Let me check.<tool_call>{GOOD}</tool_call>", False),
        (f"<tool_call>{BAD_DATE}</tool_call>", False),
    ]:
        assert _complete(tokenizer, grammar, text) is ok, text


def test_narrowing_is_reported_or_refused(compiler) -> None:
    schema = {**CALL, "properties": {**CALL["properties"], "arguments": {"type": "array", "uniqueItems": True}}}
    grammar = compiler.compile(_spec(False, schema))
    assert any("uniqueItems" in n for n in grammar.narrowing)
    with pytest.raises(GrammarError, match="narrowed"):
        compiler.compile(_spec(False, schema, allow_narrowing=False))


@pytest.mark.parametrize(
    "tagged",
    [
        {"schema": CALL, "open": "", "close": "</tool_call>", "parallel": False},
        {"schema": CALL, "open": "<tool_call>", "close": "</tool_call>"},
        {"schema": "text", "open": "<tool_call>", "close": "</tool_call>", "parallel": False},
    ],
)
def test_malformed_spec_is_refused(tagged) -> None:
    with pytest.raises(GrammarError, match="tagged_json"):
        StructuredSpec(tagged_json=tagged)
