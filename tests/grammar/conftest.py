"""Fixtures for the grammar tests: SmolLM2's real tokenizer and shared compilers."""

from __future__ import annotations

import pytest

from tests.grammar.helpers import EOS, VOCAB


@pytest.fixture(scope="session")
def tokenizer(smol_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_dir)


@pytest.fixture(scope="session")
def compiler(tokenizer):
    """The default compiler (auto backend, strict objects), without background upgrades."""
    from loraplex.grammar import GrammarCompiler

    c = GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB, upgrade_in_background=False)
    yield c
    c.close()


@pytest.fixture(scope="session")
def llg_compiler(tokenizer):
    """Every constraint through llguidance."""
    from loraplex.grammar import GrammarCompiler

    c = GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB, backend="llguidance")
    yield c
    c.close()


@pytest.fixture(scope="session")
def dfa_compiler(tokenizer):
    """Every constraint through outlines_core's token automaton (fails for what has no regex)."""
    from loraplex.grammar import GrammarCompiler

    c = GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB, backend="outlines", timeout_s=60)
    yield c
    c.close()
