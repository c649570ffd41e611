"""The C residual-add + RMSNorm, rotary and SiLU- and GELU-gated product kernels against their torch references, and
their refusals."""

from __future__ import annotations

import pytest
import torch

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
from tests.c_kernels import needs_c_kernels
from tests.kernels.dispatch import add_rms_norm, rope_, silu_mul

pytestmark = needs_c_kernels


@pytest.mark.parametrize("rows,dim", [(1, 576), (7, 64), (300, 100), (2048, 576)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_matches_reference(rows, dim, with_delta):
    g = torch.Generator().manual_seed(rows + dim)
    residual = torch.randn(rows, dim, generator=g) * 3
    delta = torch.randn(rows, dim, generator=g) if with_delta else None
    weight = torch.randn(dim, generator=g)
    res_ref, res_c = residual.clone(), residual.clone()
    ref = add_rms_norm_ref(res_ref, delta, weight, 1e-5)
    out = add_rms_norm_c(res_c, delta, weight, 1e-5)
    assert torch.allclose(res_c, res_ref, rtol=0, atol=0)  # the residual update is one exact add
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6), (out - ref).abs().max()


def test_add_rms_norm_dispatch_falls_back_for_other_dtypes():
    residual = torch.randn(5, 32, dtype=torch.float64)
    delta = torch.randn(5, 32, dtype=torch.float64)
    weight = torch.randn(32, dtype=torch.float64)
    expect = add_rms_norm_ref(residual.clone(), delta, weight, 1e-6)
    assert torch.equal(add_rms_norm(residual, delta, weight, 1e-6), expect)
    with pytest.raises(ValueError, match="float32"):
        add_rms_norm_c(residual, delta, weight, 1e-6)


def test_add_rms_norm_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="delta"):
        add_rms_norm_c(torch.randn(4, 8), torch.randn(4, 9), torch.randn(8), 1e-6)
    with pytest.raises(ValueError, match="weight"):
        add_rms_norm_c(torch.randn(4, 8), None, torch.randn(9), 1e-6)


def _tables(max_pos: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    emb = torch.outer(torch.arange(max_pos).float(), inv).repeat(1, 2)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("rows,heads,kv_extra,head_dim", [(1, 12, 3, 64), (37, 4, 0, 16), (300, 6, 2, 128)])
def test_rope_matches_reference(rows, heads, kv_extra, head_dim):
    g = torch.Generator().manual_seed(rows)
    # rows wider than the rotated heads, like a fused qkv row whose v heads stay untouched
    qkv = torch.randn(rows, (heads + kv_extra) * head_dim, generator=g)
    cos, sin = _tables(512, head_dim)
    positions = torch.randint(0, 512, (rows,), generator=g)
    ref, out = qkv.clone(), qkv.clone()
    rope_ref(ref, heads, head_dim, cos, sin, positions)
    rope_c(out, heads, head_dim, cos, sin, positions)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6), (out - ref).abs().max()
    assert torch.equal(out[:, heads * head_dim :], qkv[:, heads * head_dim :])
    unchecked = qkv.clone()  # the engine's later layers skip the positions check
    rope_c(unchecked, heads, head_dim, cos, sin, positions, check_positions=False)
    assert torch.equal(unchecked, out)


def test_rope_on_a_strided_view_and_the_dispatcher():
    qkv = torch.randn(9, 5 * 32)
    view = qkv[:, 32:]  # unit-stride rows that start inside a wider row
    cos, sin = _tables(64, 32)
    positions = torch.arange(9)
    ref = view.clone()
    rope_ref(ref, 3, 32, cos, sin, positions)
    rope_(view, 3, 32, cos, sin, positions)
    assert torch.allclose(qkv[:, 32:], ref, rtol=1e-5, atol=1e-6)


def test_rope_refuses_positions_outside_the_tables():
    cos, sin = _tables(16, 8)
    with pytest.raises(ValueError, match="positions"):
        rope_c(torch.randn(2, 16), 2, 8, cos, sin, torch.tensor([3, 16]))
    with pytest.raises(ValueError, match="one position per row"):
        rope_c(torch.randn(2, 16), 2, 8, cos, sin, torch.tensor([3]))


@pytest.mark.parametrize("rows,inter", [(1, 1536), (64, 1536), (2048, 1536), (5, 13)])
def test_silu_mul_matches_reference(rows, inter):
    g = torch.Generator().manual_seed(rows + inter)
    gate_up = torch.randn(rows, 2 * inter, generator=g) * 6  # both tails of the sigmoid, e^-|g| near underflow
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    ref = silu_mul_ref(gate_up, inter)
    out = silu_mul_c(gate_up, inter)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6), (out - ref).abs().max()
    assert torch.equal(silu_mul(gate_up, inter), out)


@pytest.mark.parametrize("rows,inter", [(1, 2048), (64, 640), (5, 13)])
def test_gelu_tanh_mul_matches_reference(rows, inter):
    """GeGLU (Gemma): transformers' gelu_pytorch_tanh computed as g * sigmoid(2u); both tails, zero, huge values."""
    g = torch.Generator().manual_seed(rows * inter)
    gate_up = torch.randn(rows, 2 * inter, generator=g) * 6
    gate_up[0, :6] = torch.tensor([-100.0, 100.0, 0.0, -0.0, 1e-4, -3e4])
    ref = gelu_tanh_mul_ref(gate_up, inter)
    out = gelu_tanh_mul_c(gate_up, inter)
    # against float64 (torch's float32 tanh form cancels in the negative tail: 1 + tanh(u) near 0, off by up to
    # ~1e-5 there, where the sigmoid form keeps its relative precision); and within that of torch's float32
    exact = gelu_tanh_mul_ref(gate_up.double(), inter)
    assert torch.allclose(out.double(), exact, rtol=2e-6, atol=1e-12), (out.double() - exact).abs().max()
    assert torch.allclose(out, ref, rtol=1e-5, atol=2e-5), (out - ref).abs().max()
    assert torch.equal(out[0, :4], ref[0, :4])  # exact at zero and in the saturated tails


def test_silu_mul_refuses_a_width_that_is_not_two_halves():
    with pytest.raises(ValueError, match="2 \\* 10"):
        silu_mul_c(torch.randn(3, 21), 10)
