"""GrammarCompiler: non-blocking submits, cache, in-flight de-duplication, timeouts, upgrades.

Nothing here asserts a duration: a compile that must not finish yet is held by stopping its worker process
(SIGSTOP), so "submit did not wait" and "the deadline killed it" are facts, not timings."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from collections.abc import Iterator

import pytest
import torch

from loraplex.grammar import GrammarCompiler, GrammarError, StructuredSpec
from loraplex.grammar.compiler import UPGRADE_NICE
from tests.grammar.helpers import EOS, VOCAB

# A regex whose automaton has 2^13 states: too large to index inside a request.
SLOW_REGEX = "(a|b)*a(a|b){12}"


@contextlib.contextmanager
def stopped_worker(compiler: GrammarCompiler) -> Iterator[None]:
    """Stop the compiler's (single, already started) compile worker process until the block ends: nothing it
    was given can finish meanwhile."""
    workers = [w for w in compiler._pool._workers if w is not None and w.proc.poll() is None]
    assert len(workers) == 1, "warm the compiler up first: one live worker"
    pid = workers[0].proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # the pool may have killed it (a deadline)
            os.kill(pid, signal.SIGCONT)


def test_cache_hit_is_an_already_done_future(compiler):
    spec = StructuredSpec(json={"type": "object", "properties": {"n": {"type": "integer"}}})
    first = compiler.compile(spec)
    before = compiler.stats()
    with stopped_worker(compiler):  # a hit never reaches a worker: it is answered while the worker is stopped
        for _ in range(20):
            fut = compiler.submit(StructuredSpec(json={"properties": {"n": {"type": "integer"}}, "type": "object"}))
            assert fut.done() and fut.result() is first
    after = compiler.stats()
    assert after["cache_hits"] - before["cache_hits"] == 20 and after["compiles"] == before["compiles"]


def test_same_spec_submitted_100_times_concurrently_compiles_once(compiler):
    spec = StructuredSpec(regex=f"id-{uuid.uuid4().hex}-[0-9]{{3}}")
    before = compiler.stats()["compiles"]
    futures, lock = [], threading.Lock()
    start = threading.Barrier(10)

    def submit_ten() -> None:
        start.wait()
        for _ in range(10):
            f = compiler.submit(spec)
            with lock:
                futures.append(f)

    threads = [threading.Thread(target=submit_ten) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = {id(f.result(timeout=30)) for f in futures}
    assert len(futures) == 100 and len(results) == 1
    assert compiler.stats()["compiles"] - before == 1


def test_submit_never_blocks_while_compiling(compiler):
    compiler.compile(StructuredSpec(choice=["warm-up"]))
    with stopped_worker(compiler):  # no compile can finish: a submit that waited for one would never return
        futures = [compiler.submit(StructuredSpec(regex=f"nb{i}-{uuid.uuid4().hex}[a-z]+")) for i in range(5)]
        assert not any(f.done() for f in futures)
    assert all(f.result(timeout=60) is not None for f in futures)


def test_stats_report_compiles_hits_and_seconds(compiler):
    before = compiler.stats()
    spec = StructuredSpec(choice=[f"stat-{uuid.uuid4().hex}", "stat-b"])  # never compiled before
    compiler.compile(spec)
    compiler.compile(spec)
    bad = StructuredSpec(json={"type": "object", "properties": {f"p{uuid.uuid4().hex}": {"type": "strng"}}})
    with pytest.raises(GrammarError):
        compiler.compile(bad)
    s = compiler.stats()
    assert s["compiles"] - before["compiles"] == 2  # the choice and the refusal; the repeat was a hit
    assert s["cache_hits"] - before["cache_hits"] == 1
    assert s["errors"] - before["errors"] == 1 and s["timeouts"] == before["timeouts"]
    assert s["outlines"] + s["llguidance"] - before["outlines"] - before["llguidance"] == 1
    assert s["compile_seconds"] > before["compile_seconds"]
    # both went in (the oldest entries make room once the cache is full: other tests share this compiler)
    assert s["cache_entries"] == min(before["cache_entries"] + 2, compiler.cache_size)


def test_refusals_are_cached(compiler):
    spec = StructuredSpec(json={"$ref": "https://example.com/other.json"})
    with pytest.raises(GrammarError):
        compiler.compile(spec)
    fut = compiler.submit(spec)
    assert fut.done() and isinstance(fut.exception(), GrammarError)


def test_timeout_fails_that_request_only_and_the_pool_recovers(tokenizer):
    with GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB, backend="outlines", timeout_s=1.0) as c:
        c.compile(StructuredSpec(regex="warm"))  # the worker process is up
        stuck = StructuredSpec(regex="stuck-[0-9]")
        with stopped_worker(c):  # the compile cannot finish: only its deadline ends it (the pool kills the worker)
            runaway = c.submit(stuck)
            after = c.submit(StructuredSpec(regex="ok[0-9]"))  # queued behind the runaway compile
            with pytest.raises(GrammarError, match="timed out after 1 s") as timed_out:
                runaway.result(timeout=60)
            assert timed_out.value.code == "compile_timeout"
        assert after.result(timeout=60).min_tokens == 2  # a fresh worker took the next job
        assert c.stats()["timeouts"] == 1
        # the timeout was not cached: it compiles now, to the fewest tokens that spell "stuck-<digit>"
        assert c.submit(stuck).result(timeout=60).min_tokens == _fewest_tokens(
            tokenizer, [f"stuck-{d}" for d in range(10)]
        )


def _fewest_tokens(tokenizer, texts: list[str]) -> int:
    """The fewest vocabulary tokens that spell any of ``texts`` (dynamic programming over each text)."""
    pieces = {tokenizer.convert_tokens_to_string([t]) for t in tokenizer.get_vocab()}
    best = None
    for text in texts:
        cost = [0] + [None] * len(text)
        for end in range(1, len(text) + 1):
            options = [cost[start] + 1 for start in range(end) if cost[start] is not None and text[start:end] in pieces]
            cost[end] = min(options) if options else None
        if cost[-1] is not None:
            best = cost[-1] if best is None else min(best, cost[-1])
    assert best is not None
    return best


def _fewest_tokens_for_slow_regex(tokenizer) -> int:
    """The fewest tokens of any text SLOW_REGEX matches (a's and b's, the 13th character from the end an a),
    by breadth-first search over the tokens made of a's and b's; the state is the text's last 13 characters."""
    pieces = {tokenizer.convert_tokens_to_string([t]) for t in tokenizer.get_vocab()}
    pieces = [p for p in pieces if p and set(p) <= {"a", "b"}]
    frontier, seen, depth = {""}, {""}, 0
    while frontier:
        depth += 1
        nxt = set()
        for tail in frontier:
            for piece in pieces:
                text = (tail + piece)[-13:]
                if len(text) == 13 and text[0] == "a":
                    return depth
                if text not in seen:
                    seen.add(text)
                    nxt.add(text)
        frontier = nxt
    raise AssertionError("no token sequence matches")


def test_auto_serves_a_large_automaton_through_llguidance(compiler, tokenizer):
    """llguidance's min_tokens is the length of a completion its search found: at least the true minimum, and
    achievable: following the budget masks from the start ends complete in exactly that many tokens."""
    g = compiler.compile(StructuredSpec(regex=SLOW_REGEX))
    assert g.backend == "llguidance"
    assert g.min_tokens >= _fewest_tokens_for_slow_regex(tokenizer)
    m = g.new_matcher()
    words = (VOCAB + 31) // 32
    for used in range(g.min_tokens):
        mask = torch.zeros(words, dtype=torch.int32)
        m.fill_bitmask(mask, remaining_tokens=g.min_tokens - used)
        allowed = [t for t in range(VOCAB) if (int(mask[t // 32]) >> (t % 32)) & 1 and t != EOS]
        assert allowed, f"no token allowed after {used} tokens"
        assert m.accept_token(allowed[0])
    assert m.is_accepting()


def test_lru_eviction(tokenizer):
    with GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB, cache_size=2) as c:
        specs = [StructuredSpec(regex=f"lru{i}") for i in range(3)]
        for s in specs:
            c.compile(s)
        assert c.stats()["cache_entries"] == 2
        c.compile(specs[2])  # still cached
        assert c.stats()["compiles"] == 3
        c.compile(specs[0])  # evicted: compiled again
        assert c.stats()["compiles"] == 4


def test_background_upgrade_replaces_llguidance_with_an_automaton(tokenizer):
    spec = StructuredSpec(json={"type": "string", "pattern": "^\\p{Letter}+$"})  # ~300 states
    with GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB) as c:
        assert c.compile(spec).backend == "llguidance"
        # A generous bound: the build took 89 s on a 2-core machine at load 7, and 120 s was once not enough.
        assert c.wait_for_upgrades(600)
        assert c.stats()["upgrades"] == 1
        # the build ran at the lowest CPU priority: it must not take cores from the engine's step threads
        base = os.getpriority(os.PRIO_PROCESS, 0)
        (worker,) = c._upgrade_pool._workers
        assert worker is not None and os.getpriority(os.PRIO_PROCESS, worker.proc.pid) == min(19, base + UPGRADE_NICE)
        assert c._pool._workers[0] is not None  # the request-path compile worker keeps the server's priority
        assert os.getpriority(os.PRIO_PROCESS, c._pool._workers[0].proc.pid) == base
        upgraded = c.compile(spec)
        assert upgraded.backend == "outlines"
        m = upgraded.new_matcher()
        assert all(m.accept_token(t) for t in tokenizer.encode('"Πλάτων"', add_special_tokens=False))
        assert m.is_accepting()


def test_closed_compiler_refuses(tokenizer):
    c = GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB)
    c.close()
    with pytest.raises(GrammarError, match="closed"):
        c.compile(StructuredSpec(regex="x"))


def test_auto_builds_only_small_automata_inside_the_request(compiler, tokenizer):
    """A few-state constraint gets its token automaton at once; a ~60-state one is served by llguidance (the
    automaton would cost ~1-2 ms a state to build), with the same language."""
    small = compiler.compile(StructuredSpec(choice=["small-yes", "small-no"]))
    assert small.backend == "outlines"
    larger = compiler.compile(StructuredSpec(regex="[a-z]{60}"))
    assert larger.backend == "llguidance"
    m = larger.new_matcher()
    assert all(m.accept_token(t) for t in tokenizer.encode("ab" * 30, add_special_tokens=False))
    assert m.is_accepting()
    m = larger.new_matcher()
    assert all(m.accept_token(t) for t in tokenizer.encode("ab" * 29, add_special_tokens=False))
    assert not m.is_accepting()


def test_llguidance_template_is_built_once_here_from_the_text_the_worker_sent_ahead(tokenizer, monkeypatch):
    """The worker sends the grammar text before building its own matcher; the compiler builds its template from
    it meanwhile, on its own thread, and hands it to the grammar: one LLMatcher built in this process per
    compile, from the artifact's grammar text (before, the parent built it only after the worker's reply)."""
    import llguidance

    built: list[str] = []
    real = llguidance.LLMatcher

    def counting(tokenizer_, grammar, **kw):  # (LLMatcher cannot be subclassed)
        built.append((threading.current_thread().name.split("_")[0], grammar))
        return real(tokenizer_, grammar, **kw)

    monkeypatch.setattr(llguidance, "LLMatcher", counting)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}, "required": ["n"]}
    with GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB, backend="llguidance") as c:
        grammar = c.compile(StructuredSpec(json=schema))
        assert grammar.backend == "llguidance"
        assert built == [("grammar-llg-build", grammar.grammar)]  # (not the pool thread, after the reply)
        assert not c._prebuilt  # handed over (or dropped) when the compile finished
        m = grammar.new_matcher()  # the template serves matchers as one built here would
        for t in tokenizer.encode('{"n":12}', add_special_tokens=False):
            assert m.accept_token(t)
        assert m.is_accepting()


def test_a_failing_partial_result_callback_does_not_fail_the_job(tokenizer, monkeypatch):
    """Partial results only let the parent start early: a callback that raises leaves the compile as it was."""
    with GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB, backend="llguidance") as c:

        def broken(key, body):
            raise RuntimeError("prebuild failed")

        monkeypatch.setattr(c, "_prebuild", broken)
        grammar = c.compile(StructuredSpec(json={"type": "object", "properties": {"b": {"type": "boolean"}}}))
        assert grammar.backend == "llguidance" and grammar.min_tokens >= 1
