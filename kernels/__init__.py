"""loraplex.kernels: Triton kernels for CUDA and C kernels for the CPU, each beside a torch reference
with the same signature.

Dispatchers (``paged_attention``, ``lora_shrink``, ``lora_expand``, ``apply_token_bitmask``)
run Triton on CUDA tensors and torch elsewhere. Triton is imported only on the first
Triton call, so CPU-only use never needs it and tests can enable ``TRITON_INTERPRET``.
The C kernels (``csrc/``: decode attention, prefill-chunk attention, the multi-LoRA delta, residual
add + RMSNorm, rotary, the SiLU-gated product) serve float32 CPU tensors; they are compiled on first
use (``cpu_build``), and the engine falls back to the torch paths without a compiler.
"""

from .attention import paged_attention, paged_attention_ref, paged_attention_triton, store_kv
from .cpu_decode_attention import paged_decode_attention, paged_decode_attention_c, paged_decode_attention_ref
from .cpu_lora import lora_apply_c, lora_apply_ref
from .cpu_prefill_attention import paged_prefill_attention_c, paged_prefill_attention_ref
from .elementwise import (
    add_rms_norm,
    add_rms_norm_c,
    add_rms_norm_ref,
    rope_,
    rope_c,
    rope_ref,
    silu_mul,
    silu_mul_c,
    silu_mul_ref,
)
from .bitmask import apply_token_bitmask, apply_token_bitmask_ref, apply_token_bitmask_triton
from .lora import (
    LoRABatchMapping,
    lora_expand,
    lora_expand_grouped,
    lora_expand_ref,
    lora_expand_triton,
    lora_shrink,
    lora_shrink_grouped,
    lora_shrink_ref,
    lora_shrink_triton,
)

__all__ = [
    "LoRABatchMapping",
    "add_rms_norm",
    "add_rms_norm_c",
    "add_rms_norm_ref",
    "apply_token_bitmask",
    "apply_token_bitmask_ref",
    "apply_token_bitmask_triton",
    "lora_apply_c",
    "lora_apply_ref",
    "lora_expand",
    "lora_expand_grouped",
    "lora_expand_ref",
    "lora_expand_triton",
    "lora_shrink",
    "lora_shrink_grouped",
    "lora_shrink_ref",
    "lora_shrink_triton",
    "paged_attention",
    "paged_attention_ref",
    "paged_attention_triton",
    "paged_decode_attention",
    "paged_decode_attention_c",
    "paged_decode_attention_ref",
    "paged_prefill_attention_c",
    "paged_prefill_attention_ref",
    "rope_",
    "rope_c",
    "rope_ref",
    "silu_mul",
    "silu_mul_c",
    "silu_mul_ref",
    "store_kv",
]
