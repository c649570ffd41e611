"""The C kernels' bfloat16 paths against their torch references.

Every bfloat16 C kernel widens its inputs exactly, sums in float32 and rounds its output once. So each is
held to two oracles:

* the torch reference run in float32 on the same (bfloat16-valued) inputs: the kernel's output must be that
  exact result rounded, to within half a bfloat16 unit in the last place plus float32 summation noise:
  ``|out - exact| <= 2**-8 * |exact| + 1e-5 * scale`` elementwise (2**-8 relative is half an ulp at the
  top of a binade), and equal to ``exact.to(bfloat16)`` in at least 98% of the elements;
* the torch reference run in bfloat16 (the path a bfloat16 engine takes without the C kernels, and the way
  transformers computes in bfloat16): close to it, and never further from the exact result than it is
  (the reference rounds intermediates the kernels keep in float32).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraplex.kernels.attention import PagedAttentionInputs
from loraplex.kernels.cpu_decode_attention import (
    paged_decode_attention_c,
    paged_decode_attention_ref,
)
from loraplex.kernels.cpu_lora import CLoRAStep, lora_apply_c, lora_apply_ref
from loraplex.kernels.cpu_prefill_attention import paged_prefill_attention_c, paged_prefill_attention_ref
from loraplex.kernels.elementwise import (
    add_rms_norm_c,
    add_rms_norm_ref,
    gelu_tanh_mul_c,
    gelu_tanh_mul_ref,
    rope_c,
    rope_ref,
    silu_mul_c,
    silu_mul_ref,
)
from loraplex.kernels.lora_mapping import LoRABatchMapping
from tests.c_kernels import needs_c_kernels
from tests.kernels.dispatch import add_rms_norm, paged_decode_attention, rope_, silu_mul
from tests.kernels.test_cpu_lora import _weights

pytestmark = needs_c_kernels

BF16 = torch.bfloat16


def _bf16_randn(*shape: int, generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=generator) * scale).to(BF16)


def assert_rounded_once(out: torch.Tensor, exact: torch.Tensor, min_equal: float = 0.98) -> None:
    """``out`` (bfloat16) is the float32 ``exact`` rounded once, to within float32 summation noise."""
    assert out.dtype == BF16 and out.shape == exact.shape
    o, e = out.float(), exact.float()
    bound = 2**-8 * e.abs() + 1e-5 * e.abs().max()
    excess = (o - e).abs() - bound
    assert bool((excess <= 0).all()), f"off by up to {float(excess.max()):.3g} past half an ulp"
    equal = float((out == exact.to(BF16)).float().mean())
    assert equal >= min_equal, f"only {equal:.1%} equal to the exact result rounded"


def assert_no_worse_than(out: torch.Tensor, ref16: torch.Tensor, exact: torch.Tensor, atol: float) -> None:
    """Close to the bfloat16 torch reference, and at most as far from the exact result as it is."""
    err_c = float((out.float() - exact.float()).abs().max())
    err_ref = float((ref16.float() - exact.float()).abs().max())
    assert err_c <= err_ref + 1e-6, (err_c, err_ref)
    torch.testing.assert_close(out.float(), ref16.float(), rtol=2**-6, atol=atol)


# ------------------------------------------------------------------------------------------ attention
def _cache(blocks: int, block_size: int, kv_heads: int, head_dim: int, g: torch.Generator):
    return (_bf16_randn(blocks, block_size, kv_heads, head_dim, generator=g) for _ in "kv")


def _decode_case(heads: int, kv_heads: int, head_dim: int, block_size: int, lens: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // block_size) for n in lens) + 1
    num_blocks = len(lens) * max_blocks + 3
    k, v = _cache(num_blocks, block_size, kv_heads, head_dim, g)
    tables = torch.randperm(num_blocks, generator=g)[: len(lens) * max_blocks].view(len(lens), max_blocks)
    q = _bf16_randn(len(lens), heads, head_dim, generator=g)
    return q, k, v, tables.to(torch.int32), torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size,lens,window,softcap",
    [
        (9, 3, 64, 16, [1, 17, 200, 16, 33], None, None),  # SmolLM2's GQA 3, partial last blocks
        (8, 8, 32, 16, [5, 64], None, None),  # no GQA, head_dim off the specialised sizes
        (12, 1, 64, 8, [7, 300, 1], None, None),  # MQA, small blocks
        (20, 2, 16, 32, [31, 32, 33], None, None),  # group 10: the generic body
        (4, 2, 128, 16, [129], None, None),
        (9, 3, 64, 16, [1, 17, 200, 16, 33, 48], 5, None),  # a window starting mid-block
        (9, 3, 64, 16, [1, 17, 200, 16, 33, 48], 16, 1.5),  # a window on a block edge, Gemma 2's soft-cap
        (6, 3, 24, 5, [3, 11, 97], None, 2.0),  # odd block size, head_dim 24
    ],
)
def test_decode_attention_bf16(heads, kv_heads, head_dim, block_size, lens, window, softcap):
    q, k, v, tables, seq_lens = _decode_case(heads, kv_heads, head_dim, block_size, lens)
    scale = head_dim**-0.5
    out = paged_decode_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, None, scale, window, softcap))
    exact = paged_decode_attention_ref(
        PagedAttentionInputs(q.float(), k.float(), v.float(), tables, seq_lens, None, scale, window, softcap)
    )
    assert_rounded_once(out, exact)
    ref16 = paged_decode_attention_ref(PagedAttentionInputs(q, k, v, tables, seq_lens, None, scale, window, softcap))
    assert_no_worse_than(out, ref16, exact, atol=2e-2)
    assert torch.equal(
        paged_decode_attention(PagedAttentionInputs(q, k, v, tables, seq_lens, None, scale, window, softcap)), out
    )


def _prefill_case(heads, kv_heads, head_dim, block_size, q_lens, ctx_lens, seed=0):
    """q as a strided view into a fused bfloat16 qkv row, as the engine passes it."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(ctx_lens, q_lens)]
    max_blocks = max(-(-n // block_size) for n in seq_lens) + 1
    num_blocks = len(q_lens) * max_blocks + 3
    k, v = _cache(num_blocks, block_size, kv_heads, head_dim, g)
    tables = torch.randperm(num_blocks, generator=g)[: len(q_lens) * max_blocks].view(len(q_lens), max_blocks)
    total = sum(q_lens)
    qkv = _bf16_randn(total, (heads + 2 * kv_heads) * head_dim, generator=g)
    q = qkv[:, : heads * head_dim].view(total, heads, head_dim)
    starts = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return q, k, v, tables.to(torch.int32), torch.tensor(seq_lens, dtype=torch.int32), starts


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,block_size,q_lens,ctx_lens,window,softcap",
    [
        (9, 3, 64, 16, [5, 1, 17, 33, 170], [0, 3, 16, 40, 16], None, None),  # fresh, decode, continued chunks
        (8, 8, 32, 16, [64, 2], [0, 61], None, None),  # no GQA
        (12, 1, 64, 8, [7, 30, 1], [300, 0, 9], None, None),  # MQA (group 12: generic body), small blocks
        (4, 2, 128, 16, [40], [100], None, None),
        (6, 3, 24, 5, [13, 9], [0, 22], None, None),  # odd block size, head_dim 24
        (9, 3, 64, 16, [5, 1, 17, 33, 170], [0, 3, 16, 40, 16], 7, None),  # sliding window
        (9, 3, 64, 16, [5, 1, 17, 33, 70], [0, 3, 16, 40, 16], 32, 1.5),  # window on a block edge + soft-cap
    ],
)
def test_prefill_attention_bf16(heads, kv_heads, head_dim, block_size, q_lens, ctx_lens, window, softcap):
    q, k, v, tables, seq_lens, starts = _prefill_case(heads, kv_heads, head_dim, block_size, q_lens, ctx_lens)
    scale = head_dim**-0.5
    out = paged_prefill_attention_c(PagedAttentionInputs(q, k, v, tables, seq_lens, starts, scale, window, softcap))
    exact = paged_prefill_attention_ref(
        PagedAttentionInputs(q.float(), k.float(), v.float(), tables, seq_lens, starts, scale, window, softcap)
    )
    assert_rounded_once(out, exact)
    ref16 = paged_prefill_attention_ref(PagedAttentionInputs(q, k, v, tables, seq_lens, starts, scale, window, softcap))
    assert_no_worse_than(out, ref16, exact, atol=2e-2)


def test_attention_refuses_mixed_dtypes():
    q, k, v, tables, seq_lens = _decode_case(9, 3, 64, 16, [5, 9])
    with pytest.raises(ValueError, match="float32 or bfloat16 CPU tensors of one dtype"):
        paged_decode_attention_c(PagedAttentionInputs(q, k.float(), v.float(), tables, seq_lens, None, 0.125))
    with pytest.raises(ValueError, match="float32 or bfloat16 CPU tensors of one dtype"):
        paged_decode_attention_c(PagedAttentionInputs(q.half(), k.half(), v.half(), tables, seq_lens, None, 0.125))
    q, k, v, tables, seq_lens, starts = _prefill_case(9, 3, 64, 16, [5, 9], [0, 3])
    with pytest.raises(ValueError, match="float32 or bfloat16 CPU tensors of one dtype"):
        paged_prefill_attention_c(PagedAttentionInputs(q.float(), k, v, tables, seq_lens, starts, 0.125))
    with pytest.raises(ValueError, match=r"out must be a contiguous torch\.bfloat16"):
        paged_prefill_attention_c(
            PagedAttentionInputs(q, k, v, tables, seq_lens, starts, 0.125), out=torch.zeros(q.shape)
        )


# ------------------------------------------------------------------------------------------ elementwise
@pytest.mark.parametrize("rows,dim", [(1, 576), (7, 64), (300, 100), (2048, 576), (3, 13)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_bf16(rows, dim, with_delta):
    g = torch.Generator().manual_seed(rows + dim)
    residual = _bf16_randn(rows, dim, generator=g, scale=3)
    delta = _bf16_randn(rows, dim, generator=g) if with_delta else None
    weight = _bf16_randn(dim, generator=g)
    res_ref, res_c = residual.clone(), residual.clone()
    ref = add_rms_norm_ref(res_ref, delta, weight, 1e-5)
    out = add_rms_norm_c(res_c, delta, weight, 1e-5)
    assert torch.equal(res_c, res_ref)  # the residual update is one add, rounded as torch rounds it
    # transformers' order: the normalised row rounded to bfloat16, times the weight, rounded again; the
    # kernel does the same, so only the float32 sum of squares' order differs
    ulp = 2.0 ** (torch.floor(torch.log2(ref.float().abs().clamp_min(1e-30))) - 7)
    assert bool(((out.float() - ref.float()).abs() <= ulp).all())
    assert float((out == ref).float().mean()) >= 0.98
    assert torch.equal(add_rms_norm(residual.clone(), delta, weight, 1e-5), out)  # the dispatcher takes C


@pytest.mark.parametrize("rows,heads,head_dim,stride_extra", [(1, 12, 64, 128), (37, 4, 32, 0), (300, 3, 16, 8)])
def test_rope_bf16(rows, heads, head_dim, stride_extra):
    g = torch.Generator().manual_seed(rows)
    max_pos = 512
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(BF16), emb.sin().to(BF16)
    qkv = _bf16_randn(rows, heads * head_dim + stride_extra, generator=g)
    positions = torch.randint(0, max_pos, (rows,), generator=g)
    out, ref16, exact = qkv.clone(), qkv.clone(), qkv.float()
    rope_c(out, heads, head_dim, cos, sin, positions)
    rope_ref(ref16, heads, head_dim, cos, sin, positions)
    rope_ref(exact, heads, head_dim, cos.float(), sin.float(), positions)
    assert_rounded_once(out, exact)
    assert_no_worse_than(out, ref16, exact, atol=2e-2)
    assert torch.equal(out[:, heads * head_dim :], qkv[:, heads * head_dim :])  # the v heads untouched
    again = qkv.clone()
    rope_(again, heads, head_dim, cos, sin, positions)
    assert torch.equal(again, out)


@pytest.mark.parametrize("rows,inter", [(1, 1536), (9, 100), (64, 13)])
def test_silu_mul_bf16(rows, inter):
    g = torch.Generator().manual_seed(inter)
    gate_up = _bf16_randn(rows, 2 * inter, generator=g, scale=4)
    out = silu_mul_c(gate_up, inter)
    ref = silu_mul_ref(gate_up, inter)  # F.silu rounds to bfloat16 before the product, as the kernel does
    ulp = 2.0 ** (torch.floor(torch.log2(ref.float().abs().clamp_min(1e-30))) - 7)
    assert bool(((out.float() - ref.float()).abs() <= ulp).all())
    assert float((out == ref).float().mean()) >= 0.98
    assert torch.equal(silu_mul(gate_up, inter), out)


@pytest.mark.parametrize("rows,inter", [(1, 2048), (9, 100)])
def test_gelu_tanh_mul_bf16(rows, inter):
    g = torch.Generator().manual_seed(inter)
    gate_up = _bf16_randn(rows, 2 * inter, generator=g, scale=4)
    out = gelu_tanh_mul_c(gate_up, inter)
    # GELU rounded to bfloat16 before the product, as transformers' bfloat16 module and the kernel do; from float64
    # (torch's float32 tanh form cancels in the negative tail, where the kernel's sigmoid form does not)
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    ref = F.gelu(gate.double(), approximate="tanh").to(BF16) * up
    # (below 1e-6 absolute: the far negative tail, ~1e-20 here and 0 in float64's tanh form, which saturates too)
    ulp = 2.0 ** (torch.floor(torch.log2(ref.float().abs().clamp_min(1e-6))) - 7)
    assert bool(((out.float() - ref.float()).abs() <= ulp).all())
    visible = ref.float().abs() >= 1e-6
    assert float((out == ref)[visible].float().mean()) >= 0.98
    torch_ref = gelu_tanh_mul_ref(gate_up, inter)  # and torch's bfloat16 module where it does not cancel
    assert float((out == torch_ref)[visible].float().mean()) >= 0.95


def test_rounding_is_torchs_bit_for_bit_across_the_range():
    """The kernels' float32 -> bfloat16 rounding is torch's own, for every magnitude: huge sums that round to
    inf, subnormal results (which AVX512-BF16's conversion instruction would flush to zero), ties to even.
    The residual update (vector and scalar tails) and the SiLU product's stores round exactly as torch's
    bfloat16 add and multiply do."""
    g = torch.Generator().manual_seed(11)
    scales = torch.tensor([1e-39, 1e-36, 1e-3, 1.0, 1e3, 1e37, 3e38]).repeat_interleave(37)
    residual = (torch.randn(scales.numel(), generator=g) * scales).to(BF16).view(7, 37)
    delta = (torch.randn(scales.numel(), generator=g) * scales).to(BF16).view(7, 37)
    res_c, res_ref = residual.clone(), residual.clone()
    add_rms_norm_c(res_c, delta, torch.ones(37, dtype=BF16), 1e-6)
    res_ref.add_(delta)
    same_bits = res_c.view(torch.int16) == res_ref.view(torch.int16)
    assert bool((same_bits | (res_c.isnan() & res_ref.isnan())).all())  # inf - inf: a NaN either way
    assert bool((res_ref.float().abs() < 1.17e-38).any() & (res_ref != 0).any())  # subnormals were made
    gate = torch.full((7, 37), 30.0)  # silu(30) = 30 exactly in bfloat16
    gate_up = torch.cat([gate.to(BF16), delta], dim=1)
    out = silu_mul_c(gate_up, 37)
    ref = silu_mul_ref(gate_up, 37)
    assert bool(((out.view(torch.int16) == ref.view(torch.int16)) | (out.isnan() & ref.isnan())).all())


def test_elementwise_refuses_mixed_dtypes():
    residual = torch.randn(4, 32).to(BF16)
    with pytest.raises(ValueError, match="one dtype"):
        add_rms_norm_c(residual, None, torch.randn(32), 1e-6)
    # the dispatcher takes the reference for mixed dtypes instead
    expect = add_rms_norm_ref(residual.clone(), None, torch.randn(32, generator=torch.Generator().manual_seed(0)), 1e-6)
    got = add_rms_norm(residual.clone(), None, torch.randn(32, generator=torch.Generator().manual_seed(0)), 1e-6)
    assert torch.equal(got, expect)


# ------------------------------------------------------------------------------------------ LoRA
def _lora_weights(widths: list[int], in_features: int, ranks: list[int], seed: int):
    """test_cpu_lora's slot weights at rank 16, scaled down by 10 (bf16 activations stay well inside range)."""
    a, bt, offsets, rank_tensor = _weights(len(ranks), widths, in_features, 16, ranks, seed)
    return a * 0.1, bt * 0.1, offsets, rank_tensor


@pytest.mark.parametrize("weight_dtype", [torch.float32, BF16, torch.float16])
@pytest.mark.parametrize(
    "widths,in_features,indices",
    [
        ([576, 192, 192], 576, [3, -1, 0, 3, 3, 1, -1, 2, 0]),  # qkv slices, decode-like, base rows
        ([1536, 1536], 576, [1] * 7 + [2] * 20),  # gate_up, full tiles of 8 tokens
        ([40, 13], 37, [0, 1, 2, 3, 0, 1]),  # widths and in_features off the vector width
        ([40, 13], 37, [0] * 9 + [1] * 8 + [2] * 16),
    ],
)
def test_lora_bf16_activations(widths, in_features, indices, weight_dtype):
    a, bt, offsets, ranks = _lora_weights(widths, in_features, [16, 8, 3, 0], seed=len(indices))
    a, bt = a.to(weight_dtype), bt.to(weight_dtype)
    g = torch.Generator().manual_seed(7)
    x = _bf16_randn(len(indices), in_features, generator=g)
    y0 = _bf16_randn(len(indices), sum(widths), generator=g)
    mapping = LoRABatchMapping.build(indices, 4)
    out = lora_apply_c(x, y0.clone(), a, bt, mapping, offsets, ranks)
    exact = lora_apply_ref(x.float(), y0.float(), a.float(), bt.float(), mapping, offsets, ranks)
    assert_rounded_once(out, exact)
    ref16 = lora_apply_ref(x, y0.clone(), a, bt, mapping, offsets, ranks)
    assert_no_worse_than(out, ref16, exact, atol=3e-2)
    base_rows = torch.tensor(indices) < 0
    assert torch.equal(out[base_rows], y0[base_rows])  # rows without adapter untouched, bit for bit
    assert not torch.equal(out[~base_rows], y0[~base_rows])


def test_lora_step_checks_the_activation_dtype():
    a, bt, offsets, ranks = _lora_weights([8], 8, [4, 4], seed=1)
    mapping = LoRABatchMapping.build([0, 1], 2)
    step = CLoRAStep({"g": (a.to(BF16)[None], bt.to(BF16)[None], offsets)}, mapping, ranks, activation_dtype=BF16)
    with pytest.raises(ValueError, match=r"takes torch\.bfloat16 CPU tensors"):
        step.apply("g", 0, torch.randn(2, 8), torch.randn(2, 8))
    with pytest.raises(ValueError, match="float32 or bfloat16 activations"):
        CLoRAStep({"g": (a[None], bt[None], offsets)}, mapping, ranks, activation_dtype=torch.float16)
    with pytest.raises(ValueError, match="float32 or bfloat16 CPU activations"):
        lora_apply_c(torch.randn(2, 8).to(BF16), torch.randn(2, 8), a, bt, mapping, offsets, ranks)
