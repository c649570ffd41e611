"""int8 weights per output channel (kernels/int8_channel.py): the quantizer, every build of the C kernel (AVX-512,
8-float vectors, AVX2's int8 products, plain C) against the torch reference, with float and int8 activations."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels import cpu_build, cpu_features, int8_channel, quant
from loraplex.kernels.int8_channel import (
    Int8Weight,
    dequantize_int8_channel,
    int8_matmul,
    int8_matmul_c,
    int8_matmul_ref,
    quantize_int8_channel,
)
from tests.c_kernels import c_kernels_missing, needs_c_kernels
from tests.device import TEST_DEVICE
from tests.kernels.test_cpu_quant import _assert_close, _int8_path_expected, _tie_rows

ROWS = (1, 2, 3, 4, 5, 17, 70)  # 4 rows of x at a time, and partial groups of them


def random_weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A quantized random weight whose rows span scales from tiny to large, its last row raw int8 bytes (-128
    included, which the quantizer never writes but the kernel must read)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-3, 1, n)[:, None]
    q, scale = quantize_int8_channel(w)
    q[-1] = torch.randint(-128, 128, (k,), generator=g, dtype=torch.int8)
    return q, scale


def test_quantize_int8_channel():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 96, generator=g) * torch.tensor([1e-4, 0.1, 1.0, 10.0, 1e3, 0.0])[:, None]
    w[2, 5] = -7.5  # its row's largest |w|: -127 exactly
    q, scale = quantize_int8_channel(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (6,)
    assert torch.equal(scale, w.abs().amax(1) / 127)
    assert int(q[2, 5]) == -127 and int(q.abs().max()) == 127 and int(q.min()) >= -127
    assert torch.equal(q[5], torch.zeros(96, dtype=torch.int8)) and float(scale[5]) == 0.0
    err = (dequantize_int8_channel(q, scale) - w).abs()
    assert bool((err <= scale[:, None] / 2 * (1 + 1e-6)).all())  # each weight within half a step
    assert torch.equal(quantize_int8_channel(w.bfloat16())[1], w.bfloat16().float().abs().amax(1) / 127)


def test_reference_is_the_dequantized_product():
    q, scale = random_weight(9, 64, seed=2)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    dense = dequantize_int8_channel(q, scale)
    _assert_close(int8_matmul_ref(x, q, scale), x @ dense.T, torch.float32)
    y8 = int8_matmul_ref(x, q, scale, int8_activations=True)
    rounded_x = torch.stack([quant.quantize_activations(r[None])[0].float() for r in x])  # [3, 1, 2, 32]
    dx = quant.quantize_activations(x)[1]
    xq = (rounded_x[:, 0] * dx[..., None]).reshape(3, 64)  # x as the int8 path sees it
    _assert_close(y8, xq @ dense.T, torch.float32)
    assert (y8 - x @ dense.T).abs().max() > 1e-4  # x's rounding shows


@needs_c_kernels
@pytest.mark.parametrize("variant", sorted(quant._VARIANT_FLAGS))
def test_every_path_matches_reference(variant):
    """Each build a CPU may run, on this one: float activations (k not a multiple of the vector width included:
    the tails; one row of x has a path of its own), int8 activations (an odd number of groups: the 512-bit path's
    tail; ties in x's rounding), float32 and bfloat16 x, one to 70 rows of x, output rows not a multiple of 4."""
    lib = int8_channel._library(variant)
    flags = cpu_features.cpu_flags()
    expected_width = {"scalar": 0, "vw8": 8, "avx2": 8, "native": 16 if "avx512f" in flags else 8}[variant]
    assert lib.loraplex_int8_vector_width() == expected_width
    assert lib.loraplex_int8_int8_path() == _int8_path_expected(variant)
    g = torch.Generator().manual_seed(4)
    for n, k in ((7, 32), (37, 37 * 32), (38, 70), (9, 56)):  # (56: one lone vector after the pairs, 16 or 8 wide)
        q, scale = random_weight(n, k, seed=n + k)
        for m in ROWS:
            rows = torch.randn(m, k, generator=g)
            if k % 32 == 0:
                rows = torch.cat((rows[: m - 1], _tie_rows(k)[:1]))
            for dtype in (torch.float32, torch.bfloat16):
                x = rows.to(dtype)
                ref32 = int8_matmul_ref(x.float(), q, scale)
                _assert_close(int8_channel._run_c(lib, x, q, scale), ref32, dtype)
                if k % 32 == 0:
                    ref8 = int8_matmul_ref(x.float(), q, scale, int8_activations=True)
                    _assert_close(int8_channel._run_c(lib, x, q, scale, int8_activations=True), ref8, dtype)
                    assert ((ref8 - ref32).abs().max() / ref32.abs().max()) < 0.05  # x's int8 rounding: ~1%


@needs_c_kernels
def test_int8_weight_is_int8_matmul_prepared():
    """Int8Weight gives int8_matmul_c's results, also written into columns of a wider matrix (out=)."""
    q, scale = random_weight(37, 256, seed=5)
    g = torch.Generator().manual_seed(6)
    for int8 in (False, True):
        weight = Int8Weight(q, scale, int8_activations=int8)
        for m in (1, 5, 70):
            for dtype in (torch.float32, torch.bfloat16):
                x = torch.randn(m, 256, generator=g).to(dtype)
                expected = int8_matmul_c(x, q, scale, int8)
                assert torch.equal(weight(x), expected)
                assert torch.equal(int8_matmul(x, q, scale, int8), expected)  # the dispatch takes the C kernel
                wide = torch.full((m, 50), 7.0, dtype=dtype)
                got = weight(x, out=wide[:, 5:42])
                assert got.data_ptr() == wide[:, 5:42].data_ptr() and torch.equal(got, expected)
                assert bool((wide[:, :5] == 7).all() and (wide[:, 42:] == 7).all())
    assert int8_matmul_c(torch.randn(0, 256), q, scale).shape == (0, 37)
    x = torch.randn(256, 3).t()  # not contiguous: copied
    _assert_close(int8_matmul_c(x, q, scale), int8_matmul_ref(x, q, scale), torch.float32)
    with pytest.raises(ValueError, match=r"out must be a CPU torch.float32 \[3, 37\] with contiguous rows"):
        Int8Weight(q, scale)(x, out=torch.empty(37, 3).t())


def test_off_the_cpu_the_reference_serves():
    """LORAPLEX_TEST_DEVICE=cuda: weights on the GPU, the torch reference there."""
    q, scale = random_weight(6, 64, seed=7)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(8))
    for int8 in (False, True):
        expected = int8_matmul_ref(x, q, scale, int8)
        weight = Int8Weight(q.to(TEST_DEVICE), scale.to(TEST_DEVICE), int8)
        _assert_close(weight(x.to(TEST_DEVICE)).cpu(), expected, torch.float32)
        out = torch.empty(2, 6, device=TEST_DEVICE)
        assert weight(x.to(TEST_DEVICE), out=out) is out
        _assert_close(out.cpu(), expected, torch.float32)


def test_without_c_kernels_the_reference_serves(monkeypatch):
    monkeypatch.setenv("LORAPLEX_CPU_KERNELS", "0")
    monkeypatch.setattr(cpu_build, "_loaded", {})
    q, scale = random_weight(3, 64, seed=9)
    x = torch.randn(2, 64)
    assert int8_channel.int8_kernel_available() is False
    with pytest.raises(RuntimeError, match="not available"):
        int8_matmul_c(x, q, scale)
    assert torch.equal(int8_matmul(x, q, scale, True), int8_matmul_ref(x, q, scale, True))
    assert torch.equal(Int8Weight(q, scale)(x), int8_matmul_ref(x, q, scale))


def test_bad_inputs_are_named():
    q, scale = random_weight(3, 64, seed=10)
    x = torch.randn(2, 64)
    checked = [int8_matmul_ref, int8_matmul] + ([int8_matmul_c] if c_kernels_missing() is None else [])
    for fn in checked:
        with pytest.raises(ValueError, match=r"int8 weights must be int8 \[n, k\], got torch.uint8"):
            fn(x, q.view(torch.uint8), scale)
        with pytest.raises(ValueError, match=r"scales must be float32 \[3\], got torch.float32 \(2,\)"):
            fn(x, q, scale[:2])
        with pytest.raises(ValueError, match=r"x must be \[m, k=64\], got \(2, 32\)"):
            fn(torch.randn(2, 32), q, scale)
        with pytest.raises(ValueError, match=r"x must be float32 or bfloat16, got torch.float64"):
            fn(x.double(), q, scale)
        q40, s40 = quantize_int8_channel(torch.randn(3, 40))
        with pytest.raises(ValueError, match="per group of 32: k=40 is not a multiple of 32"):
            fn(torch.randn(2, 40), q40, s40, True)
    with pytest.raises(ValueError, match="per group of 32: k=40"):
        Int8Weight(q40, s40, int8_activations=True)
    with pytest.raises(ValueError, match="takes a float"):
        quantize_int8_channel(torch.ones(2, 32, dtype=torch.int32))
