"""Triton kernel behind ``paged_attention_triton`` (imported lazily: ``triton.jit`` picks
the interpreter or the compiler when this module is imported).

One program handles ``BLOCK_Q`` query tokens of one sequence and all query heads that
share one kv head (``BLOCK_M = BLOCK_Q * GROUP_P`` rows), and walks that sequence's KV
pages with an online softmax. The grid needs no host sync: axis 0 has
``num_tokens // BLOCK_Q + num_seqs`` slots, an upper bound on the query blocks of all
sequences, and each program finds its sequence by binary search over
``query_start_loc[s] // BLOCK_Q + s`` (the first block slot of sequence ``s``).

With a sliding window (``HAS_WINDOW``) a query at position p sees keys p - window + 1 .. p and tiles
wholly before the block's first visible key are skipped; with a soft-cap (``HAS_SOFTCAP``) scores become
``softcap * tanh(score / softcap)`` (Gemma 2) before the mask.

Keys are read in tiles of ``TILE_N`` positions, each position finding its page through the
block table, so any page size works: a tile is one whole page when pages are a power of two
of at least 16 (the smallest ``tl.dot`` width), and spans several pages when they are smaller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

if TYPE_CHECKING:
    from .attention import PagedAttentionInputs

_LOG2E = 1.4426950408889634


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, block_slot, BLOCK_Q: tl.constexpr):
    """Largest sequence ``s`` whose first block slot ``qsl[s] // BLOCK_Q + s`` is <= block_slot."""
    lo = tl.full([], 0, tl.int32)
    hi = lo + num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= block_slot:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["num_seqs"])
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    qk_scale_log2,
    sm_scale,
    softcap,
    window,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_bt,
    stride_bb,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    PAGE: tl.constexpr,
    TILE_N: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_P
    block_slot = tl.program_id(0)
    kv_head = tl.program_id(1)

    seq = _find_seq(query_start_loc_ptr, num_seqs, block_slot, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_block = block_slot - (q_start // BLOCK_Q + seq)
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    first_pos = seq_len - q_len  # absolute position of the chunk's first query

    rows = tl.arange(0, BLOCK_M)
    tok_in_chunk = q_block * BLOCK_Q + rows // GROUP_P
    head_in_group = rows % GROUP_P
    row_valid = (tok_in_chunk < q_len) & (head_in_group < GROUP)
    token = (q_start + tok_in_chunk).to(tl.int64)
    head = kv_head * GROUP + head_in_group
    q_pos = first_pos + tok_in_chunk

    dims = tl.arange(0, HEAD_DIM_P)
    dim_valid = dims < HEAD_DIM
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=row_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )

    # Finite start value: a row with every key masked keeps m at -1e30 and never makes NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)

    # Keys this tile can see: 0 .. position of its last query row.
    kv_len = first_pos + tl.minimum((q_block + 1) * BLOCK_Q, q_len)
    num_tiles = tl.cdiv(kv_len, TILE_N)
    first_tile = 0
    if HAS_WINDOW:  # the block's first query row sees nothing before first_pos + q_block * BLOCK_Q - window + 1
        first_tile = tl.maximum(first_pos + q_block * BLOCK_Q - window + 1, 0) // TILE_N
    offs_tile = tl.arange(0, TILE_N)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile_idx in range(first_tile, num_tiles):
        key_pos = tile_idx * TILE_N + offs_tile
        key_valid = key_pos < kv_len  # never read stale slots of a partial last page
        block_id = tl.load(table_row + (key_pos // PAGE) * stride_bb, mask=key_valid, other=0).to(tl.int64)
        k_slot = block_id * stride_kb + (key_pos % PAGE) * stride_ks  # [TILE_N]
        k = tl.load(
            k_cache_ptr + k_slot[None, :] + kv_head * stride_kh + dims[:, None] * stride_kd,
            mask=dim_valid[:, None] & key_valid[None, :],
            other=0.0,
        )  # [HEAD_DIM_P, TILE_N]
        if HAS_SOFTCAP:  # softcap * tanh(x / softcap), tanh written with exp (stable at both ends)
            x = tl.dot(q, k, input_precision=PRECISION) * (sm_scale / softcap)
            s = (1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)) * (softcap * 1.4426950408889634)
        else:
            s = tl.dot(q, k, input_precision=PRECISION) * qk_scale_log2
        seen = key_pos[None, :] <= q_pos[:, None]
        if HAS_WINDOW:
            seen = seen & (key_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_slot = block_id * stride_vb + (key_pos % PAGE) * stride_vs
        v = tl.load(
            v_cache_ptr + v_slot[:, None] + kv_head * stride_vh + dims[None, :] * stride_vd,
            mask=key_valid[:, None] & dim_valid[None, :],
            other=0.0,
        )  # [TILE_N, HEAD_DIM_P]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_i[:, None]
    tl.store(
        out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :] * stride_od,
        acc.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & dim_valid[None, :],
    )


def launch_paged_attention(inputs: PagedAttentionInputs, out: torch.Tensor) -> None:
    """Launch the kernel writing into ``out`` (same shape and dtype as ``inputs.q``)."""
    q, k_cache, v_cache, block_tables = inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_tables
    seq_lens, query_start_loc = inputs.seq_lens, inputs.query_starts()
    scale, window, softcap = inputs.scale, inputs.window, inputs.softcap
    num_tokens, num_heads, head_dim = q.shape
    page = k_cache.shape[1]
    num_kv_heads = k_cache.shape[2]
    # one page per key tile where pages are a power of two >= 16, else tiles of 16 positions across pages
    tile_n = page if page >= 16 and page & (page - 1) == 0 else 16
    group = num_heads // num_kv_heads
    group_p = triton.next_power_of_2(group)
    num_seqs = seq_lens.shape[0]
    # Pure decode batches (one row per sequence) use small tiles; chunks use larger ones.
    rows_target = 16 if num_tokens == num_seqs else 64
    block_q = max(1, rows_target // group_p)
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_lens.contiguous(),
        query_start_loc.contiguous(),
        scale * _LOG2E,
        float(scale),
        float(softcap or 0.0),
        int(window or 0),
        num_seqs,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.stride(3),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        v_cache.stride(3),
        block_tables.stride(0),
        block_tables.stride(1),
        GROUP=group,
        GROUP_P=group_p,
        HEAD_DIM=head_dim,
        HEAD_DIM_P=max(16, triton.next_power_of_2(head_dim)),
        PAGE=page,
        TILE_N=tile_n,
        BLOCK_Q=block_q,
        PRECISION=precision,
        HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None,
    )
