"""The C decode-attention kernel against its torch reference, and its refusals."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels.attention import PagedAttentionInputs
from loraplex.kernels.cpu_decode_attention import (
    paged_decode_attention_c,
    paged_decode_attention_ref,
)
from tests.c_kernels import needs_c_kernels
from tests.kernels.dispatch import paged_decode_attention

pytestmark = needs_c_kernels


def _case(num_seqs: int, heads: int, kv_heads: int, head_dim: int, block_size: int, lens: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // block_size) for n in lens) + 1
    num_blocks = num_seqs * max_blocks + 3
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    tables = torch.randperm(num_blocks, generator=g)[: num_seqs * max_blocks].view(num_seqs, max_blocks)
    q = torch.randn(num_seqs, heads, head_dim, generator=g)
    return q, k, v, tables.to(torch.int32), torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size,lens",
    [
        (9, 3, 64, 16, [1, 17, 200, 16, 33]),  # SmolLM2's GQA 3, partial last blocks
        (8, 8, 32, 16, [5, 64]),  # no GQA
        (12, 1, 64, 8, [7, 300, 1]),  # MQA, small blocks
        (20, 2, 16, 32, [31, 32, 33]),  # group 10: the generic (non-specialised) body
        (4, 2, 128, 16, [129]),
    ],
)
def test_matches_reference(heads, kv_heads, head_dim, block_size, lens):
    q, k, v, tables, seq_lens = _case(len(lens), heads, kv_heads, head_dim, block_size, lens)
    scale = head_dim**-0.5
    ref = paged_decode_attention_ref(PagedAttentionInputs(q, k, v, tables, seq_lens, None, scale))
    out = paged_decode_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, None, scale))
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-5), (out - ref).abs().max()
    assert torch.equal(paged_decode_attention(PagedAttentionInputs(q, k, v, tables, seq_lens, None, scale)), out)


@pytest.mark.parametrize("window,softcap", [(1, None), (5, None), (16, None), (40, None), (None, 1.5), (5, 1.5)])
def test_window_and_softcap_match_reference(window, softcap):
    """Sliding windows shorter and longer than the contexts, starting mid-block and on a block edge, and
    Gemma 2's soft-cap (small enough to change the scores: they are about N(0, 1) here)."""
    lens = [1, 17, 200, 16, 33, 48]
    q, k, v, tables, seq_lens = _case(len(lens), 9, 3, 64, 16, lens, seed=3)
    scale = 64**-0.5
    ref = paged_decode_attention_ref(PagedAttentionInputs(q, k, v, tables, seq_lens, None, scale, window, softcap))
    out = paged_decode_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, None, scale, window, softcap))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    plain = paged_decode_attention_ref(PagedAttentionInputs(q, k, v, tables, seq_lens, None, scale))
    assert not torch.allclose(out, plain, atol=1e-3)  # the window / cap changed the result


def test_refuses_a_window_below_one_and_a_cap_not_positive():
    q, k, v, tables, seq_lens = _case(1, 2, 2, 16, 16, [5])
    with pytest.raises(ValueError, match="sliding window must be at least 1"):
        paged_decode_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, None, 0.25, window=0))
    with pytest.raises(ValueError, match="soft-cap must be positive"):
        paged_decode_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, None, 0.25, softcap=-1.0))


def test_other_dtypes_use_the_reference():
    q, k, v, tables, seq_lens = _case(2, 4, 2, 32, 16, [3, 40])
    out = paged_decode_attention(PagedAttentionInputs(q.double(), k.double(), v.double(), tables, seq_lens, None, 0.2))
    ref = paged_decode_attention_ref(
        PagedAttentionInputs(q.double(), k.double(), v.double(), tables, seq_lens, None, 0.2)
    )
    assert out.dtype == torch.float64 and torch.equal(out, ref)


def test_refuses_tables_outside_the_cache():
    q, k, v, tables, seq_lens = _case(2, 4, 2, 32, 16, [3, 40])
    tables[1, 2] = k.shape[0]  # read by the second sequence (its third block)
    with pytest.raises(ValueError, match="block table entries"):
        paged_decode_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, None, 0.2))


def test_refuses_bad_shapes():
    q, k, v, tables, seq_lens = _case(2, 4, 2, 32, 16, [3, 40])
    with pytest.raises(ValueError, match="one seq_len"):
        paged_decode_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens[:1], None, 0.2))
    with pytest.raises(ValueError, match="blocks"):
        paged_decode_attention_c(PagedAttentionInputs(q, k, v, tables[:, :1], seq_lens, None, 0.2))
    with pytest.raises(ValueError, match="float32"):
        paged_decode_attention_c(PagedAttentionInputs(q.double(), k.double(), v.double(), tables, seq_lens, None, 0.2))
