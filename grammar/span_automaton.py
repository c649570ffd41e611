"""Our own span automaton for grounded values: the per-request part built in well under a millisecond per 10,000
characters, where llguidance's substring lexeme takes 12-20 ms (bench/README.md, issue 37's build target).

The language is the one grammar/grounding.py gives llguidance: a grounded string's content is the canonical JSON
spelling of a run of consecutive characters of one source segment (``grounding.source_segments``). Here the
segments become one string of *symbols*: a character's spelling byte by byte, where the bytes after the backslash
of an escape are symbol ``byte + 256`` (so ``\\n``'s ``n`` is not the letter ``n``, and a span can neither start nor
end inside an escape), and segments are joined by ``SEPARATOR``, which no output reads. A suffix automaton of that
string has every substring as a path from its state 0 (Blumer et al.; built in linear time). The output side reads
bytes through a small decoder (``step``) that knows where it is inside an escape or a UTF-8 character; a closing
quote at a character boundary ends the content.

The grammar around the grounded strings is a byte DFA of the schema's regex (``TemplateDFA``: outlines_core's Index
over single-byte tokens, each grounded string's placeholder one "hole" token). A grammar state is then (template
state, span state, decoder), and a mask is the set of tokens readable from it: ``SpanMatcher.mask`` walks the
vocabulary's byte trie (``TokenTrie``, built once per tokenizer) in C (kernels/csrc/span_automaton.c), stopping
wherever no state follows. ``reference_mask`` and ``ReferenceSpans`` are the same in plain Python, the oracle of the
C code's tests; llguidance's grounded grammar is the oracle of the language (tests/grammar/test_span_automaton.py).

It serves a grounded schema whose grounded strings carry no other keyword (grammar/span_grammar.py binds each request
to it; the template is built in the compile worker, grammar/workers/job.py). A string with other keywords (minLength,
pattern, format, enum) is intersected by llguidance (grammar/backend_llguidance/grounded.py), as before.
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loraplex.grammar.grounding import SourceText, placeholder, source_pieces
from loraplex.grammar.spec import GrammarError

SEPARATOR = 512  # between two segments: no output reads it, so no span crosses from one into the next
QUOTE, BACKSLASH = 0x22, 0x5C


_ESCAPE = re.compile(rb"\\(?:u[0-9a-f]{4}|.)", re.DOTALL)  # one escape of canonical JSON text


def source_symbols(sources: Sequence[SourceText]) -> np.ndarray:
    """The symbol string of the sources (int16): each character's canonical JSON spelling, escapes marked."""
    parts: list[np.ndarray] = []
    separator = np.asarray([SEPARATOR], dtype=np.int16)
    for piece in source_pieces(sources):
        data = json.dumps(piece, ensure_ascii=False)[1:-1].encode("utf-8")  # the canonical spelling (json_text.py)
        symbols = np.frombuffer(data, dtype=np.uint8).astype(np.int16)
        for m in _ESCAPE.finditer(data):
            symbols[m.start() + 1 : m.end()] += 256
        if parts:
            parts.append(separator)
        parts.append(symbols)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)


GrammarState = tuple[int, int, int]  # (template state, span state or -1 outside a hole, decoder)


def step(
    symbol_next: Callable[[int, int], int | None], table: np.ndarray, hole: np.ndarray, state: GrammarState, b: int
) -> GrammarState | None:
    """One byte from grammar state ``(t, s, d)`` (``symbol_next(s, symbol)``: the span automaton's edge or None);
    the state reached, or None. The decoder ``d``: 0 at a character boundary, 1 after a backslash, 2..5 with 1..4
    hex digits of ``\\uXXXX`` to come, 6..8 with 1..3 UTF-8 continuation bytes to come."""
    t, s, d = state
    if s < 0:
        t = int(table[t, b])
        if t < 0:
            return None
        return (t, 0, 0) if hole[t] >= 0 else (t, -1, 0)
    if d == 0 and 0x80 <= b < 0xC0:  # a continuation byte where a character starts: a span never starts mid-character
        return None
    if d == 0 and b == QUOTE:
        t = int(table[hole[t], b])
        if t < 0:
            return None
        return (t, 0, 0) if hole[t] >= 0 else (t, -1, 0)
    nxt = symbol_next(s, b + 256 if 1 <= d <= 5 else b)
    if nxt is None:
        return None
    if d == 0:
        d = 1 if b == BACKSLASH else 8 if b >= 0xF0 else 7 if b >= 0xE0 else 6 if b >= 0xC0 else 0
    elif d == 1:
        d = 5 if b == ord("u") else 0
    elif d in (2, 6):
        d = 0
    else:
        d -= 1
    return (t, nxt, d)


# ---- the reference: plain Python ---------------------------------------------------------------------------------
class ReferenceSpans:
    """A suffix automaton in Python (dict edges): the oracle of the C build."""

    def __init__(self, symbols: Sequence[int]) -> None:
        edges: list[dict[int, int]] = [{}]
        length, link = [0], [-1]
        last = 0
        for c in symbols:
            cur = len(edges)
            edges.append({})
            length.append(length[last] + 1)
            link.append(0)
            p = last
            while p >= 0 and c not in edges[p]:
                edges[p][c] = cur
                p = link[p]
            if p >= 0:
                q = edges[p][c]
                if length[p] + 1 == length[q]:
                    link[cur] = q
                else:
                    clone = len(edges)
                    edges.append(dict(edges[q]))
                    length.append(length[p] + 1)
                    link.append(link[q])
                    while p >= 0 and edges[p].get(c) == q:
                        edges[p][c] = clone
                        p = link[p]
                    link[q] = link[cur] = clone
            last = cur
        self.edges = edges

    def next(self, s: int, symbol: int) -> int | None:
        return self.edges[s].get(symbol)


def reference_mask(
    spans: ReferenceSpans, template: TemplateDFA, token_bytes: Sequence[bytes | None], state: tuple[int, int, int]
) -> set[int]:
    """The tokens readable from ``state``, each token's bytes stepped one by one."""
    allowed = set()
    for tid, data in enumerate(token_bytes):
        if not data:
            continue
        g = state
        for b in data:
            nxt = step(spans.next, template.table, template.hole, g, b)
            if nxt is None:
                break
            g = nxt
        else:
            allowed.add(tid)
    return allowed


# ---- the template: the schema's regex as a byte DFA with holes ----------------------------------------------------
@dataclass(frozen=True)
class TemplateDFA:
    """A byte DFA of a regex whose grounded strings' contents are holes. State 0 is the start; ``table[t, b]`` the
    next state (-1: none); ``hole[t]``: the state after the hole that starts at ``t`` (-1: none; a hole state reads
    no byte of its own: the content is the span automaton's), ``accepting[t]``: the output may end at ``t``."""

    table: np.ndarray  # int32 [states, 256]
    hole: np.ndarray  # int32 [states]
    accepting: np.ndarray  # bool [states]

    @classmethod
    def of_regex(cls, regex: str, slots: int) -> TemplateDFA:
        """The DFA of ``regex`` (holding ``grounding.placeholder(k)`` for each of ``slots`` grounded strings).
        Raises GrammarError where a state may both start a hole and read a byte of its own (a grounded string
        beside another alternative for the same text), which this automaton does not serve."""
        from outlines_core import Index, Vocabulary

        from loraplex.grammar.backend_outlines.automaton import SENTINEL_BYTES, SENTINEL_CHAR

        # Single bytes, and each placeholder (NUL, k's digits, NUL) as one symbol of its own: a hole. No output
        # holds a raw NUL, so the placeholders' inner states, reached by byte 0 only, are left out.
        probe: dict[bytes, list[int]] = {bytes([b]): [b] for b in range(256) if b != 0xF4}
        probe[SENTINEL_BYTES] = [256]
        for k in range(slots):
            probe[placeholder(k).encode("utf-8")] = [257 + k]
        index = Index(f"(?:{regex}){SENTINEL_CHAR}", Vocabulary(257 + slots, probe))
        raw: dict[int, dict[int, int]] = index.get_transitions()
        finals = set(index.get_final_states())
        order = [index.get_initial_state()]
        number = {order[0]: 0}
        for s in order:  # breadth first; the list grows as it is read
            for token, nxt in raw.get(s, {}).items():
                if token != 0 and nxt not in finals and nxt not in number:
                    number[nxt] = len(order)
                    order.append(nxt)
        n = len(order)
        table = np.full((n, 256), -1, dtype=np.int32)
        hole = np.full(n, -1, dtype=np.int32)
        accepting = np.zeros(n, dtype=bool)
        for i, s in enumerate(order):
            for token, nxt in raw.get(s, {}).items():
                if 0 < token < 256 and nxt in number:
                    table[i, token] = number[nxt]
                elif token == 256 and nxt in finals:
                    accepting[i] = True
                elif token > 256 and nxt in number:
                    if hole[i] >= 0:
                        raise GrammarError("two grounded strings start at one place of the schema")
                    hole[i] = number[nxt]
            if hole[i] >= 0 and (table[i] >= 0).any():
                raise GrammarError("a grounded string starts where other text may also be written")
        return cls(table, hole, accepting)


# ---- the vocabulary's byte trie ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenTrie:
    """Every token's bytes in one trie (breadth-first node order, node 0 the root): node i's children are
    ``child_node[child_start[i]:child_start[i + 1]]`` on bytes ``child_byte[...]``, and the tokens spelled by the
    path to node i are ``token_ids[token_start[i]:token_start[i + 1]]``. Built once per tokenizer."""

    child_start: np.ndarray  # int32 [nodes + 1]
    child_node: np.ndarray  # int32 [nodes - 1]
    child_byte: np.ndarray  # uint8 [nodes - 1]
    token_start: np.ndarray  # int32 [nodes + 1]
    token_ids: np.ndarray  # int32

    @property
    def nodes(self) -> int:
        return len(self.child_start) - 1

    @classmethod
    def of(cls, token_bytes: Sequence[bytes | None]) -> TokenTrie:
        children: list[dict[int, int]] = [{}]
        ends: list[list[int]] = [[]]
        for tid, data in enumerate(token_bytes):
            if not data:
                continue
            node = 0
            for b in data:
                nxt = children[node].get(b)
                if nxt is None:
                    nxt = children[node][b] = len(children)
                    children.append({})
                    ends.append([])
                node = nxt
            ends[node].append(tid)
        order = [0]  # breadth first, so that a node's children are one run
        for node in order:
            order.extend(children[node][b] for b in sorted(children[node]))
        new = {old: i for i, old in enumerate(order)}
        child_start, child_node, child_byte, token_start, token_ids = [0], [], [], [0], []
        for old in order:
            for b in sorted(children[old]):
                child_byte.append(b)
                child_node.append(new[children[old][b]])
            child_start.append(len(child_node))
            token_ids.extend(ends[old])
            token_start.append(len(token_ids))
        i32 = np.int32
        return cls(
            np.asarray(child_start, i32),
            np.asarray(child_node, i32),
            np.asarray(child_byte, np.uint8),
            np.asarray(token_start, i32),
            np.asarray(token_ids, i32),
        )


# ---- the C automaton ---------------------------------------------------------------------------------------------
_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_SIGNATURES: dict[str, tuple[object, list[Any]]] = {
    "loraplex_sam_build": (_P, [_P, _I64]),
    "loraplex_sam_free": (None, [_P]),
    "loraplex_sam_states": (_I64, [_P]),
    "loraplex_span_consume": (_I64, [_P, _P, _P, _P, _P, _I64]),
    "loraplex_span_mask": (_I64, [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P]),
    "loraplex_span_next_bytes": (_I64, [_P, _P, _P, _P, _P]),
    "loraplex_span_forced": (_I64, [_P, _P, _P, _P, _P, _P, _I64]),
}


def _library() -> ctypes.CDLL | None:
    from loraplex.kernels.cpu_build import load

    return load("span_automaton", _SIGNATURES)


def span_automaton_available() -> bool:
    """Whether the C span automaton can run here (a C compiler, C kernels not switched off)."""
    return _library() is not None


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


class SpanAutomaton:
    """The suffix automaton of one request's sources, in C (freed with the object)."""

    def __init__(self, sources: Sequence[SourceText]) -> None:
        lib = _library()
        if lib is None:
            raise GrammarError("the span automaton needs the C kernels (a C compiler, LORAPLEX_CPU_KERNELS not 0)")
        self._lib = lib
        self.symbols = source_symbols(sources)
        handle = lib.loraplex_sam_build(_ptr(self.symbols), len(self.symbols))
        if not handle:
            raise MemoryError("the span automaton could not be allocated")
        self._handle: ctypes.c_void_p | None = ctypes.c_void_p(handle)

    @property
    def states(self) -> int:
        return int(self._lib.loraplex_sam_states(self._handle))

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.loraplex_sam_free(handle)
            self._handle = None


class SpanMatcher:
    """A grammar state of one request (template + span automaton + decoder) with what a backend needs from it:
    reading bytes, the bytes that may come next, and a mask. EOS is not part of it (``accepting`` says where the
    output may end)."""

    def __init__(self, spans: SpanAutomaton, template: TemplateDFA, trie: TokenTrie, state: np.ndarray | None = None):
        self.spans, self.template, self.trie = spans, template, trie
        table = np.ascontiguousarray(template.table, dtype=np.int32)
        hole = np.ascontiguousarray(template.hole, dtype=np.int32)
        self._accepting = np.ascontiguousarray(template.accepting, dtype=np.uint8)
        self._held = (table, hole)  # (kept: the C functions read them by address)
        if state is None:
            state = np.array([0, 0 if hole[0] >= 0 else -1, 0], dtype=np.int32)  # (t, s, d)
        self.state = state
        self.visited = 0  # trie nodes the last mask reached
        lib, p = spans._lib, ctypes.c_void_p
        self._lib = lib
        # the constant arguments as ctypes values once (ctypes then passes them without converting)
        self._args = (spans._handle, p(_ptr(table)), p(_ptr(hole)))
        self._trie_args = tuple(
            p(_ptr(a)) for a in (trie.child_start, trie.child_node, trie.child_byte, trie.token_start, trie.token_ids)
        )
        self._stack = _stack_for(trie)
        self._forced_buf = np.empty(4096, dtype=np.uint8)

    def copy(self) -> SpanMatcher:
        """The same grammar state, independent of this one (everything else shared)."""
        twin = object.__new__(SpanMatcher)
        twin.__dict__.update(self.__dict__)
        twin.state = self.state.copy()
        return twin

    def key(self) -> tuple[int, int, int]:
        return (int(self.state[0]), int(self.state[1]), int(self.state[2]))

    def consume(self, data: bytes) -> bool:
        """Read ``data``; False (state unchanged) if some byte is not allowed."""
        trial = self.state.copy()
        buf = np.frombuffer(data, dtype=np.uint8)
        if self._lib.loraplex_span_consume(*self._args, _ptr(trial), _ptr(buf), len(data)) != len(data):
            return False
        self.state[:] = trial
        return True

    @property
    def accepting(self) -> bool:
        return int(self.state[1]) < 0 and bool(self.template.accepting[int(self.state[0])])

    def next_bytes(self) -> np.ndarray:
        """uint8 [256]: 1 where that byte can be read from here."""
        out = np.zeros(256, dtype=np.uint8)
        self._lib.loraplex_span_next_bytes(*self._args, _ptr(self.state), _ptr(out))
        return out

    def forced_bytes(self) -> bytes:
        """The bytes every continuation from here starts with (empty where the output may end here), at most 4096."""
        buf = self._forced_buf
        n = self._lib.loraplex_span_forced(*self._args, _ptr(self._accepting), _ptr(self.state), _ptr(buf), len(buf))
        return buf[:n].tobytes()

    def mask_into(self, ptr: int) -> None:
        """Set the bit of every token readable from here in the uint32 words at ``ptr`` (not cleared first)."""
        self.visited = int(
            self._lib.loraplex_span_mask(*self._args, _ptr(self.state), *self._trie_args, ptr, _ptr(self._stack))
        )

    def mask(self, out: np.ndarray) -> None:
        """``mask_into`` a numpy array of words."""
        self.mask_into(_ptr(out))


_stacks: dict[tuple[int, int], np.ndarray] = {}


def _stack_for(trie: TokenTrie) -> np.ndarray:
    """The walk's scratch (4 x the trie's nodes, 1.6 MB for SmolLM2's), one per trie and thread: a walk runs to its
    end on its thread, so the matchers of that thread share it instead of allocating their own."""
    key = (id(trie), threading.get_ident())
    stack = _stacks.get(key)
    if stack is None:
        stack = _stacks[key] = np.empty(4 * trie.nodes + 4, dtype=np.int32)
    return stack
