"""Paged attention: Triton (interpreter) == torch reference == naive dense attention."""

import math

import pytest
import torch

from loraplex.kernels.attention import (
    PagedAttentionInputs,
    paged_attention_ref,
    paged_attention_triton,
    store_kv,
)
from tests.device import TRITON_HALF_DTYPES, on_test_device  # first: it chooses interpreter or compiler
from tests.kernels.dispatch import paged_attention

HEAD_DIM = 32


def make_batch(
    chunks: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    seed: int = 0,
    head_dim: int = HEAD_DIM,
):
    """Random paged batch; chunks = [(seq_len, q_len)]. Unused cache slots hold NaN and
    unused block-table entries a huge id, so reading either would show in the result."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(seq_len / block_size) for seq_len, _ in chunks]
    num_blocks = sum(blocks_per_seq) + 3
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(blocks_per_seq) + 2
    block_tables = torch.full((len(chunks), max_blocks), 10**6, dtype=torch.int32)
    used = 0
    for s, ((seq_len, _), nb) in enumerate(zip(chunks, blocks_per_seq)):
        ids = perm[used : used + nb]
        used += nb
        block_tables[s, :nb] = ids.to(torch.int32)
        for pos in range(seq_len):
            blk, off = ids[pos // block_size], pos % block_size
            k_cache[blk, off] = torch.randn(num_kv_heads, head_dim, generator=gen)
            v_cache[blk, off] = torch.randn(num_kv_heads, head_dim, generator=gen)
    q_lens = [q_len for _, q_len in chunks]
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen)
    qsl = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([seq_len for seq_len, _ in chunks], dtype=torch.int32)
    return q, k_cache, v_cache, block_tables, seq_lens, qsl


def naive_attention(q, k_cache, v_cache, block_tables, seq_lens, qsl, scale, window=None, softcap=None):
    """Per-sequence dense causal attention in float64 (a query at p sees keys p - window + 1 .. p; scores
    soft-capped as cap * tanh(s / cap))."""
    out = torch.empty(q.shape, dtype=torch.float64)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    for s in range(seq_lens.shape[0]):
        seq_len = int(seq_lens[s])
        start, end = int(qsl[s]), int(qsl[s + 1])
        pos = torch.arange(seq_len)
        blocks = block_tables[s].long()[pos // block_size]
        k = k_cache[blocks, pos % block_size].double().repeat_interleave(group, dim=1)
        v = v_cache[blocks, pos % block_size].double().repeat_interleave(group, dim=1)
        for j in range(end - start):
            p = seq_len - (end - start) + j
            lo = 0 if window is None else max(0, p - window + 1)
            scores = torch.einsum("hd,lhd->hl", q[start + j].double(), k[lo : p + 1]) * scale
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            out[start + j] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v[lo : p + 1])
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


CASES = {
    "decode_only": [(1, 1), (17, 1), (33, 1), (64, 1), (5, 1)],
    "prefill_only": [(7, 7), (40, 40), (16, 16)],
    "chunked_prefill": [(45, 13), (64, 32)],
    "mixed": [(37, 37), (1, 1), (50, 1), (70, 21), (3, 3), (31, 1)],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "block_size"),
    [(2, 2, 16), (6, 2, 32), (8, 2, 16)],  # GQA ratios 1, 3, 4
)
def test_triton_matches_reference(case, num_heads, num_kv_heads, block_size):
    batch = make_batch(CASES[case], num_heads, num_kv_heads, block_size, seed=len(case) + num_heads)
    scale = HEAD_DIM**-0.5
    ref = paged_attention_ref(PagedAttentionInputs(*batch, scale))
    tri = paged_attention_triton(PagedAttentionInputs(*on_test_device(*batch), scale)).cpu()
    assert tri.dtype == ref.dtype == torch.float32
    assert torch.isfinite(tri).all()
    assert rel_err(tri, ref) < 1e-4


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(3, 3), (9, 3), (8, 2)])
def test_reference_matches_naive(case, num_heads, num_kv_heads):
    batch = make_batch(CASES[case], num_heads, num_kv_heads, 16, seed=7, head_dim=64)
    scale = 0.125
    ref = paged_attention_ref(PagedAttentionInputs(*batch, scale))
    assert torch.isfinite(ref).all()
    assert rel_err(ref, naive_attention(*batch, scale)) < 1e-5


WINDOW_SOFTCAP = [(1, None), (6, None), (20, None), (None, 1.5), (9, 2.0)]


@pytest.mark.parametrize(("window", "softcap"), WINDOW_SOFTCAP)
@pytest.mark.parametrize("case", ["mixed", "chunked_prefill"])
def test_reference_window_and_softcap_match_naive(case, window, softcap):
    batch = make_batch(CASES[case], 6, 2, 16, seed=11, head_dim=64)
    ref = paged_attention_ref(PagedAttentionInputs(*batch, 0.125, window=window, softcap=softcap))
    assert torch.isfinite(ref).all()
    assert rel_err(ref, naive_attention(*batch, 0.125, window=window, softcap=softcap)) < 1e-5
    assert rel_err(ref, naive_attention(*batch, 0.125)) > 1e-3  # the window / cap changed the result


@pytest.mark.parametrize(("window", "softcap"), WINDOW_SOFTCAP)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "block_size"), [(6, 2, 16), (8, 2, 8)])
def test_triton_window_and_softcap_match_reference(window, softcap, num_heads, num_kv_heads, block_size):
    batch = make_batch(CASES["mixed"], num_heads, num_kv_heads, block_size, seed=13)
    scale = HEAD_DIM**-0.5
    ref = paged_attention_ref(PagedAttentionInputs(*batch, scale, window=window, softcap=softcap))
    tri = paged_attention_triton(
        PagedAttentionInputs(*on_test_device(*batch), scale, window=window, softcap=softcap)
    ).cpu()
    assert torch.isfinite(tri).all()
    assert rel_err(tri, ref) < 1e-4


def test_triton_odd_head_dim_and_strided_query():
    """head_dim not a power of two, q a strided view (as split out of a fused qkv)."""
    q, k_cache, v_cache, bt, seq_lens, qsl = make_batch([(20, 6), (9, 1)], 6, 2, 16, head_dim=24)
    fused = torch.randn(q.shape[0], 2 * q.shape[1], 24)
    fused[:, ::2] = q
    (fused_dev,) = on_test_device(fused)
    q_view = fused_dev[:, ::2]
    out = paged_attention_triton(
        PagedAttentionInputs(q_view, *on_test_device(k_cache, v_cache, bt, seq_lens, qsl), 0.2)
    ).cpu()
    assert rel_err(out, paged_attention_ref(PagedAttentionInputs(q, k_cache, v_cache, bt, seq_lens, qsl, 0.2))) < 1e-4


@pytest.mark.parametrize("dtype", TRITON_HALF_DTYPES)
def test_triton_half_precision_matches_float32_reference(dtype):
    """The engine's GPU dtypes: q and the caches in ``dtype``, compared with float32 math on the same values."""
    q, k_cache, v_cache, bt, seq_lens, qsl = make_batch(CASES["mixed"], 9, 3, 16, seed=5, head_dim=64)
    k_cache = k_cache.nan_to_num(0.0)  # half-precision NaN padding is fine too, but keep the reference simple
    v_cache = v_cache.nan_to_num(0.0)
    q, k_cache, v_cache = q.to(dtype), k_cache.to(dtype), v_cache.to(dtype)
    out = paged_attention_triton(
        PagedAttentionInputs(*on_test_device(q, k_cache, v_cache, bt, seq_lens, qsl), 0.125)
    ).cpu()
    assert out.dtype == dtype
    ref = paged_attention_ref(
        PagedAttentionInputs(q.float(), k_cache.float(), v_cache.float(), bt, seq_lens, qsl, 0.125)
    )
    assert rel_err(out.float(), ref) < 1e-2


def test_reference_keeps_half_precision_dtype():
    batch = make_batch([(10, 4), (5, 1)], 4, 2, 16)
    q = batch[0].to(torch.bfloat16)
    out = paged_attention_ref(PagedAttentionInputs(q, *batch[1:], 0.3))
    assert out.dtype == torch.bfloat16
    full = paged_attention_ref(PagedAttentionInputs(q.float(), *batch[1:], 0.3))
    assert rel_err(out.float(), full) < 1e-2


def test_dispatch_uses_reference_on_cpu():
    batch = make_batch([(12, 12), (30, 1)], 4, 2, 16)
    assert torch.equal(
        paged_attention(PagedAttentionInputs(*batch, 0.5)), paged_attention_ref(PagedAttentionInputs(*batch, 0.5))
    )


def test_store_kv_writes_slots_and_skips_minus_one():
    k_cache = torch.zeros(4, 16, 2, 8)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    store_kv(k, v, k_cache, v_cache, torch.tensor([17, -1, 63]))
    assert torch.equal(k_cache[1, 1], k[0]) and torch.equal(v_cache[3, 15], v[2])
    assert torch.count_nonzero(k_cache) == torch.count_nonzero(k[0]) + torch.count_nonzero(k[2])


def test_store_kv_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="number of tokens"):
        store_kv(
            torch.zeros(2, 1, 4),
            torch.zeros(2, 1, 4),
            torch.zeros(1, 16, 1, 4),
            torch.zeros(1, 16, 1, 4),
            torch.tensor([0]),
        )


@pytest.mark.parametrize("block_size", [1, 8, 12, 24])
def test_triton_pages_smaller_than_a_tile_or_not_a_power_of_two(block_size):
    """Key tiles of 16 positions then span several pages (each position looks its page up)."""
    batch = make_batch(CASES["mixed"], 6, 2, block_size, seed=block_size)
    out = paged_attention_triton(PagedAttentionInputs(*on_test_device(*batch), 0.5)).cpu()
    assert rel_err(out, paged_attention_ref(PagedAttentionInputs(*batch, 0.5))) < 1e-4


def test_store_kv_all_valid_writes_what_the_checked_path_writes():
    """all_valid (the metadata checked the slots once per step) takes one index_copy_ per cache: the same
    caches as the checked indexed write, for strided k/v rows such as the views of a fused qkv row."""
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(5, 3 * 2 * 8, generator=g)
    k, v = qkv[:, 16:32].view(5, 2, 8), qkv[:, 32:].view(5, 2, 8)  # strided rows
    slots = torch.tensor([17, 3, 63, 40, 0])
    caches = [torch.zeros(4, 16, 2, 8) for _ in range(4)]
    store_kv(k, v, caches[0], caches[1], slots)
    store_kv(k, v, caches[2], caches[3], slots, all_valid=True)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert torch.equal(caches[2][1, 1], k[0]) and torch.equal(caches[3][3, 15], v[2])
