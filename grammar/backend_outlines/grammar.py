"""CompiledGrammar/GrammarMatcher over a precomputed token automaton (the outlines_core backend).

A matcher is one integer state: accepting a token is two table lookups (token -> class, then [state, class] -> next
state), a mask fill is a copy of that state's precomputed row. Budget mode is grammar/budget.py's, shared with
llguidance so that both close an output alike; the search it runs is memoised per state (backend_outlines.node).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from loraplex.grammar.backend_outlines.automaton import AutomatonData, token_row
from loraplex.grammar.backend_outlines.node import AutomatonNode, AutomatonStates, ByteTables
from loraplex.grammar.backend_types import CompiledGrammar, single_token
from loraplex.grammar.budget import PlannedMatcher
from loraplex.grammar.search import CompletionSearch


class AutomatonGrammar(CompiledGrammar):
    backend = "outlines"

    def __init__(
        self,
        data: AutomatonData,
        eos_ids: tuple[int, ...],
        close_within_budget: bool,
        search: CompletionSearch,
        tables: ByteTables,
        plan: list[int],
    ) -> None:
        """``search``: the vocabulary's search of the automaton's language; ``plan``: the search's completion from
        the start (the compile worker made it)."""
        if not search.automaton_language:
            raise ValueError("an automaton is closed by the search of the automaton's language")
        self.data = data
        self.states = AutomatonStates(data, tables)
        self.eos_ids = frozenset(eos_ids)
        self.close_within_budget = close_within_budget
        self.search = search
        self.plan = list(plan)
        self.min_tokens = len(plan)
        self.rows = torch.from_numpy(data.rows)
        self.words = int(data.rows.shape[1])
        self.eos_row = torch.from_numpy(token_row(np.asarray(sorted(eos_ids)), self.words))
        self._lock = threading.Lock()
        self._forced: dict[int, int | None] = {}  # state -> its only allowed token (no budget), memo

    def forced_token(self, state: int) -> int | None:
        """The only token state's unbudgeted row allows, else None (memoised: a dict read per step)."""
        if state not in self._forced:
            token = single_token(self.rows[state])
            with self._lock:
                self._forced[state] = token
        return self._forced[state]

    def new_matcher(self) -> AutomatonMatcher:
        return AutomatonMatcher(self)

    def has_continuation(self, state: int) -> bool:
        return any(n >= 0 for n in self.states.table[state])


class AutomatonMatcher(PlannedMatcher):
    def __init__(self, grammar: AutomatonGrammar) -> None:
        self._g = grammar
        self.state = 0
        g = grammar
        self._init_plan(g.search, g.plan, g.close_within_budget, g.words, g.eos_ids, g.eos_row, frozenset())

    def accept_token(self, token_id: int) -> bool:
        g = self._g
        if self._terminated:
            return False
        if token_id in g.eos_ids:
            if g.states.accepting[self.state]:
                self._terminated = True
                return True
            return False
        nxt = g.states.next_state(self.state, token_id)
        if nxt is None:
            return False
        self.state = nxt
        self._advanced(token_id)
        return True

    def forced_token(self, remaining_tokens: int | None = None) -> int | None:
        row = self._budget_mask(remaining_tokens)
        return self._g.forced_token(self.state) if row is None else single_token(row)

    def native_forced_bytes(self) -> bytes | None:
        return b"" if self._terminated else self._g.states.forced_from(self.state)

    def valid_prefix(self, token_ids: list[int]) -> int:
        g = self._g
        state, n = self.state, 0
        if self._terminated:
            return 0
        for token in token_ids:
            if token in g.eos_ids:
                return n + 1 if g.states.accepting[state] else n
            nxt = g.states.next_state(state, token)
            if nxt is None:
                return n
            state, n = nxt, n + 1
        return n

    def fork(self) -> AutomatonMatcher:
        copy = AutomatonMatcher(self._g)
        copy.state, copy._terminated = self.state, self._terminated
        self._copy_plan_to(copy)
        return copy

    def bitmask_words(self) -> int:
        return self._g.words

    def is_accepting(self) -> bool:
        return self._terminated or self._g.states.accepting[self.state]

    def is_terminated(self) -> bool:
        g = self._g
        return self._terminated or (g.states.accepting[self.state] and not g.has_continuation(self.state))

    # ---- what PlannedMatcher asks ----------------------------------------------------------------
    def _node(self) -> AutomatonNode:
        return self._g.states.node(self.state)

    def _accepting(self) -> bool:
        return self._g.states.accepting[self.state]

    def _fill_plain(self, out: torch.Tensor) -> None:
        out.copy_(self._g.rows[self.state])
