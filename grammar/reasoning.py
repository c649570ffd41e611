"""A constraint that applies after the model's reasoning (engine/reasoning.py): free text inside ``<think>...</think>``,
then the constrained answer, all within one token budget.

While reasoning, every token with text is allowed but EOS (the answer must come) and the tokens that would finish
the closing marker with more text after it in the same token (the answer must start on a token of its own, where
the constraint's matcher takes over). Once the remaining budget is down to the closing marker's tokens plus the
fewest tokens that complete the answer, the marker is forced, token by token: thinking never eats the answer.
After the marker up to two whitespace tokens may come before the answer (the splitter drops them). Where the
prompt leaves it open whether the model thinks (``MAY_OPEN``), the first token is the opening marker's or one of the
answer's. The answer is the inner matcher's throughout, budget mode included.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from loraplex.grammar.backend_types import GrammarMatcher

if TYPE_CHECKING:
    from loraplex.engine.reasoning import Phase, ReasoningFormat

MAX_LEADING_WHITESPACE = 2  # tokens between the closing marker and the answer


def _row(words: int, ids: Iterable[int]) -> torch.Tensor:
    row = torch.zeros(words, dtype=torch.int32)
    view = row.numpy().view("uint32")
    for t in ids:
        view[t // 32] |= 1 << (t % 32)
    return row


@dataclass(frozen=True)
class ReasoningVocab:
    """What every reasoning matcher of one engine shares (one pass over the vocabulary)."""

    fmt: ReasoningFormat
    words: int
    token_bytes: list[bytes]  # (special tokens without text: b"")
    free_row: torch.Tensor  # every token with text, EOS excluded
    whitespace_row: torch.Tensor  # tokens that are whitespace only
    whitespace: frozenset[int]
    # tokens that finish the closing marker with non-whitespace text after it, by how many marker bytes the text
    # before them already holds (0: the token holds the whole marker)
    finishing: tuple[frozenset[int], ...]
    finishing_rows: tuple[torch.Tensor, ...]

    @classmethod
    def of(
        cls, fmt: ReasoningFormat, token_bytes: Sequence[bytes | None], eos_ids: frozenset[int], words: int
    ) -> ReasoningVocab:
        spelled = [b or b"" for b in token_bytes]
        end = fmt.end.encode()
        free = {t for t, b in enumerate(token_bytes) if b and t not in eos_ids}
        free |= set(fmt.start_ids) | set(fmt.end_ids)
        whitespace = {t for t in free if spelled[t] and not spelled[t].strip()}
        finishing: list[frozenset[int]] = []
        for held in range(len(end)):
            need = end[held:]
            found = set()
            for t in free:
                b = spelled[t]
                at = b.find(need) if held == 0 else (0 if b.startswith(need) else -1)
                if at >= 0 and b[at + len(need) :].strip():
                    found.add(t)
            finishing.append(frozenset(found))
        return cls(
            fmt,
            words,
            spelled,
            _row(words, free),
            _row(words, whitespace),
            frozenset(whitespace),
            tuple(finishing),
            tuple(_row(words, f) for f in finishing),
        )


class ReasoningMatcher(GrammarMatcher):
    def __init__(self, inner: GrammarMatcher, vocab: ReasoningVocab, phase: Phase) -> None:
        self._inner = inner
        self._v = vocab
        self._phase = phase
        self._tail = b""  # the reasoning's last bytes (finding the closing marker)
        self._recent: tuple[int, ...] = ()  # the reasoning's last tokens (the marker by its ids)
        self._forcing: tuple[int, ...] = ()  # marker tokens still to force
        self._lead = 0  # whitespace tokens after the closing marker
        self._started = False  # the inner matcher has taken a token
        self._opening = False  # forcing the opening marker's later tokens (not reasoning text)
        self._count = 0
        self.answer_start = 0

    # ---- phases ------------------------------------------------------------------------------------
    @property
    def _reasoning(self) -> bool:
        from loraplex.engine.reasoning import Phase

        return self._phase == Phase.REASONING

    @property
    def _may_open(self) -> bool:
        from loraplex.engine.reasoning import Phase

        return self._phase == Phase.MAY_OPEN

    def _answer(self) -> None:
        from loraplex.engine.reasoning import Phase

        self._phase = Phase.ANSWER
        self._forcing = ()

    def _closing_cost(self) -> int:
        return len(self._v.fmt.end_ids) + self._inner.min_tokens_to_accept()

    def _held(self) -> int:
        """How many leading bytes of the closing marker the reasoning's tail holds."""
        end = self._v.fmt.end.encode()
        for n in range(min(len(self._tail), len(end) - 1), 0, -1):
            if self._tail.endswith(end[:n]):
                return n
        return 0

    # ---- GrammarMatcher ----------------------------------------------------------------------------
    def fill_bitmask(self, out: torch.Tensor, remaining_tokens: int | None = None) -> None:
        v = self._v
        if self._may_open:
            self._inner.fill_bitmask(out, remaining_tokens)
            if remaining_tokens is None or remaining_tokens > self._closing_cost() + len(v.fmt.start_ids):
                out.copy_(out | _row(v.words, {v.fmt.start_ids[0]}))
            return
        if self._reasoning:
            if not self._forcing and remaining_tokens is not None and remaining_tokens <= self._closing_cost():
                self._forcing = v.fmt.end_ids
            if self._forcing:
                out.copy_(_row(v.words, {self._forcing[0]}))
                return
            row = v.free_row.clone()
            row &= ~v.finishing_rows[0]
            held = self._held()
            if held:
                row &= ~v.finishing_rows[held]
            out.copy_(row)
            return
        self._inner.fill_bitmask(out, remaining_tokens)
        if self._leading_allowed(remaining_tokens):
            out.copy_(out | v.whitespace_row)

    def _free(self, token_id: int) -> bool:
        """Whether the reasoning may take this token unforced (the mask's rule)."""
        v = self._v
        if token_id in v.finishing[0] or token_id in v.finishing[self._held()]:
            return False
        return bool((int(v.free_row[token_id // 32]) >> (token_id % 32)) & 1)

    def _leading_allowed(self, remaining_tokens: int | None) -> bool:
        if self._started or self._lead >= MAX_LEADING_WHITESPACE:
            return False
        return remaining_tokens is None or remaining_tokens - 1 >= self._inner.min_tokens_to_accept()

    def accept_token(self, token_id: int) -> bool:
        v = self._v
        if self._may_open:
            if token_id == v.fmt.start_ids[0]:
                from loraplex.engine.reasoning import Phase

                self._phase = Phase.REASONING
                self._forcing = v.fmt.start_ids[1:]
                self._opening = bool(self._forcing)
                self._count += 1
                return True
            self._answer()
        if self._reasoning:
            if self._forcing:
                if token_id != self._forcing[0]:
                    return False
                self._forcing = self._forcing[1:]
            elif not self._free(token_id):
                return False
            self._count += 1
            if self._opening:  # (the opening marker's tokens are not reasoning text)
                self._opening = bool(self._forcing)
                return True
            self._tail = (self._tail + v.token_bytes[token_id])[-64:]
            self._recent = (self._recent + (token_id,))[-len(v.fmt.end_ids) :]
            if self._recent == v.fmt.end_ids or v.fmt.end.encode() in self._tail:
                self._answer()
            return True
        if not self._started and self._inner.accept_token(token_id):
            self._started = True
            self.answer_start = self._count
            self._count += 1
            return True
        if self._started:
            ok = self._inner.accept_token(token_id)
            self._count += ok
            return ok
        if token_id in v.whitespace and self._lead < MAX_LEADING_WHITESPACE:
            self._lead += 1
            self._count += 1
            return True
        return False

    def is_accepting(self) -> bool:
        return not self._reasoning and not self._may_open and self._inner.is_accepting()

    def is_terminated(self) -> bool:
        return not self._reasoning and not self._may_open and self._inner.is_terminated()

    def fork(self) -> ReasoningMatcher:
        copy = ReasoningMatcher(self._inner.fork(), self._v, self._phase)
        copy.__dict__.update({k: v for k, v in self.__dict__.items() if k != "_inner"})
        return copy

    def bitmask_words(self) -> int:
        return self._v.words

    def needs_budget_check(self) -> bool:
        return self._started and self._inner.needs_budget_check()

    def fits_budget(self, token_id: int, remaining_after: int) -> bool:
        return self._inner.fits_budget(token_id, remaining_after) if self._started else True

    def budget_fallback(self) -> int:
        return self._inner.budget_fallback()

    def native_forced_bytes(self) -> bytes | None:
        """Nothing is forced before the answer (the closing marker's tokens come through the mask)."""
        if self._reasoning or self._may_open or not self._started:
            return b""
        return self._inner.native_forced_bytes()

    def valid_prefix(self, token_ids: list[int]) -> int:
        """Drafts run only in the answer: while thinking, when to force the closing marker depends on the budget,
        which a draft cannot see (an accepted draft could carry the reasoning past that point)."""
        if self._reasoning or self._may_open:
            return 0
        trial = self.fork()
        for n, token in enumerate(token_ids):
            if not trial.accept_token(token):
                return n
        return len(token_ids)

    def min_tokens_to_accept(self) -> int:
        if self._reasoning:
            return (len(self._forcing) if self._forcing else len(self._v.fmt.end_ids)) + (
                self._inner.min_tokens_to_accept()
            )
        return self._inner.min_tokens_to_accept()
