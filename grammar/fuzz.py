"""Model-free random walks through a compiled grammar's masks: the soundness check of structured output.

A walk starts a matcher, and at each step draws a token uniformly from the ones the mask allows (EOS
included once the output is complete), under a token budget that the matcher must respect
(``close_within_budget``). What it produces is what a model could produce: if any walk's text does not
validate against the schema, the grammar is wider than the schema.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from loraplex.grammar.backend_types import CompiledGrammar
from loraplex.grammar.vocab import VocabInfo


@dataclass
class Walk:
    text: str | None  # None: the bytes were not UTF-8 (a mask let a token split a character)
    tokens: list[int]
    closed: bool  # the matcher accepted the output within the budget
    mask_seconds: list[float]
    error: str | None = None  # the matcher refused a token its own mask allowed (a bug, never a model's fault)


def allowed_tokens(mask: torch.Tensor, vocab_size: int) -> np.ndarray:
    """Token ids whose bit is set in an int32 bitmask row (bit b of word w = token 32 * w + b)."""
    bits = np.unpackbits(mask.numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])


def random_walk(grammar: CompiledGrammar, vocab: VocabInfo, rng: random.Random, budget: int) -> Walk:
    import time

    matcher = grammar.new_matcher()
    mask = torch.zeros(vocab.words, dtype=torch.int32)
    tokens: list[int] = []
    seconds: list[float] = []
    eos = set(vocab.eos_ids)
    for used in range(budget):
        t = time.perf_counter()
        matcher.fill_bitmask(mask, remaining_tokens=budget - used)
        seconds.append(time.perf_counter() - t)
        allowed = allowed_tokens(mask, vocab.vocab_size)
        if len(allowed) == 0:
            break
        token = int(allowed[rng.randrange(len(allowed))])
        if matcher.needs_budget_check() and not matcher.fits_budget(token, budget - used - 1):
            token = matcher.budget_fallback()
        if not matcher.accept_token(token):
            error = f"the matcher refused token {token} after {tokens}, which its own mask allowed"
            return Walk(None, tokens, False, seconds, error)
        if token in eos:
            break
        tokens.append(token)
        if matcher.is_terminated():
            break
    data = b"".join(vocab.token_bytes[t] or b"" for t in tokens)
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return Walk(text, tokens, matcher.is_accepting(), seconds)
