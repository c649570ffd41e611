"""The C prefill-attention kernel against its torch reference (the general paged attention), and its refusals."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels.attention import PagedAttentionInputs
from loraplex.kernels.cpu_prefill_attention import (
    paged_prefill_attention_c,
    paged_prefill_attention_ref,
)
from tests.c_kernels import needs_c_kernels

pytestmark = needs_c_kernels


def _case(
    heads: int, kv_heads: int, head_dim: int, block_size: int, q_lens: list[int], ctx_lens: list[int], seed: int = 0
):
    """q as a view into a fused qkv row (strided, as the engine passes it); shuffled block tables."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(ctx_lens, q_lens)]
    max_blocks = max(-(-n // block_size) for n in seq_lens) + 1
    num_blocks = len(q_lens) * max_blocks + 3
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    tables = torch.randperm(num_blocks, generator=g)[: len(q_lens) * max_blocks].view(len(q_lens), max_blocks)
    total = sum(q_lens)
    qkv = torch.randn(total, (heads + 2 * kv_heads) * head_dim, generator=g)
    q = qkv[:, : heads * head_dim].view(total, heads, head_dim)
    starts = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return q, k, v, tables.to(torch.int32), torch.tensor(seq_lens, dtype=torch.int32), starts


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size,q_lens,ctx_lens",
    [
        (9, 3, 64, 16, [5, 1, 17, 33, 170], [0, 3, 16, 40, 16]),  # SmolLM2: fresh, decode, continued chunks
        (8, 8, 32, 16, [64, 2], [0, 61]),  # no GQA: 32-token query tiles
        (12, 1, 64, 8, [7, 30, 1], [300, 0, 9]),  # MQA (group 12: generic body), small blocks
        (20, 2, 16, 32, [31, 33], [1, 32]),  # group 10, blocks of 32 (two key tiles each)
        (4, 2, 128, 16, [129], [0]),
        (64, 1, 16, 16, [9, 3], [20, 0]),  # the largest group: one token per task
    ],
)
def test_matches_reference(heads, kv_heads, head_dim, block_size, q_lens, ctx_lens):
    q, k, v, tables, seq_lens, starts = _case(heads, kv_heads, head_dim, block_size, q_lens, ctx_lens)
    scale = head_dim**-0.5
    ref = paged_prefill_attention_ref(PagedAttentionInputs(q, k, v, tables, seq_lens, starts, scale))
    out = paged_prefill_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, starts, scale))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size,q_lens,ctx_lens",
    [
        (9, 3, 64, 16, [5, 1, 17, 33, 170], [0, 3, 16, 40, 16]),
        (12, 1, 64, 8, [7, 30, 1], [300, 0, 9]),  # generic body, small blocks
        (64, 1, 16, 16, [9, 3], [20, 0]),
    ],
)
@pytest.mark.parametrize("window,softcap", [(1, None), (7, None), (16, None), (50, None), (None, 1.5), (20, 2.0)])
def test_window_and_softcap_match_reference(heads, kv_heads, head_dim, block_size, q_lens, ctx_lens, window, softcap):
    """Windows of one token, shorter than a query tile, a block, longer than some contexts; soft-caps that
    change the scores; queries whose window starts inside, before and after the task's first key tile."""
    q, k, v, tables, seq_lens, starts = _case(heads, kv_heads, head_dim, block_size, q_lens, ctx_lens, seed=5)
    scale = head_dim**-0.5
    ref = paged_prefill_attention_ref(PagedAttentionInputs(q, k, v, tables, seq_lens, starts, scale, window, softcap))
    out = paged_prefill_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, starts, scale, window, softcap))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    plain = paged_prefill_attention_ref(PagedAttentionInputs(q, k, v, tables, seq_lens, starts, scale))
    # the window / cap changed the result, unless the window covers every context
    changes = softcap is not None or window < int(seq_lens.max())
    assert torch.allclose(out, plain, atol=1e-3) != changes


def test_skip_decodes_leaves_their_rows_alone():
    q, k, v, tables, seq_lens, starts = _case(9, 3, 64, 16, [1, 20, 1, 7], [40, 5, 3, 0])
    out = torch.full(q.shape, 7.0)
    paged_prefill_attention_c(
        PagedAttentionInputs(q, k, v, tables, seq_lens, starts, 0.125), out=out, skip_decodes=True
    )
    ref = paged_prefill_attention_ref(PagedAttentionInputs(q, k, v, tables, seq_lens, starts, 0.125))
    chunk_rows = torch.tensor([False] + [True] * 20 + [False] + [True] * 7)
    assert bool((out[~chunk_rows] == 7.0).all())
    torch.testing.assert_close(out[chunk_rows], ref[chunk_rows], rtol=1e-4, atol=1e-5)


def test_refuses_tables_outside_the_cache():
    q, k, v, tables, seq_lens, starts = _case(4, 2, 32, 16, [3, 40], [0, 2])
    tables[1, 2] = k.shape[0]  # the second chunk's third block
    with pytest.raises(ValueError, match="block table entries"):
        paged_prefill_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, starts, 0.2))


def test_refuses_bad_layouts():
    q, k, v, tables, seq_lens, starts = _case(4, 2, 32, 16, [3, 40], [0, 2])
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_prefill_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, starts[:2], 0.2))
    with pytest.raises(ValueError, match="non-decreasing"):
        paged_prefill_attention_c(
            PagedAttentionInputs(q, k, v, tables, seq_lens, torch.tensor([0, 30, 20], dtype=torch.int32), 0.2)
        )
    with pytest.raises(ValueError, match="cover"):
        paged_prefill_attention_c(
            PagedAttentionInputs(q, k, v, tables, torch.tensor([3, 30], dtype=torch.int32), starts, 0.2)
        )
    with pytest.raises(ValueError, match="blocks"):
        paged_prefill_attention_c(PagedAttentionInputs(q, k, v, tables[:, :1], seq_lens, starts, 0.2))
    with pytest.raises(ValueError, match="float32"):
        paged_prefill_attention_c(
            PagedAttentionInputs(q.double(), k.double(), v.double(), tables, seq_lens, starts, 0.2)
        )
    with pytest.raises(ValueError, match="out must be"):
        paged_prefill_attention_c(
            PagedAttentionInputs(q, k, v, tables, seq_lens, starts, 0.2), out=torch.empty(3, 4, 32)
        )
