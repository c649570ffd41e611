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

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from loraplex.engine.core.sequence import Sequence
from loraplex.engine.errors import RequestError
from loraplex.engine.outputs import FinishReason
from loraplex.engine.probe import EngineProbe
from loraplex.engine.reasoning import Phase, ReasoningFormat
from loraplex.engine.stats import GrammarStats
from loraplex.kernels.bitmask import apply_token_bitmask

if TYPE_CHECKING:
    from loraplex.grammar import CompiledGrammar, GrammarCompiler, StructuredSpec
    from loraplex.grammar.backend_types import GrammarBackend, GrammarMatcher
    from loraplex.grammar.forced_bytes import ByteTable
    from loraplex.grammar.grounding import SourceText
    from loraplex.grammar.reasoning import ReasoningVocab


FORCED_TEXT_LIMIT = 64  # bytes of forced text one jump-forward or grammar draft covers at most


def utf8_prefix(data: bytes) -> str:
    """The longest prefix of ``data`` that is whole UTF-8 characters (a forced run may end inside one)."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


class StructuredOutputManager:
    """Owns the grammar compiler, gates admission on compiled grammars, fills and applies bitmasks."""

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: list[int],
        vocab_size: int,
        timeout_s: float,
        cache_size: int,
        workers: int,
        backend: GrammarBackend = "auto",
    ) -> None:
        self._tokenizer = tokenizer
        self._backend: GrammarBackend = backend
        self._eos = eos_token_ids
        self.vocab_size = vocab_size
        self._timeout = timeout_s
        self._cache_size = cache_size
        self._workers = workers
        self._compiler: GrammarCompiler | None = None  # created on first use: unconstrained deployments never
        self._compiler_lock = threading.Lock()  # start the pool; precheck may run on another thread
        self._failed: dict[str, str] = {}  # request id -> error message
        self.probe: EngineProbe | None = None  # set through LLMEngine.probe
        self._byte_table: ByteTable | None = None  # byte-level jump-forward's tables, built on first use
        self.reasoning: ReasoningFormat | None = None  # the engine's reasoning parser (set by the engine)
        # The reasoning matchers' shared tables (~0.2 s): built once, for the first constrained reasoning request,
        # in this worker after its grammar compiled (`_compiled`), never on the engine thread.
        self._reasoning_vocab: ReasoningVocab | None = None
        self._reasoning_vocab_lock = threading.Lock()
        self._vocab_builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reasoning-vocab")

    @property
    def compiler(self) -> GrammarCompiler:
        with self._compiler_lock:
            if self._compiler is None:
                from loraplex.grammar.compiler import GrammarCompiler

                self._compiler = GrammarCompiler(
                    self._tokenizer,
                    eos_token_ids=self._eos,
                    vocab_size=self.vocab_size,
                    timeout_s=self._timeout,
                    cache_size=self._cache_size,
                    max_workers=self._workers,
                    backend=self._backend,
                )
            return self._compiler

    def forced_text(self, seq: Sequence, limit: int = FORCED_TEXT_LIMIT) -> tuple[str, bool]:
        """The text the sequence's grammar forces next, cut to whole UTF-8 characters (at most ``limit`` bytes), and
        whether it completes the output (only when nothing was cut); the matcher is not changed."""
        data, complete = self.forced_bytes(seq, limit)
        text = utf8_prefix(data)
        return text, complete and len(text.encode("utf-8")) == len(data)

    def forced_bytes(self, seq: Sequence, limit: int) -> tuple[bytes, bool]:
        """The bytes the sequence's grammar forces next (at most ``limit``), and whether they complete the output
        (grammar.forced_bytes); the matcher is not changed."""
        if self._byte_table is None:
            from loraplex.grammar.forced_bytes import ByteTable

            self._byte_table = ByteTable(self.compiler.vocab)
        assert seq.grammar is not None  # (asked for constrained sequences only)
        return self._byte_table.forced(seq.grammar, limit)

    def stats(self) -> GrammarStats:
        """Compile counters for metrics (zeros until the first constrained request starts the compiler)."""
        st = self._compiler.stats() if self._compiler is not None else {}
        return GrammarStats(
            compiles=int(st.get("compiles", 0)),
            compile_seconds=st.get("compile_seconds", 0.0),
            cache_hits=int(st.get("cache_hits", 0)),
        )

    def close(self) -> None:
        self._vocab_builder.shutdown(wait=False, cancel_futures=True)
        if self._compiler is not None:
            self._compiler.close()

    def _compiled(
        self, spec: StructuredSpec, sources: tuple[SourceText, ...] | None, phase: Phase | None
    ) -> Future[CompiledGrammar]:
        """``spec`` compiled (the compiler's future); for an output that starts before its answer, resolved only
        once the reasoning tables exist too, built in ``_vocab_builder`` (a callback on an already compiled
        grammar runs on the caller's thread, which may be the engine's: it only hands the build over)."""
        compiled = self.compiler.submit(spec, sources)
        if not _before_answer(phase) or self._reasoning_vocab is not None:
            return compiled
        out: Future[CompiledGrammar] = Future()

        def build(fut: Future[CompiledGrammar]) -> None:
            try:
                grammar = fut.result()
                self._reasoning_vocab_for(grammar)
            except BaseException as exc:  # GrammarError, timeout; anything else fails this request only
                out.set_exception(exc)
            else:
                out.set_result(grammar)

        def hand_over(fut: Future[CompiledGrammar]) -> None:
            try:
                self._vocab_builder.submit(build, fut)
            except RuntimeError:  # shut down meanwhile
                out.set_exception(RequestError("the engine is closing"))

        compiled.add_done_callback(hand_over)
        return out

    def _reasoning_vocab_for(self, grammar: CompiledGrammar) -> ReasoningVocab:
        """The reasoning tables, built on first use (one pass over the vocabulary); thread-safe."""
        with self._reasoning_vocab_lock:
            if self._reasoning_vocab is None:
                from loraplex.grammar.reasoning import ReasoningVocab

                assert self.reasoning is not None  # (a phase is only set on an engine with a parser)
                v = self.compiler.vocab
                words = grammar.new_matcher().bitmask_words()
                self._reasoning_vocab = ReasoningVocab.of(self.reasoning, v.token_bytes, frozenset(self._eos), words)
            return self._reasoning_vocab

    def precheck(
        self,
        spec: StructuredSpec,
        max_tokens: int | None,
        sources: tuple[SourceText, ...] | None = None,
        phase: Phase | None = None,
    ) -> Future[CompiledGrammar | None]:
        """Compile ``spec`` (or hit the cache) and check that ``max_tokens`` holds its shortest output; the
        future fails with GrammarError or RequestError. Thread-safe: the server calls it before queueing. (Typed
        as the engine's precheck, whose unconstrained requests get None.)"""
        checked: Future[CompiledGrammar | None] = Future()

        def finish(compiled: Future[CompiledGrammar]) -> None:
            try:
                grammar = compiled.result()
                self.check_budget(grammar, max_tokens, self._closing_tokens(phase))
            except Exception as exc:  # GrammarError, RequestError, timeout
                checked.set_exception(exc)
            else:
                checked.set_result(grammar)

        self._compiled(spec, sources, phase).add_done_callback(finish)
        return checked

    def attach(self, seq: Sequence, grammar: CompiledGrammar | None) -> None:
        """Give a constrained sequence its matcher: at once from a grammar ``precheck`` returned, else once its
        compile (submitted here) is done and its budget checked (``can_admit``)."""
        spec = seq.params.structured
        if spec is None:
            return
        if grammar is not None:
            self._start(seq, grammar)
        else:
            seq.grammar_future = self._compiled(spec, seq.params.grounding_sources, seq.reasoning_phase)

    def _start(self, seq: Sequence, grammar: CompiledGrammar) -> None:
        matcher = grammar.new_matcher()
        phase = seq.reasoning_phase
        if phase is not None and _before_answer(phase):  # the constraint applies after the reasoning
            from loraplex.grammar.reasoning import ReasoningMatcher

            # (built by the time the grammar reached here: `_compiled`; only a grammar that did not come through
            # it, such as one precheck compiled for another phase, would build it here)
            matcher = ReasoningMatcher(matcher, self._reasoning_vocab_for(grammar), phase)
        seq.grammar = matcher
        seq.narrowing = grammar.narrowing
        seq.grounding = grammar.grounding

    def _closing_tokens(self, phase: Phase | None) -> int:
        """Tokens an output starting in ``phase`` spends before its answer at the least (the closing marker)."""
        if phase != Phase.REASONING or self.reasoning is None:
            return 0
        return len(self.reasoning.end_ids)

    @staticmethod
    def check_budget(compiled: CompiledGrammar, max_tokens: int | None, before: int = 0) -> None:
        """Refuse a request whose max_tokens cannot hold even the shortest valid output (after ``before`` tokens
        that must come first: the closing marker of a reasoning that the prompt opened)."""
        if max_tokens is not None and compiled.min_tokens + before > max_tokens:
            after = f" after the {before} tokens that end the reasoning" if before else ""
            raise RequestError(
                f"max_tokens={max_tokens} is too small for this structured output: the shortest "
                f"valid output needs {compiled.min_tokens} tokens{after}"
            )

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
            self.check_budget(compiled, seq.params.max_tokens, self._closing_tokens(seq.reasoning_phase))
        except Exception as exc:  # GrammarError, RequestError, timeout: that request only
            self._failed[seq.request_id] = str(exc)
            return False
        self._start(seq, compiled)
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
        timings = self.probe.mask_seconds if self.probe is not None and self.probe.time_structured else None
        for j, i in enumerate(rows):
            seq = seqs[i]
            m, spec = seq.grammar, seq.params.structured
            assert m is not None and spec is not None  # (a constrained row)
            remaining = seq.remaining_tokens if spec.close_within_budget else None
            t = time.perf_counter() if timings is not None else 0.0
            m.fill_bitmask(bitmask[j], remaining)
            if timings is not None:
                timings.append(time.perf_counter() - t)
        apply_token_bitmask(
            logits,
            bitmask.to(logits.device, non_blocking=True),
            torch.tensor(rows, dtype=torch.long, device=logits.device),
        )

    def budget_check(self, seqs: list[Sequence]) -> BudgetCheck | None:
        """The rows (aligned with `seqs`) whose sampled token must be checked against the budget."""
        rows = [i for i, s in enumerate(seqs) if s.grammar is not None and s.grammar.needs_budget_check()]
        if not rows:
            return None
        probe = self.probe
        return BudgetCheck(seqs, rows, probe.check_seconds if probe is not None and probe.time_structured else None)

    @staticmethod
    def advance(seq: Sequence, token: int) -> FinishReason | None:
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


def _before_answer(phase: Phase | None) -> bool:
    """Whether an output starting in ``phase`` may reason before its answer (its constraint waits for it)."""
    return phase is not None and phase != Phase.ANSWER


class BudgetCheck:
    """The sampler's TokenCheck for constrained rows: the output must stay closable within max_tokens."""

    def __init__(self, seqs: list[Sequence], rows: list[int], seconds: list[float] | None) -> None:
        self._seqs = seqs
        self.rows = rows
        self._seconds = seconds

    def _matcher(self, row: int) -> tuple[GrammarMatcher, int]:
        seq = self._seqs[row]
        assert seq.grammar is not None and seq.remaining_tokens is not None  # (only rows whose matcher asked)
        return seq.grammar, seq.remaining_tokens

    def fits(self, row: int, token: int) -> bool:
        m, remaining = self._matcher(row)
        if self._seconds is None:
            return m.fits_budget(token, remaining - 1)
        t = time.perf_counter()
        ok = m.fits_budget(token, remaining - 1)
        self._seconds.append(time.perf_counter() - t)
        return ok

    def fallback(self, row: int) -> int:
        return self._matcher(row)[0].budget_fallback()
