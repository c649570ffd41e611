"""The budget search's C parts against their Python references: the span automaton's greedy walk
(kernels/csrc/span_automaton.c's loraplex_span_greedy against grammar/search.py's ``_python_greedy``), the fewest
tokens spelling a byte string (kernels/csrc/token_split.c against ``_fewest_tokens``), and a span node's one-read
``validate_tokens`` against reading token by token. Each must give exactly the Python answer: the budget logic is
what makes a greedy request give the same tokens from every backend."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import torch

from loraplex.grammar import StructuredSpec
from loraplex.grammar.grounding import SourceText
from loraplex.grammar.search import GREEDY_LOOP_EXITS, CompletionSearch, _OutOfMasks
from loraplex.grammar.span_grammar import SpanGrammar, SpanNode
from tests.c_kernels import needs_c_kernels
from tests.grammar.helpers import allowed_ids
from tests.grammar.test_grammar_grounded import random_schema, random_source

G = {"type": "string", "x-loraplex-grounded": True}
LOOPY = {  # values whose walks loop (digits, an email's local part, a pattern's class) and must find their way out
    "type": "object",
    "properties": {
        "email": {**G, "format": "email"},
        "code": {**G, "pattern": "^[a-z0-9]+-[0-9]+$"},
        "n": {"type": "number"},
        "ref": {"type": "string", "pattern": "^[a-z]+[0-9]+$"},
        "key": {"type": "string", "pattern": "^[ab]*abba$"},  # no mask shows the way out: repeats decide
        "alt": {"type": "string", "pattern": "^([ab][cd])*[ef][cd]x$"},  # a loop of two masks, left by a third
        "tags": {"type": "array", "items": {**G, "minLength": 2}, "maxItems": 3},
    },
    "required": ["email", "code", "n", "ref"],
}
LOOPY_SOURCE = "write to ada.lovelace99@example.org or bob@x.io about order abc123-4567 and xy-12; ok"
LOOPY_PREFIXES = [  # states inside "key" and "alt", where the walks loop, whatever the random walks reach
    b'{"email":"bob@x.io","code":"abc123-4567","n":1,"ref":"a1",' + tail
    for tail in (b'"key":"', b'"key":"a', b'"key":"abb', b'"alt":"', b'"alt":"ac')
]


def walk(search: CompletionSearch, node: SpanNode, loop_exits: int | None, masks: int | None, native: bool) -> Any:
    """The greedy walk from ``node`` (``native``: the C walk, else the Python one) under a bound on its masks: its
    bytes and the masks it computed, or "out of masks"."""
    search._masks_left, search.masks_computed = masks, 0
    try:
        greedy = search._greedy if native else search._python_greedy
        return greedy(node, loop_exits), search.masks_computed
    except _OutOfMasks:
        return "out of masks"
    finally:
        search._masks_left = None


def python_walk(search: CompletionSearch, node: SpanNode, loop_exits: int | None, masks: int | None) -> Any:
    return walk(search, node, loop_exits, masks, native=False)


def c_walk(search: CompletionSearch, node: SpanNode, loop_exits: int | None, masks: int | None) -> Any:
    return walk(search, node, loop_exits, masks, native=True)


def node_after(grammar: SpanGrammar, text: bytes) -> SpanNode:
    node = grammar.new_matcher()._node()
    for b in text:
        assert node.consume_token(int(grammar.search.byte_token[b])), text
    return node


def states_along_walks(grammar: SpanGrammar, rng: random.Random, walks: int, steps: int):
    """Nodes of the grammar's states along random walks (mostly staying inside values, where walks are long)."""
    for _ in range(walks):
        m = grammar.new_matcher()
        mask = torch.zeros(m.bitmask_words(), dtype=torch.int32)
        for _ in range(steps):
            yield m._node()
            m.fill_bitmask(mask)
            ids = [t for t in allowed_ids(mask) if t not in grammar.eos_ids]
            if not ids:
                break
            inside = [t for t in ids if b'"' not in (grammar.token_bytes(t) or b'"')]
            assert m.accept_token(rng.choice(inside if inside and rng.random() < 0.7 else ids))


@needs_c_kernels
@pytest.mark.parametrize("seed", range(6))
def test_the_c_greedy_walk_chooses_the_python_walks_bytes(compiler, seed, monkeypatch):
    rng = random.Random(seed)
    exits = []  # the Python walk's searches for a way out of a loop: the test must reach them
    leave_loop = CompletionSearch._leave_loop

    def counted(self, *args):
        exits.append(1)
        return leave_loop(self, *args)

    monkeypatch.setattr(CompletionSearch, "_leave_loop", counted)
    schema = LOOPY if seed < 2 else random_schema(rng, 0, [], "")
    if "x-loraplex-grounded" not in json.dumps(schema):
        schema = {"type": "object", "properties": {"g": G, "other": schema}, "required": ["g"]}
    text = LOOPY_SOURCE if seed < 2 else " ".join(random_source(rng) for _ in range(3))
    grammar = compiler.compile(StructuredSpec(json=schema), [SourceText(1, text)])
    assert isinstance(grammar, SpanGrammar)
    search = grammar.search
    compared = 0
    fixed = [node_after(grammar, prefix) for prefix in LOOPY_PREFIXES] if seed < 2 else []
    for node in [*fixed, *states_along_walks(grammar, rng, walks=4, steps=40)]:
        for loop_exits in (GREEDY_LOOP_EXITS, None, 0, 1):
            expected = python_walk(search, node, loop_exits, None)
            assert c_walk(search, node, loop_exits, None) == expected, (node.state, loop_exits)
            if expected != "out of masks" and expected[1] > 0:  # a bound on masks at and just below what it takes
                for bound in {expected[1], expected[1] - 1, rng.randint(0, expected[1])}:
                    want = python_walk(search, node, loop_exits, bound)
                    assert c_walk(search, node, loop_exits, bound) == want, (node.state, loop_exits, bound)
            compared += 1
    assert compared > 40
    if seed < 2:
        assert exits, "no walk searched for a way out of a loop"


@needs_c_kernels
@pytest.mark.parametrize("automaton_language", [False, True])
def test_the_c_token_split_equals_the_python_programme(compiler, automaton_language):
    search = CompletionSearch(compiler.vocab, automaton_language=automaton_language)
    assert search.splitter is not None
    pieces = [b for b in search.by_bytes if len(b) <= 12]
    rng = random.Random(int(automaton_language))
    for _ in range(300):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        if rng.random() < 0.3:
            data += bytes(rng.choices(range(256), k=rng.randint(1, 8)))
        if not all(search.byte_token[b] >= 0 for b in data):  # (a byte without a token: neither splits it)
            continue
        assert search.splitter.split(data) == search._fewest_tokens(data, None), data


@needs_c_kernels
def test_a_span_node_validates_tokens_as_reading_them_one_by_one(compiler):
    rng = random.Random(3)
    grammar = compiler.compile(StructuredSpec(json=LOOPY), [SourceText(1, LOOPY_SOURCE)])
    assert isinstance(grammar, SpanGrammar)
    vocab = compiler.vocab.token_bytes
    pieces = [t for t, b in enumerate(vocab) if b]
    for node in states_along_walks(grammar, rng, walks=3, steps=30):
        plan = grammar.search.plan(node) or []
        for tokens in (plan, plan[: len(plan) // 2] + rng.choices(pieces, k=3), rng.choices(pieces, k=4)):
            trial, expected = node._m.copy(), 0
            for t in tokens:
                if not trial.consume(vocab[t]):
                    break
                expected += 1
            assert node.validate_tokens(tokens) == expected, tokens
        assert node.validate_tokens(plan) == len(plan)


@needs_c_kernels
def test_one_search_serves_two_threads_as_it_serves_one(compiler):
    """The engine checks budgets on its thread while the compiler's binder makes a new request's plan on another,
    with the one search of the vocabulary: each thread's mask count and bound are its own (shared, they gave the
    binder's plan the engine's bound, and the memo wrong mask counts: different tokens for the same request)."""
    import threading

    rng = random.Random(5)
    grammar = compiler.compile(StructuredSpec(json=LOOPY), [SourceText(1, LOOPY_SOURCE)])
    assert isinstance(grammar, SpanGrammar)
    search = grammar.search
    nodes = [*states_along_walks(grammar, rng, walks=3, steps=30)]
    bounds = [rng.randint(0, 40) for _ in nodes]
    checks = [python_walk(search, n, GREEDY_LOOP_EXITS, b) for n, b in zip(nodes, bounds)]  # one thread at a time
    plans = [c_walk(search, n, None, None) for n in nodes]
    seen: dict[str, list[Any]] = {"checks": [], "plans": []}

    def engine() -> None:  # bounded checks, the Python walk
        for _ in range(10):
            seen["checks"].append([python_walk(search, n, GREEDY_LOOP_EXITS, b) for n, b in zip(nodes, bounds)])

    def binder() -> None:  # plans without a bound, the C walk (which lets go of the GIL)
        for _ in range(10):
            seen["plans"].append([c_walk(search, n, None, None) for n in nodes])

    threads = [threading.Thread(target=engine), threading.Thread(target=binder)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen["checks"]) == len(seen["plans"]) == 10, "a thread failed"
    assert all(run == checks for run in seen["checks"])
    assert all(run == plans for run in seen["plans"])


@needs_c_kernels
def test_each_trie_has_walk_scratch_of_its_own_size():
    """The C mask walk's scratch is sized by its trie; tries are freed and made again (a compiler a vocabulary), and
    one made at a freed trie's address must not get the freed trie's scratch."""
    from loraplex.grammar.span_automaton import TokenTrie, _stack_for

    for size in range(2, 40):
        trie = TokenTrie.of([bytes([i]) + b"xyz"[: size % 4] for i in range(size * 6)])
        assert len(_stack_for(trie)) >= 5 * trie.nodes + 5
        del trie
