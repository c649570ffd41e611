"""One language whichever backend serves a constraint: llguidance and the token automaton, walked in lock-step over
random paths with a token budget, give the same mask, forced bytes, budget checks, budget fallbacks and distances
at every step. Real-world schemas of the dev set (SchemaStore), a tool call's schema and the regex, choice and
format specs. A control shows the walk finds a difference where there is one: llguidance's own JSON compiler
(what served these schemas before) allows other tokens than the automaton."""

from __future__ import annotations

import json
import random

import msgspec
import pytest
import torch

from loraplex.grammar import StructuredSpec
from loraplex.grammar.backend_llguidance import text as llg_text
from loraplex.grammar.backend_llguidance.grammar import LLGuidanceGrammar
from loraplex.grammar.workers.job import CompileOptions, translate
from loraplex.platform.openai.schemas import ChatCompletionRequest as ChatRequest
from loraplex.platform.openai.tools import call_schema, tool_mode
from tests.grammar.helpers import EOS, REPO, VOCAB, allowed_ids
from tests.platform.test_platform_tools import TOOLS, USER

DEV_SET = REPO.parent / "shared" / "schemas" / "schemastore-dev"
# dev-set schemas with an exact regex of at most ~5,000 characters (s3-bucket-cors: its automaton does not fit the
# worker's memory limit, so only llguidance ever serves it)
DEV_IDS = [
    "settings.job",
    "partial-fastapi",
    "gpc",
    "partial-scheduled",
    "enonic-xp-service-8.0.0",
    "vsls",
    "packwiz-index",
    "servicehub.service.schema",
    "github-issue-config",
    "packwiz-mod",
    "typewiz",
    "backportrc",
    "factorial-drupal-breakpoints-css-0.2.0",
    "img-catapult-psp-1.0.0",
    "sprite",
    "samtrc",
    "imgbotconfig",
    "loobin-1.0",
    "stylua",
    "github-release-config",
    "heloisa-marketplace",
    "partial-pdm-dockerize",
]
# what platform/openai/tools.py makes of the tool-calling tests' three tools with tool_choice "required" (the request
# whose streamed and whole answers once differed when the background build took over)
TOOL_CALLS = call_schema(
    tool_mode(msgspec.convert({"model": "m", "messages": USER, "tools": TOOLS, "tool_choice": "required"}, ChatRequest))
)
SPECS = {
    "tool_calls": StructuredSpec(json=TOOL_CALLS),
    "regex": StructuredSpec(regex=r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8}){0,2}\."),
    "choice": StructuredSpec(choice=["alpha", "beta", "gamma delta"]),
    "email_and_number": StructuredSpec(
        json={
            "type": "object",
            "properties": {"to": {"type": "string", "format": "email"}, "n": {"type": "number"}},
            "required": ["to"],
        }
    ),
}


def _dev_spec(schema_id: str) -> StructuredSpec:
    index = {e["id"]: e for e in map(json.loads, (DEV_SET / "index.jsonl").read_text().splitlines())}
    return StructuredSpec(json=json.loads((DEV_SET / index[schema_id]["file"]).read_text()))


def lockstep(a, b, rng: random.Random, budget: int) -> str | None:
    """Walk two matchers with the same tokens the way the engine's sampler draws (up to 8 candidates checked
    against the budget, else the fallback); the first difference found, or None."""
    ma, mb = a.new_matcher(), b.new_matcher()
    xa, xb = torch.zeros((VOCAB + 31) // 32, dtype=torch.int32), torch.zeros((VOCAB + 31) // 32, dtype=torch.int32)
    for used in range(budget + 1):
        remaining = budget - used
        ma.fill_bitmask(xa, remaining)
        mb.fill_bitmask(xb, remaining)
        if not torch.equal(xa, xb):
            only_a, only_b = set(allowed_ids(xa)) - set(allowed_ids(xb)), set(allowed_ids(xb)) - set(allowed_ids(xa))
            return f"step {used}: masks differ (only first: {sorted(only_a)[:5]}, only second: {sorted(only_b)[:5]})"
        if ma.native_forced_bytes() != mb.native_forced_bytes():
            return f"step {used}: forced bytes {ma.native_forced_bytes()!r} != {mb.native_forced_bytes()!r}"
        if ma.needs_budget_check() != mb.needs_budget_check():
            return f"step {used}: one checks the budget, the other not"
        allowed = allowed_ids(xa)
        if not allowed:
            return f"step {used}: nothing allowed"
        candidates = rng.sample(allowed, min(8, len(allowed)))
        token = candidates[0]
        if ma.needs_budget_check():
            fits_a = [ma.fits_budget(t, remaining - 1) for t in candidates]
            fits_b = [mb.fits_budget(t, remaining - 1) for t in candidates]
            if fits_a != fits_b:
                return f"step {used}: budget checks {fits_a} != {fits_b}"
            token = next((t for t, ok in zip(candidates, fits_a) if ok), -1)
            if token < 0:
                token = ma.budget_fallback()
                if token != mb.budget_fallback():
                    return f"step {used}: budget fallbacks differ"
        if not (ma.accept_token(token) and mb.accept_token(token)):
            return f"step {used}: token {token} refused"
        if token == EOS:
            return None
        if ma.min_tokens_to_accept() != mb.min_tokens_to_accept():
            return f"step {used}: distances {ma.min_tokens_to_accept()} != {mb.min_tokens_to_accept()}"
    return f"not closed within {budget} tokens"


def _walks(a, b, seed: str, walks: int = 3) -> list[str]:
    rng = random.Random(seed)
    found = []
    for _ in range(walks):
        budget = a.min_tokens + rng.randint(0, 40)  # from the tightest budget a request may have to a loose one
        diff = lockstep(a, b, rng, budget)
        if diff:
            found.append(diff)
    return found


@pytest.mark.parametrize("schema_id", DEV_IDS)
def test_dev_set_schemas_walk_alike_on_both_backends(dfa_compiler, llg_compiler, schema_id):
    spec = _dev_spec(schema_id)
    assert translate(spec, CompileOptions()).automaton_language  # an exact regex: both backends serve it
    a, b = dfa_compiler.compile(spec), llg_compiler.compile(spec)
    assert (a.backend, b.backend) == ("outlines", "llguidance")
    assert a.min_tokens == b.min_tokens and a.narrowing == b.narrowing
    assert _walks(a, b, schema_id) == []


@pytest.mark.parametrize("name", list(SPECS))
def test_tool_calls_regexes_and_formats_walk_alike_on_both_backends(dfa_compiler, llg_compiler, name):
    a, b = dfa_compiler.compile(SPECS[name]), llg_compiler.compile(SPECS[name])
    assert a.min_tokens == b.min_tokens and a.narrowing == b.narrowing
    assert _walks(a, b, name, walks=6) == []


def test_the_walk_finds_llguidances_own_json_language_different(dfa_compiler, llg_compiler):
    """The control: llguidance's JSON compiler forces the canonical token where bytes are forced and allows
    characters the automaton cannot hold, so the lock-step walk must report a difference."""
    spec = SPECS["tool_calls"]
    automaton = dfa_compiler.compile(spec)
    served = llg_compiler.compile(spec)
    ll_tokenizer, search, rows = llg_compiler._llguidance_parts()
    text = llg_text.json_schema_grammar(spec.schema())
    own = LLGuidanceGrammar(text, ll_tokenizer, rows, search, served.min_tokens, served.plan, True)
    assert _walks(automaton, own, "control", walks=6) != []
