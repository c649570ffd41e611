"""The compute backend: which kernels run an engine's steps, decided once when the engine starts.

* ``triton``: CUDA tensors. Paged attention and the LoRA shrink/expand are Triton kernels; the elementwise
  steps run as torch ops.
* ``cpu-c``: float32 or bfloat16 CPU tensors with the C kernels built (``csrc/``): decode and prefill
  attention read the paged cache in place, the multi-LoRA delta, residual add + RMSNorm, rotary and the
  SiLU- and GELU-gated products. (A bfloat16 engine on the CPU exists only on hosts with native bfloat16:
  ``kernels.cpu_features``, checked by ``EngineArgs.resolved_dtype``.)
* ``torch``: anything else on the CPU (float16, no C compiler, ``LORAPLEX_CPU_KERNELS=0``): vectorised
  torch paths, which are also the references the kernels are tested against.

The model, the attention plan and the per-step LoRA context call the functions of the one ``ComputeBackend``
they are given; none of them decides again per call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from .cpu_build import KernelBuildError
from .cpu_decode_attention import C_DTYPES, cpu_decode_kernel_available
from .cpu_lora import cpu_lora_kernel_available
from .cpu_prefill_attention import MAX_GROUP, cpu_prefill_kernel_available
from .elementwise import (
    add_rms_norm_c,
    add_rms_norm_ref,
    cpu_elementwise_available,
    gelu_tanh_mul_c,
    gelu_tanh_mul_ref,
    rope_c,
    rope_ref,
    silu_mul_c,
    silu_mul_ref,
)
from .lora import lora_expand_grouped, lora_expand_triton, lora_shrink_grouped, lora_shrink_triton

__all__ = ["BackendName", "ComputeBackend", "cpu_c_backend", "select_backend", "torch_backend", "triton_backend"]

log = logging.getLogger(__name__)

BackendName = Literal["triton", "cpu-c", "torch"]


@dataclass(frozen=True)
class ComputeBackend:
    """The kernels of one backend, with the signatures of their torch references."""

    name: BackendName
    add_rms_norm: Callable[..., torch.Tensor]
    rope_: Callable[..., None]
    silu_mul: Callable[..., torch.Tensor]
    gelu_mul: Callable[..., torch.Tensor]  # GeGLU's gelu_pytorch_tanh(gate) * up (Gemma)
    lora_shrink: Callable[..., torch.Tensor]  # the torch and Triton LoRA paths; cpu-c runs kernels.cpu_lora
    lora_expand: Callable[..., torch.Tensor]


def triton_backend() -> ComputeBackend:
    return ComputeBackend(
        "triton", add_rms_norm_ref, rope_ref, silu_mul_ref, gelu_tanh_mul_ref, lora_shrink_triton, lora_expand_triton
    )


def cpu_c_backend() -> ComputeBackend:
    return ComputeBackend(
        "cpu-c", add_rms_norm_c, rope_c, silu_mul_c, gelu_tanh_mul_c, lora_shrink_grouped, lora_expand_grouped
    )


def torch_backend() -> ComputeBackend:
    return ComputeBackend(
        "torch", add_rms_norm_ref, rope_ref, silu_mul_ref, gelu_tanh_mul_ref, lora_shrink_grouped, lora_expand_grouped
    )


def cpu_kernels_available() -> bool:
    """Every C kernel is built and loaded (False when they are switched off or no C compiler exists; a
    compiler that fails raises KernelBuildError naming the kernel)."""
    return all(
        check()
        for check in (
            cpu_decode_kernel_available,
            cpu_prefill_kernel_available,
            cpu_lora_kernel_available,
            cpu_elementwise_available,
        )
    )


def select_backend(
    device: torch.device, dtype: torch.dtype, head_dim: int, num_heads: int, num_kv_heads: int
) -> ComputeBackend:
    """The backend for a model of this shape on ``device`` in ``dtype``."""
    if device.type == "cuda":
        return triton_backend()
    if device.type != "cpu" or dtype not in C_DTYPES:
        return torch_backend()
    if head_dim % 8 != 0 or num_heads // num_kv_heads > MAX_GROUP:
        log.warning(
            "the C kernels need head_dim a multiple of 8 and at most %d query heads per KV head (got "
            "%d and %d): running the torch paths",
            MAX_GROUP,
            head_dim,
            num_heads // num_kv_heads,
        )
        return torch_backend()
    try:
        available = cpu_kernels_available()
    except KernelBuildError as exc:  # a broken build is loud here and fails the kernel tests; serving goes on
        log.error("%s; running the torch paths instead", exc)
        return torch_backend()
    return cpu_c_backend() if available else torch_backend()
