"""Real-world JSON Schemas: coverage, soundness and recall of loraplex's structured output, and of llguidance
(default and lenient) and xgrammar on the same corpus and tokenizer.

    .venv/bin/python -P -m bench.schema_coverage [--corpus DIR] [--walks 50] [--limit N] [--sample N] [--peers]

For every schema of the corpus (default ../shared/schemas/schemastore-dev: SchemaStore schemas with their
own example documents):

* loraplex compiles it (exact, narrowed, or refused with a reason), then random walks through the masks
  (a uniformly random allowed token per step, under a token budget the matcher must close within) must
  produce only documents that validate under the schema's own draft with format checking: the count of
  invalid walks is the soundness figure, and it must be zero;
* recall: the valid example documents, keys put into the order we generate, fed token by token;
* compile times and mask times.

--corpus also reads MaskBench's folder of JSONSchemaBench schemas with test documents (guidance-ai/jsonschemabench,
maskbench/data; not in this repository): acceptance is then also shown per category.

With --peers, llguidance (default: refuses what it does not support; lenient: ignores it) and xgrammar
(needs `pip install --no-deps xgrammar apache-tvm-ffi`) compile the same schemas, and each peer's soundness
is the number of invalid example documents it accepts.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.validators import validator_for

from bench.common import REPO
from loraplex.grammar import GrammarCompiler, GrammarError, StructuredSpec
from loraplex.grammar.fuzz import random_walk

DEFAULT_CORPUS = REPO.parent / "shared" / "schemas" / "schemastore-dev"


def load_corpus(root: Path, limit: int | None, sample: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Our dev-set layout (index.jsonl naming schema and instance files), or MaskBench's (JSONSchemaBench's
    schemas with test documents: one `<category>---<name>.json` per schema, {"schema": .., "tests": [{"data":
    .., "valid": ..}]}). ``sample``: that many schemas drawn at random (seeded), for a long corpus."""
    cases = []
    if (root / "index.jsonl").exists():
        for line in (root / "index.jsonl").read_text().splitlines():
            entry = json.loads(line)
            schema = json.loads((root / entry["file"]).read_text())
            instances = [(json.loads((root / i["file"]).read_text()), i["valid"]) for i in entry.get("instances", [])]
            cases.append({"id": entry["id"], "category": root.name, "schema": schema, "instances": instances})
    else:
        for path in sorted(root.glob("*.json")):
            entry = json.loads(path.read_text())
            instances = [(t["data"], bool(t["valid"])) for t in entry.get("tests") or [] if "data" in t]
            category = path.stem.split("---")[0] if "---" in path.stem else re.sub(r"_?\d+$", "", path.stem)
            cases.append({"id": path.stem, "category": category, "schema": entry["schema"], "instances": instances})
    if sample is not None and sample < len(cases):
        cases = sorted(random.Random(seed).sample(cases, sample), key=lambda c: c["id"])
    return cases[:limit] if limit else cases


def validator(schema: Any) -> Any:
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def reason_of(message: str) -> str:
    """A short refusal category: the keyword or what kind of failure."""
    for pattern in (r"unsupported keyword '([^']+)'", r"unsupported format '([^']+)'", r"^(\w+) at /"):
        m = re.search(pattern, message)
        if m:
            return m.group(1)
    if "timed out" in message:
        return "compile timeout"
    if "invalid schema" in message:
        return "invalid schema"
    return message.split(":")[0][:40]


def key_order(schema: Any) -> dict[str, int]:
    """Property names in the order the schema declares them (the order we generate objects in)."""
    order: dict[str, int] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for name in node.get("properties", {}) if isinstance(node.get("properties"), dict) else {}:
                order.setdefault(name, len(order))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return order


def reorder(doc: Any, order: dict[str, int]) -> Any:
    if isinstance(doc, dict):
        keys = sorted(doc, key=lambda k: (order.get(k, len(order)), list(doc).index(k)))
        return {k: reorder(doc[k], order) for k in keys}
    if isinstance(doc, list):
        return [reorder(v, order) for v in doc]
    return doc


def accepts(grammar: Any, token_ids: list[int], errors: list[str] | None = None) -> bool:
    """Whether the grammar takes the document; a matcher that fails on the way (llguidance's lexer can run out
    of expressions on a long document) takes it not, and the failure is listed in ``errors``."""
    m = grammar.new_matcher()
    ok = all(m.accept_token(t) for t in token_ids) and m.is_accepting()
    if m.failure is not None and errors is not None:
        errors.append(m.failure[:120])
    return ok


def run_ours(
    cases: list[dict], tokenizer: Any, walks: int, budget: int, seed: int, progress: int = 0
) -> dict[str, Any]:
    compiler = GrammarCompiler(
        tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        vocab_size=len(tokenizer),
        upgrade_in_background=False,
        timeout_s=10.0,
    )
    rng = random.Random(seed)
    out: dict[str, Any] = {
        "status": Counter(),
        "refused": Counter(),
        "invalid": 0,
        "walks": 0,
        "unclosed": 0,
        "compile_ms": [],
        "mask_us": [],
        "recall": [0, 0],
        "invalid_examples": [0, 0],  # (accepted, seen): the peers' soundness measure, applied to us
        "example_errors": [],  # matcher failures while feeding an example document (counted as not accepted)
        "bad": [],
        "by_category": Counter(),  # accepted schemas per category
    }
    try:
        compiler.compile(StructuredSpec(regex="warm-up"))
        for done, case in enumerate(cases):
            if progress and done and done % progress == 0:
                print(f"  ... {done}/{len(cases)} schemas, {out['invalid']} invalid walks so far", flush=True)
            t = time.perf_counter()
            try:
                g = compiler.compile(StructuredSpec(json=case["schema"]))
            except GrammarError as e:
                out["status"]["refused"] += 1
                out["refused"][reason_of(str(e))] += 1
                continue
            finally:
                out["compile_ms"].append((time.perf_counter() - t) * 1e3)
            out["status"]["narrowed" if g.narrowing else "exact"] += 1
            out["by_category"][case["category"]] += 1
            check = validator(case["schema"])
            for _ in range(walks):  # a request below the grammar's min_tokens is refused: none walks below it
                walk = random_walk(g, compiler.vocab, rng, max(budget, g.min_tokens))
                out["walks"] += 1
                out["mask_us"] += [s * 1e6 for s in walk.mask_seconds]
                if walk.error is not None:
                    out["invalid"] += 1
                    out["bad"].append((case["id"], f"{g.backend}: {walk.error}"))
                    continue
                if not walk.closed:
                    out["unclosed"] += 1
                    continue
                try:
                    doc = json.loads(walk.text) if walk.text is not None else None
                    ok = walk.text is not None and check.is_valid(doc)
                except json.JSONDecodeError:
                    ok = False
                if not ok:
                    out["invalid"] += 1
                    out["bad"].append((case["id"], walk.text))
            order = key_order(case["schema"])
            for doc, valid in case["instances"]:
                counts = out["recall"] if valid else out["invalid_examples"]
                counts[1] += 1
                counts[0] += any(  # either key order, like the peers (for invalid documents: the worst case)
                    accepts(g, tokenizer.encode(text, add_special_tokens=False), out["example_errors"])
                    for text in {
                        json.dumps(form, ensure_ascii=False, separators=(",", ":"))
                        for form in (reorder(doc, order), doc)
                    }
                )
    finally:
        compiler.close()
    return out


def run_llguidance(cases: list[dict], tokenizer: Any, lenient: bool) -> dict[str, int]:
    from llguidance import LLMatcher, LLTokenizer
    from llguidance.hf import from_tokenizer

    ll_tok: LLTokenizer = from_tokenizer(tokenizer)
    out = Counter()
    for case in cases:
        try:
            grammar = LLMatcher.grammar_from_json_schema(
                case["schema"], overrides={"whitespace_flexible": False, "lenient": lenient}
            )
            m = LLMatcher(ll_tok, grammar, log_level=0)
            if m.is_error():
                raise ValueError(m.get_error())
        except Exception:
            out["refused"] += 1
            continue
        out["compiled"] += 1
        order = key_order(case["schema"])  # declaration order, the order the engines generate keys in
        for doc, valid in case["instances"]:
            ok = False
            for form in (doc, reorder(doc, order)):  # either key order (for invalid documents: the worst case)
                text = json.dumps(form, ensure_ascii=False, separators=(",", ":"))
                m = LLMatcher(ll_tok, grammar, log_level=0)
                ok = ok or (m.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and m.is_accepting())
            out["valid_accepted" if valid else "invalid_accepted"] += bool(ok)
            out["valid" if valid else "invalid"] += 1
    return dict(out)


def run_xgrammar(cases: list[dict], tokenizer: Any) -> dict[str, int] | None:
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info)
    out = Counter()
    for case in cases:
        try:
            compiled = compiler.compile_json_schema(json.dumps(case["schema"]), any_whitespace=False)
        except Exception:
            out["refused"] += 1
            continue
        out["compiled"] += 1
        order = key_order(case["schema"])  # declaration order, the order the engines generate keys in
        for doc, valid in case["instances"]:
            # xgrammar's JSON (any_whitespace=False) has json.dumps' default separators, ", " and ": "
            ok = False
            for form in (doc, reorder(doc, order)):  # either key order (for invalid documents: the worst case)
                text = json.dumps(form, ensure_ascii=False)
                m = xgr.GrammarMatcher(compiled)
                tokens = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
                ok = ok or all(m.accept_token(t) for t in tokens)
            out["valid_accepted" if valid else "invalid_accepted"] += bool(ok)
            out["valid" if valid else "invalid"] += 1
    return dict(out)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--walks", type=int, default=50, help="random walks per accepted schema")
    ap.add_argument("--budget", type=int, default=256, help="max tokens per walk")
    ap.add_argument("--limit", type=int, default=None, help="only the first N schemas")
    ap.add_argument("--sample", type=int, default=None, help="N schemas drawn at random (seeded by --seed)")
    ap.add_argument("--progress", type=int, default=0, help="print a line every N schemas (0: never)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peers", action="store_true", help="also llguidance (default, lenient) and xgrammar")
    ap.add_argument("--show-invalid", type=int, default=5, help="print up to N invalid walks")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from loraplex.engine.model.files import prepare_default_model

    tokenizer = AutoTokenizer.from_pretrained(str(prepare_default_model()))
    cases = load_corpus(args.corpus, args.limit, args.sample, args.seed)
    t = time.perf_counter()
    ours = run_ours(cases, tokenizer, args.walks, args.budget, args.seed, args.progress)
    n = len(cases)
    accepted = ours["status"]["exact"] + ours["status"]["narrowed"]
    print(f"{args.corpus.name}: {n} schemas; loraplex in {time.perf_counter() - t:.0f} s")
    print(
        f"accepted {accepted}/{n} ({accepted / n:.1%}): exact {ours['status']['exact']}, "
        f"narrowed {ours['status']['narrowed']}, refused {ours['status']['refused']}"
    )
    if ours["refused"]:
        print("refused by reason: " + ", ".join(f"{k} {v}" for k, v in ours["refused"].most_common()))
    categories = Counter(c["category"] for c in cases)
    if len(categories) > 1:
        print(
            "accepted by category: "
            + ", ".join(f"{name} {ours['by_category'][name]}/{n}" for name, n in sorted(categories.items()))
        )
    print(
        f"soundness: {ours['invalid']} invalid of {ours['walks']} random walks ({args.walks} per schema, budget "
        f"{args.budget} tokens); {ours['unclosed']} walks did not close within the budget"
    )
    for case_id, text in ours["bad"][: args.show_invalid]:
        print(f"  invalid walk in {case_id}: {text!r:.200}")
    hit, total = ours["recall"]
    print(f"recall: {hit}/{total} valid example documents accepted (keys in generation order)")
    bad_hit, bad_total = ours["invalid_examples"]
    print(f"invalid example documents accepted: {bad_hit}/{bad_total}")
    if ours["example_errors"]:
        errors = ours["example_errors"]
        print(f"matcher failures feeding example documents: {len(errors)} (first: {errors[0]})")
    cm = ours["compile_ms"]
    print(
        f"compile ms: p50 {pct(cm, 0.5):.1f}, p95 {pct(cm, 0.95):.1f}, max {max(cm):.0f}; mask us: p50 "
        f"{pct(ours['mask_us'], 0.5):.1f}, p99 {pct(ours['mask_us'], 0.99):.1f}"
    )
    if not args.peers:
        return
    rows = [
        [
            "loraplex",
            accepted,
            f"{bad_hit}/{bad_total} invalid examples accepted; {ours['invalid']} invalid random walks",
            f"{hit}/{total}",
        ]
    ]
    for label, result in (
        ("llguidance (default)", run_llguidance(cases, tokenizer, False)),
        ("llguidance (lenient)", run_llguidance(cases, tokenizer, True)),
        ("xgrammar", run_xgrammar(cases, tokenizer)),
    ):
        if result is None:
            print(f"{label}: not installed")
            continue
        rows.append(
            [
                label,
                result.get("compiled", 0),
                f"{result.get('invalid_accepted', 0)}/{result.get('invalid', 0)} invalid examples accepted",
                f"{result.get('valid_accepted', 0)}/{result.get('valid', 0)}",
            ]
        )
    print("| engine | schemas compiled | soundness | valid examples accepted |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print(f"(loraplex soundness: invalid random walks; median compile {statistics.median(cm):.1f} ms)")


if __name__ == "__main__":
    main()
