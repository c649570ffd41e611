"""loraplex.kernels: Triton kernels for CUDA and C kernels for the CPU, each beside a torch reference
with the same signature.

The engine picks its kernels once (``backend.select_backend``: triton, cpu-c or torch) and builds one
attention plan per step (``attention_plan``); nothing dispatches per call. The package exports what the
engine uses: that choice (``ComputeBackend``, ``select_backend``), the per-step attention
(``AttentionMetadata``, ``attention``, the ``PagedAttentionInputs`` they pass on, ``store_kv``), the LoRA
batch layout (``LoRABatchMapping``) and the structured-output mask (``apply_token_bitmask``, Triton on CUDA,
torch elsewhere). The implementations themselves (``*_ref``, ``*_triton``, ``*_c``, ``*_grouped``) live in
their modules, where the tests import them:

* ``attention``: the paged-attention inputs, paged attention over mixed prefill chunks and decodes (torch,
  Triton) and the KV-cache write;
* ``cpu_decode_attention``, ``cpu_prefill_attention``: C attention over the paged cache;
* ``lora``, ``lora_mapping``: batched multi-LoRA shrink / expand (torch per-token and grouped, Triton SGMV);
  ``cpu_lora``: shrink + expand in one C call;
* ``elementwise``: residual add + RMSNorm, rotary, the SiLU-gated product (torch, C);
* ``bitmask``: structured-output token masks applied to logits (torch, Triton);
* ``quant``: matrix products with GGUF-quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K; torch, C) and Q8_0
  quantization;
* ``cpu_build``: compiles the C kernels once per machine and loads them; ``cpu_features``: native bfloat16.

Triton is imported only on the first Triton call, so CPU-only use never needs it and tests can enable
``TRITON_INTERPRET``.
"""

from .attention import PagedAttentionInputs, store_kv
from .attention_plan import AttentionMetadata, attention
from .backend import ComputeBackend, select_backend
from .bitmask import apply_token_bitmask
from .lora_mapping import LoRABatchMapping

__all__ = [
    "AttentionMetadata",
    "ComputeBackend",
    "LoRABatchMapping",
    "PagedAttentionInputs",
    "apply_token_bitmask",
    "attention",
    "select_backend",
    "store_kv",
]
