"""Measure compile time and per-step mask time per backend on the schema suite.

    python -P -m bench.grammar_backends [--suite PATH] [--model DIR] [--backends auto,llguidance,outlines]

For each backend: compile every distinct schema of suite.jsonl (p50/p95/max, refusals, timeouts),
the latency of a cache hit, and for every valid instance the time of one fill_bitmask per token
of its compact JSON (p50/p99 over all sequence-steps) plus accept_token.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from loraplex.grammar import GrammarCompiler, GrammarError, StructuredSpec


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(backend: str, cases: list[dict], tokenizer, timeout_s: float) -> dict:
    compiler = GrammarCompiler(
        tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        vocab_size=len(tokenizer),
        backend=backend,
        upgrade_in_background=False,
        timeout_s=timeout_s,
    )
    try:
        compiler.compile(StructuredSpec(regex="warm-up"))  # start the worker outside the timings
        grammars: dict[str, object] = {}
        compile_ms, refused, timeouts, used = [], 0, 0, {"outlines": 0, "llguidance": 0}
        for case in cases:
            key = json.dumps(case["schema"], sort_keys=True)
            if key in grammars:
                continue
            t = time.perf_counter()
            try:
                g = compiler.compile(StructuredSpec(json=case["schema"]))
                used[g.backend] += 1
            except GrammarError as e:
                g = None
                refused += 1
                timeouts += "timed out" in str(e)
            compile_ms.append((time.perf_counter() - t) * 1e3)
            grammars[key] = g
        hit_us = []
        for case in cases[:200]:
            t = time.perf_counter()
            compiler.submit(StructuredSpec(json=case["schema"]))
            hit_us.append((time.perf_counter() - t) * 1e6)
        mask_us: dict[str, list[float]] = {"outlines": [], "llguidance": []}
        accept_us: list[float] = []
        words = (len(tokenizer) + 31) // 32
        out = torch.zeros(words, dtype=torch.int32)
        for case in cases:
            g = grammars[json.dumps(case["schema"], sort_keys=True)]
            if g is None or not case["valid"]:
                continue
            ids = tokenizer.encode(
                json.dumps(case["data"], ensure_ascii=False, separators=(",", ":")), add_special_tokens=False
            )
            m = g.new_matcher()  # type: ignore[attr-defined]  # (g: a compiled grammar of either backend)
            for step, tid in enumerate(ids):
                t = time.perf_counter()
                m.fill_bitmask(out, remaining_tokens=10_000 - step)
                mask_us[g.backend].append((time.perf_counter() - t) * 1e6)  # type: ignore[attr-defined]  # (as above)
                t = time.perf_counter()
                ok = m.accept_token(tid)
                accept_us.append((time.perf_counter() - t) * 1e6)
                if not ok:
                    break
        res = {
            "backend": backend,
            "schemas": len(compile_ms),
            "refused": refused,
            "timeouts": timeouts,
            "served_by": used,
            "compile_ms_p50": _pct(compile_ms, 0.5),
            "compile_ms_p95": _pct(compile_ms, 0.95),
            "compile_ms_max": max(compile_ms),
            "cache_hit_us_p50": _pct(hit_us, 0.5),
            "cache_hit_us_max": max(hit_us),
            "accept_us_p50": _pct(accept_us, 0.5),
        }
        for name, values in mask_us.items():
            if values:
                res.update(
                    {
                        f"{name}_mask_steps": len(values),
                        f"{name}_mask_us_p50": _pct(values, 0.5),
                        f"{name}_mask_us_p99": _pct(values, 0.99),
                        f"{name}_mask_us_max": max(values),
                    }
                )
        return res
    finally:
        compiler.close()


def main() -> None:
    from transformers import AutoTokenizer

    from loraplex.engine.model.files import default_model_dir

    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", type=Path, default=Path(__file__).resolve().parents[2] / "shared/schemas/suite.jsonl")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--backends", default="auto,llguidance")
    ap.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model or default_model_dir())
    cases = [json.loads(line) for line in args.suite.read_text().splitlines() if line.strip()]
    torch.set_num_threads(1)
    for backend in args.backends.split(","):
        res = run(backend, cases, tokenizer, args.timeout)
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()), flush=True)


if __name__ == "__main__":
    main()
