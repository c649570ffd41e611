"""loraplex.kernels: Triton kernels, each beside a torch reference with the same signature.

Dispatchers (``paged_attention``, ``lora_shrink``, ``lora_expand``, ``apply_token_bitmask``)
run Triton on CUDA tensors and torch elsewhere. Triton is imported only on the first
Triton call, so CPU-only use never needs it and tests can enable ``TRITON_INTERPRET``.
"""

from .attention import paged_attention, paged_attention_ref, paged_attention_triton, store_kv
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
    "apply_token_bitmask",
    "apply_token_bitmask_ref",
    "apply_token_bitmask_triton",
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
    "store_kv",
]
