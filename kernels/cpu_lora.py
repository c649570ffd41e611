"""Multi-LoRA shrink + expand in one C call on the CPU, beside its torch reference with the same signature.

``lora_apply(x, y, lora_a, lora_bt, mapping, slice_offsets, slot_ranks)`` adds every token's adapter delta
to ``y`` in place. ``lora_a`` is the kernels' ``[num_slots, num_slices, max_rank, in]`` and ``lora_bt`` B
transposed, ``[num_slots, max_rank, out_total]`` (the LoRA manager's slot layout); ``slot_ranks[slot]``
bounds the rank rows read (rows past it are zero). The C path (``csrc/lora_apply.c``) serves float32 CPU
tensors and reads each active slot's weights once at its own rank; the reference is the per-token
``lora_shrink_ref`` / ``lora_expand_ref`` pair.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch

from .cpu_build import load
from .lora import _check_expand, _check_shrink, lora_expand_ref, lora_shrink_ref
from .lora_mapping import LoRABatchMapping

__all__ = ["cpu_lora_kernel_available", "lora_apply_c", "lora_apply_ref"]


_p, _i64 = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {"loraplex_lora_apply_f32": (
    ctypes.c_int, [_p, _p, _p, _p, _p, _i64, _i64, _i64, _i64, _p, _p, _p, _i64, _p, _p, ctypes.c_int])}


def _library() -> ctypes.CDLL | None:
    return load("lora_apply", _SIGNATURES)


def cpu_lora_kernel_available() -> bool:
    return _library() is not None


def _check(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_bt: torch.Tensor,
           mapping: LoRABatchMapping, slice_offsets: Sequence[int], slot_ranks: torch.Tensor) -> None:
    _check_shrink(x, lora_a, mapping)
    _check_expand(y, (lora_a.shape[1], x.shape[0], lora_a.shape[2]), lora_bt.transpose(1, 2), mapping, slice_offsets)
    if lora_bt.shape[:2] != (lora_a.shape[0], lora_a.shape[2]):
        raise ValueError(f"lora_bt {tuple(lora_bt.shape)} does not match lora_a {tuple(lora_a.shape)}")
    if slot_ranks.shape != (lora_a.shape[0],):
        raise ValueError(f"slot_ranks must hold one rank per slot ({lora_a.shape[0]}), got {tuple(slot_ranks.shape)}")


@functools.lru_cache(maxsize=64)
def _offsets_tensor(offsets: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(offsets, dtype=torch.int64)


def lora_apply_ref(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_bt: torch.Tensor,
                   mapping: LoRABatchMapping, slice_offsets: Sequence[int], slot_ranks: torch.Tensor) -> torch.Tensor:
    """Torch reference: per-token shrink, then per-token expand (ranks are implied by the zero padding)."""
    _check(x, y, lora_a, lora_bt, mapping, slice_offsets, slot_ranks)
    buf = lora_shrink_ref(x, lora_a, mapping)
    return lora_expand_ref(y, buf, lora_bt.transpose(1, 2), mapping, slice_offsets)


def lora_apply_c(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_bt: torch.Tensor,
                 mapping: LoRABatchMapping, slice_offsets: Sequence[int], slot_ranks: torch.Tensor) -> torch.Tensor:
    """The C kernel, in place on ``y``; raises when it cannot serve these tensors (float32 CPU, contiguous)."""
    _check(x, y, lora_a, lora_bt, mapping, slice_offsets, slot_ranks)
    lib = _library()
    if lib is None:
        raise RuntimeError("the C LoRA kernel is not available on this machine")
    tensors = (x, y, lora_a, lora_bt)
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        raise ValueError("the C LoRA kernel takes float32 CPU tensors")
    if not y.is_contiguous():
        raise ValueError("the C LoRA kernel updates y in place and needs it contiguous")
    if mapping.num_active_tokens == 0:
        return y
    x, lora_a, lora_bt = x.contiguous(), lora_a.contiguous(), lora_bt.contiguous()
    offsets = _offsets_tensor(tuple(slice_offsets))
    ranks = slot_ranks.to(torch.int32).contiguous()
    tokens, slots, lens, starts = mapping.host_segments  # built once per step, shared by every layer
    rc = lib.loraplex_lora_apply_f32(
        x.data_ptr(), y.data_ptr(), lora_a.data_ptr(), lora_bt.data_ptr(), offsets.data_ptr(), lora_a.shape[1],
        lora_a.shape[3], y.shape[1], lora_a.shape[2], slots.data_ptr(), starts.data_ptr(), lens.data_ptr(),
        slots.shape[0], tokens.data_ptr(), ranks.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise MemoryError("the C LoRA kernel could not allocate its scratch buffer")
    return y
