"""A schema with grounded values (grammar/grounding.py): compiled once as a template, bound to each request's
source text as an ordinary llguidance grammar.

The template is what the compiler caches; it serves no request itself (``new_matcher`` refuses). Where our span
automaton serves the schema (a response format whose template the compile worker could build: ``spans``,
grammar/span_grammar.py), ``bind`` hands each request to it: the same language in a fraction of the build time.
Otherwise (tool calls, no C compiler, a template too large) ``bind`` builds
the request's grammar (the span terminal of its sources: llguidance's suffix automaton), plans its shortest
completion (the budget logic of grammar/budget.py, as for every llguidance grammar), and finds the grounded
strings no span of this source can satisfy: where that leaves no output the request is refused by name, else the
values are narrowed and said so. The compiler runs ``bind`` off the engine loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from loraplex.grammar import grounding
from loraplex.grammar.backend_llguidance.grammar import LLGuidanceGrammar, VocabRows
from loraplex.grammar.backend_types import CompiledGrammar, GrammarMatcher
from loraplex.grammar.grounding import GroundedSlot, GroundedValue, SourceText
from loraplex.grammar.search import CompletionSearch
from loraplex.grammar.spec import GrammarError

if TYPE_CHECKING:
    from loraplex.grammar.span_grammar import SpanTemplate


class Grounding:
    """What a bound grammar's output needs to say where its grounded values came from."""

    def __init__(
        self, schema: Any, tags: tuple[str, str] | None, sources: Sequence[SourceText], build_seconds: float = 0.0
    ) -> None:
        self.schema = schema
        self.tags = tags
        self.sources = tuple(sources)
        # how long the request's grammar took to build (llguidance's span automaton and the template's lexemes, or
        # our span automaton's whole bind): bench.grounding reports it
        self.build_seconds = build_seconds

    def locate(self, text: str) -> list[GroundedValue]:
        """The grounded values of a complete output; for tool calls, each call's pointers start with its index."""
        if self.tags is None:
            return grounding.locate(self.schema, text, self.sources)
        open_tag, close_tag = self.tags
        found: list[GroundedValue] = []
        for i, block in enumerate(text.split(open_tag)[1:]):
            call = block.split(close_tag, 1)[0]
            for v in grounding.locate(self.schema, call, self.sources):
                found.append(GroundedValue(f"/{i}{v.pointer}", v.message, v.start, v.end))
        return found


class GroundedTemplate(CompiledGrammar):
    backend = "llguidance"
    min_tokens = 0  # (known per request only: the bound grammar's budget is checked)

    def __init__(
        self,
        template: str,
        slots: Sequence[GroundedSlot],
        schema: Any,
        ll_tokenizer: Any,
        rows: VocabRows,
        search: CompletionSearch,
        close_within_budget: bool,
        automaton_language: bool,
        tags: tuple[str, str] | None,
        plan: Sequence[int] | None = None,
        spans: SpanTemplate | None = None,
    ) -> None:
        self.template = template
        self.slots = tuple(slots)
        self.schema = schema
        self._tokenizer = ll_tokenizer
        self._rows = rows
        self._search = search
        self._close = close_within_budget
        self.automaton_language = automaton_language
        self._tags = tags
        # a completion valid whatever the source (through empty spans; grammar/workers/job.py), else None: then each
        # request searches its own
        self.plan = None if plan is None else list(plan)
        # where set, each request is bound to our span automaton instead (grammar/span_grammar.py): the same
        # language, built in a fraction of the time
        self.spans = spans

    def new_matcher(self) -> GrammarMatcher:
        raise GrammarError(
            f"x-loraplex-grounded at {self.slots[0].pointer}: a grounded value needs the request's source text, and "
            "none was given",
            code="unsatisfiable_schema",
        )

    def bind(self, sources: Sequence[SourceText]) -> CompiledGrammar:
        """The grammar of one request: its grounded values are spans of ``sources``.

        One llguidance build serves both the request and the check of its grounded strings with other keywords:
        the grammar's start is the document after a tag, or one such string after its own tag, so the span
        automaton is built once; the request's matcher is the copy that consumed the document's tag."""
        from llguidance import LLMatcher

        if self.spans is not None:
            started = time.perf_counter()
            spanned, empty_slots = self.spans.bind(sources, self._search, self.plan, self._close)
            empty = [self.slots[k] for k in empty_slots]
            if spanned is None:
                raise _unsatisfiable(empty)
            return self._finish(spanned, empty, sources, time.perf_counter() - started)
        limits = _limits(sum(len(s.text) for s in sources))
        checked = [k for k, slot in enumerate(self.slots) if slot.content]
        text = LLMatcher.grammar_from_lark(grounding.request_lark(self.template, checked, sources))
        started = time.perf_counter()
        built = LLMatcher(self._tokenizer, text, log_level=0, limits=limits)
        build_seconds = time.perf_counter() - started
        _check(built)
        empty = [self.slots[k] for k in checked if self._empty(built, grounding.slot_tag(k))]
        matcher = built.deep_copy()
        if not matcher.consume_tokens(self._tokenizer.tokenize_str(grounding.DOCUMENT_TAG)):
            raise GrammarError("internal: the grounded grammar refused its own start tag")
        plan = self.plan if self.plan is not None else self._search.plan(matcher)
        if plan is None:
            raise _unsatisfiable(empty)
        grammar = LLGuidanceGrammar(
            text,
            self._tokenizer,
            self._rows,
            self._search,
            len(plan),
            plan,
            self._close,
            matcher,
            automaton_language=self.automaton_language,
        )
        return self._finish(grammar, empty, sources, build_seconds)

    def _finish(
        self, grammar: CompiledGrammar, empty: Sequence[GroundedSlot], sources: Sequence[SourceText], seconds: float
    ) -> CompiledGrammar:
        """A bound grammar with its narrowing (the template's, and the grounded strings no span satisfies) and what
        finding its values' spans needs."""
        grammar.narrowing = self.narrowing + tuple(
            f"x-loraplex-grounded at {s.pointer}: no span of the source text satisfies the string's other keywords, "
            "so it is never written"
            for s in empty
        )
        grammar.grounding = Grounding(self.schema, self._tags, sources, seconds)
        return grammar

    def _empty(self, built: Any, tag: str) -> bool:
        """Whether no span satisfies the grounded string behind ``tag`` (with its other keywords)."""
        trial = built.deep_copy()
        if not trial.consume_tokens(self._tokenizer.tokenize_str(tag)):
            raise GrammarError(f"internal: the grounded grammar refused its own tag {tag!r}")
        return not trial.is_accepting() and self._search.plan(trial) is None


def _unsatisfiable(empty: Sequence[GroundedSlot]) -> GrammarError:
    named = "; ".join(f"{s.pointer} (with its other keywords)" for s in empty) or "the grounded values"
    return GrammarError(
        "no output can satisfy the schema with this request's source text: no span of it fits the grounded "
        f"string at {named}",
        code="unsatisfiable_schema",
    )


# llguidance's default budget for analysing a grammar's lexemes at build time (its LLParserLimits), and what a
# span automaton needs on top of it per character of source text (measured: 100,000 characters of text under a
# pattern need about 4 million)
_INITIAL_LEXER_FUEL = 1_000_000
_FUEL_PER_CHARACTER = 60


def _limits(characters: int) -> Any:
    """The request's limits: lexer fuel for its source's size, and errors that never quote the grammar (it holds
    the tenant's text; the messages stay out of logs and other responses)."""
    from llguidance import LLParserLimits

    fuel = max(_INITIAL_LEXER_FUEL, _FUEL_PER_CHARACTER * characters)
    return LLParserLimits(initial_lexer_fuel=fuel, verbose_errors=False)


def _check(matcher: Any) -> None:
    if matcher.is_error():
        first = matcher.get_error().strip().splitlines()[0]
        raise GrammarError(f"llguidance rejected the grounded grammar: {first}", code="unsupported_schema")
