"""Per-step costs of this engine, measured for bench/cluster_sim.py (written to bench/cluster_costs.json).

    .venv/bin/python -P -m bench.cluster_costs [--out bench/cluster_costs.json] [--refit]

Runs Workload A's prompts (64 greedy output tokens, ignore_eos) through an LLMEngine on the bundled
SmolLM2 on one thread: its first 16 requests at once over 8 adapters (the single-replica throughput the
simulation must reproduce), then 4 at once, then 16 on the base model, recording every step's tokens,
sequences, distinct adapters and seconds. Least-squares fits (`fit`) give a decode step's seconds from its
sequences and distinct adapters, and a step with prompt tokens' seconds from its tokens and adapters. The
adapter load cost is the median time of `add_adapter` (read, check, stack: what a replica pays for an
adapter it does not hold) over the adapters used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import load_workload, machine_load, workload_dir
from bench.lora import DEFAULT_ADAPTERS, ensure_adapters

N_ADAPTERS = 8
N_REQUESTS = 16  # Workload A's first 16 at once (all 64 take many minutes on a busy 2-core machine)
THREADS = 1  # one core per simulated replica: steady step times on a shared machine (no OpenMP barriers)
MAX_LORAS = 8
MAX_NUM_SEQS = 64


def _run(engine, prompts: list[list[int]], refs: list) -> tuple[list[tuple[int, int, int, float]], float, int]:
    """Every request at once; (tokens, seqs, distinct adapters, seconds) of each step, wall seconds, tokens out."""
    from loraplex.engine import SamplingParams

    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(p, params, adapter=refs[i % len(refs)] if refs else None)
    steps, out_tokens = [], 0
    t0 = time.perf_counter()
    while engine.has_unfinished():
        adapters = {s.adapter_hash for s in engine.scheduler.running if s.adapter_hash}
        before = engine.last_step
        outs = engine.step()
        out_tokens += sum(len(o.new_token_ids) for o in outs)
        last = engine.last_step
        if last is not before:  # a step that ran a batch
            steps.append((last.num_tokens, last.num_seqs, len(adapters), last.seconds))
    return steps, time.perf_counter() - t0, out_tokens


def _nonnegative_fit(rows: list[list[float]], y: list[float]) -> list[float]:
    """Least squares with no negative coefficient (a step never gets cheaper with more work, and never costs
    less than nothing): a feature whose coefficient comes out negative (noise, or collinear with another) is
    dropped and the rest fitted again. Column 0 is the intercept."""
    x, yv = np.array(rows), np.array(y)
    keep = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], yv, rcond=None)
        negative = [k for k, c in zip(keep, coef) if c < 0]
        if not negative:
            full = [0.0] * x.shape[1]
            for k, c in zip(keep, coef):
                full[k] = float(c)
            return full
        keep.remove(negative[0])


def fit(steps: list[tuple[int, int, int, float]]) -> dict[str, dict[str, float]]:
    """Two step-time models: decode-only steps (one token per sequence) on (1, seqs, distinct adapters), and
    steps with prompt tokens on (1, tokens, distinct adapters): a prompt token costs far less than a decode
    sequence (batched matmuls), so one shared per-token slope fits neither."""
    decode = [s for s in steps if s[0] == s[1]]
    prefill = [s for s in steps if s[0] > s[1]]
    d = _nonnegative_fit([[1.0, n, a] for _, n, a, _ in decode], [sec for *_, sec in decode])
    p = _nonnegative_fit([[1.0, t, a] for t, _, a, _ in prefill], [sec for *_, sec in prefill])
    return {
        "decode": {"c0": d[0], "per_seq": d[1], "per_adapter": d[2]},
        "prefill": {"c0": p[0], "per_token": p[1], "per_adapter": p[2]},
    }


def measure() -> dict:
    from transformers import AutoTokenizer

    from loraplex.engine import EngineArgs, LLMEngine, prepare_default_model

    model_dir = prepare_default_model()
    wl = load_workload()
    reqs = wl.build_requests(AutoTokenizer.from_pretrained(str(model_dir)))
    prompts = [r["prompt_token_ids"] for r in reqs]
    dirs = ensure_adapters(workload_dir(), model_dir, DEFAULT_ADAPTERS, N_ADAPTERS)[:N_ADAPTERS]
    torch.set_num_threads(THREADS)
    # no prefix caching: the warm run repeats prompts, and the simulation computes every prompt token
    engine = LLMEngine(EngineArgs(max_loras=MAX_LORAS, max_num_seqs=MAX_NUM_SEQS, enable_prefix_caching=False))
    load_s = []
    refs = []
    for d in dirs:
        t = time.perf_counter()
        refs.append(engine.add_adapter(str(d)))
        load_s.append(time.perf_counter() - t)
    _run(engine, prompts[:8], refs)  # warm: first-use costs are not per-step costs
    runs = {}
    for name, n, with_adapters in (
        ("main", N_REQUESTS, True),
        ("small", N_REQUESTS // 4, True),
        ("base", N_REQUESTS, False),
    ):
        runs[name] = _run(engine, prompts[:n], refs if with_adapters else [])
        print(f"  {name}: {n} requests in {runs[name][1]:.1f}s", flush=True)
    engine.close()
    steps = [s for run in runs.values() for s in run[0]]
    steps64, wall64, out64 = runs["main"]
    return {
        "step_seconds": fit(steps),
        "adapter_load_s": statistics.median(load_s),
        "engine": {
            "max_loras": MAX_LORAS,
            "max_num_seqs": MAX_NUM_SEQS,
            "max_num_batched_tokens": 2048,
            "threads": THREADS,
        },
        "workload": {
            "prompt_tokens": [len(p) for p in prompts[:N_REQUESTS]],
            "output_tokens": 64,
            "adapters": N_ADAPTERS,
        },
        "measured": {
            "requests": N_REQUESTS,
            "seconds": wall64,
            "requests_per_s": N_REQUESTS / wall64,
            "output_tokens_per_s": out64 / wall64,
            "steps": len(steps64),
        },
        "machine": {"cpus": os.cpu_count(), "load": machine_load()},
        "command": "python -P -m bench.cluster_costs",
        "steps": [list(step) for step in steps],  # (tokens, seqs, distinct adapters, seconds): refit at will
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("cluster_costs.json"))
    ap.add_argument("--refit", action="store_true", help="fit the step models again from the file's steps")
    args = ap.parse_args()
    if args.refit:
        costs = json.loads(args.out.read_text())
        costs["step_seconds"] = fit([tuple(s) for s in costs["steps"]])
    else:
        costs = measure()
    args.out.write_text(json.dumps(costs, indent=1) + "\n")
    print(json.dumps({k: v for k, v in costs.items() if k not in ("workload", "steps")}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
