"""Structured output inside the batch: compile off the loop, wait in the scheduler, mask before sampling.

Grammars compile in loraplex.grammar's worker pool; a constrained request stays in the waiting queue
(without holding anyone else up) until its matcher is ready. Each step, every constrained row gets
its allowed-token bitmask filled by its matcher and applied to its logits row; unconstrained rows are
never touched. The matcher advances with each sampled token; when it reaches an accepting state with
no continuation the sequence finishes, and when the remaining budget reaches the fewest tokens that
complete the document, only tokens on a shortest completion path stay allowed. Where a mask cannot
guarantee that by itself (llguidance), the sampled token of that row is checked before it is taken
(`budget_check`: the sampler then falls back to the runner-up of the same draw).
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future

import torch

from loraplex.engine.sampling_params import RequestError
from loraplex.engine.sequence import Sequence
from loraplex.kernels.bitmask import apply_token_bitmask


class StructuredOutputManager:
    """Owns the grammar compiler, gates admission on compiled grammars, fills and applies bitmasks."""

    def __init__(self, tokenizer, eos_token_ids: list[int], vocab_size: int, timeout_s: float, cache_size: int,
                 workers: int) -> None:
        self._tokenizer = tokenizer
        self._eos = eos_token_ids
        self.vocab_size = vocab_size
        self._timeout = timeout_s
        self._cache_size = cache_size
        self._workers = workers
        self._compiler = None  # created on first use: unconstrained deployments never start the pool
        self._failed: dict[str, str] = {}  # request id -> error message
        self.mask_seconds: deque[float] = deque(maxlen=100_000)  # per constrained sequence-step fill time
        self.check_seconds: deque[float] = deque(maxlen=100_000)  # per checked sequence-step budget check

    @property
    def compiler(self):
        if self._compiler is None:
            from loraplex.grammar.compiler import GrammarCompiler

            self._compiler = GrammarCompiler(self._tokenizer, eos_token_ids=self._eos, vocab_size=self.vocab_size,
                                             timeout_s=self._timeout, cache_size=self._cache_size,
                                             max_workers=self._workers)
        return self._compiler

    def stats(self) -> dict:
        """Compile counters for metrics (zeros until the first constrained request starts the compiler)."""
        st = self._compiler.stats() if self._compiler is not None else {}
        return {"grammar_compiles": st.get("compiles", 0), "grammar_compile_seconds": st.get("compile_seconds", 0.0),
                "grammar_cache_hits": st.get("cache_hits", 0)}

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()

    def submit(self, seq: Sequence) -> Future | None:
        spec = seq.params.structured
        if spec is None:
            return None
        seq.grammar_future = self.compiler.submit(spec)
        return seq.grammar_future

    @staticmethod
    def check_budget(compiled, max_tokens: int | None) -> None:
        """Refuse a request whose max_tokens cannot hold even the shortest valid output."""
        if max_tokens is not None and compiled.min_tokens > max_tokens:
            raise RequestError(f"max_tokens={max_tokens} is too small for this structured output: the shortest "
                               f"valid output needs {compiled.min_tokens} tokens")

    # ---------------------------------------------------------------- AdmissionPolicy
    def begin_step(self, running: list[Sequence]) -> None:
        pass

    def can_admit(self, seq: Sequence) -> bool:
        fut = seq.grammar_future
        if fut is None or seq.grammar is not None:
            return True
        if not fut.done():
            return False
        try:
            compiled = fut.result()
            self.check_budget(compiled, seq.params.max_tokens)
        except Exception as exc:  # GrammarError, RequestError, timeout: that request only
            self._failed[seq.request_id] = str(exc)
            return False
        seq.grammar = compiled.new_matcher()
        return True

    def admitted(self, seq: Sequence) -> None:
        pass

    def take_failures(self) -> dict[str, str]:
        failed, self._failed = self._failed, {}
        return failed

    # ---------------------------------------------------------------- per step
    def apply_masks(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Mask the logits rows of constrained sequences (rows align with `seqs`)."""
        rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
        if not rows:
            return
        words = (self.vocab_size + 31) // 32
        bitmask = torch.empty((len(rows), words), dtype=torch.int32)
        for j, i in enumerate(rows):
            seq = seqs[i]
            remaining = seq.remaining_tokens if seq.params.structured.close_within_budget else None
            t = time.perf_counter()
            seq.grammar.fill_bitmask(bitmask[j], remaining)
            self.mask_seconds.append(time.perf_counter() - t)
        apply_token_bitmask(logits, bitmask.to(logits.device, non_blocking=True),
                            torch.tensor(rows, dtype=torch.long, device=logits.device))

    def budget_check(self, seqs: list[Sequence]) -> "BudgetCheck | None":
        """The rows (aligned with `seqs`) whose sampled token must be checked against the budget."""
        rows = [i for i, s in enumerate(seqs) if s.grammar is not None and s.grammar.needs_budget_check()]
        return BudgetCheck(seqs, rows, self.check_seconds) if rows else None

    @staticmethod
    def advance(seq: Sequence, token: int) -> str | None:
        """Feed the sampled token to the matcher; a finish reason when the grammar decides one."""
        m = seq.grammar
        if m is None:
            return None
        if not m.accept_token(token):
            # The mask allowed only valid tokens, so this means the matcher and mask disagree: stop cleanly.
            return "error"
        if m.is_terminated():
            return "stop"
        remaining = seq.remaining_tokens
        if remaining is not None and remaining <= 0:
            return "stop" if m.is_accepting() else "length"
        return None


class BudgetCheck:
    """The sampler's TokenCheck for constrained rows: the output must stay closable within max_tokens."""

    def __init__(self, seqs: list[Sequence], rows: list[int], seconds: deque[float]) -> None:
        self._seqs = seqs
        self.rows = rows
        self._seconds = seconds

    def fits(self, row: int, token: int) -> bool:
        seq = self._seqs[row]
        t = time.perf_counter()
        ok = seq.grammar.fits_budget(token, seq.remaining_tokens - 1)
        self._seconds.append(time.perf_counter() - t)
        return ok

    def fallback(self, row: int) -> int:
        return self._seqs[row].grammar.budget_fallback()
