"""CompiledGrammar/GrammarMatcher over llguidance (Lark grammars, JSON schemas without an exact regex, and regexes
whose token automaton is not built yet or would be too large).

Masks are computed by llguidance each step; budget mode is grammar/budget.py's, shared with the automaton. A
grammar in the automaton's language (``automaton_language``: our regex, grammar/workers/job.py) never allows a
token holding byte 0xF4, as the automaton cannot (backend_outlines.automaton), so the two serve one language.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from loraplex.grammar.backend_types import CompiledGrammar
from loraplex.grammar.budget import PlannedMatcher
from loraplex.grammar.search import CompletionSearch, token_filter
from loraplex.grammar.spec import GrammarError
from loraplex.grammar.vocab import VocabInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VocabRows:
    """What every LLGuidanceGrammar of one tokenizer shares; built once per compiler (a pass over the
    vocabulary, which every compile paid when each grammar built its own: bench/README.md)."""

    words: int
    eos_ids: frozenset[int]
    special: frozenset[int]  # ids without bytes that are not EOS: never allowed
    with_f4: frozenset[int]  # ids whose bytes hold 0xF4: never allowed in the automaton's language
    allowed_row: torch.Tensor  # int32 [words]: every token with bytes
    automaton_row: torch.Tensor  # int32 [words]: every token with bytes, none holding 0xF4
    eos_row: torch.Tensor  # int32 [words]: the EOS ids

    @classmethod
    def of(cls, info: VocabInfo) -> VocabRows:
        eos_ids = frozenset(info.eos_ids)
        allowed, eos = token_filter(info, automaton_language=False)
        automaton, _ = token_filter(info, automaton_language=True)
        return cls(
            words=info.words,
            eos_ids=eos_ids,
            special=frozenset(t for t, b in enumerate(info.token_bytes) if b is None) - eos_ids,
            with_f4=frozenset(t for t, b in enumerate(info.token_bytes) if b is not None and 0xF4 in b),
            allowed_row=torch.from_numpy(allowed),
            automaton_row=torch.from_numpy(automaton),
            eos_row=torch.from_numpy(eos),
        )


class LLGuidanceGrammar(CompiledGrammar):
    backend = "llguidance"

    def __init__(
        self,
        grammar: str,
        ll_tokenizer: Any,
        rows: VocabRows,
        search: CompletionSearch,
        min_tokens: int,
        plan: list[int],
        close_within_budget: bool,
        template: Any = None,
        automaton_language: bool = False,
    ) -> None:
        """``template``: a fresh LLMatcher of ``grammar`` already built (the compiler builds it while the
        worker plans), else it is built here. ``search`` must be the one of the grammar's language
        (``CompletionSearch.automaton_language``)."""
        from llguidance import LLMatcher

        if template is None:
            template = LLMatcher(ll_tokenizer, grammar, log_level=0)
        if template.is_error():
            raise GrammarError(f"llguidance rejected the grammar: {template.get_error()}")
        self._template = template
        self.grammar = grammar
        self.search = search
        self.min_tokens = min_tokens
        self.plan = list(plan)
        self.close_within_budget = close_within_budget
        if search.automaton_language != automaton_language:
            raise ValueError("the completion search must be the one of the grammar's language")
        self.automaton_language = automaton_language
        self.eos_ids = rows.eos_ids
        self.words = rows.words
        self.allowed_row = rows.automaton_row if automaton_language else rows.allowed_row
        self.eos_row = rows.eos_row
        self.never = rows.special | rows.with_f4 if automaton_language else rows.special

    def new_matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self, self._template.deep_copy())


class LLGuidanceMatcher(PlannedMatcher):
    def __init__(self, grammar: LLGuidanceGrammar, matcher: Any) -> None:
        self._g = grammar
        self._m = matcher
        self._buf = torch.zeros(grammar.words, dtype=torch.int32)
        g = grammar
        self._init_plan(g.search, g.plan, g.close_within_budget, g.words, g.eos_ids, g.eos_row, g.never)

    # ---- state -----------------------------------------------------------------------------------
    def accept_token(self, token_id: int) -> bool:
        g = self._g
        if self._terminated or self.failure is not None:
            return False
        if token_id in g.eos_ids:
            if self._m.is_accepting():
                self._terminated = True
                return True
            return False
        if token_id in g.never or self._m.validate_tokens([token_id]) != 1:
            return False
        if not self._m.consume_token(token_id):
            # validate_tokens said yes, but llguidance's lexer can still give up on a long document ("too many
            # expressions constructed"): the matcher refuses from here on, so its request stops with an error
            # and nobody else's step fails
            self.failure = f"llguidance matcher failed: {self._m.get_error().splitlines()[0]}"
            log.warning("%s", self.failure)
            return False
        self._advanced(token_id)
        return True

    def is_accepting(self) -> bool:
        return self.failure is None and (self._terminated or self._m.is_accepting())

    def is_terminated(self) -> bool:
        return self._terminated or (self._m.is_accepting() and self._m.is_stopped())

    def valid_prefix(self, token_ids: list[int]) -> int:
        if self._terminated:
            return 0
        g = self._g
        plain = []
        for token in token_ids:  # llguidance's count up to the first EOS or never-allowed token
            if token in g.eos_ids or token in g.never:
                break
            plain.append(token)
        n = int(self._m.validate_tokens(plain)) if plain else 0
        if n == len(plain) < len(token_ids) and token_ids[n] in g.eos_ids:  # EOS ends a complete output only
            trial = self._m.deep_copy()
            if all(trial.consume_token(t) for t in plain) and trial.is_accepting():
                n += 1
        return n

    def native_forced_bytes(self) -> bytes | None:
        return b"" if self._terminated else bytes(self._m.compute_ff_bytes())

    def fork(self) -> LLGuidanceMatcher:
        copy = LLGuidanceMatcher(self._g, self._m.deep_copy())
        copy._terminated = self._terminated
        copy.failure = self.failure
        self._copy_plan_to(copy)
        return copy

    def bitmask_words(self) -> int:
        return self._g.words

    # ---- what PlannedMatcher asks ----------------------------------------------------------------
    def _node(self) -> Any:
        return self._m

    def _accepting(self) -> bool:
        return bool(self._m.is_accepting())

    def _fill_plain(self, out: torch.Tensor) -> None:
        g = self._g
        buf = self._buf
        self._m.unsafe_compute_mask_ptr(buf.data_ptr(), g.words * 4)
        buf.bitwise_and_(g.allowed_row)
        if self._m.is_accepting():
            buf.bitwise_or_(g.eos_row)
        out.copy_(buf)
