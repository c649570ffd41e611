"""GGUF-quantized weights on the CPU: ``python -P -m bench.quant_matmul``.

Times the C kernel (kernels/quant.py ``quant_matmul_c``) per block format on SmolLM2-135M's projection shapes, for 1
row (a lone decode), 8 and 64 rows (decode batches), 256 and 512 (prefill chunks; the LM head only up to 64: prefill
asks it for the last position of each sequence), against ``F.linear`` in float32 on the de-quantized weight (the
float path the engine runs otherwise), and prints the speed-up (float time / quantized time) and the rate at which
each reads its weight (GB/s of the weight's bytes: the quantized blocks for the kernel, float32 for F.linear). "int8
x": the same with ``int8_activations=True`` (x quantized to int8 per group of 32, integer products: llama.cpp's way;
from 8 rows on AVX-512 VNNI its integer GEMM, elsewhere the row kernels, which read each weight row once per 4 rows
of x). "interleaved": the same products on the weight laid out by ``interleave_x16`` (Q8_0, Q4_0, Q4_1 on AVX-512
VNNI: what the engine multiplies with int8 activations there). The calls being compared alternate (so that both see
the same load) and each time is a median; with ``--threads 1`` it is the thread's CPU time, which a busy machine's
other processes do not inflate (their cache traffic still can), else wall-clock time. The machine's load is printed
beside them. K-quant formats need k to be a multiple of 256 and are left out of the k=576 shapes (GGUF files store
those tensors in another format). ``--threads 1`` measures one core (on a busy machine two OpenMP threads wait for
each other).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from bench.common import machine_load, print_table
from loraplex.kernels.quant import (
    QUANT_TYPES,
    QuantWeight,
    block_shape,
    cpu_quant_kernel_available,
    dequantize_ref,
    interleave_x16,
    interleaved_kernel_available,
    quant_matmul_c,
    row_bytes,
)

SHAPES = {  # name: (k in, n out, formats) of SmolLM2-135M
    "gate_up": (576, 1536, QUANT_TYPES),
    "down": (1536, 576, QUANT_TYPES),
    "lm_head": (576, 49152, ("Q8_0",)),
}
ROWS = (1, 8, 64, 256, 512)
LM_HEAD_MAX_ROWS = 64
INT8_MAX_ROWS = 512
_F16_SCALES = {  # float16 fields
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q4_K": (0, 2),
    "Q6_K": (208,),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
}


def random_blocks(qtype: str, n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Random blocks with small finite float16 scales (the kernel's speed does not depend on the values)."""
    elems, nbytes = block_shape(qtype)
    blocks = torch.randint(0, 256, (n * (k // elems), nbytes), dtype=torch.uint8, generator=g)
    for offset in _F16_SCALES[qtype]:
        scale = (torch.rand(blocks.shape[0], 1, generator=g) * 0.01).to(torch.float16)
        blocks[:, offset : offset + 2] = scale.view(torch.uint8)
    return blocks.reshape(n, row_bytes(qtype, k))


def paired_us(fns: Sequence[Callable[[], object]], budget_s: float, clock: Callable[[], float]) -> list[float]:
    """Median microseconds of each of ``fns``, called in turn (A B A B ...) for about ``budget_s`` each."""
    for fn in fns:
        fn()
    start = clock()
    for fn in fns:
        fn()
    once = max(clock() - start, 1e-6)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(max(5, min(300, int(budget_s * len(fns) / once)))):
        for fn, out in zip(fns, samples, strict=True):
            t = clock()
            fn()
            out.append(clock() - t)
    return [statistics.median(t) * 1e6 for t in samples]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's; 1 on a busy machine)")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds of repeats per measurement")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="rows of x, comma-separated")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not cpu_quant_kernel_available():
        raise SystemExit("the C kernels are not available here (no C compiler, or LORAPLEX_CPU_KERNELS=0)")
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    print(f"{torch.get_num_threads()} threads, {clock.__name__}; {machine_load()}")
    g = torch.Generator().manual_seed(0)
    rows_out = []
    for name, (k, n, formats) in SHAPES.items():
        for qtype in formats:
            if k % block_shape(qtype)[0]:
                continue
            blocks = random_blocks(qtype, n, k, g)
            w = dequantize_ref(blocks, qtype, k)
            for m in (int(r) for r in args.rows.split(",")):
                if name == "lm_head" and m > LM_HEAD_MAX_ROWS:
                    continue
                x = torch.randn(m, k, generator=g)
                fns = [functools.partial(F.linear, x, w), functools.partial(quant_matmul_c, x, blocks, qtype, k)]
                if m <= INT8_MAX_ROWS:
                    fns.append(functools.partial(quant_matmul_c, x, blocks, qtype, k, int8_activations=True))
                    if interleaved_kernel_available(qtype, n):
                        mixed = QuantWeight(interleave_x16(blocks, qtype, k), qtype, k, True, interleaved=True)
                        fns.append(functools.partial(mixed, x))
                f_us, q_us, *i8_us = paired_us(fns, args.budget, clock)
                rows_out.append(
                    [
                        f"{name} k={k} n={n}",
                        qtype,
                        m,
                        q_us / 1e3,
                        blocks.numel() / q_us / 1e3,
                        f_us / 1e3,
                        w.numel() * 4 / f_us / 1e3,
                        f_us / q_us,
                        *([i8_us[0] / 1e3, f_us / i8_us[0]] if i8_us else ["-", "-"]),
                        *([i8_us[1] / 1e3, f_us / i8_us[1]] if len(i8_us) > 1 else ["-", "-"]),
                    ]
                )
    headers = ["shape", "format", "rows", "quant ms", "quant GB/s", "F.linear f32 ms", "f32 GB/s", "speed-up"]
    print_table([*headers, "int8 x ms", "int8 x speed-up", "interleaved ms", "interleaved speed-up"], rows_out)


if __name__ == "__main__":
    main()
