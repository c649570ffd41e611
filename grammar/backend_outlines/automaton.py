"""Token automaton from a regex via outlines_core's Index, as plain numpy arrays.

outlines_core 0.2.14 drops a token whose bytes run through a state where a *prefix* matched
(its DFA reports matches one byte late), so `1.5` is rejected by `[0-9]+(\\.[0-9]+)?`. We append
a sentinel character (U+10FFFF) to the regex and give it its own token id: then no match ends
before the sentinel, every token is indexed, and "accepting" is "the sentinel leads to a final
state". Real tokens containing byte 0xF4 (the sentinel's lead byte; U+100000..U+10FFFF, private
use) are left out of the vocabulary.

From the Index we keep: a transition table over token classes, which states accept, and one int32 bitmask row per
state, so a mask fill is a row copy. Tokens into states that cannot reach acceptance (found by a backwards BFS of
distances) are dropped; how an output closes within a budget is grammar/budget.py's, the same for both backends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from loraplex.grammar.spec import GrammarError
from loraplex.grammar.vocab import VocabInfo

SENTINEL_CHAR = "\U0010ffff"
SENTINEL_BYTES = SENTINEL_CHAR.encode("utf-8")
UNREACHABLE = np.iinfo(np.int32).max


@dataclass
class AutomatonData:
    """A deterministic token automaton; state 0 is the start.

    Tokens that behave alike in every state share a class, so transitions are a small
    [states, classes] table: next state of token t in state s is table[s, token_class[t]]
    (-1: not allowed).
    """

    token_class: np.ndarray  # int32 [vocab_size]
    table: np.ndarray  # int32 [S, C]
    accepting: np.ndarray  # bool [S]
    rows: np.ndarray  # int32 [S, words]: allowed tokens (EOS bits set where accepting)


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


def _index(regex: str, vocabulary: Any) -> Any:  # (outlines_core ships no type information)
    from outlines_core import Index

    try:
        return Index(f"(?:{regex}){SENTINEL_CHAR}", vocabulary)
    except ValueError as e:
        if "incompatible with the regex" in str(e):  # no way to the end: nothing matches
            raise GrammarError("the constraint matches no output this tokenizer can produce") from None
        raise GrammarError(f"regex cannot be compiled into an automaton: {e}") from None


def count_states(regex: str, vocab: OutlinesVocab) -> int:
    """Number of automaton states (cheap: a 256-byte vocabulary instead of the tokenizer's)."""
    return len(_index(regex, vocab.probe).get_transitions())


def build_automaton(regex: str, vocab: OutlinesVocab) -> AutomatonData:
    """Compile `regex` (full match of the output) into an AutomatonData for the tokenizer."""
    index = _index(regex, vocab.full)
    raw: dict[int, dict[int, int]] = index.get_transitions()
    finals = set(index.get_final_states())  # states after the sentinel: outside the output
    sentinel = vocab.sentinel_id
    start = index.get_initial_state()
    order = [start]
    number = {start: 0}
    queue = deque([start])
    while queue:
        for succ_state in set(raw.get(queue.popleft(), {}).values()):
            if succ_state not in finals and succ_state not in number:
                number[succ_state] = len(order)
                order.append(succ_state)
                queue.append(succ_state)
    n = len(order)
    accepting = np.array([raw.get(s, {}).get(sentinel) in finals for s in order], dtype=bool)
    succ = [[number[d] for d in set(raw.get(s, {}).values()) if d in number] for s in order]
    dist = distances_to_accept(n, succ, accepting)
    if dist[0] == UNREACHABLE:
        raise GrammarError("the constraint matches no output")
    lookup = np.full(max(max(number), max(finals, default=0)) + 1, -1, dtype=np.int64)
    lookup[list(number)] = list(number.values())
    vocab_size = vocab.info.vocab_size

    def dense(i: int) -> np.ndarray:
        """Next state (or -1) of every token in state i, without tokens into dead states."""
        trans = raw.get(order[i], {})
        toks = np.fromiter(trans.keys(), dtype=np.int64, count=len(trans))
        nxts = lookup[np.fromiter(trans.values(), dtype=np.int64, count=len(trans))]
        ok = (toks < vocab_size) & (nxts >= 0)
        toks, nxts = toks[ok], nxts[ok]
        live = dist[nxts] != UNREACHABLE
        out = np.full(vocab_size, -1, dtype=np.int64)
        out[toks[live]] = nxts[live]
        return out

    words = vocab.info.words
    rows = np.zeros((n, words), dtype=np.int32)
    signature = np.zeros(vocab_size, dtype=np.uint64)
    eos = np.asarray(vocab.info.eos_ids, dtype=np.int64)
    for i in range(n):
        nxt = dense(i)
        signature = signature * np.uint64(1_000_003) + (nxt + 2).astype(np.uint64)
        allowed = np.flatnonzero(nxt >= 0)
        if accepting[i]:
            allowed = np.concatenate([allowed, eos])
        rows[i] = token_row(allowed, words)
    _, rep, token_class = np.unique(signature, return_index=True, return_inverse=True)
    token_class = token_class.astype(np.int32)
    table = np.empty((n, len(rep)), dtype=np.int32)
    for i in range(n):
        nxt = dense(i)
        table[i] = nxt[rep]
        if not np.array_equal(table[i][token_class], nxt):  # a hash collision merged two classes
            token_class = np.arange(vocab_size, dtype=np.int32)
            table = np.stack([dense(j) for j in range(n)]).astype(np.int32)
            break
    return AutomatonData(token_class, table, accepting, rows)


def distances_to_accept(n: int, succ: list[list[int]], accepting: np.ndarray) -> np.ndarray:
    """Fewest tokens from each state to an accepting one: BFS backwards over the state graph."""
    incoming: list[list[int]] = [[] for _ in range(n)]
    for a, outs in enumerate(succ):
        for b in outs:
            incoming[b].append(a)
    dist = np.full(n, UNREACHABLE, dtype=np.int64)
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
