"""Bounded search for a short completion from a matcher's state: the budget logic of both backends.

llguidance exposes no states, so distances cannot be precomputed there; the token automaton could, but both
backends must close an output the same way (grammar/budget.py says why), so both run this search over the
same `SearchNode` operations. Over byte strings (every byte
has a one-byte token) we walk greedily to acceptance: forced bytes, else the first allowed byte
of CLOSING_ORDER. Only if that fails, a bounded uniform-cost search runs (shortest first, forced
bytes in one jump, per length one matcher per distinct next-token mask, at most `beam` per length);
on JSON schemas it costs orders of magnitude more than the walk and rarely beats it, so it is not
used to refine it. The byte string is split into as few tokens as the
matcher allows (dynamic programming over the vocabulary). The result is a concrete plan:
achievable and short, an upper bound on the true distance (not always the minimum).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from loraplex.grammar.token_split import TokenSplitter
from loraplex.grammar.vocab import VocabInfo

MAX_TOKEN_BYTES = 48
# Masks one budget check may compute (a check runs for a sampled token inside a decode step). Checks on the
# dev set's random walks take a few masks, while a pattern the greedy walk cannot finish can take seconds of
# them and then fail (bench/README.md has the counts): the bound sits far above the first. A check that runs out says
# "does not fit" (the token is passed over: narrowing, never widening); plans are not bounded (the budget
# fallback needs one, and the first is made by the compile worker, under its timeout).
CHECK_MAX_MASKS = 2000
GREEDY_LOOP_EXITS = 64  # the first greedy walk gives up after this many searches for a way out of a loop
# Greedy completion prefers bytes that close what is open, then short values.
REPEAT = 8
CLOSING_ORDER = (
    '"}])>,0123456789' + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" + " -+.:;_'!?#$%&*/=@^`|~<({[\\\n\t"
)


class SearchNode(Protocol):
    """What the search asks of a matcher state: llguidance's LLMatcher has these methods, and the token automaton's
    `AutomatonNode` mirrors them. The search only copies nodes; the caller's node is never advanced."""

    def deep_copy(self) -> SearchNode: ...

    def consume_token(self, token: int) -> bool: ...

    def compute_ff_bytes(self) -> bytes: ...

    def is_accepting(self) -> bool: ...

    def is_error(self) -> bool: ...

    def unsafe_compute_mask_ptr(self, ptr: int, nbytes: int) -> None: ...

    def validate_tokens(self, tokens: list[int]) -> int: ...


class StateMemo:
    """What the search found from each state of a grammar with named states (the token automaton's numbers, the span
    automaton's tuples): the search is a function of the state, so each state's completion is computed once per
    grammar instead of once per step."""

    def __init__(self) -> None:
        self.paths: dict[Hashable, tuple[bytes | None, int]] = {}  # state -> (completion bytes, masks it took)
        self.out_of_masks: set[Hashable] = set()  # states whose bounded run ran out (an unbounded run may succeed)
        self.tokens: dict[Hashable, list[int]] = {}  # state -> its completion bytes tokenized


class _OutOfMasks(Exception):
    """A bounded search computed its allowance of masks."""


@dataclass(frozen=True)
class WalkInputs:
    """What a node's own greedy walk (``native_greedy``: the span automaton's, in C) needs of the search to walk as
    `CompletionSearch._greedy` does."""

    byte_token: np.ndarray  # int64 [256]: each byte's one-byte token, -1: none
    usable: np.ndarray  # uint8 [256]: 1 where that token may be in the normalised mask of a state that does not accept
    order: np.ndarray  # uint8 [256]: the bytes in the walk's order of preference
    kept: np.ndarray  # uint32 [words]: the tokens the normalised mask of a state that does not accept may hold
    max_bytes: int
    repeat: int


class _PerThread(threading.local):
    """A search's working state, one per thread: the engine checks budgets on its thread while the compiler's
    binder makes a new request's plan on another with the same search (and the C walks let go of the GIL), so a
    shared bound and mask count gave one thread's run the other's (tests/grammar/test_span_greedy.py)."""

    def __init__(self, words: int) -> None:
        self.buf = np.zeros(words, dtype=np.int32)  # the last mask computed
        self.masks_left: int | None = None  # None: unbounded
        self.masks_computed = 0  # masks computed by the last completion_bytes (a bounded run fails above the bound)


def token_filter(info: VocabInfo, automaton_language: bool) -> tuple[np.ndarray, np.ndarray]:
    """(kept, eos) int32 bitmask rows: the tokens a mask may hold (tokens with bytes; in the automaton's language
    none holding byte 0xF4, see backend_outlines.automaton) and the EOS ids."""
    kept = np.zeros(info.words * 32, dtype=bool)
    for tid, data in enumerate(info.token_bytes):
        if data is not None and not (automaton_language and 0xF4 in data):
            kept[tid] = True
    eos = np.zeros(info.words * 32, dtype=bool)
    eos[list(info.eos_ids)] = True
    return _pack(kept), _pack(eos)


def _pack(bits: np.ndarray) -> np.ndarray:
    return np.packbits(bits, bitorder="little").view("<i4").copy()


class CompletionSearch:
    """One per vocabulary and language (``automaton_language``: a regex both backends serve, where tokens holding
    byte 0xF4 are never allowed). Masks are normalised before the search reads them (kept tokens only, EOS bits
    exactly where the node accepts), so two backends with the same language see the same masks."""

    def __init__(
        self,
        info: VocabInfo,
        *,
        automaton_language: bool = False,
        max_expansions: int = 120,
        beam: int = 16,
        max_bytes: int = 2048,
        native_split: bool = True,
    ) -> None:
        """``native_split``: tokenize plans with the C programme (grammar/token_split.py) where the C kernels run;
        the compile workers pass False (their process does not import torch, which the C kernels' loader does), and
        get the same tokens from the Python one."""
        self.words = info.words
        self.automaton_language = automaton_language
        self._kept, self._eos = token_filter(info, automaton_language)
        self.max_expansions = max_expansions
        self.beam = beam
        self.max_bytes = max_bytes
        self.byte_token = np.full(256, -1, dtype=np.int64)
        self.by_bytes: dict[bytes, int] = {}
        for tid, data in enumerate(info.token_bytes):
            if data is None or len(data) > MAX_TOKEN_BYTES or (automaton_language and 0xF4 in data):
                continue
            self.by_bytes.setdefault(data, tid)
            if len(data) == 1 and self.byte_token[data[0]] < 0:
                self.byte_token[data[0]] = tid
        self._bytes = np.flatnonzero(self.byte_token >= 0)
        ids = self.byte_token[self._bytes]
        self._word, self._bit = ids >> 5, ids & 31
        self._order = [ord(c) for c in CLOSING_ORDER] + [b for b in range(256) if chr(b) not in CLOSING_ORDER]
        self._thread = _PerThread(self.words)
        self.splitter = TokenSplitter(self.by_bytes, MAX_TOKEN_BYTES) if native_split else None
        kept_plain = (self._kept & ~self._eos).view(np.uint32)
        bit = ((kept_plain[self.byte_token.clip(0) >> 5] >> (self.byte_token.clip(0) & 31)) & 1).astype(np.uint8)
        self.walk_inputs = WalkInputs(
            self.byte_token.copy(),
            np.where(self.byte_token >= 0, bit, 0).astype(np.uint8),
            np.asarray(self._order, dtype=np.uint8),
            kept_plain,
            max_bytes,
            REPEAT,
        )

    @property
    def _buf(self) -> np.ndarray:
        return self._thread.buf

    @property
    def _masks_left(self) -> int | None:
        return self._thread.masks_left

    @_masks_left.setter
    def _masks_left(self, value: int | None) -> None:
        self._thread.masks_left = value

    @property
    def masks_computed(self) -> int:
        """Masks computed by this thread's last ``completion_bytes`` (a bounded run fails above its bound)."""
        return self._thread.masks_computed

    @masks_computed.setter
    def masks_computed(self, value: int) -> None:
        self._thread.masks_computed = value

    def _mask(self, m: Any) -> np.ndarray:
        if self._masks_left is not None:
            if self._masks_left <= 0:
                raise _OutOfMasks()
            self._masks_left -= 1
        self.masks_computed += 1
        m.unsafe_compute_mask_ptr(self._buf.ctypes.data, self.words * 4)
        np.bitwise_and(self._buf, self._kept, out=self._buf)
        if m.is_accepting():
            np.bitwise_or(self._buf, self._eos, out=self._buf)
        else:
            np.bitwise_and(self._buf, ~self._eos, out=self._buf)
        return self._buf

    def plan(self, matcher: Any, thorough: bool = False) -> list[int] | None:
        """Tokens from `matcher`'s state to an accepting one, or None if none found in bounds. ``thorough`` (a
        grammar's first plan, made once at compile time, whose length is the shortest budget a request may have):
        the bounded uniform-cost search runs too and the shorter plan wins, so `{}` is found where the greedy walk
        opens a key first."""
        if matcher.is_accepting():
            return []
        path = self.completion_bytes(matcher)
        best = None if path is None else self.tokenize(matcher, path)
        if thorough:
            short = self._shortest(matcher, self.max_bytes if path is None else len(path) + 1)
            if short is not None and short != path:
                tokens = self._tokenize(matcher, short)  # (not memoised: a state's memo holds its greedy completion)
                if best is None or len(tokens) < len(best):
                    best = tokens
        return best

    def fits(self, matcher: Any, budget: int) -> bool:
        """Whether `plan(matcher)` would be at most `budget` tokens."""
        if matcher.is_accepting():
            return True
        return self.check(matcher, budget)[0]

    def check(self, matcher: Any, budget: int) -> tuple[bool, bytes | None, list[int] | None]:
        """(fits, completion bytes, plan) for a matcher that is not accepting: whether `plan(matcher)` would be
        at most `budget` tokens, with what was found on the way (the plan only where it had to be tokenized:
        a byte string no longer than the budget fits, since no token is shorter than one byte)."""
        self._masks_left = CHECK_MAX_MASKS
        try:
            path = self.completion_bytes(matcher)
        except _OutOfMasks:
            path = None
        finally:
            self._masks_left = None
        if path is None:
            return False, None, None
        if len(path) <= budget:
            return True, path, None
        tokens = self.tokenize(matcher, path)
        return len(tokens) <= budget, path, tokens

    def completion_bytes(self, matcher: Any) -> bytes | None:
        """The byte string `plan` tokenizes: the greedy walk, else the bounded search, else the greedy walk
        without its bound on loop exits (a walk that keeps looking for ways out of loops is usually failing, and
        slowly, where the search finds a completion at once: bench/README.md). A node with a ``memo`` (and a
        ``state``) gets the memoised answer, bounded runs failing exactly where a fresh run would."""
        memo: StateMemo | None = getattr(matcher, "memo", None)
        if memo is None:
            return self._completion_bytes(matcher)
        state = matcher.state
        hit = memo.paths.get(state)
        if hit is None:
            if self._masks_left is not None and state in memo.out_of_masks:
                raise _OutOfMasks()
            try:
                path = self._completion_bytes(matcher)
            except _OutOfMasks:
                memo.out_of_masks.add(state)
                raise
            hit = memo.paths[state] = (path, self.masks_computed)
        if self._masks_left is not None and hit[1] > self._masks_left:
            raise _OutOfMasks()
        return hit[0]

    def _completion_bytes(self, matcher: Any) -> bytes | None:
        self.masks_computed = 0
        path = self._greedy(matcher, GREEDY_LOOP_EXITS)
        if path is None:
            path = self._shortest(matcher, self.max_bytes)
        if path is None:
            path = self._greedy(matcher, None)
        return path

    def _greedy(self, matcher: Any, loop_exits: int | None) -> bytes | None:
        """`_python_greedy`'s walk; a node with its own (``native_greedy``: the span automaton's, in C, which must
        choose the same bytes) walks itself."""
        native = getattr(matcher, "native_greedy", None)
        if native is None:
            return self._python_greedy(matcher, loop_exits)
        path, masks, out_of_masks = native(self.walk_inputs, loop_exits, self._masks_left)
        self.masks_computed += masks
        if self._masks_left is not None:
            self._masks_left -= masks
        if out_of_masks:
            raise _OutOfMasks()
        return cast("bytes | None", path)

    def _python_greedy(self, matcher: Any, loop_exits: int | None) -> bytes | None:
        """Close as soon as possible: forced bytes, else the first allowed byte in CLOSING_ORDER.

        Back in a state whose mask was seen since the last forced bytes means the walk is looping (digits of
        a number, the local part of an email): then the first byte whose successor accepts or has an unseen mask
        wins, else the first that changes the mask, so loops are left after one turn instead of spelling
        out CLOSING_ORDER. A byte
        chosen REPEAT times in a run of states with the same mask is passed over as a last resort.
        Past `loop_exits` such searches for a way out (None: no bound), the walk gives up.

        Forced bytes (a key, a separator) are progress, so they start a new record of masks: the second
        string value of an object has the first one's masks without being a loop, and treating it as one
        sent the walk through every escape and UTF-8 lead byte of that string (each a new mask) before
        closing it, an order of magnitude slower for a plan of about the same length (bench/README.md).
        """
        node = matcher.deep_copy()
        path = b""
        used: dict[tuple[int, int], int] = {}
        seen: set[int] = set()
        last, trapped = 0, False
        while not node.is_accepting():
            if len(path) >= self.max_bytes:
                return None
            forced = node.compute_ff_bytes()
            if forced:
                if not self._consume_bytes(node, forced):
                    return None
                path += forced
                seen.clear()
                continue
            allowed = set(self._next_bytes(node).tolist())
            sig = hash(self._buf.tobytes())  # the mask _next_bytes just computed
            if sig != last:  # repeats count within one run of a mask (another field may share the mask)
                used.clear()
                trapped = False
            last = sig
            candidates = [c for c in self._order if c in allowed]
            b = None
            if sig in seen and not trapped:
                if loop_exits is not None:
                    if loop_exits <= 0:
                        return None
                    loop_exits -= 1
                b = self._leave_loop(node, candidates, seen, sig)
            trapped = b is None and sig in seen  # no way out of this mask yet: not looked for again in this run
            seen.add(sig)
            if b is None:
                b = next((c for c in candidates if used.get((sig, c), 0) < REPEAT), None)
            if b is None or not node.consume_token(int(self.byte_token[b])):
                return None
            used[(sig, b)] = used.get((sig, b), 0) + 1
            path += bytes([b])
        return path

    def _leave_loop(self, node: Any, candidates: list[int], seen: set[int], here: int) -> int | None:
        """The first candidate byte that accepts or reaches a mask not seen yet; else the first that leaves
        this mask (the digits after the dot of "1.2" have the mask the digits before it had)."""
        other = None
        for c in candidates:
            child = node.deep_copy()
            if not child.consume_token(int(self.byte_token[c])):
                continue
            sig = hash(self._mask(child).tobytes())
            if child.is_accepting() or sig not in seen:
                return c
            if other is None and sig != here:
                other = c
        return other

    def _shortest(self, matcher: Any, limit: int) -> bytes | None:
        """Uniform-cost search for an accepting byte string shorter than `limit`."""
        buckets: dict[int, dict[int, tuple[Any, bytes]]] = {0: {0: (matcher.deep_copy(), b"")}}
        expansions = 0
        while buckets and expansions < self.max_expansions:
            length = min(buckets)
            if length >= limit:
                return None
            for node, path in list(buckets.pop(length).values())[: self.beam]:
                if node.is_accepting():
                    return path
                forced = node.compute_ff_bytes()
                if forced:
                    child = node.deep_copy()
                    if self._consume_bytes(child, forced):
                        self._push(buckets, child, path + forced)
                    continue
                expansions += 1
                for b in self._next_bytes(node).tolist():
                    child = node.deep_copy()
                    if child.consume_token(int(self.byte_token[b])):
                        self._push(buckets, child, path + bytes([b]))
        return None

    def _next_bytes(self, node: Any) -> np.ndarray:
        """The bytes whose one-byte token `node` allows next."""
        mask = self._mask(node)
        allowed: np.ndarray = self._bytes[((mask[self._word] >> self._bit) & 1).astype(bool)]
        return allowed

    def _push(self, buckets: dict[int, dict[int, tuple[Any, bytes]]], node: Any, path: bytes) -> None:
        bucket = buckets.setdefault(len(path), {})
        sig = -1 if node.is_accepting() else hash(self._mask(node).tobytes())
        bucket.setdefault(sig, (node, path))

    def _consume_bytes(self, m: Any, data: bytes) -> bool:
        for b in data:
            tid = int(self.byte_token[b])
            if tid < 0 or not m.consume_token(tid):
                return False
        return True

    def tokenize(self, matcher: Any, data: bytes) -> list[int]:
        """Fewest tokens spelling `data` that the matcher allows, starting from its state.

        llguidance judges bytes, so any spelling of an allowed byte string is usually allowed: the fewest
        tokens over the vocabulary alone are checked once, and only when the matcher refuses them does the
        search ask it at every position (a deep copy per byte, costly on long plans: bench/README.md). A node with
        a ``memo`` is only asked for its own completion's bytes, so the tokens are memoised by its state."""
        memo: StateMemo | None = getattr(matcher, "memo", None)
        if memo is not None:
            hit = memo.tokens.get(matcher.state)
            if hit is None:
                hit = memo.tokens[matcher.state] = self._tokenize(matcher, data)
            return list(hit)
        return self._tokenize(matcher, data)

    def _tokenize(self, matcher: Any, data: bytes) -> list[int]:
        tokens = None if self.splitter is None else self.splitter.split(data)
        if tokens is None:
            tokens = self._fewest_tokens(data, None)
        if matcher.deep_copy().validate_tokens(tokens) == len(tokens):
            return tokens
        return self._fewest_tokens(data, matcher)

    def _fewest_tokens(self, data: bytes, matcher: Any | None) -> list[int]:
        """Dynamic programming over the vocabulary; with a matcher, only tokens it allows at each position."""
        n = len(data)
        states = []
        if matcher is not None:
            states.append(matcher.deep_copy())
            for b in data:
                nxt = states[-1].deep_copy()
                nxt.consume_token(int(self.byte_token[b]))
                states.append(nxt)
        inf = n + 1
        best = [0] + [inf] * n
        back: list[tuple[int, int] | None] = [None] * (n + 1)
        for i in range(n):
            if best[i] >= inf:
                continue
            for length in range(1, min(MAX_TOKEN_BYTES, n - i) + 1):
                if best[i] + 1 >= best[i + length]:
                    continue
                tid = self.by_bytes.get(data[i : i + length])
                if tid is not None and (matcher is None or states[i].validate_tokens([tid]) == 1):
                    best[i + length] = best[i] + 1
                    back[i + length] = (i, tid)
        out: list[int] = []
        pos = n
        while pos > 0:
            # (every byte has a one-byte token, so each position on the way back has its step)
            i, tid = cast(tuple[int, int], back[pos])
            out.append(tid)
            pos = i
        return out[::-1]
