"""The reasoning matchers' shared tables (grammar/reasoning.py `ReasoningVocab.of`, one pass over the vocabulary,
~0.2 s) are built off the engine thread: with the grammar's compile, before the first constrained reasoning request
is admitted, so no engine step stalls every running request for them. Both ways in are checked: a request queued
uncompiled (LLM.generate: the engine compiles it) and one the server prechecked (compiled before queueing)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from loraplex.engine import LLM, SamplingParams
from loraplex.grammar import StructuredSpec
from loraplex.grammar.reasoning import ReasoningVocab
from tests.structured.test_reasoning import SCHEMA, prompt, think_id


@pytest.fixture
def fresh_llm(tiny_qwen3_dir: Path) -> Iterator[LLM]:
    """An engine of its own: nothing built by another test's requests."""
    llm = LLM(
        str(tiny_qwen3_dir),
        reasoning_parser="qwen3",
        max_model_len=512,
        kv_cache_bytes=32 << 20,
        grammar_compile_timeout_s=120.0,  # a fresh engine's first compile starts its workers: slow on a busy machine
    )
    yield llm
    llm.engine.structured.close()


@pytest.fixture
def vocab_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each `ReasoningVocab.of` call ran on."""
    threads: list[str] = []
    original = ReasoningVocab.of.__func__  # type: ignore[attr-defined]

    def counted(cls: type[ReasoningVocab], *args: Any, **kwargs: Any) -> ReasoningVocab:
        threads.append(threading.current_thread().name)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(ReasoningVocab, "of", classmethod(counted))
    return threads


def params(llm: LLM, seed: int) -> SamplingParams:
    bias = {think_id(llm, "<think>"): 30.0}  # it opens a block: the reasoning matcher is in use
    return SamplingParams(
        max_tokens=40,
        temperature=1.0,
        seed=seed,
        logit_bias=bias,
        structured=StructuredSpec(json=SCHEMA),
        reasoning=True,
    )


def test_a_request_compiled_by_the_engine_does_not_build_the_tables_on_its_thread(fresh_llm, vocab_builds):
    llm = fresh_llm
    engine_thread = threading.current_thread().name  # LLM.generate queues and steps on the caller's thread
    outs = llm.generate([prompt(llm)] * 2, [params(llm, 0), params(llm, 1)])
    for out in outs:
        assert out.reasoning and out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), SCHEMA)
    assert len(vocab_builds) == 1 and engine_thread not in vocab_builds, vocab_builds
    llm.generate([prompt(llm)], [params(llm, 2)])
    assert len(vocab_builds) == 1  # built once per engine


def test_a_prechecked_request_does_not_build_the_tables_on_the_engine_thread(fresh_llm, vocab_builds):
    llm = fresh_llm
    engine_thread = threading.current_thread().name  # here the test thread both queues and steps
    ids = prompt(llm)
    p = params(llm, 0)
    grammar = llm.engine.precheck(ids, p).result(timeout=120)  # what the server does before queueing
    assert grammar is not None and len(vocab_builds) == 1 and engine_thread not in vocab_builds, vocab_builds
    rid = llm.engine.add_request(ids, p, grammar=grammar)
    finished = []
    while llm.engine.has_unfinished():
        finished += [o for o in llm.engine.step() if o.finished and o.request_id == rid]
    (out,) = finished
    assert out.reasoning and out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), SCHEMA)
    assert len(vocab_builds) == 1
