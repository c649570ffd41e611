"""Forced bytes (byte-level jump-forward's input) on SmolLM2's tokenizer, both backends: the text every allowed
continuation starts with, written out by hand, whether it completes the output, the byte limit, llguidance's own
answer equal to the mask walk, and the matcher left where it was."""

from __future__ import annotations

import pytest

from loraplex.engine.structured import utf8_prefix
from loraplex.grammar import StructuredSpec
from loraplex.grammar.forced_bytes import ByteTable

SCHEMA = {
    "type": "object",
    "properties": {"invoice_number": {"type": "string"}, "paid": {"type": "boolean"}},
    "required": ["invoice_number", "paid"],
    "additionalProperties": False,
}
# (text already generated, forced bytes after it, whether they complete the output)
SCHEMA_STEPS = [
    ("", b'{"invoice_number":"', False),
    ('{"invoice_number":"INV', b"", False),  # inside a free string: nothing is forced
    ('{"invoice_number":"INV-1"', b',"paid":', False),
    ('{"invoice_number":"INV-1","paid":t', b"rue}", True),
    ('{"invoice_number":"INV-1","paid":f', b"alse}", True),
]
REGEX_STEPS = [("", b"INV-", False), ("INV-1234", b"", False), ("INV-12345", b"", True)]


@pytest.fixture(scope="module")
def table(compiler) -> ByteTable:
    return ByteTable(compiler.vocab)


def _at(compiler, tokenizer, spec: StructuredSpec, text: str):
    matcher = compiler.compile(spec).new_matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert matcher.accept_token(token), (text, token)
    return matcher


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
@pytest.mark.parametrize(
    "spec, steps", [(StructuredSpec(json=SCHEMA), SCHEMA_STEPS), (StructuredSpec(regex=r"INV-[0-9]{5}"), REGEX_STEPS)]
)
def test_forced_bytes_written_out(backend, spec, steps, table, dfa_compiler, llg_compiler, tokenizer):
    compiler = dfa_compiler if backend == "outlines" else llg_compiler
    for text, forced, complete in steps:
        matcher = _at(compiler, tokenizer, spec, text)
        assert table.walk(matcher) == (forced, complete), text
        assert table.forced(matcher) == (forced, complete), text  # llguidance: its own call; outlines: the walk


def test_lark_grammar_on_llguidance(table, llg_compiler, tokenizer):
    spec = StructuredSpec(grammar='start: "hello" " " NAME "!"\nNAME: /[a-z]+/')
    assert table.forced(_at(llg_compiler, tokenizer, spec, "")) == (b"hello ", False)
    assert table.walk(_at(llg_compiler, tokenizer, spec, "")) == (b"hello ", False)
    assert table.forced(_at(llg_compiler, tokenizer, spec, "hello wo")) == (b"", False)


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_limit_and_matcher_unchanged(backend, table, dfa_compiler, llg_compiler, tokenizer):
    compiler = dfa_compiler if backend == "outlines" else llg_compiler
    matcher = _at(compiler, tokenizer, StructuredSpec(json=SCHEMA), "")
    assert table.forced(matcher, limit=5) == (b'{"inv', False)
    assert table.walk(matcher, limit=5) == (b'{"inv', False)
    # the walks advanced scratch copies only: the matcher still takes the first token of the output
    assert matcher.accept_token(tokenizer.encode('{"', add_special_tokens=False)[0])
    assert table.forced(matcher) == (b'invoice_number":"', False)


def test_fork_is_independent(llg_compiler, dfa_compiler, tokenizer):
    for compiler in (dfa_compiler, llg_compiler):
        matcher = _at(compiler, tokenizer, StructuredSpec(regex=r"ab(c|d)"), "")
        copy = matcher.fork()
        abc = tokenizer.encode("abc", add_special_tokens=False)
        abd = tokenizer.encode("abd", add_special_tokens=False)
        assert all(copy.accept_token(t) for t in abc) and copy.is_accepting()
        assert not matcher.is_accepting() and matcher.valid_prefix(abd) == len(abd)
        assert all(matcher.accept_token(t) for t in abd) and matcher.is_accepting()


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_multibyte_characters(backend, table, dfa_compiler, llg_compiler, tokenizer):
    compiler = dfa_compiler if backend == "outlines" else llg_compiler
    matcher = _at(compiler, tokenizer, StructuredSpec(regex=r"Zürich-[0-9]"), "")
    assert table.forced(matcher) == ("Zürich-".encode(), False)
    assert table.forced(matcher, limit=2) == (b"Z\xc3", False)  # the limit may cut a character in two


def test_utf8_prefix_keeps_whole_characters():
    assert utf8_prefix(b"Z\xc3") == "Z"
    assert utf8_prefix("Zü".encode()) == "Zü"
    assert utf8_prefix("€".encode()[:2]) == ""
    assert utf8_prefix(b"") == ""
