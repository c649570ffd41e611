"""Triton SGMV kernels behind ``lora_shrink_triton`` / ``lora_expand_triton`` (imported
lazily: ``triton.jit`` picks the interpreter or the compiler at import time).

Both kernels run over the segment form of :class:`LoRABatchMapping`: program
``(segment, token block, output block)`` multiplies up to ``BLOCK_M`` tokens of one
active slot by that slot's weights, so a prefill chunk (one long segment) and many
decodes (many short segments) share one launch. Accumulation is float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .lora_mapping import LoRABatchMapping


@triton.jit
def _segment_tokens(sorted_ptr, slots_ptr, starts_ptr, lens_ptr, BLOCK_M: tl.constexpr):
    """Slot, token ids and row mask of this program's token block of its segment."""
    seg = tl.program_id(0)
    seg_len = tl.load(lens_ptr + seg)
    slot = tl.load(slots_ptr + seg).to(tl.int64)
    start = tl.load(starts_ptr + seg)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < seg_len
    tok = tl.load(sorted_ptr + start + offs_m, mask=m_mask, other=0).to(tl.int64)
    return slot, tok, m_mask


@triton.jit
def _sgmv_shrink_kernel(
    x_ptr,
    a_ptr,
    buf_ptr,
    sorted_ptr,
    slots_ptr,
    starts_ptr,
    lens_ptr,
    in_features,
    rank,
    stride_xt,
    stride_xk,
    stride_a_slot,
    stride_a_slice,
    stride_a_r,
    stride_a_k,
    stride_buf_slice,
    stride_buf_t,
    stride_buf_r,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """buf[slice, tok, :rank] = x[tok] @ lora_a[slot, slice, :rank].T"""
    if tl.program_id(1) * BLOCK_M >= tl.load(lens_ptr + tl.program_id(0)):
        return
    slot, tok, m_mask = _segment_tokens(sorted_ptr, slots_ptr, starts_ptr, lens_ptr, BLOCK_M)
    slice_id = tl.program_id(2)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < rank
    offs_k = tl.arange(0, BLOCK_K)
    a_base = a_ptr + slot * stride_a_slot + slice_id * stride_a_slice
    acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < in_features
        x = tl.load(
            x_ptr + tok[:, None] * stride_xt + kk[None, :] * stride_xk,
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        a = tl.load(
            a_base + offs_r[None, :] * stride_a_r + kk[:, None] * stride_a_k,
            mask=k_mask[:, None] & r_mask[None, :],
            other=0.0,
        )  # [BLOCK_K, BLOCK_R]
        acc += tl.dot(x, a, input_precision=PRECISION)
    tl.store(
        buf_ptr + slice_id * stride_buf_slice + tok[:, None] * stride_buf_t + offs_r[None, :] * stride_buf_r,
        acc.to(buf_ptr.dtype.element_ty),
        mask=m_mask[:, None] & r_mask[None, :],
    )


@triton.jit
def _sgmv_expand_kernel(
    y_ptr,
    buf_ptr,
    b_ptr,
    sorted_ptr,
    slots_ptr,
    starts_ptr,
    lens_ptr,
    offsets_ptr,
    rank,
    blocks_per_slice,
    stride_yt,
    stride_yn,
    stride_buf_slice,
    stride_buf_t,
    stride_buf_r,
    stride_b_slot,
    stride_b_n,
    stride_b_r,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """y[tok, cols of slice] += buf[slice, tok, :rank] @ lora_b[slot, cols of slice, :rank].T"""
    if tl.program_id(1) * BLOCK_M >= tl.load(lens_ptr + tl.program_id(0)):
        return
    slice_id = tl.program_id(2) // blocks_per_slice
    n_block = tl.program_id(2) % blocks_per_slice
    col_lo = tl.load(offsets_ptr + slice_id)
    col_hi = tl.load(offsets_ptr + slice_id + 1)
    if n_block * BLOCK_N >= col_hi - col_lo:
        return
    slot, tok, m_mask = _segment_tokens(sorted_ptr, slots_ptr, starts_ptr, lens_ptr, BLOCK_M)
    offs_n = col_lo + n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < col_hi
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        rr = r0 + tl.arange(0, BLOCK_R)
        r_mask = rr < rank
        u = tl.load(
            buf_ptr + slice_id * stride_buf_slice + tok[:, None] * stride_buf_t + rr[None, :] * stride_buf_r,
            mask=m_mask[:, None] & r_mask[None, :],
            other=0.0,
        )
        w = tl.load(
            b_ptr + slot * stride_b_slot + offs_n[None, :] * stride_b_n + rr[:, None] * stride_b_r,
            mask=r_mask[:, None] & n_mask[None, :],
            other=0.0,
        )  # [BLOCK_R, BLOCK_N]
        acc += tl.dot(u, w, input_precision=PRECISION)
    y_ptrs = y_ptr + tok[:, None] * stride_yt + offs_n[None, :] * stride_yn
    mask = m_mask[:, None] & n_mask[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


def _block_m(mapping: LoRABatchMapping) -> int:
    return 16 if mapping.max_seg_len <= 16 else (32 if mapping.max_seg_len <= 32 else 64)


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def launch_shrink(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRABatchMapping, buf: torch.Tensor) -> None:
    num_slices, rank, in_features = lora_a.shape[1], lora_a.shape[2], lora_a.shape[3]
    block_m = _block_m(mapping)
    grid = (mapping.num_active, triton.cdiv(mapping.max_seg_len, block_m), num_slices)
    _sgmv_shrink_kernel[grid](
        x,
        lora_a,
        buf,
        mapping.sorted_token_ids,
        mapping.active_slots,
        mapping.seg_starts,
        mapping.seg_lens,
        in_features,
        rank,
        x.stride(0),
        x.stride(1),
        lora_a.stride(0),
        lora_a.stride(1),
        lora_a.stride(2),
        lora_a.stride(3),
        buf.stride(0),
        buf.stride(1),
        buf.stride(2),
        BLOCK_M=block_m,
        BLOCK_R=max(16, triton.next_power_of_2(rank)),
        BLOCK_K=64,
        PRECISION=_precision(x.dtype),
    )


_OFFSETS_CACHE: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _offsets_tensor(slice_offsets: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Device copy of the slice offsets, made once per layout and device."""
    key = (tuple(slice_offsets), device)
    if key not in _OFFSETS_CACHE:
        _OFFSETS_CACHE[key] = torch.tensor(key[0], dtype=torch.int32, device=device)
    return _OFFSETS_CACHE[key]


def launch_expand(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    mapping: LoRABatchMapping,
    slice_offsets: tuple[int, ...],
) -> None:
    rank = lora_b.shape[2]
    block_m = _block_m(mapping)
    block_n = 64
    widest = max(hi - lo for lo, hi in zip(slice_offsets[:-1], slice_offsets[1:]))
    blocks_per_slice = max(1, triton.cdiv(widest, block_n))
    num_slices = len(slice_offsets) - 1
    grid = (mapping.num_active, triton.cdiv(mapping.max_seg_len, block_m), num_slices * blocks_per_slice)
    _sgmv_expand_kernel[grid](
        y,
        buf,
        lora_b,
        mapping.sorted_token_ids,
        mapping.active_slots,
        mapping.seg_starts,
        mapping.seg_lens,
        _offsets_tensor(slice_offsets, y.device),
        rank,
        blocks_per_slice,
        y.stride(0),
        y.stride(1),
        buf.stride(0),
        buf.stride(1),
        buf.stride(2),
        lora_b.stride(0),
        lora_b.stride(1),
        lora_b.stride(2),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_R=min(64, max(16, triton.next_power_of_2(rank))),
        PRECISION=_precision(buf.dtype),
    )
