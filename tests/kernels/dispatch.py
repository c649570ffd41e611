"""Per-call dispatchers for the kernel tests: pick an implementation from the tensors a call gets.

The engine never dispatches per call (``kernels.backend`` picks one set of kernels when it starts), so these
live with the tests that run one test body on CPU and GPU tensors alike: Triton for CUDA tensors, the C kernel
for the CPU tensors it serves, the torch reference otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loraplex.kernels.attention import PagedAttentionInputs, paged_attention_ref, paged_attention_triton
from loraplex.kernels.cpu_decode_attention import (
    C_DTYPES,
    cpu_decode_kernel_available,
    paged_decode_attention_c,
    paged_decode_attention_ref,
)
from loraplex.kernels.elementwise import (
    add_rms_norm_c,
    add_rms_norm_ref,
    c_ready,
    rope_c,
    rope_ref,
    silu_mul_c,
    silu_mul_ref,
)
from loraplex.kernels.lora import (
    LoRABatchMapping,
    lora_expand_grouped,
    lora_expand_triton,
    lora_shrink_grouped,
    lora_shrink_triton,
)


def paged_attention(inputs: PagedAttentionInputs) -> torch.Tensor:
    """Paged attention: Triton on CUDA, the torch reference elsewhere."""
    impl = paged_attention_triton if inputs.q.is_cuda else paged_attention_ref
    return impl(inputs)


def paged_decode_attention(inputs: PagedAttentionInputs) -> torch.Tensor:
    """The C kernel for float32 or bfloat16 CPU tensors when it is built, the torch reference otherwise."""
    q = inputs.q
    if (
        q.device.type == "cpu"
        and q.dtype == inputs.k_cache.dtype == inputs.v_cache.dtype
        and q.dtype in C_DTYPES
        and q.shape[-1] % 8 == 0
        and cpu_decode_kernel_available()
    ):
        return paged_decode_attention_c(inputs)
    return paged_decode_attention_ref(inputs)


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRABatchMapping) -> torch.Tensor:
    """Shrink: Triton on CUDA, the grouped torch path elsewhere."""
    impl = lora_shrink_triton if x.is_cuda else lora_shrink_grouped
    return impl(x, lora_a, mapping)


def lora_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    mapping: LoRABatchMapping,
    slice_offsets: Sequence[int],
) -> torch.Tensor:
    """Expand (in place on ``y``): Triton on CUDA, the grouped torch path elsewhere."""
    impl = lora_expand_triton if y.is_cuda else lora_expand_grouped
    return impl(y, buf, lora_b, mapping, slice_offsets)


def add_rms_norm(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The C kernel where it serves these tensors (``residual`` contiguous: it is updated in place), else torch."""
    tensors = (residual, weight) if delta is None else (residual, weight, delta)
    if residual.is_contiguous() and c_ready(*tensors):
        return add_rms_norm_c(residual, delta, weight, eps)
    return add_rms_norm_ref(residual, delta, weight, eps)


def rope_(
    qkv: torch.Tensor,
    heads: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    check_positions: bool = True,
) -> None:
    """The C kernel where it serves these tensors (unit stride along a row), else torch."""
    if qkv.stride(1) == 1 and c_ready(qkv, cos, sin):
        rope_c(qkv, heads, head_dim, cos, sin, positions, check_positions)
    else:
        rope_ref(qkv, heads, head_dim, cos, sin, positions)


def silu_mul(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    """The C kernel where it serves this tensor, else torch."""
    if c_ready(gate_up):
        return silu_mul_c(gate_up, inter)
    return silu_mul_ref(gate_up, inter)
