"""engine.model.linear.Linear: the oneDNN-packed CPU projection equals F.linear; the fallback is F.linear itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraplex.engine.model import linear
from loraplex.engine.model.linear import Linear, onednn_linear_available


@pytest.mark.parametrize("rows", [0, 1, 7, 64, 300])
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (3072, 576), (33, 17)])
def test_matches_f_linear_in_float32(rows, shape):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(*shape, generator=g)
    x = torch.randn(rows, shape[1], generator=g)
    lin = Linear(w)
    assert lin.packed == onednn_linear_available(torch.float32)
    y = lin(x)
    assert y.shape == (rows, shape[0]) and y.dtype == torch.float32
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_non_contiguous_input_rows():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 40, generator=g)
    x = torch.randn(10, 100, generator=g)[:, 20:60]
    torch.testing.assert_close(Linear(w)(x), F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_bfloat16_follows_the_weight_dtype():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g).bfloat16()
    x = torch.randn(5, 32, generator=g).bfloat16()
    y = Linear(w)(x)
    assert y.dtype == torch.bfloat16
    # Both paths accumulate in float32 and round the result to bfloat16 once: each output is within one
    # bfloat16 unit in the last place (8 significant bits) of the exact product of the bfloat16 inputs.
    exact = x.double() @ w.double().T
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    for out in (y, F.linear(x, w)):
        assert ((out.double() - exact).abs() <= ulp).all()


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("LORAPLEX_ONEDNN", "0")
    linear.onednn_linear_available.cache_clear()
    try:
        lin = Linear(torch.randn(8, 4))
        assert not lin.packed
    finally:
        monkeypatch.delenv("LORAPLEX_ONEDNN")
        linear.onednn_linear_available.cache_clear()
