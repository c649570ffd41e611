"""A grounded schema bound to one request's sources, served by our span automaton (grammar/span_automaton.py)
instead of an llguidance grammar: the same language (tests compare the masks token by token), built per request in
1-3 ms per 10,000 characters instead of 17-25.

It follows the same budget logic as every other grammar (grammar/budget.py's ``PlannedMatcher``: the completion
search over a node of the state), so a greedy request gets the same tokens from either. Masks are our C walk of the
vocabulary's trie, EOS bits where the output may end.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from loraplex.grammar.backend_outlines.automaton import token_row
from loraplex.grammar.backend_types import CompiledGrammar
from loraplex.grammar.budget import PlannedMatcher
from loraplex.grammar.grounding import SourceText
from loraplex.grammar.search import CompletionSearch, StateMemo, WalkInputs
from loraplex.grammar.span_automaton import (
    QUOTE,
    GreedyWalk,
    SpanAutomaton,
    SpanMatcher,
    SpanRequest,
    TemplateDFA,
    TokenTrie,
)

MASK_CACHE_ROWS = 64  # per request: 6 KB a row for SmolLM2's vocabulary (384 KB; 64 requests in a batch: 25 MB)


@dataclass(frozen=True)
class SpanTemplate:
    """A grounded schema as our span automaton serves it: its byte DFA, and the vocabulary's trie and bytes; and the
    budget search's completions that hold for every request of the schema (``SharedPlans``)."""

    template: TemplateDFA
    trie: TokenTrie
    token_bytes: tuple[bytes | None, ...]
    eos_ids: tuple[int, ...]
    words: int
    shared: SharedPlans = field(default_factory=lambda: SharedPlans(), compare=False)
    # the C greedy walk's tables, per search: id(search's WalkInputs) -> (them, the walk)
    walks: dict[int, tuple[WalkInputs, GreedyWalk]] = field(default_factory=dict, compare=False)

    def walk_for(self, search: CompletionSearch) -> GreedyWalk:
        hit = self.walks.get(id(search.walk_inputs))
        if hit is None:
            hit = self.walks[id(search.walk_inputs)] = (search.walk_inputs, GreedyWalk(self.trie, search.walk_inputs))
        return hit[1]

    def bind(
        self, sources: Sequence[SourceText], search: CompletionSearch, plan: list[int] | None, close: bool
    ) -> tuple[SpanGrammar | None, list[int]]:
        """The grammar of one request (None: no output is possible with these sources) and the grounded strings
        (slots) no span of them satisfies. ``plan``: a completion valid whatever the source, else the search makes
        one."""
        request = SpanRequest(SpanAutomaton(sources), self.template)
        if not request.satisfiable:
            return None, request.empty_slots
        grammar = SpanGrammar(request, self.trie, self.token_bytes, self.eos_ids, self.words, search, [], close)
        grammar.walk = self.walk_for(search)
        if not request.dead.any():  # (a request with a closed grounded string has its own completions)
            grammar.memo = SharedMemo(self.shared, grammar)
        if plan is None:
            plan = search.plan(SpanNode(grammar, SpanMatcher(request, self.trie)))
            if plan is None:
                return None, request.empty_slots
        grammar.plan, grammar.min_tokens = list(plan), len(plan)
        return grammar, request.empty_slots


@dataclass
class SharedPlans:
    """What the completion search found from template states (outside every grounded string) along completions that
    read no byte of a grounded string's content: those depend on the template alone (an empty span is a span of every
    source), so every request of the schema may reuse them, as every request of a token automaton does."""

    paths: dict[Hashable, tuple[bytes | None, int]] = field(default_factory=dict)
    tokens: dict[Hashable, list[int]] = field(default_factory=dict)


class _Layered(dict):  # type: ignore[type-arg]
    """A request's own memo entries, over the schema's shared ones (``share(key, value)``: may it be shared)."""

    def __init__(self, shared: dict[Hashable, Any], share: Callable[[Hashable, Any], bool]) -> None:
        super().__init__()
        self._shared, self._share = shared, share

    def get(self, key: Hashable, default: Any = None) -> Any:
        hit = super().get(key)
        if hit is None:
            hit = self._shared.get(key)
        return default if hit is None else hit

    def __setitem__(self, key: Hashable, value: Any) -> None:
        super().__setitem__(key, value)
        if self._share(key, value):
            self._shared[key] = value


class SharedMemo(StateMemo):
    """A request's memo of the search (grammar/search.py's ``StateMemo``) that reads and adds to the schema's
    ``SharedPlans`` where a completion holds for every request: from a template state, reading no content byte."""

    def __init__(self, shared: SharedPlans, grammar: SpanGrammar) -> None:
        super().__init__()
        self._grammar = grammar
        self.paths = _Layered(shared.paths, self._path_holds_for_all)
        self.tokens = _Layered(shared.tokens, lambda key, _: key in shared.paths)

    def _path_holds_for_all(self, key: Hashable, value: tuple[bytes | None, int]) -> bool:
        t, s, d, q, stopped = cast(tuple[int, int, int, int, bool], key)
        path = value[0]
        if s >= 0 or stopped or path is None:
            return False
        probe = SpanMatcher(self._grammar.request, self._grammar.trie, np.array([t, s, d, q], dtype=np.int32))
        for b in path:
            state = probe.state
            if state[1] >= 0 and not (state[2] == 0 and b == QUOTE):
                return False  # a byte of a grounded string's content: chosen from this request's source
            if not probe.consume(bytes((b,))):
                return False
        return True


class SpanNode:
    """The completion search's view of a state (grammar/search.py's ``SearchNode``), as llguidance's matcher
    answers it: EOS is consumed only where the output may end, and stops the node."""

    __slots__ = ("_g", "_m", "_stopped")

    def __init__(self, grammar: SpanGrammar, matcher: SpanMatcher, stopped: bool = False) -> None:
        self._g, self._m, self._stopped = grammar, matcher, stopped

    @property
    def memo(self) -> StateMemo:
        """The request's memo of what the search found from each state (the search is a function of the state)."""
        return self._g.memo

    @property
    def state(self) -> tuple[int, int, int, int, bool]:
        return (*self._m.key(), self._stopped)

    def deep_copy(self) -> SpanNode:
        return SpanNode(self._g, self._m.copy(), self._stopped)

    def consume_token(self, token: int) -> bool:
        if self._stopped:
            return False
        if token in self._g.eos_ids:
            self._stopped = self._m.accepting
            return self._stopped
        data = self._g.token_bytes(token)
        return data is not None and self._m.consume(data)

    def compute_ff_bytes(self) -> bytes:
        return b"" if self._stopped else self._m.forced_bytes()

    def native_greedy(
        self, inputs: WalkInputs, loop_exits: int | None, masks_left: int | None
    ) -> tuple[bytes | None, int, bool]:
        """The search's greedy walk from here in C (grammar/search.py's ``CompletionSearch._greedy``)."""
        if self._stopped:
            return b"", 0, False
        walk = self._g.walk
        if walk is None or walk.inputs is not inputs:
            walk = self._g.walk = GreedyWalk(self._g.trie, inputs)
        return self._m.greedy(walk, loop_exits, masks_left)

    def is_accepting(self) -> bool:
        return self._stopped or self._m.accepting

    def is_error(self) -> bool:
        return False

    def unsafe_compute_mask_ptr(self, ptr: int, nbytes: int) -> None:
        words = np.frombuffer(memoryview((ctypes.c_uint32 * (nbytes // 4)).from_address(ptr)), dtype=np.uint32)
        self._g.fill(self._m, words, self._stopped)

    def validate_tokens(self, tokens: Iterable[int]) -> int:
        tokens = list(tokens)
        if self._stopped:
            return 0
        spelled = [self._g.token_bytes(t) for t in tokens]
        if None not in spelled and self._g.eos_ids.isdisjoint(tokens):  # bytes only: one read of them all
            read = self._m.copy().readable(b"".join(cast(list[bytes], spelled)))
            return int(np.searchsorted(np.cumsum([len(b) for b in cast(list[bytes], spelled)]), read, side="right"))
        trial, n = self._m.copy(), 0
        for token in tokens:
            if token in self._g.eos_ids:
                return n + 1 if trial.accepting else n
            data = self._g.token_bytes(token)
            if data is None or not trial.consume(data):
                break
            n += 1
        return n


class SpanGrammar(CompiledGrammar):
    backend = "span"

    def __init__(
        self,
        request: SpanRequest,
        trie: TokenTrie,
        token_bytes: tuple[bytes | None, ...],
        eos_ids: tuple[int, ...],
        words: int,
        search: CompletionSearch,
        plan: list[int],
        close_within_budget: bool,
    ) -> None:
        if not search.automaton_language:
            raise ValueError("a span grammar is in the automaton's language: its search must be that one")
        self.request, self.trie = request, trie
        self._token_bytes = token_bytes
        self.eos_ids = frozenset(eos_ids)
        self.words = words
        self.search = search
        self.plan = list(plan)
        self.min_tokens = len(plan)
        self.close_within_budget = close_within_budget
        self.memo: StateMemo = StateMemo()
        self.walk: GreedyWalk | None = None  # the C greedy walk's tables (SpanTemplate.walk_for)
        # the plain masks of the states seen lately (a value's start, a key's name: states a request comes back to,
        # and that the budget's search asks about again and again), as a few hundred rows at most
        self._masks: OrderedDict[tuple[int, int, int, int], np.ndarray] = OrderedDict()
        self.eos_row = torch.from_numpy(token_row(np.asarray(sorted(eos_ids)), words))
        self._eos_words = self.eos_row.numpy().view(np.uint32)

    def token_bytes(self, token: int) -> bytes | None:
        return self._token_bytes[token] if 0 <= token < len(self._token_bytes) else None

    def fill(self, matcher: SpanMatcher, words: np.ndarray, stopped: bool = False) -> None:
        """The plain mask of a state into uint32 ``words``: the tokens readable from it, EOS where it may end."""
        if stopped:
            words[:] = 0
            return
        key = matcher.key()
        row = self._masks.get(key)
        if row is None:
            row = np.zeros(self.words, dtype=np.uint32)
            matcher.mask(row)
            if matcher.accepting:
                row |= self._eos_words
            self._masks[key] = row
            if len(self._masks) > MASK_CACHE_ROWS:
                self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(key)
        words[:] = row

    def new_matcher(self) -> SpanGrammarMatcher:
        return SpanGrammarMatcher(self, SpanMatcher(self.request, self.trie))


class SpanGrammarMatcher(PlannedMatcher):
    def __init__(self, grammar: SpanGrammar, matcher: SpanMatcher) -> None:
        self._g = grammar
        self._m = matcher
        self._buf = np.zeros(grammar.words, dtype=np.uint32)
        g = grammar
        self._init_plan(g.search, g.plan, g.close_within_budget, g.words, g.eos_ids, g.eos_row, frozenset())

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id in self._g.eos_ids:
            if self._m.accepting:
                self._terminated = True
                return True
            return False
        data = self._g.token_bytes(token_id)
        if data is None or not self._m.consume(data):
            return False
        self._advanced(token_id)
        return True

    def valid_prefix(self, token_ids: list[int]) -> int:
        return 0 if self._terminated else self._node().validate_tokens(token_ids)

    def native_forced_bytes(self) -> bytes | None:
        return b"" if self._terminated else self._m.forced_bytes()

    def fork(self) -> SpanGrammarMatcher:
        copy = SpanGrammarMatcher(self._g, self._m.copy())
        copy._terminated = self._terminated
        self._copy_plan_to(copy)
        return copy

    def bitmask_words(self) -> int:
        return self._g.words

    def is_accepting(self) -> bool:
        return self._terminated or self._m.accepting

    def is_terminated(self) -> bool:
        return self._terminated or (self._m.accepting and not self._m.next_bytes().any())

    # ---- what PlannedMatcher asks ----------------------------------------------------------------
    def _node(self) -> SpanNode:
        return SpanNode(self._g, self._m)

    def _accepting(self) -> bool:
        return self._m.accepting

    def _fill_plain(self, out: torch.Tensor) -> None:
        self._g.fill(self._m, self._buf)
        out.copy_(torch.from_numpy(self._buf.view(np.int32)))
