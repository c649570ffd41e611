"""Token automaton from a regex via outlines_core's Index, as plain numpy arrays.

outlines_core 0.2.14 drops a token whose bytes run through a state where a *prefix* matched
(its DFA reports matches one byte late), so `1.5` is rejected by `[0-9]+(\\.[0-9]+)?`. We append
a sentinel character (U+10FFFF) to the regex and give it its own token id: then no match ends
before the sentinel, every token is indexed, and "accepting" is "the sentinel leads to a final
state". Real tokens containing byte 0xF4 (the sentinel's lead byte; U+100000..U+10FFFF, private
use) are left out of the vocabulary.

From the Index we keep: per state the allowed tokens and their next states (CSR arrays),
which states accept, each state's distance in tokens to acceptance (backwards BFS), and one
int32 bitmask row per state, so a mask fill is a row copy. Tokens into states that cannot reach
acceptance are dropped.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from loraplex.grammar.spec import GrammarError
from loraplex.grammar.vocab import VocabInfo

SENTINEL_CHAR = "\U0010ffff"
SENTINEL_BYTES = SENTINEL_CHAR.encode("utf-8")
UNREACHABLE = np.iinfo(np.int32).max


@dataclass
class AutomatonData:
    """A deterministic token automaton; state 0 is the start."""

    offsets: np.ndarray  # int64 [S+1]: tokens of state s are tokens[offsets[s]:offsets[s+1]]
    tokens: np.ndarray  # int32, sorted within each state
    nexts: np.ndarray  # int32, next state for each entry of `tokens`
    accepting: np.ndarray  # bool [S]
    dist: np.ndarray  # int32 [S]: fewest tokens to an accepting state
    rows: np.ndarray  # int32 [S, words]: allowed tokens (EOS bits set where accepting)

    @property
    def num_states(self) -> int:
        return len(self.accepting)


class OutlinesVocab:
    """outlines_core vocabularies for one tokenizer: the full one and a 256-byte probe."""

    def __init__(self, info: VocabInfo) -> None:
        from outlines_core import Vocabulary

        self.info = info
        self.sentinel_id = info.vocab_size
        fake_eos = info.vocab_size + 1
        by_bytes: dict[bytes, list[int]] = {}
        for tid, data in enumerate(info.token_bytes):
            if data is not None and 0xF4 not in data:
                by_bytes.setdefault(data, []).append(tid)
        by_bytes.setdefault(SENTINEL_BYTES, []).append(self.sentinel_id)
        self.full = Vocabulary(fake_eos, by_bytes)
        probe: dict[bytes, list[int]] = {bytes([b]): [b] for b in range(256) if b != 0xF4}
        probe[SENTINEL_BYTES] = [256]
        self.probe = Vocabulary(257, probe)


def _index(regex: str, vocabulary) -> "object":  # type: ignore[no-untyped-def]
    from outlines_core import Index

    try:
        return Index(f"(?:{regex}){SENTINEL_CHAR}", vocabulary)
    except ValueError as e:
        raise GrammarError(f"regex cannot be compiled into an automaton: {e}") from None


def count_states(regex: str, vocab: OutlinesVocab) -> int:
    """Number of automaton states (cheap: a 256-byte vocabulary instead of the tokenizer's)."""
    return len(_index(regex, vocab.probe).get_transitions())


def build_automaton(regex: str, vocab: OutlinesVocab) -> AutomatonData:
    """Compile `regex` (full match of the output) into an AutomatonData for the tokenizer."""
    index = _index(regex, vocab.full)
    raw = index.get_transitions()
    finals = set(index.get_final_states())
    sentinel = vocab.sentinel_id
    start = index.get_initial_state()
    # number states by BFS from the start, skipping the sentinel edge (it leaves the output)
    number = {start: 0}
    order = [start]
    queue = deque([start])
    while queue:
        s = queue.popleft()
        for tid, nxt in raw.get(s, {}).items():
            if tid != sentinel and tid < vocab.info.vocab_size and nxt not in number:
                number[nxt] = len(order)
                order.append(nxt)
                queue.append(nxt)
    n = len(order)
    accepting = np.array([raw.get(s, {}).get(sentinel) in finals for s in order], dtype=bool)
    if not accepting.any():
        raise GrammarError("the constraint matches no output")
    src_l, tok_l, dst_l = [], [], []
    for i, s in enumerate(order):
        edges = [(t, number[d]) for t, d in raw.get(s, {}).items() if t != sentinel and t < vocab.info.vocab_size]
        if edges:
            t_arr, d_arr = zip(*edges)
            src_l.append(np.full(len(edges), i, dtype=np.int32))
            tok_l.append(np.asarray(t_arr, dtype=np.int32))
            dst_l.append(np.asarray(d_arr, dtype=np.int32))
    src = np.concatenate(src_l) if src_l else np.zeros(0, np.int32)
    tok = np.concatenate(tok_l) if tok_l else np.zeros(0, np.int32)
    dst = np.concatenate(dst_l) if dst_l else np.zeros(0, np.int32)
    dist = _distances(n, src, dst, accepting)
    if dist[0] == UNREACHABLE:
        raise GrammarError("the constraint matches no output")
    keep = dist[dst] != UNREACHABLE
    src, tok, dst = src[keep], tok[keep], dst[keep]
    order_idx = np.lexsort((tok, src))
    src, tok, dst = src[order_idx], tok[order_idx], dst[order_idx]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=offsets[1:])
    rows = _rows(n, src, tok, accepting, vocab.info)
    return AutomatonData(offsets, tok, dst, accepting, dist, rows)


def _distances(n: int, src: np.ndarray, dst: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """Fewest tokens from each state to an accepting one: BFS backwards over distinct edges."""
    pairs = np.unique(src.astype(np.int64) * n + dst)
    e_src, e_dst = pairs // n, pairs % n
    incoming: list[list[int]] = [[] for _ in range(n)]
    for a, b in zip(e_src.tolist(), e_dst.tolist()):
        incoming[b].append(a)
    dist = np.full(n, UNREACHABLE, dtype=np.int32)
    queue = deque(np.flatnonzero(accepting).tolist())
    dist[accepting] = 0
    while queue:
        s = queue.popleft()
        for p in incoming[s]:
            if dist[p] == UNREACHABLE:
                dist[p] = dist[s] + 1
                queue.append(p)
    return dist


def token_row(token_ids: np.ndarray, words: int) -> np.ndarray:
    """Pack token ids into one int32 bitmask row (bit b of word w = token 32*w+b)."""
    bits = np.zeros(words * 32, dtype=bool)
    bits[token_ids] = True
    return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32, copy=False)


def _rows(n: int, src: np.ndarray, tok: np.ndarray, accepting: np.ndarray, info: VocabInfo) -> np.ndarray:
    words = info.words
    rows = np.zeros((n, words), dtype=np.int32)
    chunk = max(1, (64 << 20) // (words * 32))  # bound the temporary bool matrix to ~64 MB
    eos = np.asarray(info.eos_ids, dtype=np.int64)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        bits = np.zeros((hi - lo, words * 32), dtype=bool)
        sel = (src >= lo) & (src < hi)
        bits[src[sel] - lo, tok[sel]] = True
        acc = np.flatnonzero(accepting[lo:hi])
        if len(acc):
            bits[np.repeat(acc, len(eos)), np.tile(eos, len(acc))] = True
        rows[lo:hi] = np.packbits(bits, axis=1, bitorder="little").view("<i4")
    return rows
