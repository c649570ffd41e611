"""CompiledGrammar/GrammarMatcher over llguidance (Lark grammars, and constraints whose token
automaton would be too large to build quickly).

Masks are computed by llguidance each step. Distances come from CompletionSearch as a plan (a
token path to acceptance); budget mode follows the plan token by token, so the promised number
of tokens is exactly what it takes. Under a budget, a freely sampled token must also pass
`fits_budget` (the engine's sampler takes the next runner-up otherwise): one token can commit the
output to a long required part (an optional key whose value is a date-time: +20 tokens), so
"distance grows slowly" is not assumed anywhere. The check keeps the invariant that a completion of
at most the remaining budget is known, which makes the plan the always-safe fallback.

Planning before the budget is near is skipped: after a plan of length d at position p, the distance
at position q is estimated as d + GROWTH * (q - p), and a new plan is made once the budget comes
within MARGIN of that. That estimate only decides when to start following the plan; correctness
rests on the per-token check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from loraplex.grammar.backend_llguidance.search import CompletionSearch
from loraplex.grammar.backend_outlines.automaton import token_row
from loraplex.grammar.backend_types import CompiledGrammar, GrammarMatcher
from loraplex.grammar.spec import GrammarError
from loraplex.grammar.vocab import VocabInfo

log = logging.getLogger(__name__)

GROWTH = 4
MARGIN = 8
ENGAGE_SLACK = 4


@dataclass(frozen=True)
class VocabRows:
    """What every LLGuidanceGrammar of one tokenizer shares; built once per compiler (a pass over the
    vocabulary, which every compile paid when each grammar built its own: bench/README.md)."""

    words: int
    eos_ids: frozenset[int]
    special: frozenset[int]  # ids without bytes that are not EOS: never allowed
    allowed_row: torch.Tensor  # int32 [words]: every token with bytes
    eos_row: torch.Tensor  # int32 [words]: the EOS ids

    @classmethod
    def of(cls, info: VocabInfo) -> VocabRows:
        eos_ids = frozenset(info.eos_ids)
        real = np.asarray([t for t, b in enumerate(info.token_bytes) if b is not None], dtype=np.int64)
        return cls(
            words=info.words,
            eos_ids=eos_ids,
            special=frozenset(t for t, b in enumerate(info.token_bytes) if b is None) - eos_ids,
            allowed_row=torch.from_numpy(token_row(real, info.words)),
            eos_row=torch.from_numpy(token_row(np.asarray(sorted(eos_ids)), info.words)),
        )


class LLGuidanceGrammar(CompiledGrammar):
    backend = "llguidance"

    def __init__(
        self,
        grammar: str,
        ll_tokenizer: Any,
        rows: VocabRows,
        search: CompletionSearch,
        min_tokens: int,
        plan: list[int],
        close_within_budget: bool,
        template: Any = None,
    ) -> None:
        """``template``: a fresh LLMatcher of ``grammar`` already built (the compiler builds it while the
        worker plans), else it is built here."""
        from llguidance import LLMatcher

        if template is None:
            template = LLMatcher(ll_tokenizer, grammar, log_level=0)
        if template.is_error():
            raise GrammarError(f"llguidance rejected the grammar: {template.get_error()}")
        self._template = template
        self.grammar = grammar
        self.search = search
        self.min_tokens = min_tokens
        self.plan = list(plan)
        self.close_within_budget = close_within_budget
        self.eos_ids = rows.eos_ids
        self.words = rows.words
        self.allowed_row = rows.allowed_row
        self.eos_row = rows.eos_row
        self.special = rows.special

    def new_matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self, self._template.deep_copy())


class LLGuidanceMatcher(GrammarMatcher):
    def __init__(self, grammar: LLGuidanceGrammar, matcher: Any) -> None:
        self._g = grammar
        self._m = matcher
        self._pos = 0
        self._terminated = False
        self._plan: list[int] | None = list(grammar.plan)
        self._plan_pos = 0
        self._known: tuple[int, int] = (0, grammar.min_tokens)  # (position, distance) of the last plan
        self._buf = torch.zeros(grammar.words, dtype=torch.int32)
        self._check = False  # the last mask was free under a budget: the sampled token needs fits_budget
        # what fits_budget found after each token it was asked about, since the last mask: (completion bytes, plan
        # or None); the token then accepted hands its entry to _found, so the next plan is not searched again
        self._after: dict[int, tuple[bytes, list[int] | None]] = {}
        self._found: tuple[int, bytes, list[int] | None] | None = None  # (position, bytes, plan or None)
        self._search_failed_at = -1  # a position where a budget check's search ran out (see fits_budget)

    # ---- state -----------------------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        g = self._g
        if self._terminated or self.failure is not None:
            return False
        if token_id in g.eos_ids:
            if self._m.is_accepting():
                self._terminated = True
                return True
            return False
        if token_id in g.special or self._m.validate_tokens([token_id]) != 1:
            return False
        if not self._m.consume_token(token_id):
            # validate_tokens said yes, but llguidance's lexer can still give up on a long document ("too many
            # expressions constructed"): the matcher refuses from here on, so its request stops with an error
            # and nobody else's step fails
            self.failure = f"llguidance matcher failed: {self._m.get_error().splitlines()[0]}"
            log.warning("%s", self.failure)
            return False
        plan = self._current_plan()
        self._pos += 1
        if plan and plan[0] == token_id:
            self._plan, self._plan_pos = plan[1:], self._pos
        else:
            self._plan = None
            found = self._after.get(token_id)
            self._found = None if found is None else (self._pos, *found)
        self._after = {}
        return True

    def is_accepting(self) -> bool:
        return self.failure is None and (self._terminated or self._m.is_accepting())

    def is_terminated(self) -> bool:
        return self._terminated or (self._m.is_accepting() and self._m.is_stopped())

    def valid_prefix(self, token_ids: list[int]) -> int:
        if self._terminated:
            return 0
        g = self._g
        plain = []
        for token in token_ids:  # llguidance's count up to the first EOS or special token
            if token in g.eos_ids or token in g.special:
                break
            plain.append(token)
        n = int(self._m.validate_tokens(plain)) if plain else 0
        if n == len(plain) < len(token_ids) and token_ids[n] in g.eos_ids:  # EOS ends a complete output only
            trial = self._m.deep_copy()
            if all(trial.consume_token(t) for t in plain) and trial.is_accepting():
                n += 1
        return n

    def native_forced_bytes(self) -> bytes | None:
        return b"" if self._terminated else bytes(self._m.compute_ff_bytes())

    def fork(self) -> LLGuidanceMatcher:
        copy = LLGuidanceMatcher(self._g, self._m.deep_copy())
        copy._pos, copy._terminated, copy._known = self._pos, self._terminated, self._known
        copy.failure = self.failure
        copy._plan_pos = self._plan_pos
        copy._plan = None if self._plan is None else list(self._plan)
        return copy

    def bitmask_words(self) -> int:
        return self._g.words

    # ---- distances -------------------------------------------------------------------------------
    def _current_plan(self) -> list[int] | None:
        return self._plan if self._plan is not None and self._plan_pos == self._pos else None

    def _make_plan(self) -> list[int]:
        plan = self._current_plan()
        if plan is None:
            found = self._found if self._found is not None and self._found[0] == self._pos else None
            if found is not None:  # fits_budget searched from this very state (the search is deterministic)
                plan = found[2] if found[2] is not None else self._g.search.tokenize(self._m, found[1])
            else:
                plan = self._g.search.plan(self._m)
            if plan is None:
                raise GrammarError("no completion found within the search bounds")
            self._plan, self._plan_pos = plan, self._pos
            self._known = (self._pos, len(plan))
        return plan

    def min_tokens_to_accept(self) -> int:
        if self.is_accepting():
            return 0
        return len(self._make_plan())

    def _near_budget(self, remaining: int) -> bool:
        # The plan is a greedy upper bound, not the true distance: a free token taken with only a token
        # or two of slack can land where the next greedy plan no longer fits. So the plan is followed
        # once the budget comes within ENGAGE_SLACK of its length, leaving room for that overestimate.
        plan = self._current_plan()
        if plan is not None:
            return remaining <= len(plan) + ENGAGE_SLACK
        pos, dist = self._known
        if remaining > dist + GROWTH * (self._pos - pos) + MARGIN + ENGAGE_SLACK:
            return False
        return remaining <= len(self._make_plan()) + ENGAGE_SLACK

    def needs_budget_check(self) -> bool:
        return self._check

    def fits_budget(self, token_id: int, remaining_after: int) -> bool:
        g = self._g
        if token_id in g.eos_ids:
            return bool(self._m.is_accepting())
        if remaining_after < 0 or token_id in g.special:
            return False
        plan = self._current_plan()
        trial = self._m.deep_copy()  # a token that errors the parser (too complex) leaves this matcher as it was
        if not trial.consume_token(token_id) or trial.is_error():
            return False
        if plan and plan[0] == token_id:
            return len(plan) - 1 <= remaining_after
        if trial.is_accepting():
            return True
        if self._search_failed_at == self._pos:
            # one bounded search already ran out at this position: the sampler's other candidates are passed
            # over without another (a step pays for at most one), and the budget fallback follows the plan
            return False
        fits, path, tokens = g.search.check(trial, remaining_after)
        if path is not None:
            self._after[token_id] = (path, tokens)
        else:
            self._search_failed_at = self._pos
        return fits

    def budget_fallback(self) -> int:
        return self._make_plan()[0]

    # ---- masks -----------------------------------------------------------------------------------
    def fill_bitmask(self, out: torch.Tensor, remaining_tokens: int | None = None) -> None:
        g = self._g
        self._check = False
        self._after = {}
        if self._terminated:
            out.copy_(g.eos_row)
            return
        if (
            remaining_tokens is not None
            and g.close_within_budget
            and not self._m.is_accepting()
            and self._near_budget(remaining_tokens)
        ):
            out.copy_(torch.from_numpy(token_row(np.asarray(self._make_plan()[:1]), g.words)))
            return
        if remaining_tokens is not None and g.close_within_budget and remaining_tokens <= 0:
            out.copy_(g.eos_row)
            return
        self._check = remaining_tokens is not None and g.close_within_budget
        buf = self._buf
        self._m.unsafe_compute_mask_ptr(buf.data_ptr(), g.words * 4)
        buf.bitwise_and_(g.allowed_row)
        if self._m.is_accepting():
            buf.bitwise_or_(g.eos_row)
        out.copy_(buf)
