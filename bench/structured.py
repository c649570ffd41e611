"""Structured output in the batch: Workload A with 0%, 50% and 100% of requests JSON-schema constrained.

    .venv/bin/python -P -m bench.structured [--skip-compile]

Each run is the core benchmark's batch (64 requests, greedy, max_tokens 64; unconstrained rows use
ignore_eos) with the workload's extraction SCHEMA on a share of the requests. Constrained outputs end
with their JSON, so the 100% run has fewer output tokens and more of its time is prefill; a last run,
"0% (matched lengths)", repeats the unconstrained batch with each request's max_tokens set to the length
its constrained output had, so the two runs do the same model work and their ratio is the cost of the
constraint itself. Prints tokens/s of each run, the share of constrained outputs that validate, the mask
time per constrained sequence-step (p50/p99, measured inside the engine) and compile times over
../shared/schemas (bench.grammar_backends).
"""

from __future__ import annotations

import argparse
import json
import time

from bench.common import compile_settled, load_workload, machine_load, print_table, workload_dir
from loraplex.engine import LLM, EngineProbe, SamplingParams
from loraplex.grammar.spec import StructuredSpec


def pct(xs, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skip-compile", action="store_true", help="skip the schema-suite compile timings")
    args = ap.parse_args()
    wl = load_workload()
    llm = LLM(max_num_batched_tokens=2048, max_num_seqs=128)
    reqs = wl.build_requests(llm.tokenizer)
    prompts = [r["prompt_token_ids"] for r in reqs]
    spec = StructuredSpec(json=wl.SCHEMA)
    compile_settled(llm, spec)  # outside the timings (a cache hit afterwards)
    llm.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0.0))
    print(f"Workload A, {len(prompts)} requests; {machine_load()}")
    rows = []
    constrained_lens: list[int] = []
    for share in (0.0, 0.5, 1.0, None):
        n_constrained = round(share * len(prompts)) if share is not None else 0
        if share is None:  # the unconstrained batch, each output as long as its constrained counterpart
            params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in constrained_lens]
        else:
            params = [
                SamplingParams(max_tokens=wl.MAX_TOKENS, temperature=0.0, structured=spec)
                if i < n_constrained
                else SamplingParams(max_tokens=wl.MAX_TOKENS, temperature=0.0, ignore_eos=True)
                for i in range(len(prompts))
            ]
        llm.engine.block_manager.reset_prefix_cache()
        probe = llm.engine.probe = EngineProbe(time_structured=True)
        t = time.perf_counter()
        outs = llm.generate(prompts, params)
        dt = time.perf_counter() - t
        n_out = sum(len(o.token_ids) for o in outs)
        n_in = sum(len(p) for p in prompts)
        valid = sum(wl.validate(o.text)[1] for o in outs[:n_constrained])
        masks = probe.mask_seconds
        checks = probe.check_seconds  # llguidance rows only: budget check per sampled token
        if share == 1.0:
            constrained_lens = [len(o.token_ids) for o in outs]
        label = "0% (matched lengths)" if share is None else f"{share:.0%} constrained"
        rows.append(
            [
                label,
                n_out / dt,
                (n_in + n_out) / dt,
                f"{valid}/{n_constrained}",
                pct(masks, 0.5) * 1e6,
                pct(masks, 0.99) * 1e6,
                len(checks),
                pct(checks, 0.5) * 1e6,
                f"{dt:.1f}",
            ]
        )
    print_table(
        [
            "run",
            "output tok/s",
            "total tok/s",
            "valid",
            "mask p50 us",
            "mask p99 us",
            "budget checks",
            "check p50 us",
            "seconds",
        ],
        rows,
    )
    print(
        f"100% / 0% constrained: output {rows[2][1] / rows[0][1]:.2f}x, total {rows[2][2] / rows[0][2]:.2f}x; "
        f"100% / matched-length 0%: output {rows[2][1] / rows[3][1]:.2f}x, total {rows[2][2] / rows[3][2]:.2f}x"
    )
    if not args.skip_compile:
        from transformers import AutoTokenizer

        from bench.grammar_backends import run

        suite = workload_dir().parent / "schemas" / "suite.jsonl"
        if suite.is_file():
            cases = [json.loads(line) for line in suite.read_text().splitlines() if line.strip()]
            res = run("auto", cases, AutoTokenizer.from_pretrained(str(llm.engine.model_dir)), 10.0)
            print(
                f"compile over {suite}: {res['schemas']} schemas, p50 {res['compile_ms_p50']:.1f} ms, "
                f"p95 {res['compile_ms_p95']:.1f} ms, max {res['compile_ms_max']:.1f} ms, refused {res['refused']}; "
                f"cache hit p50 {res['cache_hit_us_p50']:.1f} us"
            )


if __name__ == "__main__":
    main()
