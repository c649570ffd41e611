"""The CPU attention plans against the torch reference: the C kernels (decodes, then every chunk in one call) and the
torch groups (causal fresh chunks, masked continued chunks, padded decodes)."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels.attention import PagedAttentionInputs, paged_attention_ref
from loraplex.kernels.attention_plan import (
    AttentionMetadata,
    CausalPlan,
    CDecodePlan,
    CPrefillPlan,
    GroupPlan,
    attention,
)
from tests.c_kernels import require_c_kernels

BLOCK = 4


@pytest.mark.parametrize("c_kernels", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (9, 3)])
def test_mixed_step_matches_reference(c_kernels, heads, kv_heads):
    if c_kernels:
        require_c_kernels()
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    d, num_blocks = 16, 64
    # fresh chunks of 5 and 17 tokens (padding), a chunk continuing 9 cached tokens, decodes after 20 and 3
    q_lens, ctx_lens = [5, 17, 6, 1, 1], [0, 0, 9, 20, 3]
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, used = [], 0
    for q, c in zip(q_lens, ctx_lens):
        n = -(-(q + c) // BLOCK)
        tables.append(perm[used : used + n])
        used += n
    k_cache = torch.randn(num_blocks, BLOCK, kv_heads, d, generator=g)
    v_cache = torch.randn(num_blocks, BLOCK, kv_heads, d, generator=g)
    total = sum(q_lens)
    q = torch.randn(total, heads, d, generator=g)
    k = torch.randn(total, kv_heads, d, generator=g)
    v = torch.randn(total, kv_heads, d, generator=g)
    meta = AttentionMetadata.build(
        q_lens, ctx_lens, tables, BLOCK, torch.device("cpu"), backend="cpu-c" if c_kernels else "torch"
    )
    kinds = {type(p) for p in meta.groups}
    assert kinds == ({CDecodePlan, CPrefillPlan} if c_kernels else {CausalPlan, GroupPlan})
    inputs = meta.paged_inputs(q, k_cache, v_cache, scale=d**-0.5)
    out = attention(inputs, k, v, meta)  # also stores k/v into the caches
    ref = paged_attention_ref(
        PagedAttentionInputs(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, d**-0.5)
    )
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
