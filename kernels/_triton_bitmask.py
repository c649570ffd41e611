"""Triton kernel behind ``apply_token_bitmask_triton`` (imported lazily: ``triton.jit``
picks the interpreter or the compiler at import time)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    indices_ptr,
    vocab_size,
    num_words,
    stride_logits_row,
    stride_mask_row,
    BLOCK_V: tl.constexpr,
):
    mask_row = tl.program_id(0)
    logits_row = tl.load(indices_ptr + mask_row).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    words = cols // 32
    in_vocab = cols < vocab_size
    packed = tl.load(
        bitmask_ptr + mask_row.to(tl.int64) * stride_mask_row + words,
        mask=in_vocab & (words < num_words),
        other=0,  # columns past the mask's words are disallowed
    )
    disallowed = ((packed >> (cols % 32)) & 1) == 0
    neg_inf = tl.full([BLOCK_V], float("-inf"), dtype=logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + logits_row * stride_logits_row + cols, neg_inf, mask=in_vocab & disallowed)


def launch_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor) -> None:
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("the Triton bitmask kernel needs logits and bitmask rows to be contiguous")
    vocab_size = logits.shape[1]
    block_v = 1024
    grid = (indices.shape[0], triton.cdiv(vocab_size, block_v))
    _apply_bitmask_kernel[grid](
        logits,
        bitmask,
        indices,
        vocab_size,
        bitmask.shape[1],
        logits.stride(0),
        bitmask.stride(0),
        BLOCK_V=block_v,
    )
