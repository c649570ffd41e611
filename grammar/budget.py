"""How an output is closed within its token budget: one logic for both backends.

The same greedy request must give the same tokens whichever backend serves its constraint (llguidance before the
background build, the token automaton after it, another replica), so both backends enforce one language (the
same regex, grammar/workers/job.py) and close it the same way: this class. The automaton knows its exact
distances, but llguidance cannot, so both follow what `CompletionSearch` finds; the search sees the same
normalised masks on both, so it finds the same completion.

Distances come from the search as a plan (a token path to acceptance); budget mode follows the plan token by
token, so the promised number of tokens is exactly what it takes. Under a budget, a freely sampled token must also
pass `fits_budget` (the engine's sampler takes the next runner-up otherwise): one token can commit the output to a
long required part (an optional key whose value is a date-time: +20 tokens), so "distance grows slowly" is not
assumed anywhere. The check keeps the invariant that a completion of at most the remaining budget is known, which
makes the plan the always-safe fallback.

Planning before the budget is near is skipped: after a plan of length d at position p, the distance at position q
is estimated as d + GROWTH * (q - p), and a new plan is made once the budget comes within MARGIN of that. That
estimate only decides when to start following the plan; correctness rests on the per-token check.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch

from loraplex.grammar.backend_outlines.automaton import token_row
from loraplex.grammar.backend_types import GrammarMatcher
from loraplex.grammar.search import CompletionSearch, SearchNode
from loraplex.grammar.spec import GrammarError

GROWTH = 4
MARGIN = 8


class PlannedMatcher(GrammarMatcher):
    """A matcher whose budget mode follows the completion search. Subclasses hold the state and give the search a
    node of it (`_node`), the plain mask (`_fill_plain`) and whether the text so far is complete (`_accepting`);
    they call `_advanced(token)` after every accepted token that is not EOS, and set `_terminated` when they accept
    EOS."""

    def _init_plan(
        self,
        search: CompletionSearch,
        plan: list[int],
        close_within_budget: bool,
        words: int,
        eos_ids: frozenset[int],
        eos_row: torch.Tensor,
        never: frozenset[int],
    ) -> None:
        self._terminated = False  # EOS was accepted
        self._search = search
        self._close = close_within_budget
        self._words = words
        self._eos_ids = eos_ids
        self._eos_row = eos_row
        self._never = never  # ids never allowed (special tokens; in the automaton's language, byte 0xF4)
        self._pos = 0
        self._plan: list[int] | None = list(plan)
        self._plan_pos = 0
        self._known: tuple[int, int] = (0, len(plan))  # (position, distance) of the last plan
        self._check = False  # the last mask was free under a budget: the sampled token needs fits_budget
        # what fits_budget found after each token it was asked about, since the last mask: (completion bytes, plan
        # or None); the token then accepted hands its entry to _found, so the next plan is not searched again
        self._after: dict[int, tuple[bytes, list[int] | None]] = {}
        self._found: tuple[int, bytes, list[int] | None] | None = None  # (position, bytes, plan or None)
        self._search_failed_at = -1  # a position where a budget check's search ran out (see fits_budget)

    # ---- what a backend provides -----------------------------------------------------------------
    @abstractmethod
    def _node(self) -> SearchNode:
        """The search's view of the current state (the search copies it before advancing)."""

    @abstractmethod
    def _accepting(self) -> bool:
        """The text so far is complete (EOS may follow)."""

    @abstractmethod
    def _fill_plain(self, out: torch.Tensor) -> None:
        """The constraint's own mask, EOS bits where accepting."""

    # ---- bookkeeping -----------------------------------------------------------------------------
    def _advanced(self, token_id: int) -> None:
        plan = self._current_plan()
        self._pos += 1
        if plan and plan[0] == token_id:
            self._plan, self._plan_pos = plan[1:], self._pos
        else:
            self._plan = None
            found = self._after.get(token_id)
            self._found = None if found is None else (self._pos, *found)
        self._after = {}

    def _copy_plan_to(self, copy: PlannedMatcher) -> None:
        copy._pos, copy._known, copy._plan_pos = self._pos, self._known, self._plan_pos
        copy._plan = None if self._plan is None else list(self._plan)

    # ---- distances -------------------------------------------------------------------------------
    def _current_plan(self) -> list[int] | None:
        return self._plan if self._plan is not None and self._plan_pos == self._pos else None

    def _make_plan(self) -> list[int]:
        plan = self._current_plan()
        if plan is None:
            found = self._found if self._found is not None and self._found[0] == self._pos else None
            if found is not None:  # fits_budget searched from this very state (the search is deterministic)
                plan = found[2] if found[2] is not None else self._search.tokenize(self._node(), found[1])
            else:
                plan = self._search.plan(self._node())
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
        # The plan is followed only when the budget leaves no slack beside it: with slack, a free token passes
        # fits_budget only if the search finds a completion within the rest, and that completion is the next plan
        # (`_found`), so the invariant holds without following a plan early (which took the model's choice away
        # from short outputs: a choice of words under max_tokens=4 was always the plan's word).
        plan = self._current_plan()
        if plan is not None:
            return remaining <= len(plan)
        pos, dist = self._known
        if remaining > dist + GROWTH * (self._pos - pos) + MARGIN:
            return False
        return remaining <= len(self._make_plan())

    def needs_budget_check(self) -> bool:
        return self._check

    def fits_budget(self, token_id: int, remaining_after: int) -> bool:
        if token_id in self._eos_ids:
            return self._accepting()
        if remaining_after < 0 or token_id in self._never:
            return False
        plan = self._current_plan()
        trial = self._node().deep_copy()  # a token that errors the parser (too complex) leaves this matcher as it was
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
        fits, path, tokens = self._search.check(trial, remaining_after)
        if path is not None:
            self._after[token_id] = (path, tokens)
        else:
            self._search_failed_at = self._pos
        return fits

    def budget_fallback(self) -> int:
        return self._make_plan()[0]

    # ---- masks -----------------------------------------------------------------------------------
    def _budget_mask(self, remaining_tokens: int | None) -> torch.Tensor | None:
        """The mask the budget imposes here (None: the plain one), and whether the sampled token is then checked;
        `fill_bitmask` and `forced_token` both start here, so they leave the same state behind."""
        self._check = False
        self._after = {}
        if self._terminated:
            return self._eos_row
        if remaining_tokens is None or not self._close:
            return None
        if not self._accepting() and self._near_budget(remaining_tokens):
            return torch.from_numpy(token_row(np.asarray(self._make_plan()[:1]), self._words))
        if remaining_tokens <= 0:
            return self._eos_row
        self._check = True
        return None

    def fill_bitmask(self, out: torch.Tensor, remaining_tokens: int | None = None) -> None:
        row = self._budget_mask(remaining_tokens)
        if row is None:
            self._fill_plain(out)
        else:
            out.copy_(row)
