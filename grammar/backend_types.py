"""The interface the engine codes against: a compiled constraint and its per-sequence matcher."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Literal, TypeAlias, get_args

import numpy as np
import torch

if TYPE_CHECKING:
    from loraplex.grammar.backend_llguidance.grounded import Grounding

# What serves a compiled grammar: a token automaton (outlines_core's Index), llguidance, or (a grounded schema bound
# to a request's sources) our span automaton (grammar/span_grammar.py).
ServingBackend: TypeAlias = Literal["outlines", "llguidance", "span"]
# What a GrammarCompiler is asked to use: one of them always, or "auto" (workers/job.py says how it chooses).
GrammarBackend: TypeAlias = Literal["auto", "outlines", "llguidance"]
GRAMMAR_BACKENDS: tuple[GrammarBackend, ...] = get_args(GrammarBackend)


class GrammarMatcher(ABC):
    """Where one sequence is inside its constraint. Used from one thread (the engine loop)."""

    failure: str | None = None  # why the backend gave up mid-output (it then refuses every token); None while working
    answer_start: int = 0  # output tokens before the constrained text (a reasoning that came first)

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the token is not allowed here.

        An EOS id is accepted exactly when the text so far is complete; afterwards the matcher is
        terminated and accepts nothing more.
        """

    @abstractmethod
    def fill_bitmask(self, out: torch.Tensor, remaining_tokens: int | None = None) -> None:
        """Write the allowed-token bitmask into `out` (int32 [ceil(vocab_size / 32)], any device).

        Bit b of word w set = token 32*w+b allowed (LSB first). EOS ids are allowed exactly when
        accepting; special tokens never. When `remaining_tokens` is given and is at most
        `min_tokens_to_accept()` (and the spec's close_within_budget is on), only tokens on a
        shortest completion path are allowed, so the output ends complete within the budget.
        """

    @abstractmethod
    def is_accepting(self) -> bool:
        """The text so far is a complete valid output."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Accepting and nothing more can follow (or EOS was accepted)."""

    @abstractmethod
    def fork(self) -> GrammarMatcher:
        """An independent copy at the same position (byte-level jump-forward walks a scratch copy)."""

    @abstractmethod
    def bitmask_words(self) -> int:
        """Length of this constraint's bitmask in int32 words."""

    def needs_budget_check(self) -> bool:
        """Whether the token sampled under the last `fill_bitmask` must pass `fits_budget`.

        True where the mask alone cannot keep the output closable within the budget (llguidance:
        one free token can commit to a long required part). Exact automaton masks never need it.
        """
        return False

    def fits_budget(self, token_id: int, remaining_after: int) -> bool:
        """Whether, after `token_id`, a complete output is still reachable in `remaining_after` tokens."""
        return True

    def budget_fallback(self) -> int:
        """A token that always fits the budget (the next one on a known completion path)."""
        raise NotImplementedError

    def forced_token(self, remaining_tokens: int | None = None) -> int | None:
        """The one token the mask allows next (as `fill_bitmask` with the same budget fills it), else None.

        Jump-forward appends such tokens without sampling: the sampler could pick nothing else. May be an EOS id
        (the engine does not jump over those: it finishes sequences by its own rules).
        """
        words = torch.zeros(self.bitmask_words(), dtype=torch.int32)
        self.fill_bitmask(words, remaining_tokens)
        return single_token(words)

    def native_forced_bytes(self) -> bytes | None:
        """The bytes the backend itself says are forced from here (None: it has no such call; the engine then walks
        the masks, grammar.forced_bytes). Must agree with that walk: tests compare the two."""
        return None

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many leading tokens of `token_ids` the constraint allows in a row from here; state unchanged."""
        return 0

    @abstractmethod
    def min_tokens_to_accept(self) -> int:
        """Fewest tokens from here to a complete output (0 when accepting).

        Exact on the automaton backend; on llguidance the length of a concrete completion found
        by a bounded search (achievable, so budget mode still ends complete, but not always the
        minimum).
        """


def single_token(bitmask: torch.Tensor) -> int | None:
    """The token of a bitmask with exactly one bit set, else None."""
    words = bitmask.numpy().view(np.uint32)
    nz = np.flatnonzero(words)
    if len(nz) != 1:
        return None
    w = int(words[nz[0]])
    if w & (w - 1):
        return None
    return 32 * int(nz[0]) + w.bit_length() - 1


class CompiledGrammar(ABC):
    """A constraint compiled for one tokenizer; shared by every request that uses it."""

    min_tokens: int  # fewest tokens from the start to a complete output (see min_tokens_to_accept)
    backend: ServingBackend
    # How the constraint was narrowed to be enforceable ("keyword at pointer: how"); empty: enforced exactly.
    narrowing: tuple[str, ...] = ()
    # a grammar bound to a request's source text (x-loraplex-grounded): finds where its values came from
    grounding: Grounding | None = None

    @abstractmethod
    def new_matcher(self) -> GrammarMatcher:
        """A fresh matcher at the start of the output."""
