"""The token automaton as the completion search sees it (grammar/search.py's `SearchNode`), without torch.

Both backends close an output by the same search (grammar/budget.py), so the automaton answers the search's
questions the way llguidance's matcher does: masks are its rows, forced bytes the bytes every allowed token starts
with (walked through the rows), and each state's answers are memoised, since the search is a function of the state.
Compile workers use it too (they plan a new automaton's shortest completion), so nothing here imports torch.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from loraplex.grammar.backend_outlines.automaton import AutomatonData
from loraplex.grammar.search import StateMemo
from loraplex.grammar.vocab import VocabInfo

MAX_FORCED_BYTES = 4096  # a forced run longer than this is cut (no real constraint forces more in one stretch)


@dataclass(frozen=True)
class ByteTables:
    """Per vocabulary: each token's first byte (-1: none), the single-byte token of each byte value (-1: none), and
    for each byte value the uint32 bitmask of the tokens that do NOT start with it (special and unused ids included)."""

    first_byte: np.ndarray  # int16 [words * 32]
    byte_token: np.ndarray  # int64 [256]
    not_starting_with: np.ndarray  # uint32 [256, words]

    @classmethod
    def of(cls, info: VocabInfo) -> ByteTables:
        first = np.full(info.words * 32, -1, dtype=np.int16)
        single = np.full(256, -1, dtype=np.int64)
        for token, data in enumerate(info.token_bytes):
            if data:
                first[token] = data[0]
                if len(data) == 1:
                    single[data[0]] = token
        others = np.empty((256, info.words), dtype=np.uint32)
        for b in range(256):
            others[b] = np.packbits(first != b, bitorder="little").view("<u4")
        return cls(first, single, others)

    def forced_byte(self, words: np.ndarray) -> int | None:
        """The byte every token of a uint32 bitmask row starts with (None: no token, EOS or a special token, or
        tokens of more than one first byte)."""
        nz = np.flatnonzero(words)
        if len(nz) == 0:
            return None
        w = int(words[nz[0]])
        b = int(self.first_byte[32 * int(nz[0]) + (w & -w).bit_length() - 1])
        if b < 0 or (words & self.not_starting_with[b]).any():
            return None
        return b


class AutomatonStates:
    """One automaton's transitions, acceptance and rows, with per-state memos of forced bytes and completions."""

    def __init__(self, data: AutomatonData, tables: ByteTables) -> None:
        self.data = data
        self.tables = tables
        self.token_class: list[int] = data.token_class.tolist()
        self.table: list[list[int]] = data.table.tolist()
        self.accepting: list[bool] = data.accepting.tolist()
        self.memo = StateMemo()
        self._forced: dict[int, bytes] = {}

    def next_state(self, state: int, token_id: int) -> int | None:
        if not 0 <= token_id < len(self.token_class):
            return None
        nxt = self.table[state][self.token_class[token_id]]
        return None if nxt < 0 else nxt

    def forced_from(self, state: int) -> bytes:
        """The bytes every continuation from `state` starts with (empty where EOS may follow)."""
        hit = self._forced.get(state)
        if hit is None:
            out = bytearray()
            s: int | None = state
            while s is not None and len(out) < MAX_FORCED_BYTES:
                b = self.tables.forced_byte(self.data.rows[s].view(np.uint32))
                token = -1 if b is None else int(self.tables.byte_token[b])
                nxt = None if token < 0 else self.next_state(s, token)
                if b is None or nxt is None:
                    break
                out.append(b)
                s = nxt
            hit = self._forced[state] = bytes(out)
        return hit

    def node(self, state: int = 0) -> AutomatonNode:
        return AutomatonNode(self, state)


class AutomatonNode:
    """A state of the automaton with the methods of llguidance's matcher that the completion search calls."""

    __slots__ = ("_a", "state")

    def __init__(self, automaton: AutomatonStates, state: int) -> None:
        self._a = automaton
        self.state = state

    @property
    def memo(self) -> StateMemo:
        return self._a.memo

    def deep_copy(self) -> AutomatonNode:
        return AutomatonNode(self._a, self.state)

    def consume_token(self, token: int) -> bool:
        nxt = self._a.next_state(self.state, token)
        if nxt is None:
            return False
        self.state = nxt
        return True

    def compute_ff_bytes(self) -> bytes:
        return self._a.forced_from(self.state)

    def is_accepting(self) -> bool:
        return self._a.accepting[self.state]

    def is_error(self) -> bool:
        return False

    def unsafe_compute_mask_ptr(self, ptr: int, nbytes: int) -> None:
        row = self._a.data.rows[self.state]
        ctypes.memmove(ptr, row.ctypes.data, min(nbytes, row.nbytes))

    def validate_tokens(self, tokens: list[int]) -> int:
        state, n = self.state, 0
        for token in tokens:
            nxt = self._a.next_state(state, token)
            if nxt is None:
                break
            state, n = nxt, n + 1
        return n
