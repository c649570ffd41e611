"""loraplex.kernels: Triton kernels for CUDA and C kernels for the CPU, each beside a torch reference
with the same signature.

The engine picks its kernels once (``backend.select_backend``: triton, cpu-c or torch) and builds one
attention plan per step (``attention_plan``). The package exports that choice and the dispatchers, which
pick an implementation per call from the tensors they get: Triton on CUDA, the C kernel for float32 CPU
tensors where one exists, torch otherwise. The implementations themselves (``*_ref``, ``*_triton``,
``*_c``, ``*_grouped``) live in their modules:

* ``attention``: paged attention over mixed prefill chunks and decodes (torch, Triton) and the KV-cache write;
* ``cpu_decode_attention``, ``cpu_prefill_attention``: C attention over the paged cache;
* ``lora``, ``lora_mapping``: batched multi-LoRA shrink / expand (torch per-token and grouped, Triton SGMV);
  ``cpu_lora``: shrink + expand in one C call;
* ``elementwise``: residual add + RMSNorm, rotary, the SiLU-gated product (torch, C);
* ``bitmask``: structured-output token masks applied to logits (torch, Triton);
* ``cpu_build``: compiles the C kernels once per machine and loads them.

Triton is imported only on the first Triton call, so CPU-only use never needs it and tests can enable
``TRITON_INTERPRET``.
"""

from .attention import paged_attention, store_kv
from .attention_plan import AttentionMetadata, attention
from .backend import ComputeBackend, select_backend
from .bitmask import apply_token_bitmask
from .cpu_decode_attention import paged_decode_attention
from .elementwise import add_rms_norm, rope_, silu_mul
from .lora import lora_expand, lora_shrink
from .lora_mapping import LoRABatchMapping

__all__ = [
    "AttentionMetadata",
    "ComputeBackend",
    "LoRABatchMapping",
    "add_rms_norm",
    "apply_token_bitmask",
    "attention",
    "lora_expand",
    "lora_shrink",
    "paged_attention",
    "paged_decode_attention",
    "rope_",
    "select_backend",
    "silu_mul",
    "store_kv",
]
