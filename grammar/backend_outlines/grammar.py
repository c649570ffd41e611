"""CompiledGrammar/GrammarMatcher over a precomputed token automaton (the outlines_core backend).

A matcher is one integer state: accepting a token is two table lookups (token -> class, then
[state, class] -> next state), a mask fill is a copy of that state's precomputed row. Budget mode allows exactly the
tokens whose next state is one step closer to acceptance (rows built on first use, cached).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from loraplex.grammar.backend_outlines.automaton import AutomatonData, token_row
from loraplex.grammar.backend_types import CompiledGrammar, GrammarMatcher, single_token


class AutomatonGrammar(CompiledGrammar):
    backend = "outlines"

    def __init__(self, data: AutomatonData, eos_ids: tuple[int, ...], close_within_budget: bool) -> None:
        self.data = data
        self.eos_ids = frozenset(eos_ids)
        self.close_within_budget = close_within_budget
        self.rows = torch.from_numpy(data.rows)
        self.token_class = data.token_class.tolist()
        self.table = data.table.tolist()
        self.dist = data.dist.tolist()
        self.accepting = data.accepting.tolist()
        self.min_tokens = self.dist[0]
        words = data.rows.shape[1]
        self.eos_row = torch.from_numpy(token_row(np.asarray(sorted(eos_ids)), words))
        self._short: dict[int, torch.Tensor] = {}
        self._budget: dict[tuple[int, int], torch.Tensor] = {}
        # per state, the largest distance any allowed token leads to: below it a budget row is needed
        self.max_next_dist = [max((self.dist[n] for n in row if n >= 0), default=0) for row in self.table]
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

    def next_state(self, state: int, token_id: int) -> int | None:
        if not 0 <= token_id < len(self.token_class):
            return None
        nxt = self.table[state][self.token_class[token_id]]
        return None if nxt < 0 else nxt

    def has_continuation(self, state: int) -> bool:
        return any(n >= 0 for n in self.table[state])

    def shortest_row(self, state: int) -> torch.Tensor:
        """Tokens that move one step closer to acceptance (EOS only when accepting)."""
        row = self._short.get(state)
        if row is None:
            if self.dist[state] == 0:
                row = self.eos_row
            else:
                nxt = self.data.table[state]
                on_path = (nxt >= 0) & (self.data.dist[np.maximum(nxt, 0)] == self.dist[state] - 1)
                tokens = np.flatnonzero(on_path[self.data.token_class])
                row = torch.from_numpy(token_row(tokens, self.rows.shape[1]))
            with self._lock:
                self._short[state] = row
        return row

    def budget_row(self, state: int, limit: int) -> torch.Tensor:
        """Tokens after which acceptance stays reachable within `limit` more tokens (EOS when accepting).

        Masking only when the budget equals the distance is not enough: with one token of slack a
        token that starts a longer structure (`,` before another property) would make the document
        impossible to close, so every budget-bound step keeps exactly the tokens that still fit.
        """
        key = (state, limit)
        row = self._budget.get(key)
        if row is None:
            nxt = self.data.table[state]
            fits = (nxt >= 0) & (self.data.dist[np.maximum(nxt, 0)] <= limit)
            tokens = np.flatnonzero(fits[self.data.token_class])
            if self.accepting[state]:
                tokens = np.concatenate([tokens, np.asarray(sorted(self.eos_ids), dtype=np.int64)])
            row = torch.from_numpy(token_row(tokens, self.rows.shape[1]))
            with self._lock:
                self._budget[key] = row
        return row


class AutomatonMatcher(GrammarMatcher):
    __slots__ = ("_g", "_terminated", "state")

    def __init__(self, grammar: AutomatonGrammar) -> None:
        self._g = grammar
        self.state = 0
        self._terminated = False

    def accept_token(self, token_id: int) -> bool:
        g = self._g
        if self._terminated:
            return False
        if token_id in g.eos_ids:
            if g.accepting[self.state]:
                self._terminated = True
                return True
            return False
        nxt = g.next_state(self.state, token_id)
        if nxt is None:
            return False
        self.state = nxt
        return True

    def _row(self, remaining_tokens: int | None) -> torch.Tensor | None:
        """The precomputed row `fill_bitmask` copies; None: the state's plain row."""
        g = self._g
        if self._terminated:
            return g.eos_row
        if remaining_tokens is not None and g.close_within_budget and remaining_tokens <= g.dist[self.state]:
            return g.shortest_row(self.state)
        if (
            remaining_tokens is not None
            and g.close_within_budget
            and remaining_tokens - 1 < g.max_next_dist[self.state]
        ):
            return g.budget_row(self.state, remaining_tokens - 1)
        return None

    def fill_bitmask(self, out: torch.Tensor, remaining_tokens: int | None = None) -> None:
        row = self._row(remaining_tokens)
        out.copy_(self._g.rows[self.state] if row is None else row)

    def forced_token(self, remaining_tokens: int | None = None) -> int | None:
        row = self._row(remaining_tokens)
        return self._g.forced_token(self.state) if row is None else single_token(row)

    def valid_prefix(self, token_ids: list[int]) -> int:
        g = self._g
        state, n = self.state, 0
        if self._terminated:
            return 0
        for token in token_ids:
            if token in g.eos_ids:
                return n + 1 if g.accepting[state] else n
            nxt = g.next_state(state, token)
            if nxt is None:
                return n
            state, n = nxt, n + 1
        return n

    def fork(self) -> AutomatonMatcher:
        copy = AutomatonMatcher(self._g)
        copy.state, copy._terminated = self.state, self._terminated
        return copy

    def bitmask_words(self) -> int:
        return self._g.rows.shape[1]

    def is_accepting(self) -> bool:
        return self._terminated or self._g.accepting[self.state]

    def is_terminated(self) -> bool:
        g = self._g
        return self._terminated or (g.accepting[self.state] and not g.has_continuation(self.state))

    def min_tokens_to_accept(self) -> int:
        return 0 if self._terminated else self._g.dist[self.state]
