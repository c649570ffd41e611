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


@pytest.mark.parametrize("num_decodes", [1, 3])
def test_decode_only_step_returns_the_kernel_output(num_decodes):
    """A step of decodes alone (batch 1 included) hands q to the C decode kernel as it is (plan.whole): the
    same output as the reference, and as the same decodes beside a prefill chunk (gathered rows)."""
    require_c_kernels()
    g = torch.Generator().manual_seed(num_decodes)
    heads, kv_heads, d, num_blocks = 6, 2, 16, 32
    ctx = [11, 4, 14][:num_decodes]  # at most 4 blocks of 4
    tables = [[3 * i, 3 * i + 1, 3 * i + 2, 3 * i + 3 + 20] for i in range(num_decodes)]
    k_cache = torch.randn(num_blocks, BLOCK, kv_heads, d, generator=g)
    v_cache = torch.randn(num_blocks, BLOCK, kv_heads, d, generator=g)
    q = torch.randn(num_decodes, heads, d, generator=g)
    k = torch.randn(num_decodes, kv_heads, d, generator=g)
    v = torch.randn(num_decodes, kv_heads, d, generator=g)
    meta = AttentionMetadata.build([1] * num_decodes, ctx, tables, BLOCK, torch.device("cpu"), backend="cpu-c")
    assert [type(p) for p in meta.groups] == [CDecodePlan] and meta.groups[0].whole and meta.slots_valid
    out = attention(meta.paged_inputs(q, k_cache, v_cache, scale=d**-0.5), k, v, meta)
    ref = paged_attention_ref(
        PagedAttentionInputs(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, d**-0.5)
    )
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # the same decodes after a 2-token prefill chunk (its own blocks 30, 31): the gathered path, equal rows
    mixed = AttentionMetadata.build(
        [2, *[1] * num_decodes], [0, *ctx], [[30], *tables], BLOCK, torch.device("cpu"), "cpu-c"
    )
    assert not mixed.groups[0].whole
    q2 = torch.cat([torch.randn(2, heads, d, generator=g), q])
    k2, v2 = (
        torch.cat([torch.randn(2, kv_heads, d, generator=g), k]),
        torch.cat([torch.randn(2, kv_heads, d, generator=g), v]),
    )
    out2 = attention(mixed.paged_inputs(q2, k_cache, v_cache, scale=d**-0.5), k2, v2, mixed)
    assert torch.equal(out2[2:], out)
