"""What grounded values cost: `python -P -m bench.grounding`.

For source texts of 1,000 to 100,000 characters (prose with quotes, backslashes and newlines, the fields to
extract planted in it) and an extraction schema with three grounded strings, one grounded array and a number, once
with the strings' other keywords (pattern, maxLength, format) and once without:

* build: the per-request part, our span automaton's bind (``Grounding.build_seconds``; grammar/span_automaton.py),
  median of 5, and per 10,000 characters; beside it llguidance's bind of the same template and text (what served
  grounded values before, and still does where the span automaton cannot: no C compiler, a template too large);
* masks: random walks of the grounded language replayed through each binding, each path through a grammar bound
  for it alone (as a request is served: nothing cached from the walks), and through the same schema without the
  keyword, served by llguidance (a schema's first requests) and by the token automaton (after the background
  build); p50 and p99 of `fill_bitmask`, and the span automaton's p99 over each other p99.

The vocabulary is SmolLM2's (the bundled model); no model runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import torch

from loraplex.grammar.compiler import GrammarCompiler
from loraplex.grammar.grounding import SourceText
from loraplex.grammar.spec import StructuredSpec

WORDS = ["the", "order", "shipped", "to", "our", "customer", "on", "time", "and", "in", "full", ",", "with"]
WORDS += ["thanks", ";", "see", "note", "4", "below"]
PLANTED = (
    'Invoice INV-2024-0173 from Acme "Widgets" GmbH\\Berlin.\nContact: dana.oconnor@example.org, total 1,234.50 EUR'
)


def schema(grounded: bool, keywords: bool = True) -> dict[str, Any]:
    g = {"x-loraplex-grounded": True} if grounded else {}

    def kw(**them: Any) -> dict[str, Any]:
        return them if keywords else {}

    return {
        "type": "object",
        "properties": {
            "invoice": {"type": "string", **kw(pattern="^INV-[0-9-]+$"), **g},
            "vendor": {"type": "string", **kw(maxLength=60), **g},
            "email": {"type": "string", **kw(format="email"), **g},
            "notes": {"type": "array", "items": {"type": "string", **kw(maxLength=40), **g}, "maxItems": 3},
            "total": {"type": "number", "minimum": 0, "maximum": 1e9},
        },
        "required": ["invoice", "vendor", "email", "notes", "total"],
        "additionalProperties": False,
    }


def source(chars: int, rng: random.Random) -> str:
    words: list[str] = []
    size = 0
    while size < chars - len(PLANTED):
        w = rng.choice(WORDS) + ("\n" if rng.random() < 0.05 else "")
        words.append(w)
        size += len(w) + 1
    cut = rng.randrange(len(words) + 1)
    return " ".join(words[:cut] + [PLANTED] + words[cut:])[:chars]


def walk(grammar: Any, rng: random.Random, steps: int) -> list[int]:
    m = grammar.new_matcher()
    mask = torch.zeros(m.bitmask_words(), dtype=torch.int32)
    path: list[int] = []
    for step in range(steps):
        m.fill_bitmask(mask, steps - step)
        bits = (mask.unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
        ids = torch.nonzero(bits.flatten()).flatten().tolist()
        token = rng.choice(ids)
        if not m.accept_token(token) or m.is_terminated():
            break
        path.append(token)
    return path


def mask_times(grammar: Any, paths: list[list[int]], budget: int) -> list[float]:
    times: list[float] = []
    for path in paths:
        m = grammar.new_matcher()
        mask = torch.zeros(m.bitmask_words(), dtype=torch.int32)
        for step, token in enumerate(path):
            t = time.perf_counter()
            m.fill_bitmask(mask, budget - step)
            times.append(time.perf_counter() - t)
            assert m.accept_token(token), "an ungrounded matcher refused a grounded path"
    return times


def p(times: list[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--walks", type=int, default=20)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from loraplex.engine.model.files import default_model_dir

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    rng = random.Random(0)
    budget = 120
    with (
        GrammarCompiler(tokenizer, eos_token_ids=eos, vocab_size=49152) as auto,
        GrammarCompiler(tokenizer, eos_token_ids=eos, vocab_size=49152, backend="llguidance") as llg,
    ):
        for keywords in (True, False):
            span_table(auto, llg, args, rng, budget, keywords)


def span_table(
    auto: GrammarCompiler,
    llg: GrammarCompiler,
    args: argparse.Namespace,
    rng: random.Random,
    budget: int,
    keywords: bool,
) -> None:
    """One table: the schema grounded (our span automaton's bind, and llguidance's of the same template) and not
    (served by llguidance, and by the token automaton after its build)."""
    import copy

    spec = StructuredSpec(json=schema(True, keywords=keywords))
    plain = StructuredSpec(json=schema(False, keywords=keywords))
    plain_llg = llg.compile(plain)
    auto.compile(plain)
    auto.wait_for_upgrades(300)
    plain_automaton = auto.compile(plain)
    template = auto.prepare(spec).result()
    llg_template = copy.copy(template)
    llg_template.spans = None  # the same template bound by llguidance
    served = auto.compile(spec, [SourceText(0, PLANTED)]).backend
    print(
        f"\n{'with' if keywords else 'without'} other keywords beside the grounding: grounded served by {served}, "
        f"ungrounded by {plain_llg.backend} and then {plain_automaton.backend}"
    )
    print(
        "| source chars | span automaton build ms (median of 5) | per 10k chars | llguidance bind ms | span mask p50 / "
        "p99 ms, as served | llguidance-bound p50 / p99, as served | ungrounded: llguidance p50 / p99 | token "
        "automaton p50 / p99 | span p99 vs llguidance-bound / ungrounded llguidance / ungrounded automaton |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for chars in (int(s) for s in args.sizes.split(",")):
        text = source(chars, rng)
        sources = [SourceText(1, text)]
        builds = []
        for _ in range(5):
            grammar = auto.compile(spec, sources)
            assert grammar.grounding is not None
            builds.append(grammar.grounding.build_seconds)
        llg_builds = []
        for _ in range(3):
            t = time.perf_counter()
            llg_template.bind(sources)
            llg_builds.append(time.perf_counter() - t)
        build, llg_build = statistics.median(builds) * 1e3, statistics.median(llg_builds) * 1e3
        paths = [walk(grammar, rng, budget) for _ in range(args.walks)]
        # as served: each path through a grammar bound for it alone (what a request's masks cost: nothing of the
        # walks above is cached in it)
        g = [t for x in paths for t in mask_times(auto.compile(spec, sources), [x], budget)]
        u = [t for x in paths for t in mask_times(llg_template.bind(sources), [x], budget)]
        a = mask_times(plain_automaton, paths, budget)
        n = mask_times(plain_llg, paths, budget)
        print(
            f"| {len(text)} | {build:.2f} | {build / len(text) * 1e4:.2f} | {llg_build:.1f} | "
            f"{p(g, 0.5):.3f} / {p(g, 0.99):.3f} | {p(u, 0.5):.3f} / {p(u, 0.99):.3f} | "
            f"{p(n, 0.5):.3f} / {p(n, 0.99):.3f} | {p(a, 0.5):.3f} / {p(a, 0.99):.3f} | "
            f"{p(g, 0.99) / p(u, 0.99):.2f}x / {p(g, 0.99) / p(n, 0.99):.2f}x / {p(g, 0.99) / p(a, 0.99):.2f}x |"
        )


if __name__ == "__main__":
    main()
