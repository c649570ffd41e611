"""Per-step costs of this engine, measured for bench/cluster_sim.py (written to bench/cluster_costs.json).

    .venv/bin/python -m bench.cluster_costs [--out bench/cluster_costs.json]

Runs Workload A's prompts (64 greedy output tokens, ignore_eos) through an LLMEngine on the bundled SmolLM2:
its first 32 requests at once over 8 adapters (the single-replica throughput the simulation must reproduce),
then 8 at once, then 32 on the base model, recording every step's tokens, sequences, distinct adapters and
seconds. A least-squares fit gives step seconds = c0 + c_token * tokens + c_seq * seqs + c_adapter *
distinct adapters. The adapter load cost is the median time of `add_adapter` (read, check, stack: what a
replica pays for an adapter it does not hold) over the adapters used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from bench.common import load_workload, machine_load, workload_dir
from bench.lora import DEFAULT_ADAPTERS, ensure_adapters

N_ADAPTERS = 8
N_REQUESTS = 32  # Workload A's first 32 at once (all 64 take minutes on a busy 2-core machine)
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


def measure() -> dict:
    from transformers import AutoTokenizer

    from loraplex.engine import EngineArgs, LLMEngine, prepare_default_model

    model_dir = prepare_default_model()
    wl = load_workload()
    reqs = wl.build_requests(AutoTokenizer.from_pretrained(str(model_dir)))
    prompts = [r["prompt_token_ids"] for r in reqs]
    dirs = ensure_adapters(workload_dir(), model_dir, DEFAULT_ADAPTERS, N_ADAPTERS)[:N_ADAPTERS]
    engine = LLMEngine(EngineArgs(max_loras=MAX_LORAS, max_num_seqs=MAX_NUM_SEQS))
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
    x = np.array([[1.0, t, s, a] for t, s, a, _ in steps])
    y = np.array([sec for *_, sec in steps])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    steps64, wall64, out64 = runs["main"]
    return {
        "step_seconds": {"c0": coef[0], "per_token": coef[1], "per_seq": coef[2], "per_adapter": coef[3]},
        "adapter_load_s": statistics.median(load_s),
        "engine": {"max_loras": MAX_LORAS, "max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": 2048},
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
        "command": "python -m bench.cluster_costs",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("cluster_costs.json"))
    args = ap.parse_args()
    costs = measure()
    args.out.write_text(json.dumps(costs, indent=1) + "\n")
    print(json.dumps({k: v for k, v in costs.items() if k != "workload"}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
