"""The engine's projections in float32 against bfloat16 on the CPU: ``python -P -m bench.linear_dtypes``.

Times ``engine.model.linear.Linear`` (oneDNN's packed linear where it works, else F.linear) and plain ``F.linear``
on SmolLM2-135M's projection shapes, for 1 row (a lone decode: a GEMV), 8 and 64 rows (decode batches) and
512 rows (a prefill chunk), in both dtypes, and prints the bfloat16 / float32 time ratio (below 1: bfloat16
is faster). Medians of repeated runs, so a busy shared machine disturbs them less; the machine's load is
printed beside them. On a saturated machine two OpenMP threads wait for each other at every barrier (every
call then takes a scheduler quantum, ~16 ms): ``--threads 1`` measures the kernels instead.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench.common import machine_load, print_table
from loraplex.engine.model.linear import Linear, onednn_linear_available
from loraplex.kernels.cpu_features import native_bf16_feature

SHAPES = {  # name: (out_features, in_features) of SmolLM2-135M
    "qkv": (960, 576),
    "o": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "lm_head": (49152, 576),
}
ROWS = (1, 8, 64, 512)


def median_us(fn: Callable[[], object], budget_s: float = 0.3) -> float:
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-6)
    repeats = max(5, min(200, int(budget_s / once)))
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's; 1 on a busy machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"native bf16: {native_bf16_feature() or 'none'}; oneDNN packed linear float32 "
        f"{onednn_linear_available(torch.float32)}, bfloat16 {onednn_linear_available(torch.bfloat16)}; "
        f"{torch.get_num_threads()} threads; {machine_load()}"
    )
    g = torch.Generator().manual_seed(0)
    rows_out = []
    for name, (out_f, in_f) in SHAPES.items():
        w32 = torch.randn(out_f, in_f, generator=g) * in_f**-0.5
        w16 = w32.to(torch.bfloat16)
        lin32, lin16 = Linear(w32), Linear(w16)
        for n in ROWS:
            x32 = torch.randn(n, in_f, generator=g)
            x16 = x32.to(torch.bfloat16)
            t32 = median_us(functools.partial(lin32, x32))
            t16 = median_us(functools.partial(lin16, x16))
            f32 = median_us(functools.partial(F.linear, x32, w32))
            f16 = median_us(functools.partial(F.linear, x16, w16))
            rows_out.append([f"{name} {out_f}x{in_f}", n, t32, t16, t16 / t32, f32, f16, f16 / f32])
    print_table(
        [
            "projection",
            "rows",
            "Linear f32 us",
            "Linear bf16 us",
            "bf16/f32",
            "F.linear f32 us",
            "F.linear bf16 us",
            "bf16/f32",
        ],
        rows_out,
    )


if __name__ == "__main__":
    main()
