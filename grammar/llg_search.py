"""Bounded search for a short completion from an llguidance matcher's state.

llguidance exposes no states, so distances cannot be precomputed. We search breadth-first over
single bytes (every byte has a one-byte token), following forced bytes in one jump and keeping,
per depth, one matcher for each distinct next-token mask (states that allow the same tokens are
treated as the same). The first accepting byte string found is then split into as few tokens as
the matcher allows (dynamic programming over the vocabulary). The result is a concrete plan:
achievable, usually the shortest, always an upper bound on the true distance.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from loraplex.grammar.vocab import VocabInfo

MAX_TOKEN_BYTES = 48


class CompletionSearch:
    def __init__(self, info: VocabInfo, *, max_expansions: int = 400, beam: int = 24, max_bytes: int = 2048) -> None:
        self.words = info.words
        self.max_expansions = max_expansions
        self.beam = beam
        self.max_bytes = max_bytes
        self.byte_token = np.full(256, -1, dtype=np.int64)
        self.by_bytes: dict[bytes, int] = {}
        for tid, data in enumerate(info.token_bytes):
            if data is None or len(data) > MAX_TOKEN_BYTES:
                continue
            self.by_bytes.setdefault(data, tid)
            if len(data) == 1 and self.byte_token[data[0]] < 0:
                self.byte_token[data[0]] = tid
        self._bytes = np.flatnonzero(self.byte_token >= 0)
        ids = self.byte_token[self._bytes]
        self._word, self._bit = ids >> 5, ids & 31
        self._buf = np.zeros(self.words, dtype=np.int32)

    def _mask(self, m: Any) -> np.ndarray:
        m.unsafe_compute_mask_ptr(self._buf.ctypes.data, self.words * 4)
        return self._buf

    def plan(self, matcher: Any) -> list[int] | None:
        """Tokens from `matcher`'s state to an accepting one, or None if none found in bounds."""
        if matcher.is_accepting():
            return []
        frontier: list[tuple[Any, bytes]] = [(matcher.deep_copy(), b"")]
        expansions = 0
        while frontier and expansions < self.max_expansions:
            level: dict[int, tuple[Any, bytes]] = {}
            for node, path in frontier:
                forced = node.compute_ff_bytes()
                if forced:
                    node, path = node.deep_copy(), path + forced
                    if not self._consume_bytes(node, forced):
                        continue
                    if node.is_accepting():
                        return self.tokenize(matcher, path)
                if len(path) >= self.max_bytes:
                    continue
                expansions += 1
                mask = self._mask(node)
                allowed = self._bytes[((mask[self._word] >> self._bit) & 1).astype(bool)]
                for b in allowed.tolist():
                    child = node.deep_copy()
                    if not child.consume_token(int(self.byte_token[b])):
                        continue
                    child_path = path + bytes([b])
                    if child.is_accepting():
                        return self.tokenize(matcher, child_path)
                    sig = hash(self._mask(child).tobytes())
                    if sig not in level:
                        level[sig] = (child, child_path)
            frontier = list(level.values())[: self.beam]
        return None

    def _consume_bytes(self, m: Any, data: bytes) -> bool:
        for b in data:
            tid = int(self.byte_token[b])
            if tid < 0 or not m.consume_token(tid):
                return False
        return True

    def tokenize(self, matcher: Any, data: bytes) -> list[int]:
        """Fewest tokens spelling `data` that the matcher allows, starting from its state."""
        n = len(data)
        states = [matcher.deep_copy()]
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
                if tid is not None and states[i].validate_tokens([tid]) == 1:
                    best[i + length] = best[i] + 1
                    back[i + length] = (i, tid)
        out: list[int] = []
        pos = n
        while pos > 0:
            i, tid = back[pos]  # type: ignore[misc]
            out.append(tid)
            pos = i
        return out[::-1]
