"""GrammarCompiler: non-blocking submits, cache, in-flight de-duplication, timeouts, upgrades."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from loraplex.grammar import GrammarCompiler, GrammarError, StructuredSpec
from tests.grammar.helpers import EOS, VOCAB

# A regex whose automaton has 2^13 states: seconds to index for a 49k-token vocabulary.
SLOW_REGEX = "(a|b)*a(a|b){12}"


def test_cache_hit_is_an_already_done_future_under_1ms(compiler):
    spec = StructuredSpec(json={"type": "object", "properties": {"n": {"type": "integer"}}})
    first = compiler.compile(spec)
    best = float("inf")
    for _ in range(20):
        t = time.perf_counter()
        fut = compiler.submit(StructuredSpec(json={"properties": {"n": {"type": "integer"}}, "type": "object"}))
        best = min(best, time.perf_counter() - t)
        assert fut.done() and fut.result() is first
    assert best < 1e-3


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
    t = time.perf_counter()
    futures = [compiler.submit(StructuredSpec(regex=f"nb{i}-{uuid.uuid4().hex}[a-z]+")) for i in range(5)]
    assert time.perf_counter() - t < 0.05
    assert all(f.result(timeout=30) is not None for f in futures)


def test_stats_report_compiles_hits_and_seconds(compiler):
    spec = StructuredSpec(choice=["stat-a", "stat-b"])
    compiler.compile(spec)
    compiler.compile(spec)
    s = compiler.stats()
    assert s["compiles"] >= 1 and s["cache_hits"] >= 1 and s["compile_seconds"] > 0
    assert {"errors", "timeouts", "outlines", "llguidance", "cache_entries"} <= set(s)


def test_refusals_are_cached(compiler):
    spec = StructuredSpec(json={"type": "string", "format": "hostname"})
    with pytest.raises(GrammarError):
        compiler.compile(spec)
    fut = compiler.submit(spec)
    assert fut.done() and isinstance(fut.exception(), GrammarError)


def test_timeout_fails_that_request_only_and_the_pool_recovers(tokenizer):
    with GrammarCompiler(tokenizer, eos_token_ids=[EOS], vocab_size=VOCAB, backend="outlines", timeout_s=1.0) as c:
        c.compile(StructuredSpec(regex="warm"))  # the worker process is up
        slow = c.submit(StructuredSpec(regex=SLOW_REGEX))
        after = c.submit(StructuredSpec(regex="ok[0-9]"))  # queued behind the runaway compile
        with pytest.raises(GrammarError, match="timed out after 1 s"):
            slow.result(timeout=30)
        assert after.result(timeout=30).min_tokens == 2
        assert c.stats()["timeouts"] == 1
        assert not c.submit(StructuredSpec(regex=SLOW_REGEX)).done()  # timeouts are not cached


def test_auto_serves_a_large_automaton_through_llguidance(compiler):
    t = time.perf_counter()
    g = compiler.compile(StructuredSpec(regex=SLOW_REGEX))
    assert g.backend == "llguidance" and time.perf_counter() - t < 5
    assert 1 <= g.min_tokens <= 13  # 13 characters; some tokens hold several


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
        deadline = time.monotonic() + 60
        while c.stats()["upgrades"] == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
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
