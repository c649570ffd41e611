"""Matcher behaviour for regex, choice and Lark grammars on both backends: acceptance, EOS,
special tokens, termination, the bitmask layout."""

from __future__ import annotations

import pytest
import torch

from loraplex.grammar import GrammarCompiler, GrammarError, StructuredSpec
from tests.grammar.helpers import EOS, VOCAB, allowed_ids, feed

SPECIAL = list(range(17))  # <|endoftext|>, <|im_start|>, <|im_end|> (EOS), <repo_name>, ...
BACKENDS = ["dfa_compiler", "llg_compiler"]


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _mask(m, remaining=None) -> list[int]:
    out = torch.zeros((VOCAB + 31) // 32, dtype=torch.int32)
    m.fill_bitmask(out, remaining)
    return allowed_ids(out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_regex(request, tokenizer, backend):
    g = request.getfixturevalue(backend).compile(StructuredSpec(regex=r"-?[0-9]+(\.[0-9]+)?"))
    assert g.min_tokens == 1
    for text, ok in [("12", True), ("-1.5", True), ("1.", False), ("1.2.3", None), ("abc", None)]:
        m = g.new_matcher()
        fed = feed(m, _ids(tokenizer, text))
        assert (fed and m.is_accepting()) == bool(ok), text
        if ok is None:
            assert not fed
    m = g.new_matcher()
    assert feed(m, _ids(tokenizer, "3"))
    assert not m.is_terminated()  # more digits may follow
    allowed = _mask(m)
    assert EOS in allowed and not set(SPECIAL) - {EOS} & set(allowed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_regex_anchors_are_implied(request, tokenizer, backend):
    g = request.getfixturevalue(backend).compile(StructuredSpec(regex=r"^[a-z]+\$$"))
    m = g.new_matcher()
    assert feed(m, _ids(tokenizer, "abc$")) and m.is_accepting()


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejected_token_leaves_state_unchanged(request, tokenizer, backend):
    g = request.getfixturevalue(backend).compile(StructuredSpec(regex="ab+c"))
    m = g.new_matcher()
    assert feed(m, _ids(tokenizer, "ab"))
    before = _mask(m)
    assert not m.accept_token(_ids(tokenizer, "x")[0])
    assert not m.accept_token(EOS) and not m.accept_token(1)
    assert _mask(m) == before
    assert feed(m, _ids(tokenizer, "c")) and m.is_accepting()


@pytest.mark.parametrize("backend", BACKENDS)
def test_choice(request, tokenizer, backend):
    g = request.getfixturevalue(backend).compile(StructuredSpec(choice=["yes", "no", "a.b (c)*"]))
    for text in ["yes", "no", "a.b (c)*"]:
        m = g.new_matcher()
        assert feed(m, _ids(tokenizer, text)) and m.is_accepting() and m.is_terminated(), text
        assert _mask(m) == [EOS]
        assert m.accept_token(EOS) and not m.accept_token(EOS)
    m = g.new_matcher()
    assert not feed(m, _ids(tokenizer, "abb"))
    m = g.new_matcher()
    assert EOS not in _mask(m) and not m.is_accepting() and m.min_tokens_to_accept() >= 1


def test_grammar_lark(compiler, tokenizer):
    g = compiler.compile(
        StructuredSpec(grammar='start: expr\nexpr: term (("+" | "*") term)*\nterm: /[0-9]+/ | "(" expr ")"\n')
    )
    assert g.backend == "llguidance" and g.min_tokens == 1
    for text, ok in [("(1+2)*3", True), ("((4))", True), ("1+", False), ("(1", False), ("1++2", None)]:
        m = g.new_matcher()
        fed = feed(m, _ids(tokenizer, text))
        assert (fed and m.is_accepting()) == bool(ok), text
    m = g.new_matcher()
    assert feed(m, _ids(tokenizer, "((1"))
    assert m.min_tokens_to_accept() == len(tokenizer.encode("))", add_special_tokens=False)) == 1
    assert EOS not in _mask(m)


def test_grammar_cannot_reach_special_tokens(compiler, tokenizer):
    g = compiler.compile(StructuredSpec(grammar='start: "x" <|im_start|>? "y"\n'))
    m = g.new_matcher()
    assert feed(m, _ids(tokenizer, "x"))
    assert 1 not in _mask(m) and not m.accept_token(1)
    assert feed(m, _ids(tokenizer, "y")) and m.is_accepting()
    with pytest.raises(GrammarError, match="no complete output"):  # only reachable through a special token
        compiler.compile(StructuredSpec(grammar='start: "x" <|im_start|> "y"\n'))


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_never_allows_whitespace_or_special_tokens(request, tokenizer, backend):
    g = request.getfixturevalue(backend).compile(
        StructuredSpec(
            json={
                "type": "object",
                "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
                "required": ["a"],
            }
        )
    )
    m = g.new_matcher()
    space_ids = {t for t in range(17, VOCAB) if tokenizer.convert_ids_to_tokens(t).strip("ĠĉĊ") == ""}
    for piece in ['{"a":[', "1", ",", "2", "]", "}"]:
        allowed = set(_mask(m))
        assert not allowed & space_ids and not allowed & set(SPECIAL) - {EOS}
        assert feed(m, _ids(tokenizer, piece)), piece
    assert m.is_accepting() and m.is_terminated() and _mask(m) == [EOS]


def test_bitmask_layout_and_padding(tokenizer):
    padded = VOCAB + 64
    with GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=padded) as c:
        for backend_spec in [StructuredSpec(choice=["x"]), StructuredSpec(grammar='start: "x"\n')]:
            g = c.compile(backend_spec)
            m = g.new_matcher()
            out = torch.full(((padded + 31) // 32,), -1, dtype=torch.int32)
            m.fill_bitmask(out)
            x = _ids(tokenizer, "x")[0]
            assert allowed_ids(out) == [x]
            assert (out[x // 32].item() >> (x % 32)) & 1  # bit x%32 of word x//32, LSB first
            assert not out[VOCAB // 32 :].any()  # padding ids are never allowed


def test_two_eos_ids(tokenizer):
    with GrammarCompiler(tokenizer, eos_token_ids=[EOS, 0], vocab_size=VOCAB) as c:
        m = c.compile(StructuredSpec(choice=["ok"])).new_matcher()
        assert feed(m, _ids(tokenizer, "ok"))
        assert _mask(m) == [0, EOS]
        assert m.accept_token(0) and m.is_terminated()


@pytest.mark.parametrize("backend", BACKENDS)
def test_forced_token_and_valid_prefix(request, tokenizer, backend):
    """Jump-forward and draft cutting (engine.spec.speculative): the one token a mask allows, and how many drafted
    tokens the constraint takes in a row, without moving the matcher."""
    compiler = request.getfixturevalue(backend)
    brace = compiler.compile(StructuredSpec(regex=r"\{")).new_matcher()
    assert brace.forced_token() == tokenizer.convert_tokens_to_ids("{")  # no other token spells "{" alone
    assert feed(brace, [tokenizer.convert_tokens_to_ids("{")])
    assert brace.forced_token() == EOS  # complete, nothing may follow
    m = compiler.compile(StructuredSpec(choice=["Lyon", "Paris"])).new_matcher()
    assert m.forced_token() is None  # "L", "Ly", "P", "Pa", ... all allowed
    paris = _ids(tokenizer, "Paris")
    assert m.valid_prefix([*paris, EOS]) == len(paris) + 1
    assert m.valid_prefix([*paris, *_ids(tokenizer, "!")]) == len(paris)
    assert m.valid_prefix(_ids(tokenizer, "Rome")) == 0
    assert feed(m, _ids(tokenizer, "Lyon")) and m.is_accepting()  # the checks above left it at the start


def test_llguidance_plan_after_fits_budget_reuses_that_search(llg_compiler, tokenizer, monkeypatch):
    """The completion fits_budget found after a token is the next plan once that token is accepted: the same
    plan a fresh search from that state finds (no second search), and it ends complete."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "tags"],
        "additionalProperties": False,
    }
    g = llg_compiler.compile(StructuredSpec(json=schema))
    assert g.backend == "llguidance"
    prefix = _ids(tokenizer, '{"name":"ab')
    m = g.new_matcher()
    assert feed(m, prefix)
    assert _mask(m, remaining=100) and m.needs_budget_check()
    token = _ids(tokenizer, "c")[0]
    assert m.fits_budget(token, 99) and m.accept_token(token)
    fresh = g.new_matcher()
    assert feed(fresh, [*prefix, token])
    expected = g.search.plan(fresh._m)  # the search from the same state, on an independent matcher
    calls = []
    search_bytes = g.search.completion_bytes
    monkeypatch.setattr(g.search, "completion_bytes", lambda matcher: calls.append(1) or search_bytes(matcher))
    assert m.min_tokens_to_accept() == len(expected) and not calls
    for t in expected:
        assert m.fits_budget(t, 99) and m.accept_token(t)
    assert m.is_accepting()


def test_a_matcher_llguidance_gives_up_on_stops_its_request_only(llg_compiler, tokenizer):
    """llguidance's lexer can fail on a long document after validate_tokens said yes ("too many expressions
    constructed", met by the JSONSchemaBench run on detekt's schema): that request stops with an error
    finish instead of an exception in the engine's step (which would fail every request in the batch)."""
    from types import SimpleNamespace

    from loraplex.engine.structured import StructuredOutputManager

    grammar = llg_compiler.compile(StructuredSpec(json={"type": "object", "properties": {"a": {"type": "string"}}}))
    matcher = grammar.new_matcher()
    ids = _ids(tokenizer, '{"a":"xyz"}')
    assert feed(matcher, ids[:2])

    class GivingUp:  # llguidance's matcher at the point its lexer runs out
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def consume_token(self, token_id):
            return False

        def get_error(self):
            return "lexer error: too many expressions constructed\n<state>..."

    matcher._m = GivingUp(matcher._m)
    seq = SimpleNamespace(grammar=matcher, remaining_tokens=None)
    assert StructuredOutputManager.advance(seq, ids[2]) == "error"
    assert matcher.failure == "llguidance matcher failed: lexer error: too many expressions constructed"
    assert not matcher.accept_token(ids[2]) and not matcher.is_accepting()
    assert matcher.fork().failure == matcher.failure
