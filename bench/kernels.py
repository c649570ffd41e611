"""CPU cost of the kernels on SmolLM2-135M shapes: ``python -P -m bench.kernels``.

Prints, per LoRA projection group, the base matmul of the projection versus the grouped torch
multi-LoRA path (shrink + expand), the C kernel (where it builds) and the per-token reference, for a
decode step of 64 tokens over 16 active adapters of rank 16 and for a 256-token prefill chunk plus 15
decodes of other adapters; then one decode step's paged attention, torch reference versus C kernel.
Timings are medians, so a busy shared machine disturbs them less.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from math import nan

import torch
import torch.nn.functional as F

from loraplex.kernels.attention import PagedAttentionInputs, paged_attention_ref
from loraplex.kernels.cpu_decode_attention import cpu_decode_kernel_available, paged_decode_attention_c
from loraplex.kernels.cpu_lora import cpu_lora_kernel_available, lora_apply_c
from loraplex.kernels.lora import (
    LoRABatchMapping,
    lora_expand_grouped,
    lora_expand_ref,
    lora_shrink_grouped,
    lora_shrink_ref,
)

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 9, 3, 64
GROUPS = {  # name: (in_features, slice widths)
    "qkv": (HIDDEN, (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM)),
    "gate_up": (HIDDEN, (INTERMEDIATE, INTERMEDIATE)),
    "o": (HIDDEN, (HIDDEN,)),
    "down": (INTERMEDIATE, (HIDDEN,)),
}


def median_us(fn: Callable[[], object], repeats: int = 30, inner: int = 10) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner * 1e6)
    return statistics.median(samples)


def _time_group(
    mapping: LoRABatchMapping, in_features: int, widths: tuple[int, ...], num_slots: int, rank: int, has_c: bool
) -> tuple[float, float, float, float]:
    """Microseconds of one projection group: base matmul, grouped torch LoRA, C LoRA, per-token reference."""
    num_tokens = mapping.num_tokens
    out_total = sum(widths)
    offsets = tuple(int(v) for v in torch.tensor((0, *widths)).cumsum(0))
    x = torch.randn(num_tokens, in_features)
    weight = torch.randn(out_total, in_features)
    lora_a = torch.randn(num_slots, len(widths), rank, in_features)
    lora_b = torch.randn(num_slots, out_total, rank)
    y = torch.zeros(num_tokens, out_total)
    lora_bt = lora_b.transpose(1, 2).contiguous()
    ranks = torch.full((num_slots,), rank, dtype=torch.int32)

    def grouped() -> None:
        lora_expand_grouped(y, lora_shrink_grouped(x, lora_a, mapping), lora_b, mapping, offsets)

    def ref() -> None:
        lora_expand_ref(y, lora_shrink_ref(x, lora_a, mapping), lora_b, mapping, offsets)

    base_us, grouped_us = median_us(lambda: F.linear(x, weight)), median_us(grouped)
    c_us = median_us(lambda: lora_apply_c(x, y, lora_a, lora_bt, mapping, offsets, ranks)) if has_c else nan
    return base_us, grouped_us, c_us, median_us(ref, repeats=5, inner=3)


def bench_lora(indices: torch.Tensor, title: str, num_slots: int = 16, rank: int = 16) -> None:
    num_tokens = indices.shape[0]
    mapping = LoRABatchMapping.build(indices, num_slots)
    build_us = median_us(lambda: LoRABatchMapping.build(indices, num_slots).grouped_plan)
    plan = mapping.grouped_plan
    print(
        f"\n{title}: T={num_tokens}, {mapping.num_active} active slots, rank {rank}, "
        f"torch threads={torch.get_num_threads()}"
    )
    print(
        f"CPU plan: {plan.num_entries} entries x {plan.chunk_size} rows, "
        f"weights {'viewed' if plan.entry_slots is None else 'gathered'}"
    )
    print(f"mapping build + CPU plan (once per step): {build_us:8.1f} us")
    has_c = cpu_lora_kernel_available()
    print(f"{'group':8s} {'base us':>9s} {'grouped us':>11s} {'ratio':>6s} {'C us':>9s} {'ratio':>6s} {'ref us':>9s}")
    totals = [0.0, 0.0, 0.0]
    for name, (in_features, widths) in GROUPS.items():
        base_us, grouped_us, c_us, ref_us = _time_group(mapping, in_features, widths, num_slots, rank, has_c)
        totals[0] += base_us
        totals[1] += grouped_us
        totals[2] += c_us
        print(
            f"{name:8s} {base_us:9.1f} {grouped_us:11.1f} {grouped_us / base_us:6.2f} {c_us:9.1f} "
            f"{c_us / base_us:6.2f} {ref_us:9.1f}"
        )
    print(
        f"{'layer':8s} {totals[0]:9.1f} {totals[1]:11.1f} {totals[1] / totals[0]:6.2f} {totals[2]:9.1f} "
        f"{totals[2] / totals[0]:6.2f}"
    )
    print(
        f"30 layers: base {30 * totals[0] / 1e3:.1f} ms, LoRA grouped {30 * totals[1] / 1e3:.1f} ms, "
        f"C {30 * totals[2] / 1e3:.1f} ms per step"
    )


def bench_attention(num_seqs: int = 32, context: int = 512, block_size: int = 16) -> None:
    blocks_per_seq = context // block_size
    k_cache = torch.randn(num_seqs * blocks_per_seq, block_size, KV_HEADS, HEAD_DIM)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_seqs * blocks_per_seq).view(num_seqs, blocks_per_seq).to(torch.int32)
    q = torch.randn(num_seqs, HEADS, HEAD_DIM)
    seq_lens = torch.full((num_seqs,), context, dtype=torch.int32)
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32)
    scale = HEAD_DIM**-0.5
    us = median_us(
        lambda: paged_attention_ref(PagedAttentionInputs(q, k_cache, v_cache, tables, seq_lens, qsl, scale)),
        repeats=10,
        inner=3,
    )
    c_us = (
        median_us(
            lambda: paged_decode_attention_c(PagedAttentionInputs(q, k_cache, v_cache, tables, seq_lens, None, scale))
        )
        if cpu_decode_kernel_available()
        else nan
    )
    print(
        f"paged attention decode: {num_seqs} seqs x {context} context: torch {us:8.1f} us, C {c_us:8.1f} us per "
        f"layer (torch / C = {us / c_us:.1f}x)"
    )


if __name__ == "__main__":
    bench_lora(torch.arange(64) % 16, "decode")
    bench_lora(torch.cat([torch.zeros(256, dtype=torch.long), torch.arange(1, 16)]), "prefill chunk + decodes")
    bench_attention()
