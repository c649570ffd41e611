"""What a compile worker does with one request: translate, choose a backend, build.

Backend choice ("auto"): on a vocabulary of tens of thousands of tokens, outlines_core's Index pays
for every automaton state (strings admit most tokens in every state) and its regex determinization
explodes for nested free-form values, while llguidance compiles any schema quickly but computes each
mask at run time (bench/README.md has the figures). So a constraint with an exact regex (JSON schemas we
can translate, regexes, choices) gets a token automaton when the regex is short and its state
count (found cheaply with a 256-byte probe vocabulary, time-boxed) is small enough to build within a
compile's budget; otherwise, and for
Lark grammars, llguidance serves it, and the automaton may be built later by a background worker
to replace the cache entry. Both backends are exact: nothing is ever widened to make it compile.

One language whichever serves: where a constraint has an exact regex, llguidance serves that regex (token for
token as the automaton does, `automaton_language_grammar`), not its own JSON compiler, so a schema's first
requests (llguidance) and later ones (the automaton built in the background, or built inline on another replica)
allow the same tokens; both close the output by the same search (grammar/budget.py). llguidance's JSON compiler
serves only what has no exact regex (recursion, free-form nesting cut, tagged JSON), where nothing else can.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from loraplex.grammar import grounding
from loraplex.grammar.backend_llguidance import text as llg_text
from loraplex.grammar.backend_outlines.automaton import AutomatonData, OutlinesVocab, build_automaton, count_states
from loraplex.grammar.backend_outlines.node import AutomatonStates, ByteTables
from loraplex.grammar.grounding import GroundedSlot
from loraplex.grammar.schema.check import check_schema
from loraplex.grammar.schema.dialect import to_internal
from loraplex.grammar.schema.json_text import alt, rx_escape
from loraplex.grammar.schema.narrow import COMPLEMENTED_ONE_OF, narrow
from loraplex.grammar.schema.normalize import GROUNDED, NotRegular
from loraplex.grammar.schema.strict import close_schema
from loraplex.grammar.schema.to_regex import SchemaRegex
from loraplex.grammar.search import CompletionSearch
from loraplex.grammar.span_automaton import TemplateDFA
from loraplex.grammar.spec import GrammarError, StructuredSpec
from loraplex.grammar.vocab import VocabInfo
from loraplex.grammar.workers.messages import (
    AutomatonArtifact,
    GroundedArtifact,
    JobResult,
    LLGuidanceArtifact,
    PrebuildHint,
)

if TYPE_CHECKING:  # (backend_types imports torch, which a worker process never loads)
    from loraplex.grammar.backend_types import GrammarBackend


@dataclass(frozen=True)
class CompileOptions:
    backend: GrammarBackend = "auto"
    strict_objects: bool = True  # see schema.strict
    # automata up to this many states are built inside the request: a build costs per state (Index plus
    # tables) where llguidance compiles the same small schema in about the time of a few states (bench/README.md
    # has the figures), so a larger one is served by llguidance first and upgraded in the background
    inline_states: int = 32
    fallback_states: int = 160  # ...and up to this many where llguidance refuses the constraint
    max_states: int = 8192  # larger automata are never built (llguidance serves them)
    probe_max_chars: int = 2000  # longer regexes are not counted inside the request (too slow)
    upgrade_max_chars: int = 50_000  # longer regexes are never tried in the background
    probe_seconds: float = 0.25  # give up counting states after this long (and recycle the worker)
    max_ref_depth: int = 3
    span_template_states: int = 4096  # grounded schemas' byte DFAs up to this size (1 KB a state) are ours to serve
    span_template_seconds: float = 1.0  # ...built within this long (else llguidance binds the schema's requests)
    any_depth: int = 2


@dataclass
class Translation:
    regex: str | None  # exact regex of the output, or None
    why_not_regex: str  # when regex is None
    llg: str  # llguidance grammar text
    llg_error_label: str
    narrowing: list[str] = field(default_factory=list)  # how a schema was narrowed (empty: exact)
    # what the regex leaves out (recursion, free-form nesting cut at their bounds); llguidance is exact there
    regex_narrowing: list[str] = field(default_factory=list)
    # grounded strings (grammar/grounding.py): `llg` is then a Lark template the request's sources complete
    grounded: list[GroundedSlot] = field(default_factory=list)
    grounded_schema: Any = None  # the internal schema (local references only) `grounding.locate` walks
    grounded_tags: tuple[str, str] | None = None  # tool calls: the open and close tags around each value
    grounded_regex: str | None = None  # a response format's regex with grounded strings as placeholders

    @property
    def automaton_language(self) -> bool:
        """`llg` serves the regex itself (the language of its automaton)."""
        return self.regex is not None and not self.regex_narrowing


class WorkerContext:
    """Per-process tokenizer state for both backends."""

    def __init__(self, info: VocabInfo, options: CompileOptions) -> None:
        from llguidance import LLTokenizer

        self.info = info
        self.options = options
        self.outlines = OutlinesVocab(info)
        self.ll_tokenizer = LLTokenizer(info.tokenizer_json, n_vocab=info.vocab_size, eos_token=list(info.eos_ids))
        # (plans tokenized in Python: the C kernels' loader would import torch into this process)
        self.search = CompletionSearch(info, native_split=False)  # for llguidance's own languages
        self.automaton_search = CompletionSearch(info, automaton_language=True, native_split=False)  # exact regexes
        self.byte_tables = ByteTables.of(info)
        # tells the parent what it can start on before the job ends (set per job by the worker loop)
        self.notify: Callable[[PrebuildHint], None] = lambda body: None


def translate(
    spec: StructuredSpec,
    options: CompileOptions,
    drop_pattern_properties: bool = False,
    small_one_of: bool = False,
    root_as_definition: bool = False,
) -> Translation:
    kind = spec.kind
    if kind in ("json", "json_object"):
        schema: Any = {"type": "object"} if kind == "json_object" else spec.schema()
        parts = _schema_parts(schema, spec, options, drop_pattern_properties, small_one_of)
        schema, narrowing, rx, why, cuts = parts[:5]
        if parts[5]:
            regex = _grounded_regex(rx, why, cuts, parts[5])
            template = grounding.template_lark(regex, parts[5])
            why = "grounded values are built per request"
            return Translation(
                None,
                why,
                template,
                "schema cannot be enforced",
                narrowing,
                grounded=parts[5],
                grounded_schema=schema,
                grounded_regex=regex,
            )
        if rx is not None and not cuts:
            llg = llg_text.automaton_language_grammar(rx)
        else:
            llg = llg_text.json_schema_grammar(schema, root_as_definition)
        return Translation(rx, why, llg, "schema cannot be enforced", narrowing, cuts)
    if kind == "tagged_json":
        tagged = spec.tagged_json
        assert tagged is not None  # (its kind: the one constraint set)
        flags = (drop_pattern_properties, small_one_of)
        schema, narrowing, rx, why, cuts, slots = _schema_parts(spec.schema(), spec, options, *flags)
        text = None
        if "text" in tagged:
            text, text_narrowing, _rx, _why, _cuts, text_slots = _schema_parts(
                tagged["text"],
                spec,
                options,
                drop_pattern_properties,
                small_one_of,
            )
            narrowing += [f"{n} (of the answer)" for n in text_narrowing]
            if text_slots:
                raise GrammarError(
                    f"x-loraplex-grounded at {text_slots[0].pointer} of the answer beside tool calls: grounded values "
                    "are enforced in tool-call arguments and in answers without tools, not in an answer beside tools",
                    code="unsupported_schema",
                )
        if slots:
            calls = _grounded_regex(rx, why, cuts, slots)
            template = grounding.tagged_template_lark(calls, slots, tagged["open"], tagged["close"], tagged["parallel"])
            why = "grounded values are built per request"
            return Translation(
                None,
                why,
                template,
                "tagged JSON cannot be enforced",
                narrowing,
                grounded=slots,
                grounded_schema=schema,
                grounded_tags=(tagged["open"], tagged["close"]),
            )
        llg = llg_text.tagged_json_grammar(schema, tagged["open"], tagged["close"], tagged["parallel"], text)
        why = "free text beside tagged JSON needs a complement (text without the tag), which only llguidance holds"
        return Translation(None, why, llg, "tagged JSON cannot be enforced", narrowing)
    if kind == "regex":
        assert spec.regex is not None
        err = llg_text.regex_error(spec.regex)
        if err:
            raise GrammarError(f"invalid regex: {err}")
        rx = _strip_anchors(spec.regex)
        return Translation(rx, "", llg_text.automaton_language_grammar(rx), "invalid regex")
    if kind == "choice":
        assert spec.choice is not None
        rx = alt([rx_escape(c) for c in spec.choice])
        return Translation(rx, "", llg_text.automaton_language_grammar(rx), "invalid choice")
    assert spec.grammar is not None
    return Translation(None, "context-free grammar", llg_text.lark_grammar(spec.grammar), "grammar syntax error")


def _grounded_regex(rx: str | None, why: str, cuts: list[str], slots: list[GroundedSlot]) -> str:
    """The regex of a schema with grounded values; refused by name where it is not exact (the spans are only
    enforced inside our regex's grammar, never by llguidance's JSON compiler, which would ignore them)."""
    if rx is None or cuts:
        reason = why if rx is None else "; ".join(cuts)
        raise GrammarError(
            f"x-loraplex-grounded at {slots[0].pointer}: grounded values need a schema with an exact regular form, "
            f"and this one has none ({reason})",
            code="unsupported_schema",
        )
    return rx


def _schema_parts(
    schema: Any, spec: StructuredSpec, options: CompileOptions, drop_pattern_properties: bool, small_one_of: bool
) -> tuple[Any, list[str], str | None, str, list[str], list[GroundedSlot]]:
    """A schema checked, narrowed and closed: (schema, narrowing, regex or None, why not a regex, what the regex
    leaves out, its grounded strings). A regex that leaves something out is not offered when the request refuses
    narrowing."""
    schema, _draft = to_internal(schema)  # validated under its own draft, in one internal form
    if schema is False:
        raise GrammarError("the schema is false: no value is valid", code="unsatisfiable_schema")
    if schema is True:
        schema = {}
    # (to_internal made the schema this compile's own: the passes below rewrite it without copies)
    schema, rules = narrow(schema, drop_pattern_properties, small_one_of, in_place=True)
    if rules and not spec.allow_narrowing:
        raise GrammarError(
            "the schema can only be enforced narrowed, and the request asked to refuse rather than narrow: "
            + "; ".join(str(r) for r in rules),
            code="narrowing_refused",
        )
    narrowing = [str(r) for r in rules]
    check_schema(schema)
    if options.strict_objects:
        schema = close_schema(schema, in_place=True)
    try:
        regex = SchemaRegex(
            schema,
            max_ref_depth=options.max_ref_depth,
            any_depth=options.any_depth,
            max_chars=options.upgrade_max_chars,  # a longer regex is never made into an automaton
        )
        rx, why, cuts = regex.build(), "", regex.narrowing
    except NotRegular as e:
        rx, why, cuts = None, str(e), []
    except GrammarError as e:
        raise _with_narrowing(e, narrowing) from None
    if cuts and not spec.allow_narrowing:
        rx, why, cuts = None, f"the regex would narrow: {'; '.join(cuts)}", []
    slots = regex.grounded if rx is not None else _grounded_anywhere(schema)
    return schema, narrowing, rx, why, cuts, slots


def _grounded_anywhere(schema: Any) -> list[GroundedSlot]:
    """Where a schema without a regex asks for grounded values (so that it is refused by name, not served
    without them)."""
    found: list[GroundedSlot] = []
    todo: list[tuple[Any, str]] = [(schema, "")]
    while todo and not found:
        node, ptr = todo.pop()
        if isinstance(node, dict):
            if node.get(GROUNDED) is True:
                found.append(GroundedSlot(ptr or "/"))
            todo += [(v, f"{ptr}/{k}") for k, v in node.items()]
        elif isinstance(node, list):
            todo += [(v, f"{ptr}/{i}") for i, v in enumerate(node)]
    return found


def _with_narrowing(error: GrammarError, narrowing: list[str]) -> GrammarError:
    """A refusal that also names the narrowings applied: they may be what left nothing to generate."""
    if not narrowing:
        return error
    return GrammarError(f"{error}; after narrowing: {'; '.join(narrowing)}", code=error.code)


def _strip_anchors(regex: str) -> str:
    """The whole output must match anyway, so a leading ^ and a trailing $ are dropped."""
    if regex.startswith("^"):
        regex = regex[1:]
    if regex.endswith("$"):
        backslashes = len(regex[:-1]) - len(regex[:-1].rstrip("\\"))
        if backslashes % 2 == 0:
            regex = regex[:-1]
    return regex


def _llguidance(ctx: WorkerContext, tr: Translation) -> LLGuidanceArtifact:
    from llguidance import LLMatcher

    # building the matcher is the validation (a separate validate_grammar compiled the grammar twice:
    # same messages, measurably slower on large schemas: bench/README.md). The parent needs its own matcher
    # too (they cannot cross a process boundary): it builds it from this text while this one is built and
    # planned here.
    ctx.notify(PrebuildHint(tr.llg))
    matcher = LLMatcher(ctx.ll_tokenizer, tr.llg, log_level=0)
    if matcher.is_error():
        error = f"{tr.llg_error_label}: {llg_text.user_pointers(matcher.get_error().strip())}"
        if tr.why_not_regex and tr.llg_error_label.startswith("schema"):
            raise GrammarError(f"schema cannot be enforced: {tr.why_not_regex} ({error})", code="unsupported_schema")
        raise GrammarError(error)
    search = ctx.automaton_search if tr.automaton_language else ctx.search
    return LLGuidanceArtifact(tr.llg, _plan(search, matcher), automaton_language=tr.automaton_language)


def _plan(search: CompletionSearch, node: Any) -> list[int]:
    plan = search.plan(node, thorough=True)
    if plan is None:
        raise GrammarError(
            "no complete output was found within the search bounds (is the constraint satisfiable?)",
            code="unsatisfiable_schema",
        )
    return plan


def _automaton(ctx: WorkerContext, regex: str, states: int | None = None) -> AutomatonArtifact:
    """The token automaton of `regex`, with the completion the shared budget logic starts from."""
    data: AutomatonData = build_automaton(regex, ctx.outlines)
    plan = _plan(ctx.automaton_search, AutomatonStates(data, ctx.byte_tables).node(0))
    return AutomatonArtifact(data, plan, states)


def _bounded(work: Callable[[], Any], seconds: float) -> list[Any]:
    """``work()`` in a daemon thread, waited for at most ``seconds``: ``[its result or the exception it raised]``,
    or ``[]`` while it still runs (the caller then recycles the worker, which ends the thread)."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as e:  # handed to the caller
            result.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return result


def _count_states_bounded(regex: str, ctx: WorkerContext) -> int | None:
    """State count, or None when counting takes too long (the worker is then recycled)."""
    result = _bounded(lambda: count_states(regex, ctx.outlines), ctx.options.probe_seconds)
    if not result:
        return None
    if isinstance(result[0], BaseException):
        raise result[0]
    return int(result[0])


def compile_spec(ctx: WorkerContext, spec: StructuredSpec) -> JobResult:
    """The artifact for one spec (a token automaton or llguidance grammar text), with its narrowing."""
    flags = {"drop_pattern_properties": False, "small_one_of": False, "root_as_definition": False}
    tr = translate(spec, ctx.options)
    # a retry whose translation is one already refused (its flag changed nothing) fails alike, without a build
    refused: dict[tuple[str, str | None], GrammarError] = {}
    try:
        while True:
            try:
                if (tr.llg, tr.regex) in refused:
                    raise refused[(tr.llg, tr.regex)]
                result = _build(ctx, tr)
                break
            except GrammarError as e:
                refused[(tr.llg, tr.regex)] = e
                text = str(e)
                # (a retry only where its flag changes the translation: a schema without such a oneOf or
                # patternProperties is refused at once)
                if (
                    ("schema too large" in text or "more than 64 alternatives" in text)
                    and not flags["small_one_of"]
                    and any(n.endswith(COMPLEMENTED_ONE_OF) for n in tr.narrowing)
                ):
                    # a oneOf written with complements is the usual cause: its branches are then generated only
                    # where they are proven apart (a narrowing, reported)
                    flags["small_one_of"] = True
                elif (
                    ("patternProperty" in text or "required property" in text)
                    and not flags["drop_pattern_properties"]
                    and '"patternProperties"' in tr.llg
                ):
                    # llguidance needs patternProperties whose patterns cannot both match a key, and finds a
                    # required property only a pattern admits unsatisfiable: generate declared keys only
                    flags["drop_pattern_properties"] = True
                elif "circular references with sibling keys" in text and not flags["root_as_definition"]:
                    # llguidance compiles the root outside its table of definitions, so a cycle back to the root
                    # through an intersected reference (allOf: [{$ref}, ...]) compiles the root twice and finds
                    # the reference undefined; the same schema as a definition of a bare root reference does not
                    flags["root_as_definition"] = True
                else:
                    raise
                tr = translate(spec, ctx.options, **flags)
    except GrammarError as e:
        raise _with_narrowing(e, tr.narrowing) from None
    automaton = isinstance(result.artifact, AutomatonArtifact)
    narrowing = tuple(tr.narrowing + (tr.regex_narrowing if automaton else []))
    return replace(result, artifact=replace(result.artifact, narrowing=narrowing))


def _grounded(ctx: WorkerContext, tr: Translation) -> JobResult:
    """A grounded schema's template, checked by binding it to a one-character source (each request binds its own)."""
    from llguidance import LLMatcher

    if ctx.options.backend == "outlines":
        raise GrammarError(
            f"x-loraplex-grounded at {tr.grounded[0].pointer}: grounded values are enforced by llguidance, and this "
            "server's grammar backend is outlines only",
            code="unsupported_schema",
        )
    # bound to no text (only empty spans): the check of the template, and, where that still has an output, a
    # completion every request can take (the empty span is a span of any source). Tool calls (llguidance's forcing
    # on) plan per request: a forced run's canonical tokens depend on the source.
    lark = grounding.request_lark(tr.llg, [], [])
    checked = LLMatcher(ctx.ll_tokenizer, LLMatcher.grammar_from_lark(lark), log_level=0)
    if checked.is_error():
        raise GrammarError(f"{tr.llg_error_label}: {checked.get_error().strip().splitlines()[0]}")
    automaton_language = tr.grounded_tags is None
    plan = None
    if automaton_language and checked.consume_tokens(ctx.ll_tokenizer.tokenize_str(grounding.DOCUMENT_TAG)):
        plan = ctx.automaton_search.plan(checked, thorough=True)
    span_template, finished = _span_template_bounded(ctx, tr) if automaton_language else (None, True)
    artifact = GroundedArtifact(
        tr.llg,
        tuple(tr.grounded),
        json.dumps(tr.grounded_schema),
        automaton_language=automaton_language,
        tags=tr.grounded_tags,
        plan=plan,
        span_template=span_template,
    )
    return JobResult(artifact, recycle=not finished)  # a build still running: start a fresh worker


def _span_template_bounded(ctx: WorkerContext, tr: Translation) -> tuple[TemplateDFA | None, bool]:
    """``_span_template`` within ``span_template_seconds`` (outlines_core's Index takes minutes on a few regexes:
    a counted repetition of JSON's string unit, a uri-reference format), and whether it finished; unfinished, the
    schema's requests are bound by llguidance (the same language) and the worker is recycled. A template that cannot
    be built (any error) is not ours to serve either: llguidance binds the requests."""
    result = _bounded(lambda: _span_template(ctx, tr), ctx.options.span_template_seconds)
    if not result:
        return None, False
    return (None if isinstance(result[0], BaseException) else result[0]), True


def _span_template(ctx: WorkerContext, tr: Translation) -> TemplateDFA | None:
    """The byte DFA our span automaton serves the schema with (grammar/span_automaton.py), where it can: one
    grounded string at a place, at most ``span_template_states`` template states and as many content states (the
    grounded strings' other keywords, intersected); else None (llguidance binds each request, as before)."""
    if tr.grounded_regex is None:
        return None
    try:
        template = TemplateDFA.of_regex(tr.grounded_regex, [slot.content for slot in tr.grounded])
    except GrammarError:
        return None
    limit = ctx.options.span_template_states
    return template if len(template.hole) <= limit and len(template.content_accepting) <= limit else None


def _build(ctx: WorkerContext, tr: Translation) -> JobResult:
    opts = ctx.options
    if tr.grounded:
        return _grounded(ctx, tr)
    if opts.backend == "outlines":
        if tr.regex is None:
            raise GrammarError(f"cannot be compiled into a token automaton: {tr.why_not_regex}")
        # (the artifact's narrowing then includes what the regex leaves out)
        return JobResult(_automaton(ctx, tr.regex))
    if opts.backend == "llguidance" or tr.regex is None:
        return JobResult(_llguidance(ctx, tr))
    if tr.regex_narrowing:  # llguidance holds recursion and free-form values exactly: the regex only if it cannot
        try:
            return JobResult(_llguidance(ctx, tr))
        except GrammarError:
            states = _count_states_bounded(tr.regex, ctx) if len(tr.regex) <= opts.probe_max_chars else None
            if states is None or states > opts.fallback_states:
                raise
            return JobResult(_automaton(ctx, tr.regex, states))
    states = _count_states_bounded(tr.regex, ctx) if len(tr.regex) <= opts.probe_max_chars else None
    if states is not None and states <= opts.inline_states:
        return JobResult(_automaton(ctx, tr.regex, states))
    try:
        out = _llguidance(ctx, tr)
    except GrammarError:
        if states is None or states > opts.fallback_states:
            raise
        # llguidance cannot serve it (it finds a required pattern-only key unsatisfiable, say), the regex is exact
        return JobResult(_automaton(ctx, tr.regex, states))
    out = replace(out, states=states)
    probed = len(tr.regex) <= opts.probe_max_chars
    if probed and states is None:
        return JobResult(out, recycle=True)  # the counting thread is still running: start a fresh worker
    if (states is not None and states <= opts.max_states) or (not probed and len(tr.regex) <= opts.upgrade_max_chars):
        out = replace(out, upgrade=tr.regex)  # (exact: a regex that narrows never gets here)
    return JobResult(out)


def run_job(ctx: WorkerContext, kind: str, payload: Any) -> JobResult:
    if kind == "compile":
        return compile_spec(ctx, StructuredSpec(**payload))
    if kind == "automaton":  # background upgrade: only automata of a bounded size
        if count_states(payload, ctx.outlines) > ctx.options.max_states:
            raise GrammarError("automaton too large")
        return JobResult(_automaton(ctx, payload))
    raise GrammarError(f"unknown job kind {kind!r}")
