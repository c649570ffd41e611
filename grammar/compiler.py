"""GrammarCompiler: compiles StructuredSpecs off the engine loop, with an LRU cache.

`submit` never blocks: a cache hit returns an already-done future, an identical spec already
compiling returns that compile's future, anything else is queued to the worker pool. The cache
key is (tokenizer identity, spec.cache_key()). Refusals are cached; timeouts and worker crashes
are not. When llguidance serves a constraint whose token automaton is merely too large to build
inside the request, the automaton is built by a background worker and replaces the cache entry,
so later requests get the faster backend.

Engine use: `fut = compiler.submit(spec)` when the request arrives (GrammarError -> 400); schedule
the request once `fut.done()`; refuse it if max_tokens < grammar.min_tokens; per step
`matcher.fill_bitmask(row, remaining_tokens=max_tokens - generated)` (rows of one host int32 tensor,
copied to the logits' device once per step), then `matcher.accept_token(sampled)`; the output is
finished when `matcher.is_terminated()` (EOS accepted, or nothing can follow).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from loraplex.grammar.backend_llguidance.grounded import GroundedTemplate
from loraplex.grammar.backend_types import GRAMMAR_BACKENDS, CompiledGrammar, GrammarBackend
from loraplex.grammar.grounding import SourceText
from loraplex.grammar.spec import GrammarError, StructuredSpec
from loraplex.grammar.vocab import vocab_from_hf
from loraplex.grammar.workers.job import CompileOptions
from loraplex.grammar.workers.messages import (
    Artifact,
    AutomatonArtifact,
    GroundedArtifact,
    LLGuidanceArtifact,
    PrebuildHint,
)
from loraplex.grammar.workers.pool import JobFailed, WorkerPool

UPGRADE_TIMEOUT_S = 120.0
# Background automaton builds run at the lowest CPU priority: on a small machine a build at normal priority takes
# one of the engine's cores for its whole duration and makes every decode step of that time slower
# (bench/README.md has the figures); niced, it runs while the engine waits (and times out, leaving llguidance
# serving, on a machine that never does).
UPGRADE_NICE = 19
DEFAULT_MEMORY_LIMIT = 4 << 30


class GrammarCompiler:
    def __init__(
        self,
        tokenizer: Any,
        *,
        eos_token_ids: list[int],
        vocab_size: int,
        timeout_s: float = 10.0,
        cache_size: int = 256,
        max_workers: int = 1,
        backend: GrammarBackend = "auto",
        upgrade_in_background: bool = True,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT,
        strict_objects: bool = True,
        max_ref_depth: int = 3,
        any_depth: int = 2,
    ) -> None:
        if backend not in GRAMMAR_BACKENDS:
            raise ValueError(f"backend must be auto, outlines or llguidance, not {backend!r}")
        self.vocab = vocab_from_hf(tokenizer, list(eos_token_ids), vocab_size)
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self.backend = backend
        options = CompileOptions(
            backend=backend, strict_objects=strict_objects, max_ref_depth=max_ref_depth, any_depth=any_depth
        )
        self._init = (self.vocab, options, memory_limit_bytes)
        self._pool = WorkerPool(self._init, max_workers, "grammar-compile")
        self._upgrade_pool: WorkerPool | None = None
        self._upgrades = upgrade_in_background and backend == "auto"
        self._lock = threading.Lock()
        self._upgrades_done = threading.Condition(self._lock)
        self._upgrades_pending = 0
        self._cache: OrderedDict[tuple[str, str], Future[CompiledGrammar]] = OrderedDict()
        self._inflight: dict[tuple[str, str], Future[CompiledGrammar]] = {}
        self._stats = {
            "compiles": 0,
            "cache_hits": 0,
            "inflight_joins": 0,
            "compile_seconds": 0.0,
            "errors": 0,
            "timeouts": 0,
            "outlines": 0,
            "llguidance": 0,
            "upgrades": 0,
            "grounded_binds": 0,
            "grounded_bind_seconds": 0.0,
        }
        self._ll_tokenizer: Any = None
        self._search: Any = None
        self._rows: Any = None
        self._automaton_search: Any = None
        self._byte_tables: Any = None
        self._token_trie: Any = None  # the vocabulary's byte trie, for grounded schemas our span automaton serves
        self._ll_lock = threading.Lock()  # building the llguidance tokenizer is slow: not under _lock
        # llguidance matchers built here from the grammar text a worker sent ahead (llguidance releases the GIL
        # while it builds), while the worker builds its own and plans: per cache key, (text, template future)
        self._prebuilder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-llg-build")
        self._prebuilt: dict[tuple[str, str], tuple[str, Future[Any]]] = {}
        # binds grounded schemas to each request's source text (llguidance builds its span automaton without the GIL)
        self._binder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-grounding")
        self._closed = False
        threading.Thread(target=self._llguidance_parts, name="grammar-llg-init", daemon=True).start()

    # ---- public API ------------------------------------------------------------------------------
    def submit(self, spec: StructuredSpec, sources: Sequence[SourceText] | None = None) -> Future[CompiledGrammar]:
        """A future of the compiled grammar; fails with GrammarError (refusal or timeout). ``sources``: the request's
        source text, which a schema with grounded values is bound to (per request, off the caller's thread; the
        schema's template is what is cached)."""
        base = self._submit(spec)
        if base.done() and base.exception() is None and not isinstance(base.result(), GroundedTemplate):
            return base
        out: Future[CompiledGrammar] = Future()
        out.set_running_or_notify_cancel()

        def bind(template: GroundedTemplate) -> None:
            started = time.perf_counter()
            try:
                if sources is None:
                    template.new_matcher()  # (refuses by name)
                    raise AssertionError("unreachable")
                grammar = template.bind(sources)
            except BaseException as e:  # GrammarError; anything else fails this request only
                out.set_exception(e)
                return
            with self._lock:
                self._stats["grounded_binds"] += 1
                self._stats["grounded_bind_seconds"] += time.perf_counter() - started
            out.set_result(grammar)

        def compiled(fut: Future[CompiledGrammar]) -> None:
            error = fut.exception()
            if error is not None:
                out.set_exception(error)
                return
            grammar = fut.result()
            if not isinstance(grammar, GroundedTemplate):
                out.set_result(grammar)
                return
            try:
                self._binder.submit(bind, grammar)
            except RuntimeError:  # shut down meanwhile
                out.set_exception(GrammarError("grammar compiler is closed"))

        base.add_done_callback(compiled)
        return out

    def prepare(self, spec: StructuredSpec) -> Future[CompiledGrammar]:
        """Compile ahead of the requests that will use it: what is cached, so a schema with grounded values compiles
        to its template (binding needs each request's own text). Fails with GrammarError as a request's compile
        would, except for what only a request's source text decides (no span satisfying a grounded value)."""
        return self._submit(spec)

    def _submit(self, spec: StructuredSpec) -> Future[CompiledGrammar]:
        try:
            key = (self.vocab.identity, spec.cache_key())
        except GrammarError as e:
            fut: Future[CompiledGrammar] = Future()
            fut.set_exception(e)
            return fut
        with self._lock:
            if self._closed:
                fut = Future()
                fut.set_exception(GrammarError("grammar compiler is closed"))
                return fut
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self._stats["cache_hits"] += 1
                return hit
            running = self._inflight.get(key)
            if running is not None:
                self._stats["inflight_joins"] += 1
                return running
            fut = Future()
            fut.set_running_or_notify_cancel()
            self._inflight[key] = fut
        started = time.perf_counter()
        payload = {
            "json": spec.json,
            "regex": spec.regex,
            "choice": spec.choice,
            "grammar": spec.grammar,
            "json_object": spec.json_object,
            "tagged_json": spec.tagged_json,
            "close_within_budget": spec.close_within_budget,
            "allow_narrowing": spec.allow_narrowing,
        }
        self._pool.submit(
            "compile",
            payload,
            self.timeout_s,
            lambda art, err: self._finish(key, spec, fut, started, art, err),
            partial=lambda body: self._prebuild(key, body),
        )
        return fut

    def compile(self, spec: StructuredSpec, sources: Sequence[SourceText] | None = None) -> CompiledGrammar:
        """Blocking convenience: submit(spec, sources).result()."""
        return self.submit(spec, sources).result()

    def wait_for_upgrades(self, timeout_s: float | None = None) -> bool:
        """Block until no background automaton build is pending (benchmarks and warm-up measure the steady
        state, not a build competing for the CPU); False on timeout."""
        with self._upgrades_done:
            return self._upgrades_done.wait_for(lambda: self._upgrades_pending == 0, timeout_s)

    def stats(self) -> dict[str, float]:
        """Counters for metrics: compiles, cache_hits, compile_seconds, errors, timeouts, per backend."""
        with self._lock:
            return {**self._stats, "cache_entries": len(self._cache), "inflight": len(self._inflight)}

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.close()
        if self._upgrade_pool is not None:
            self._upgrade_pool.close()
        self._prebuilder.shutdown(wait=False, cancel_futures=True)
        self._binder.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> GrammarCompiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- completion (runs on a pool thread) --------------------------------------------------------
    def _finish(
        self,
        key: tuple[str, str],
        spec: StructuredSpec,
        fut: Future[CompiledGrammar],
        started: float,
        artifact: Artifact | None,
        failure: JobFailed | None,
    ) -> None:
        grammar: CompiledGrammar | None = None
        error: GrammarError | None = None
        cacheable = True
        with self._lock:
            prebuilt = self._prebuilt.pop(key, None)
        if failure is not None:
            error, cacheable = GrammarError(str(failure), code=failure.code), not failure.transient
        else:
            assert artifact is not None  # (the pool hands over one of the two)
            try:
                grammar = self._materialize(artifact, spec.close_within_budget, artifact.narrowing, prebuilt)
            except GrammarError as e:
                error = e
        with self._lock:
            self._stats["compiles"] += 1
            self._stats["compile_seconds"] += time.perf_counter() - started
            if error is not None:
                self._stats["errors"] += 1
                self._stats["timeouts"] += error.code == "compile_timeout"
            else:
                assert grammar is not None  # (no error: materialized)
                self._stats[grammar.backend] += 1
            self._inflight.pop(key, None)
            if cacheable and not self._closed:
                self._store(key, fut)
        if error is not None:
            fut.set_exception(error)
        else:
            assert grammar is not None
            fut.set_result(grammar)
            if self._upgrades and isinstance(artifact, LLGuidanceArtifact) and artifact.upgrade:
                self._schedule_upgrade(key, artifact.upgrade, spec.close_within_budget, grammar.narrowing)

    def _store(self, key: tuple[str, str], fut: Future[CompiledGrammar]) -> None:
        self._cache[key] = fut
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _prebuild(self, key: tuple[str, str], body: PrebuildHint) -> None:
        """A worker is about to build an llguidance matcher from this text: build the parent's template now."""
        text = body.llguidance
        if self._closed:
            return

        def build() -> Any:
            from llguidance import LLMatcher

            return LLMatcher(self._llguidance_parts()[0], text, log_level=0)

        try:
            fut = self._prebuilder.submit(build)
        except RuntimeError:  # shut down meanwhile
            return
        with self._lock:
            self._prebuilt[key] = (text, fut)  # a retried translation replaces the text

    def _materialize(
        self,
        artifact: Artifact,
        close_within_budget: bool,
        narrowing: tuple[str, ...],
        prebuilt: tuple[str, Future[Any]] | None = None,
    ) -> CompiledGrammar:
        grammar: CompiledGrammar
        if isinstance(artifact, GroundedArtifact):
            import json

            ll_tokenizer, search, rows = self._llguidance_parts()
            if artifact.automaton_language:
                search = self._automaton_parts()[0]
            grammar = GroundedTemplate(
                artifact.template,
                artifact.slots,
                json.loads(artifact.schema),
                ll_tokenizer,
                rows,
                search,
                close_within_budget,
                artifact.automaton_language,
                artifact.tags,
                artifact.plan,
                spans=None if artifact.span_template is None else self._span_parts(artifact.span_template),
            )
        elif isinstance(artifact, AutomatonArtifact):
            from loraplex.grammar.backend_outlines.grammar import AutomatonGrammar

            search, tables = self._automaton_parts()
            grammar = AutomatonGrammar(
                artifact.data, self.vocab.eos_ids, close_within_budget, search, tables, artifact.plan
            )
        else:
            from loraplex.grammar.backend_llguidance.grammar import LLGuidanceGrammar

            ll_tokenizer, search, rows = self._llguidance_parts()
            if artifact.automaton_language:
                search = self._automaton_parts()[0]
            plan = artifact.plan
            template = None
            if prebuilt is not None and prebuilt[0] == artifact.grammar:
                with contextlib.suppress(Exception):  # else built below, with its own error
                    template = prebuilt[1].result()
            grammar = LLGuidanceGrammar(
                artifact.grammar,
                ll_tokenizer,
                rows,
                search,
                len(plan),
                plan,
                close_within_budget,
                template,
                automaton_language=artifact.automaton_language,
            )
        grammar.narrowing = narrowing
        return grammar

    def _llguidance_parts(self) -> tuple[Any, Any, Any]:
        """(LLTokenizer, CompletionSearch, VocabRows): built once, shared by every llguidance grammar."""
        with self._ll_lock:
            if self._ll_tokenizer is None:
                from llguidance import LLTokenizer

                from loraplex.grammar.backend_llguidance.grammar import VocabRows
                from loraplex.grammar.search import CompletionSearch

                v = self.vocab
                self._ll_tokenizer = LLTokenizer(v.tokenizer_json, n_vocab=v.vocab_size, eos_token=list(v.eos_ids))
                self._search = CompletionSearch(v)
                self._rows = VocabRows.of(v)
            return self._ll_tokenizer, self._search, self._rows

    def _span_parts(self, template: Any) -> Any:
        """A grounded schema's byte DFA with what our span automaton needs beside it (the vocabulary's trie, built
        once); None where the span automaton cannot run here (no C compiler): llguidance then binds each request."""
        from loraplex.grammar.span_automaton import TokenTrie, span_automaton_available
        from loraplex.grammar.span_grammar import SpanTemplate

        if not span_automaton_available():
            return None
        with self._ll_lock:
            if self._token_trie is None:
                self._token_trie = TokenTrie.of(self.vocab.token_bytes)
            trie = self._token_trie
        return SpanTemplate(template, trie, self.vocab.token_bytes, self.vocab.eos_ids, self.vocab.words)

    def _automaton_parts(self) -> tuple[Any, Any]:
        """(CompletionSearch of the automaton's language, ByteTables): built once, shared by every grammar that
        serves an exact regex (automata, and llguidance before their build)."""
        with self._ll_lock:
            if self._automaton_search is None:
                from loraplex.grammar.backend_outlines.node import ByteTables
                from loraplex.grammar.search import CompletionSearch

                self._automaton_search = CompletionSearch(self.vocab, automaton_language=True)
                self._byte_tables = ByteTables.of(self.vocab)
            return self._automaton_search, self._byte_tables

    def _schedule_upgrade(
        self, key: tuple[str, str], regex: str, close_within_budget: bool, narrowing: tuple[str, ...]
    ) -> None:
        with self._lock:
            if self._closed:
                return
            if self._upgrade_pool is None:
                self._upgrade_pool = WorkerPool(self._init, 1, "grammar-upgrade", nice=UPGRADE_NICE)
            pool = self._upgrade_pool
            self._upgrades_pending += 1

        def done(artifact: Artifact | None, failure: JobFailed | None) -> None:
            grammar = None
            if failure is None and artifact is not None:  # else the llguidance grammar keeps serving
                with contextlib.suppress(GrammarError):
                    grammar = self._materialize(artifact, close_within_budget, narrowing)
            with self._lock:
                if grammar is not None and key in self._cache:
                    upgraded: Future[CompiledGrammar] = Future()
                    upgraded.set_result(grammar)
                    self._cache[key] = upgraded
                    self._stats["upgrades"] += 1
                self._upgrades_pending -= 1
                self._upgrades_done.notify_all()

        pool.submit("automaton", regex, UPGRADE_TIMEOUT_S, done)
