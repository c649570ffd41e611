"""Our own span automaton for grounded values: the per-request part built in 1-3 ms per 10,000 characters, where
llguidance's bind takes 17-25 ms (bench/README.md, issue 37's build target).

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

A grounded string's other keywords (minLength/maxLength, pattern, format, enum) are its content DFA
(``TemplateDFA.content_table``: their intersection, lengths counted unit by unit), read beside the span automaton;
a mask then only follows paths from which the value can still end (the C ``live`` search, memoised per request, with
a bound past which the value is narrowed). grammar/span_grammar.py binds each request to it; the template is built
in the compile worker (grammar/workers/job.py). llguidance binds what this does not serve (tool calls, templates
too large or too slow to build, no C compiler), in the same language.

The budget's completion search (grammar/search.py) walks span states in C too (``SpanMatcher.greedy``): a request's
completions from inside a grounded string read its source, so each request makes its own, on its masks' clock.
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loraplex.grammar.backend_outlines.automaton import (
    SENTINEL_BYTES,
    SENTINEL_CHAR,
    UNREACHABLE,
    distances_to_accept,
)
from loraplex.grammar.grounding import SourceText, placeholder, source_pieces
from loraplex.grammar.schema.json_text import UNIT
from loraplex.grammar.search import WalkInputs
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
def _byte_dfa(regex: str, holes: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``regex`` as a byte DFA: (table [states, 256], accepting, hole [states]: the state after the hole starting
    there, hole_slot [states]: its grounded string). Placeholders ``grounding.placeholder(k)`` for k < ``holes`` are
    holes: each one token of its own in outlines_core's Index over single bytes; no output holds a raw NUL (their
    first byte), so the placeholders' inner states are left out. States that cannot reach the end are dropped."""
    from outlines_core import Index, Vocabulary

    probe: dict[bytes, list[int]] = {bytes([b]): [b] for b in range(256) if b != 0xF4}
    probe[SENTINEL_BYTES] = [256]
    for k in range(holes):
        probe[placeholder(k).encode("utf-8")] = [257 + k]
    try:
        index = Index(f"(?:{regex}){SENTINEL_CHAR}", Vocabulary(257 + holes, probe))
    except ValueError as e:
        raise GrammarError(f"the span automaton cannot serve this regex: {e}") from None
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
    hole_slot = np.full(n, -1, dtype=np.int32)
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
                hole[i], hole_slot[i] = number[nxt], token - 257
    dead = _dead_states(table, hole, accepting, np.zeros(n, dtype=bool))
    table[np.isin(table, np.flatnonzero(dead))] = -1
    return table, accepting, hole, hole_slot


def _dead_states(table: np.ndarray, hole: np.ndarray, accepting: np.ndarray, closed: np.ndarray) -> np.ndarray:
    """bool [states]: the states from which no path reaches an accepting one (a hole at a state of ``closed`` is no
    way through)."""
    succ = [np.unique(row[row >= 0]).tolist() for row in table]
    for t in np.flatnonzero((hole >= 0) & ~closed):
        succ[t].append(int(hole[t]))
    dead: np.ndarray = distances_to_accept(len(accepting), succ, accepting) == UNREACHABLE
    return dead


_LENGTHS = re.compile(re.escape(UNIT) + r"\{(\d+),(\d*)\}")  # minLength/maxLength's content regex (to_regex.py)


def _content_dfa(regex: str) -> tuple[np.ndarray, np.ndarray]:
    """One content regex as a byte DFA (table, accepting). A length bound is counted here, unit by unit: outlines_core
    takes minutes on a counted repetition of JSON's string unit (``UNIT{0,60}``)."""
    lengths = _LENGTHS.fullmatch(regex)
    if lengths is None:
        table, accepting, _, _ = _byte_dfa(regex)
        return table, accepting
    lo, hi = int(lengths.group(1)), int(lengths.group(2)) if lengths.group(2) else None
    unit, unit_done, _, _ = _byte_dfa(UNIT)  # one character's spelling; its accepting states read nothing more
    top = hi if hi is not None else lo  # counts saturate at lo when there is no upper bound
    u = len(unit_done)
    table = np.full(((top + 1) * u, 256), -1, dtype=np.int32)  # state c * u + j: c characters, then unit state j
    for c in range(top + 1):
        nxt = unit  # (the unit's start is state 0)
        rows = table[c * u : (c + 1) * u]
        done = unit_done[np.maximum(nxt, 0)] & (nxt >= 0)
        after = min(c + 1, top) if hi is None else c + 1
        rows[:] = np.where(nxt < 0, -1, np.where(done, after * u if after <= top else -1, c * u + nxt))
    accepting = np.zeros((top + 1) * u, dtype=bool)
    accepting[[c * u for c in range(lo, top + 1)]] = True
    return table, accepting


def _intersection(regexes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The byte DFA of the strings every regex matches (the product of their DFAs), without dead states."""
    table, accepting = _content_dfa(regexes[0])
    for rx in regexes[1:]:
        other, other_accepting = _content_dfa(rx)
        pairs = {(0, 0): 0}
        order = [(0, 0)]
        rows = []
        for p, q in order:
            a, b = table[p], other[q]
            row = np.full(256, -1, dtype=np.int32)
            for byte in np.flatnonzero((a >= 0) & (b >= 0)):
                key = (int(a[byte]), int(b[byte]))
                if key not in pairs:
                    pairs[key] = len(order)
                    order.append(key)
                row[byte] = pairs[key]
            rows.append(row)
        table = np.stack(rows) if rows else np.full((1, 256), -1, dtype=np.int32)
        accepting = np.asarray([accepting[p] and other_accepting[q] for p, q in order], dtype=bool)
        dead = _dead_states(table, np.full(len(order), -1, dtype=np.int32), accepting, np.zeros(len(order), bool))
        table[np.isin(table, np.flatnonzero(dead))] = -1
    return table, accepting


@dataclass(frozen=True)
class TemplateDFA:
    """A byte DFA of a schema regex whose grounded strings' contents are holes, with the content DFAs of their other
    keywords. State 0 is the start; ``table[t, b]`` the next state (-1: none); ``hole[t]``: the state after the hole
    that starts at ``t`` (-1: none; a hole state reads no byte of its own: the content is the span automaton's);
    ``hole_content[t]``: that hole's content DFA's start state in ``content_table`` (-1: no other keyword);
    ``accepting[t]``: the output may end at ``t``."""

    table: np.ndarray  # int32 [states, 256]
    hole: np.ndarray  # int32 [states]
    hole_slot: np.ndarray  # int32 [states]: the grounded string (slot) of the hole at t, -1: none
    hole_content: np.ndarray  # int32 [states]
    accepting: np.ndarray  # bool [states]
    content_table: np.ndarray  # int32 [content states, 256]: every slot's content DFA, one table
    content_accepting: np.ndarray  # bool [content states]

    @classmethod
    def of_regex(cls, regex: str, contents: Sequence[Sequence[str]]) -> TemplateDFA:
        """The DFA of ``regex``, holding ``grounding.placeholder(k)`` for grounded string k, whose other keywords'
        regexes (over the string's JSON content) are ``contents[k]``. Raises GrammarError where a state may both
        start a hole and read a byte of its own (a grounded string beside another alternative for the same text),
        which this automaton does not serve."""
        table, accepting, hole, hole_slot = _byte_dfa(regex, len(contents))
        if ((hole >= 0) & (table >= 0).any(axis=1)).any():
            raise GrammarError("a grounded string starts where other text may also be written")
        tables, accepts, starts, offset = [], [], [], 0
        for regexes in contents:
            if not regexes:
                starts.append(-1)
                continue
            ct, ca = _intersection(regexes)
            tables.append(np.where(ct >= 0, ct + offset, -1).astype(np.int32))
            accepts.append(ca)
            starts.append(offset)
            offset += len(ca)
        content_table = np.concatenate(tables) if tables else np.full((1, 256), -1, dtype=np.int32)
        content_accepting = np.concatenate(accepts) if accepts else np.zeros(1, dtype=bool)
        slot_start = np.asarray(starts + [-1], dtype=np.int32)
        hole_content = np.where(hole_slot >= 0, slot_start[hole_slot], -1).astype(np.int32)
        return cls(table, hole, hole_slot, hole_content, accepting, content_table, content_accepting)


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
    # each thread's walk scratch (_stack_for), freed with the trie
    scratch: threading.local = field(default_factory=threading.local, compare=False, repr=False)

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
_I32 = ctypes.c_int32
_SIGNATURES: dict[str, tuple[object, list[Any]]] = {
    "loraplex_sam_build": (_P, [_P, _I64]),
    "loraplex_sam_free": (None, [_P]),
    "loraplex_sam_states": (_I64, [_P]),
    "loraplex_span_grammar_new": (_P, [_P, _P, _P, _P, _P, _P, _P, _I64, _I64]),
    "loraplex_span_grammar_free": (None, [_P]),
    "loraplex_span_hole_live": (_I64, [_P, _I32]),
    "loraplex_span_consume": (_I64, [_P, _P, _P, _I64]),
    "loraplex_span_mask": (_I64, [_P, _P, _P, _P, _P, _P, _P, _P, _P]),
    "loraplex_span_next_bytes": (_I64, [_P, _P, _P]),
    "loraplex_span_forced": (_I64, [_P, _P, _P, _P, _I64]),
    "loraplex_span_greedy": (_I64, [_P, _P, _P, _P, _P, _I64, _I64, _P, _P]),
}
_WALK_OUT_OF_MASKS, _WALK_NO_MEMORY = -2, -3  # loraplex_span_greedy's WALK_*

# Product states (span state, content state, decoder) one question "can this grounded value still end?" may expand
# before it is answered no: the value is then narrowed (never widened). Measured questions take a few hundred.
LIVENESS_FUEL = 200_000


def _library() -> ctypes.CDLL | None:
    from loraplex.kernels.cpu_build import load

    return load("span_automaton", _SIGNATURES)


def span_automaton_available() -> bool:
    """Whether the C span automaton can run here (a C compiler, C kernels not switched off)."""
    return _library() is not None


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _lib() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise GrammarError("the span automaton needs the C kernels (a C compiler, LORAPLEX_CPU_KERNELS not 0)")
    return lib


class SpanAutomaton:
    """The suffix automaton of one request's sources, in C (freed with the object)."""

    def __init__(self, sources: Sequence[SourceText]) -> None:
        self._lib = _lib()
        self.symbols = source_symbols(sources)
        handle = self._lib.loraplex_sam_build(_ptr(self.symbols), len(self.symbols))
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


class SpanRequest:
    """One request's grammar in C: the template, its content DFAs, the span automaton of the request's sources, and
    which grounded strings no span satisfies (their holes closed, and the template states that then lead nowhere).
    Its memo of which values can still end lives as long as it does."""

    def __init__(self, spans: SpanAutomaton, template: TemplateDFA, fuel: int = LIVENESS_FUEL) -> None:
        self.spans, self.template = spans, template
        self._lib = spans._lib
        i32 = np.int32
        self._arrays = (
            np.ascontiguousarray(template.table, dtype=i32),
            np.ascontiguousarray(template.hole, dtype=i32),
            np.ascontiguousarray(template.hole_content, dtype=i32),
            np.zeros(len(template.hole), dtype=np.uint8),  # dead template states (filled below)
            np.ascontiguousarray(template.content_table, dtype=i32),
            np.ascontiguousarray(template.content_accepting, dtype=np.uint8),
        )
        self.dead = self._arrays[3]
        self.accepting = np.ascontiguousarray(template.accepting, dtype=np.uint8)
        handle = self._lib.loraplex_span_grammar_new(
            spans._handle, *(_ptr(a) for a in self._arrays), len(template.content_accepting), fuel
        )
        if not handle:
            raise MemoryError("the span automaton's grammar could not be allocated")
        self._handle: ctypes.c_void_p | None = ctypes.c_void_p(handle)
        closed = np.zeros(len(template.hole), dtype=bool)
        for t in np.flatnonzero(template.hole_content >= 0):
            closed[t] = not self._lib.loraplex_span_hole_live(self._handle, int(t))
        # the grounded strings no span of these sources satisfies (with their other keywords)
        self.empty_slots = sorted({int(k) for k in template.hole_slot[closed]})
        if closed.any():
            self.dead[:] = _dead_states(template.table, template.hole, template.accepting, closed)
            self.dead[closed] = 1

    @property
    def satisfiable(self) -> bool:
        return not self.dead[0]

    def start(self) -> np.ndarray:
        """The grammar state (t, s, d, q) at the start of the output."""
        t = 0
        if self.template.hole[t] >= 0:
            return np.array([t, 0, 0, self.template.hole_content[t]], dtype=np.int32)
        return np.array([t, -1, 0, -1], dtype=np.int32)

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.loraplex_span_grammar_free(handle)
            self._handle = None


FORCED_LIMIT = 4096  # forced bytes one call returns at most (SpanMatcher.forced_bytes, the greedy walk)


class _WalkTables(ctypes.Structure):
    """kernels/csrc/span_automaton.c's walk_tables_t."""

    _fields_ = [
        (name, ctypes.c_void_p)
        for name in (
            "child_start",
            "child_node",
            "child_byte",
            "token_start",
            "token_ids",
            "byte_token",
            "usable",
            "order",
            "kept",
        )
    ] + [(name, ctypes.c_int64) for name in ("words", "max_bytes", "forced_limit", "repeat")]


class GreedyWalk:
    """What the C greedy walk reads beside a grammar: the vocabulary's trie and the completion search's tables
    (grammar/search.py's ``WalkInputs``), kept alive as long as the walk is."""

    def __init__(self, trie: TokenTrie, inputs: WalkInputs) -> None:
        self.inputs = inputs
        self._arrays = (
            trie,
            np.ascontiguousarray(inputs.byte_token, dtype=np.int32),
            np.ascontiguousarray(inputs.usable, dtype=np.uint8),
            np.ascontiguousarray(inputs.order, dtype=np.uint8),
            np.ascontiguousarray(inputs.kept, dtype=np.uint32),
        )
        _, byte_token, usable, order, kept = self._arrays
        self.tables = _WalkTables(
            *(_ptr(a) for a in (trie.child_start, trie.child_node, trie.child_byte, trie.token_start, trie.token_ids)),
            _ptr(byte_token),
            _ptr(usable),
            _ptr(order),
            _ptr(kept),
            len(kept),
            inputs.max_bytes,
            FORCED_LIMIT,
            inputs.repeat,
        )
        self._out = threading.local()  # the walk's output buffer, one per thread
        self._room = inputs.max_bytes + FORCED_LIMIT

    def buffer(self) -> np.ndarray:
        out: np.ndarray | None = getattr(self._out, "buffer", None)
        if out is None:
            out = self._out.buffer = np.empty(self._room, dtype=np.uint8)
        return out


class SpanMatcher:
    """A grammar state of one request with what a backend needs from it: reading bytes, the bytes that may come
    next, the forced ones, and a mask. EOS is not part of it (``accepting`` says where the output may end)."""

    def __init__(self, request: SpanRequest, trie: TokenTrie, state: np.ndarray | None = None) -> None:
        self.request, self.trie = request, trie
        self.state = request.start() if state is None else state  # (t, s, d, q)
        self._state = ctypes.c_void_p(self.state.ctypes.data)  # (its address, as ctypes passes it without converting)
        self.visited = 0  # trie nodes the last mask reached
        self._lib = request._lib
        self._g = request._handle  # (the request, kept above, owns it)
        p = ctypes.c_void_p
        self._trie_args = tuple(
            p(_ptr(a)) for a in (trie.child_start, trie.child_node, trie.child_byte, trie.token_start, trie.token_ids)
        )
        self._accepting = p(_ptr(request.accepting))
        self._stack_thread = -1  # the thread whose walk scratch _stack_ptr points to (looked up at the first mask)
        self._stack_ptr = p(0)
        self._forced_buf = np.empty(FORCED_LIMIT, dtype=np.uint8)

    def copy(self) -> SpanMatcher:
        """The same grammar state, independent of this one (everything else shared)."""
        twin = object.__new__(SpanMatcher)
        twin.__dict__.update(self.__dict__)
        twin.state = self.state.copy()
        twin._state = ctypes.c_void_p(twin.state.ctypes.data)
        return twin

    def key(self) -> tuple[int, int, int, int]:
        s = self.state
        return (int(s[0]), int(s[1]), int(s[2]), int(s[3]))

    def consume(self, data: bytes) -> bool:
        """Read ``data``; False (state unchanged) if some byte is not allowed."""
        return bool(self._lib.loraplex_span_consume(self._g, self._state, data, len(data)) == len(data))

    def readable(self, data: bytes) -> int:
        """How many bytes of ``data`` can be read from here (reading all of them moves the state there)."""
        return int(self._lib.loraplex_span_consume(self._g, self._state, data, len(data)))

    @property
    def accepting(self) -> bool:
        return int(self.state[1]) < 0 and bool(self.request.accepting[int(self.state[0])])

    def next_bytes(self) -> np.ndarray:
        """uint8 [256]: 1 where that byte can be read from here."""
        out = np.zeros(256, dtype=np.uint8)
        self._lib.loraplex_span_next_bytes(self._g, self._state, _ptr(out))
        return out

    def forced_bytes(self) -> bytes:
        """The bytes every continuation from here starts with (empty where the output may end here), at most 4096."""
        buf = self._forced_buf
        n = self._lib.loraplex_span_forced(self._g, self._accepting, self._state, _ptr(buf), len(buf))
        return buf[:n].tobytes()

    def _stack(self) -> ctypes.c_void_p:
        thread = threading.get_ident()
        if thread != self._stack_thread:  # (a matcher made on one thread may walk on another: scratch is per thread)
            self._stack_thread, self._stack_ptr = thread, ctypes.c_void_p(_ptr(_stack_for(self.trie)))
        return self._stack_ptr

    def mask_into(self, ptr: int) -> None:
        """Set the bit of every token readable from here in the uint32 words at ``ptr`` (not cleared first)."""
        self.visited = int(self._lib.loraplex_span_mask(self._g, self._state, *self._trie_args, ptr, self._stack()))

    def greedy(
        self, walk: GreedyWalk, loop_exits: int | None, masks_left: int | None
    ) -> tuple[bytes | None, int, bool]:
        """The completion search's greedy walk from here (grammar/search.py's ``CompletionSearch._greedy``), in C:
        (its bytes, or None where it finds none; the masks it computed; whether it stopped because it needed more
        than ``masks_left``)."""
        out = walk.buffer()
        masks = ctypes.c_int64(0)
        n = int(
            self._lib.loraplex_span_greedy(
                self._g,
                self._accepting,
                self._state,
                ctypes.byref(walk.tables),
                self._stack(),
                -1 if loop_exits is None else loop_exits,
                -1 if masks_left is None else masks_left,
                _ptr(out),
                ctypes.byref(masks),
            )
        )
        if n == _WALK_NO_MEMORY:
            raise MemoryError("the span automaton's greedy walk ran out of memory")
        return (None if n < 0 else out[:n].tobytes()), masks.value, n == _WALK_OUT_OF_MASKS

    def mask(self, out: np.ndarray) -> None:
        """``mask_into`` a numpy array of words."""
        self.mask_into(_ptr(out))


def _stack_for(trie: TokenTrie) -> np.ndarray:
    """The walk's scratch (5 x the trie's nodes, 2 MB for SmolLM2's), one per trie and thread: a walk runs to its
    end on its thread, so the matchers walking on that thread share it instead of allocating their own. (Kept on the
    trie: keyed by the trie's id, a later trie of a larger vocabulary at the same address got a smaller scratch.)"""
    stack: np.ndarray | None = getattr(trie.scratch, "stack", None)
    if stack is None:
        stack = trie.scratch.stack = np.empty(5 * trie.nodes + 5, dtype=np.int32)
    return stack
