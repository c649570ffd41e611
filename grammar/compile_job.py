"""What a compile worker does with one request: translate, choose a backend, build.

Backend choice ("auto"): a constraint that has an exact regex (JSON schemas we can translate,
regexes, choices) gets a token automaton (outlines_core) when its automaton is small enough to
build right away (counted first with a 256-byte vocabulary, which is cheap); otherwise, and for
Lark grammars, llguidance serves it, and the automaton can be built later in the background and
replace the cache entry. Both backends are exact: nothing is ever widened to make it compile.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from loraplex.grammar import llg_text
from loraplex.grammar.automaton import OutlinesVocab, build_automaton, count_states
from loraplex.grammar.json_text import alt, rx_escape
from loraplex.grammar.llg_search import CompletionSearch
from loraplex.grammar.schema_check import check_schema
from loraplex.grammar.schema_norm import NotRegular
from loraplex.grammar.schema_regex import SchemaRegex
from loraplex.grammar.spec import GrammarError, StructuredSpec
from loraplex.grammar.vocab import VocabInfo


@dataclass(frozen=True)
class CompileOptions:
    backend: str = "auto"  # auto | outlines | llguidance
    inline_states: int = 192  # automata up to this many states are built inside the request
    max_states: int = 8192  # larger automata are never built (llguidance serves them)
    probe_seconds: float = 1.0  # give up counting states after this long (and recycle the worker)
    max_ref_depth: int = 3
    any_depth: int = 2


@dataclass
class Translation:
    regex: str | None  # exact regex of the output, or None
    why_not_regex: str  # when regex is None
    llg: str | None  # llguidance grammar text
    llg_error_label: str


class WorkerContext:
    """Per-process tokenizer state for both backends."""

    def __init__(self, info: VocabInfo, options: CompileOptions) -> None:
        from llguidance import LLTokenizer

        self.info = info
        self.options = options
        self.outlines = OutlinesVocab(info)
        self.ll_tokenizer = LLTokenizer(info.tokenizer_json, n_vocab=info.vocab_size, eos_token=list(info.eos_ids))
        self.search = CompletionSearch(info)


def translate(spec: StructuredSpec, options: CompileOptions) -> Translation:
    kind = spec.kind
    if kind in ("json", "json_object"):
        schema: Any = {"type": "object"} if kind == "json_object" else spec.schema()
        check_schema(schema)
        try:
            rx, why = SchemaRegex(schema, max_ref_depth=options.max_ref_depth, any_depth=options.any_depth).build(), ""
        except NotRegular as e:
            rx, why = None, str(e)
        return Translation(rx, why, llg_text.json_schema_grammar(schema), "schema cannot be enforced")
    if kind == "regex":
        err = llg_text.regex_error(spec.regex)  # type: ignore[arg-type]
        if err:
            raise GrammarError(f"invalid regex: {err}")
        return Translation(spec.regex, "", llg_text.regex_grammar(spec.regex), "invalid regex")  # type: ignore[arg-type]
    if kind == "choice":
        rx = alt([rx_escape(c) for c in spec.choice])  # type: ignore[union-attr]
        return Translation(rx, "", llg_text.regex_grammar(rx), "invalid choice")
    return Translation(None, "context-free grammar", llg_text.lark_grammar(spec.grammar), "grammar syntax error")  # type: ignore[arg-type]


def _llguidance(ctx: WorkerContext, tr: Translation) -> dict[str, Any]:
    from llguidance import LLMatcher

    assert tr.llg is not None
    try:
        llg_text.validate(tr.llg, ctx.ll_tokenizer, tr.llg_error_label)
    except GrammarError as e:
        if tr.why_not_regex and tr.llg_error_label.startswith("schema"):
            raise GrammarError(f"schema cannot be enforced: {tr.why_not_regex} ({e})") from None
        raise
    matcher = LLMatcher(ctx.ll_tokenizer, tr.llg, log_level=0)
    if matcher.is_error():
        raise GrammarError(f"{tr.llg_error_label}: {matcher.get_error()}")
    plan = ctx.search.plan(matcher)
    if plan is None:
        raise GrammarError("no complete output was found within the search bounds (is the constraint satisfiable?)")
    return {"kind": "llg", "grammar": tr.llg, "plan": plan}


def _count_states_bounded(regex: str, ctx: WorkerContext) -> int | None:
    """State count, or None when counting takes too long (the worker is then recycled)."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(count_states(regex, ctx.outlines))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            result.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(ctx.options.probe_seconds)
    if not result:
        return None
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def compile_spec(ctx: WorkerContext, spec: StructuredSpec) -> dict[str, Any]:
    """The artifact for one spec: {"kind": "dfa", "data": ...} or {"kind": "llg", ...}."""
    opts = ctx.options
    tr = translate(spec, opts)
    if opts.backend == "outlines":
        if tr.regex is None:
            raise GrammarError(f"cannot be compiled into a token automaton: {tr.why_not_regex}")
        return {"kind": "dfa", "data": build_automaton(tr.regex, ctx.outlines)}
    if opts.backend == "llguidance" or tr.regex is None:
        return _llguidance(ctx, tr)
    states = _count_states_bounded(tr.regex, ctx)
    if states is not None and states <= opts.inline_states:
        return {"kind": "dfa", "data": build_automaton(tr.regex, ctx.outlines), "states": states}
    out = _llguidance(ctx, tr)
    out["states"] = states
    if states is None:
        out["recycle"] = True  # a counting thread may still be running: start a fresh worker
    elif states <= opts.max_states:
        out["upgrade"] = tr.regex
    return out


def run_job(ctx: WorkerContext, kind: str, payload: Any) -> dict[str, Any]:
    if kind == "compile":
        return compile_spec(ctx, StructuredSpec(**payload))
    if kind == "automaton":
        return {"kind": "dfa", "data": build_automaton(payload, ctx.outlines)}
    raise GrammarError(f"unknown job kind {kind!r}")
