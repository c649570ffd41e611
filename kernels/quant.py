"""Matrix products with GGUF-quantized weights, beside their torch reference with the same signature.

A weight ``[n out, k in]`` stays in its GGUF blocks as a GGUF file stores it: ``blocks`` is uint8 ``[n,
row_bytes(qtype, k)]``, each row ``k / block`` blocks of the format (layouts: ``csrc/quant_matmul.c``).
``quant_matmul(x, blocks, qtype, k)`` is ``x @ W.T`` for float32 or bfloat16 ``x [m, k]`` (``QuantWeight``: the
same, prepared once per weight for repeated calls): on the CPU the C kernel reads each block once per call and
widens it to float32 on the fly (decode reads 4.5 to 8.5 bits a weight, against float32's 32; from 48 rows of x
it widens panels of the weight for a blocked GEMM); elsewhere, or without the C kernels, the reference
de-quantizes the whole weight (``dequantize_ref``, pure torch, any device) and multiplies in float32.

``int8_activations=True`` computes as llama.cpp does on the CPU: x quantized per group of 32 to int8 with a
float16 scale (``quantize_activations``), each group's product with the weight's integers (``integer_groups``) an
exact integer sum (VNNI's vpdpbusd, AVX2's vpmaddubsw), scaled in float. ~2x faster for a few rows of x (decode),
at the cost of x's int8 rounding (~0.5-1% of the result); the torch reference computes the same integers.

``interleave_x16`` lays a Q8_0, Q4_0 or Q4_1 weight out in panels of 16 rows (the same bytes, permuted) for the
interleaved int8 kernel (AVX-512 VNNI: ``QuantWeight(..., interleaved=True)``), whose lanes run over 16 output
rows so that a group's scales cost one vector operation for 16 rows; ``deinterleave_x16`` undoes it, and
``interleaved_rows`` reads a few rows back (an embedding tied to an interleaved LM head).

``quantize_q8_0`` makes Q8_0 blocks from float weights (``--quantization q8_0``), bit for bit as llama.cpp's
reference quantizer and the ``gguf`` package do.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from .cpu_build import load

__all__ = [
    "QUANT_TYPES",
    "X16_TYPES",
    "QuantWeight",
    "block_shape",
    "cpu_quant_kernel_available",
    "deinterleave_x16",
    "dequantize_ref",
    "integer_groups",
    "interleave_x16",
    "interleaved_kernel_available",
    "interleaved_rows",
    "quant_matmul",
    "quant_matmul_c",
    "quant_matmul_ref",
    "quantize_activations",
    "quantize_q8_0",
    "row_bytes",
]

# C's qtype is the index here: new formats are appended
QUANT_TYPES: tuple[str, ...] = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "Q5_0", "Q5_1")
_BLOCKS = {
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q4_K": (256, 144),
    "Q6_K": (256, 210),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
}
_QTYPE_INDEX = {name: i for i, name in enumerate(QUANT_TYPES)}
_ACTIVATIONS = (torch.float32, torch.bfloat16)

# builds of the kernel: the default one, and the vector paths switched off for the tests (every path, one CPU)
_VARIANT_FLAGS: dict[str, tuple[str, ...]] = {
    "native": (),
    "vw8": ("-DLORAPLEX_QUANT_VW8",),  # 8-float vectors even where AVX-512 gives 16
    "avx2": ("-DLORAPLEX_QUANT_VW8", "-DLORAPLEX_QUANT_NO_VNNI"),  # and AVX2's int8 products, not VNNI's
    "scalar": ("-DLORAPLEX_QUANT_SCALAR",),  # plain C only
}
_p, _i64, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_BF16_FLAG = {torch.float32: _int(0), torch.bfloat16: _int(1)}  # the kernel's bf16 argument, per x dtype
_ONE_ROW = _i64(1)
_SIGNATURES = {
    "loraplex_quant_matmul": (_int, [_p, _int, _p, _int, _i64, _i64, _i64, _p, _i64, _int]),
    "loraplex_quant_matmul_int8": (_int, [_p, _int, _p, _int, _i64, _i64, _i64, _p, _i64, _int]),
    "loraplex_quant_matmul_int8_x16": (_int, [_p, _int, _p, _int, _i64, _i64, _i64, _p, _i64, _int]),
    "loraplex_quant_x16_available": (_int, [_int]),
    "loraplex_quant_vector_width": (_int, []),
    "loraplex_quant_int8_path": (_int, []),
}


def block_shape(qtype: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of ``qtype``."""
    try:
        return _BLOCKS[qtype]
    except KeyError:
        raise ValueError(f"unknown quantization type {qtype!r}: expected one of {', '.join(QUANT_TYPES)}") from None


def row_bytes(qtype: str, k: int) -> int:
    """Bytes of one row of ``k`` elements of ``qtype`` (``k`` a multiple of the block)."""
    elems, nbytes = block_shape(qtype)
    if k <= 0 or k % elems:
        raise ValueError(f"{qtype} rows hold whole blocks of {elems} elements: k={k} is not a positive multiple")
    return k // elems * nbytes


def _check_blocks(blocks: torch.Tensor, qtype: str, k: int) -> None:
    width = row_bytes(qtype, k)
    if blocks.dtype != torch.uint8 or blocks.ndim != 2 or blocks.shape[1] != width:
        raise ValueError(
            f"{qtype} blocks for k={k} must be uint8 [n, {width}], got {blocks.dtype} {tuple(blocks.shape)}"
        )


def _check_x(x: torch.Tensor, k: int) -> None:
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [m, k={k}], got {tuple(x.shape)}")
    if x.dtype not in _ACTIVATIONS:
        raise ValueError(f"x must be float32 or bfloat16, got {x.dtype}")


def output_rows(out: torch.Tensor | None, m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The [m, n] CPU output a prepared weight's C kernel writes: a new one, or `out` once checked (rows
    contiguous, each at least n apart: the kernel writes through its row stride)."""
    if out is None:
        return torch.empty((m, n), dtype=dtype)
    if (
        out.shape != (m, n)
        or out.dtype != dtype
        or not out.is_cpu
        or out.stride(1) != 1
        or (m > 1 and out.stride(0) < n)
    ):
        raise ValueError(
            f"out must be a CPU {dtype} [{m}, {n}] with contiguous rows, got {out.dtype} "
            f"{tuple(out.shape)} on {out.device} with strides {out.stride()}"
        )
    return out


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] bytes holding a little-endian float16 -> float32 [..., 1]"""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16 j] bytes -> [..., 2, 16 j] values: low nibbles first, then the high ones"""
    return torch.stack((qs & 15, qs >> 4), dim=-2)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """[..., 4] bytes of a little-endian uint32 -> [..., 32] values 0 or 16: bit j is element j's fifth bit"""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return (((qh[..., None] >> shifts) & 1) << 4).reshape(*qh.shape[:-1], 32)


def _q4_k_scales_mins(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K super-blocks [blocks, 144] -> the 6-bit scales and mins of their 8 sub-blocks, int32 [blocks, 8] each"""
    s = b[:, 4:16].to(torch.int32)
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = torch.cat((lo & 63, (hi & 15) | ((lo >> 2) & 48)), dim=1)
    mins = torch.cat((mid & 63, (hi >> 4) | ((mid >> 2) & 48)), dim=1)
    return scales, mins


def _q6_k_values(b: torch.Tensor) -> torch.Tensor:
    """Q6_K super-blocks [blocks, 210] -> their 256 unsigned 6-bit values, uint8 [blocks, 256] (0..63; the value
    is this minus 32)"""
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=b.device)
    ql = (b[:, :128].reshape(-1, 2, 1, 64) >> shifts.view(1, 1, 2, 1)) & 15
    qh_shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device)
    qh = (b[:, 128:192].reshape(-1, 2, 1, 32) >> qh_shifts.view(1, 1, 4, 1)) & 3
    return ql.reshape(-1, 256) | (qh.reshape(-1, 256) << 4)


def dequantize_ref(blocks: torch.Tensor, qtype: str, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight ``[n, k]`` in ``dtype``, on ``blocks``' device (pure torch). In float32 it equals
    ``gguf.quants.dequantize`` bit for bit: the same float32 operations in the same order."""
    _check_blocks(blocks, qtype, k)
    elems, nbytes = _BLOCKS[qtype]
    n = blocks.shape[0]
    b = blocks.reshape(n * (k // elems), nbytes)
    if qtype == "Q8_0":
        w = b[:, 2:].view(torch.int8).float() * _f16(b[:, :2])
    elif qtype == "Q4_0":
        w = _f16(b[:, :2]) * (_nibbles(b[:, 2:]).reshape(-1, 32).view(torch.int8) - 8).float()
    elif qtype == "Q4_1":
        w = _f16(b[:, :2]) * _nibbles(b[:, 4:]).reshape(-1, 32).float() + _f16(b[:, 2:4])
    elif qtype == "Q5_0":
        q = _nibbles(b[:, 6:]).reshape(-1, 32) | _fifth_bits(b[:, 2:6])
        w = _f16(b[:, :2]) * (q.view(torch.int8) - 16).float()
    elif qtype == "Q5_1":
        q = _nibbles(b[:, 8:]).reshape(-1, 32) | _fifth_bits(b[:, 4:8])
        w = _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])
    elif qtype == "Q4_K":
        scales, mins = _q4_k_scales_mins(b)  # [blocks, 8 sub-blocks]
        scale, low = scales.float(), mins.float()
        q = _nibbles(b[:, 16:].reshape(-1, 4, 32)).reshape(-1, 8, 32).float()
        d, dmin = (_f16(b[:, 0:2]) * scale)[..., None], (_f16(b[:, 2:4]) * low)[..., None]
        w = d * q - dmin
    else:  # Q6_K
        q = _q6_k_values(b).view(torch.int8) - 32
        d = (_f16(b[:, 208:210]) * b[:, 192:208].view(torch.int8).float())[..., None]  # [blocks, 16, 1]
        w = d * q.reshape(-1, 16, 16).float()
    return w.reshape(n, k).to(dtype)


def integer_groups(blocks: torch.Tensor, qtype: str, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weight as integers per group of 32 elements: ``(q, scale, low)``, int32 ``[n, k / 32, 32]`` and float32
    ``[n, k / 32]`` twice, with element ``e`` of group ``g`` of row ``r`` = ``scale[r, g] * q[r, g, e] + low[r, g]``
    exactly (in real arithmetic; Q6_K's per-16 integer scales are folded into q, Q4_K's 6-bit ones into scale)."""
    _check_blocks(blocks, qtype, k)
    elems, nbytes = _BLOCKS[qtype]
    n, groups = blocks.shape[0], k // 32
    b = blocks.reshape(n * (k // elems), nbytes)
    low = None
    if qtype == "Q8_0":
        q, scale = b[:, 2:].view(torch.int8).int(), _f16(b[:, :2])
    elif qtype in ("Q4_0", "Q4_1"):
        q, scale = _nibbles(b[:, nbytes - 16 :]).reshape(-1, 32).int(), _f16(b[:, :2])
        if qtype == "Q4_0":
            q = q - 8
        else:
            low = _f16(b[:, 2:4])
    elif qtype in ("Q5_0", "Q5_1"):
        q = (_nibbles(b[:, nbytes - 16 :]).reshape(-1, 32) | _fifth_bits(b[:, nbytes - 20 : nbytes - 16])).int()
        scale = _f16(b[:, :2])
        if qtype == "Q5_0":
            q = q - 16
        else:
            low = _f16(b[:, 2:4])
    elif qtype == "Q4_K":
        scales, mins = _q4_k_scales_mins(b)  # [blocks, 8 sub-blocks]
        sub_scale, sub_low = scales.float(), mins.float()
        q = _nibbles(b[:, 16:].reshape(-1, 4, 32)).reshape(-1, 8, 32).int()
        scale, low = _f16(b[:, 0:2]) * sub_scale, -(_f16(b[:, 2:4]) * sub_low)  # exact: 11 by 6 bits
    else:  # Q6_K
        q6 = _q6_k_values(b).int() - 32
        q = q6.reshape(-1, 16, 16) * b[:, 192:208].view(torch.int8).int()[..., None]
        scale = _f16(b[:, 208:210]).expand(-1, 8)
    scale = scale.reshape(n, groups)
    low = torch.zeros_like(scale) if low is None else low.reshape(n, groups)
    return q.reshape(n, groups, 32), scale, low


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float ``x [m, k]`` -> ``(q, d)``: int32 ``[m, k / 32, 32]`` in -127..127 and float32 ``[m, k / 32]``, x's
    groups of 32 quantized as llama.cpp quantizes activations to Q8_0 (``quantize_q8_0``: d = max|x| / 127 stored
    as float16, q = round(x / d) from the float32 d)."""
    m, k = x.shape
    b = quantize_q8_0(x).reshape(m * (k // 32), 34)
    return b[:, 2:].view(torch.int8).int().reshape(m, k // 32, 32), _f16(b[:, :2]).reshape(m, k // 32)


# interleave_x16: the formats, and each one's block fields (float16 scales first, then the quants) in bytes
X16_TYPES: tuple[str, ...] = ("Q8_0", "Q4_0", "Q4_1")
_X16_SCALE_BYTES = {"Q8_0": 2, "Q4_0": 2, "Q4_1": 4}


def _x16_view(blocks: torch.Tensor, qtype: str, k: int) -> tuple[int, int, int]:
    """(panels, groups, scale bytes) of an [n, row_bytes] weight that interleave_x16 can lay out, else ValueError."""
    _check_blocks(blocks, qtype, k)
    n = blocks.shape[0]
    if qtype not in X16_TYPES or n % 16:
        raise ValueError(f"interleaved weights are {', '.join(X16_TYPES)} with rows a multiple of 16, got {qtype} {n}")
    return n // 16, k // 32, _X16_SCALE_BYTES[qtype]


def _interleave(t: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """interleave_x16's permutation of ``t [n, row_bytes]`` (any dtype: also applied to byte positions)."""
    n, nbytes, sb = t.shape[0], _BLOCKS[qtype][1], _X16_SCALE_BYTES[qtype]
    panels, groups = n // 16, k // 32
    b = t.reshape(panels, 16, groups, nbytes).transpose(1, 2)  # [panel, group, row, block]
    scales = b[..., :sb].reshape(panels, groups, 16, sb // 2, 2).transpose(2, 3)  # [.., field, row, 2]
    words = b[..., sb:].reshape(panels, groups, 16, -1, 4).transpose(2, 3)  # [.., word, row, 4]
    out = torch.cat((scales.reshape(panels, groups, -1), words.reshape(panels, groups, -1)), dim=2)
    return out.reshape(t.shape).contiguous()


def _deinterleave(t: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """The inverse of ``_interleave``."""
    n, nbytes, sb = t.shape[0], _BLOCKS[qtype][1], _X16_SCALE_BYTES[qtype]
    panels, groups = n // 16, k // 32
    pg = t.reshape(panels, groups, 16 * nbytes)
    scales = pg[..., : 16 * sb].reshape(panels, groups, sb // 2, 16, 2).transpose(2, 3)  # [.., row, field, 2]
    words = pg[..., 16 * sb :].reshape(panels, groups, -1, 16, 4).transpose(2, 3)  # [.., row, word, 4]
    b = torch.cat((scales.reshape(panels, groups, 16, sb), words.reshape(panels, groups, 16, -1)), dim=3)
    return b.transpose(1, 2).reshape(t.shape).contiguous()


def interleave_x16(blocks: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """The weight's bytes laid out for the interleaved int8 kernel (``csrc/quant_matmul.c``, matmul_int8_x16): panels
    of 16 rows, group after group, each panel-group the 16 rows' float16 scale fields (d, then Q4_1's m: 16 of each)
    and then their quants as 32-bit words, word t of the 16 rows side by side. A permutation of the bytes: the same
    shape and size, undone by ``deinterleave_x16``."""
    _x16_view(blocks, qtype, k)
    return _interleave(blocks, qtype, k)


def deinterleave_x16(interleaved: torch.Tensor, qtype: str, k: int) -> torch.Tensor:
    """The GGUF rows of a weight ``interleave_x16`` laid out."""
    _x16_view(interleaved, qtype, k)
    return _deinterleave(interleaved, qtype, k)


@functools.cache
def _x16_row_positions(qtype: str, k: int) -> torch.Tensor:
    """int64 [16, row_bytes]: where, from the start of its panel, each byte of a panel's row r lies interleaved."""
    width = row_bytes(qtype, k)
    return _deinterleave(torch.arange(16 * width).reshape(16, width), qtype, k)


def interleaved_rows(interleaved: torch.Tensor, qtype: str, k: int, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of an interleaved weight as GGUF rows, uint8 ``[len(index), row_bytes]`` (an embedding
    lookup: a few rows of a weight whose products read it interleaved)."""
    _x16_view(interleaved, qtype, k)
    index = index.to(device=interleaved.device, dtype=torch.long)
    positions = _x16_row_positions(qtype, k).to(interleaved.device)
    width = interleaved.shape[1]
    flat = interleaved.reshape(-1)
    return flat[(index // 16 * 16 * width)[:, None] + positions[index % 16]]


def quant_matmul_ref(
    x: torch.Tensor, blocks: torch.Tensor, qtype: str, k: int, int8_activations: bool = False
) -> torch.Tensor:
    """``x @ W.T`` in ``x``'s dtype, W de-quantized to float32 and the product taken in float32 (as the C kernel
    computes: a bfloat16 ``x`` is widened, the result rounded once).

    ``int8_activations``: x quantized per group of 32 to int8 with a float scale (``quantize_activations``), and
    per group the exact integer sum of products with the weight's integers (``integer_groups``); across groups
    in floating point: ``y = sum_g dx * (scale * sum(qx qw) + low * sum(qx))`` (here in float64, the C kernel's
    float32 sums within its rounding). llama.cpp computes its CPU products this way."""
    _check_x(x, k)
    if not int8_activations:
        w = dequantize_ref(blocks, qtype, k)
        return torch.nn.functional.linear(x.float(), w).to(x.dtype)
    _check_blocks(blocks, qtype, k)
    qx, dx = quantize_activations(x.float())
    qw, scale, low = integer_groups(blocks, qtype, k)
    qx64, dx64, scale64, low64 = qx.double(), dx.double(), scale.double(), low.double()
    y = torch.zeros(x.shape[0], blocks.shape[0], dtype=torch.float64, device=x.device)
    for g in range(k // 32):  # one group at a time: memory m n, not m n k / 32
        isum = qx64[:, g] @ qw[:, g].double().T  # exact: |sum| < 2^24
        y += dx64[:, g, None] * (scale64[None, :, g] * isum + low64[None, :, g] * qx64[:, g].sum(1, keepdim=True))
    return y.to(x.dtype)


def _library(variant: str = "native") -> ctypes.CDLL | None:
    return load("quant_matmul", _SIGNATURES, _VARIANT_FLAGS[variant])


def cpu_quant_kernel_available() -> bool:
    return _library() is not None


def interleaved_kernel_available(qtype: str, n: int, lib: ctypes.CDLL | None = None) -> bool:
    """Whether ``lib`` (default: this CPU's build) multiplies an interleaved ``qtype`` weight of ``n`` rows by int8
    activations (``QuantWeight(..., interleaved=True)``): 512-bit VNNI builds, ``X16_TYPES``, n a multiple of 16."""
    lib = _library() if lib is None else lib
    return lib is not None and n % 16 == 0 and bool(lib.loraplex_quant_x16_available(_QTYPE_INDEX[qtype]))


class QuantWeight:
    """``y = x @ W.T`` for a fixed weight ``W [n, k]`` kept as GGUF blocks (uint8 ``[n, row_bytes(qtype, k)]``),
    prepared once for repeated calls: the blocks are checked, and on the CPU the C kernel and the blocks' address
    looked up, at construction. A call then checks only ``x`` (and ``out``) before the kernel: ~3 us of Python
    against quant_matmul's ~10, ~2 for one contiguous row without ``out`` (decode's case: the shape, dtype and
    layout in one test each); a decode step makes one call per projection: ~120 for SmolLM2-135M. ``out``:
    written in place, ``[m, n]`` in x's dtype with contiguous rows, which may be columns of a wider matrix (the
    parts of a fused projection). Off the CPU, or without the C kernels, the torch reference.

    ``interleaved``: ``blocks`` are laid out by ``interleave_x16`` (with int8 activations only), multiplied by the
    interleaved kernel where ``interleaved_kernel_available``, else by the reference on the rows they hold."""

    def __init__(
        self,
        blocks: torch.Tensor,
        qtype: str,
        k: int,
        int8_activations: bool = False,
        interleaved: bool = False,
    ) -> None:
        _check_blocks(blocks, qtype, k)
        if interleaved and not int8_activations:
            raise ValueError("interleaved weights are multiplied by int8 activations only")
        self.blocks = blocks.contiguous()  # (kept: the kernel reads it by address)
        self.qtype, self.k, self.n = qtype, k, int(blocks.shape[0])
        self.int8_activations, self.interleaved = int8_activations, interleaved
        if interleaved:
            _x16_view(self.blocks, qtype, k)  # (a format and row count it has)
        self._bind(_library() if self.blocks.is_cpu else None)

    def _bind(self, lib: ctypes.CDLL | None) -> QuantWeight:
        """Call ``lib``'s kernel (a build of it: the tests bind each), or the reference for None."""
        self._kernel = None
        if lib is not None and self.interleaved:
            if interleaved_kernel_available(self.qtype, self.n, lib):
                self._kernel = lib.loraplex_quant_matmul_int8_x16
        elif lib is not None:
            self._kernel = lib.loraplex_quant_matmul_int8 if self.int8_activations else lib.loraplex_quant_matmul
        # the constant arguments as ctypes values once: ctypes passes those without converting (~1 us a call)
        self._blocks_arg, self._qtype_arg = ctypes.c_void_p(self.blocks.data_ptr()), _int(_QTYPE_INDEX[self.qtype])
        self._n_arg, self._k_arg = _i64(self.n), _i64(self.k)
        # one row of x (decode): checked against these once a call, then the kernel (x's element size, its k
        # values and y's n are all the C call relies on); None where there is no such path (no kernel, or n = 0)
        self._row = torch.Size((1, self.k)) if self._kernel is not None and self.n else None
        return self

    def c_call(self) -> tuple[int, int, int] | None:
        """(the bound C kernel's address, the blocks' address, the format's index): for a caller that makes this
        weight's calls from C with the same arguments (``kernels.decode_layers``); None where calls run the
        reference."""
        if self._kernel is None:
            return None
        address = ctypes.cast(self._kernel, ctypes.c_void_p).value
        assert address is not None
        return address, self.blocks.data_ptr(), _QTYPE_INDEX[self.qtype]

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        kernel = self._kernel
        if out is None and x.shape == self._row and x.is_cpu and x.is_contiguous():
            bf16 = _BF16_FLAG.get(x.dtype)  # (None: not an activation dtype; the full path below refuses it)
            if bf16 is not None:
                assert kernel is not None  # (_row is set only with a kernel)
                y = x.new_empty(1, self.n)
                rc = kernel(
                    x.data_ptr(),
                    bf16,
                    self._blocks_arg,
                    self._qtype_arg,
                    _ONE_ROW,
                    self._n_arg,
                    self._k_arg,
                    y.data_ptr(),
                    self._n_arg,
                    torch.get_num_threads(),
                )
                if rc != 0:
                    _raise_for(rc, self)
                return y
        if kernel is None or not x.is_cpu:
            rows = deinterleave_x16(self.blocks, self.qtype, self.k) if self.interleaved else self.blocks
            y = quant_matmul_ref(x, rows, self.qtype, self.k, self.int8_activations)
            return y if out is None else out.copy_(y)
        if x.ndim != 2 or x.shape[1] != self.k or x.dtype not in _ACTIVATIONS:
            _check_x(x, self.k)
        x = x.contiguous()
        m = x.shape[0]
        out = output_rows(out, m, self.n, x.dtype)
        if m and self.n:
            rc = kernel(
                x.data_ptr(),
                x.dtype == torch.bfloat16,
                self._blocks_arg,
                self._qtype_arg,
                m,
                self._n_arg,
                self._k_arg,
                out.data_ptr(),
                out.stride(0),
                torch.get_num_threads(),
            )
            if rc != 0:
                _raise_for(rc, self)
        return out


def _raise_for(rc: int, weight: QuantWeight) -> None:
    """The C kernel's nonzero return as an error: 1 scratch not allocated, 2 an unknown format, 3 no interleaved
    kernel for this weight in this build (QuantWeight binds that kernel only where it has one)."""
    if rc == 1:
        raise MemoryError("the C quantized matmul could not allocate its scratch buffers")
    layout = "interleaved " if weight.interleaved else ""
    raise RuntimeError(
        f"the C quantized matmul refused the {layout}{weight.qtype} weight [{weight.n}, {weight.k}]: {rc}"
    )


def _run_c(
    lib: ctypes.CDLL, x: torch.Tensor, blocks: torch.Tensor, qtype: str, k: int, int8_activations: bool = False
) -> torch.Tensor:
    _check_x(x, k)
    if not (x.is_cpu and blocks.is_cpu):
        raise ValueError(f"the C quantized matmul takes CPU tensors, got x on {x.device}, blocks on {blocks.device}")
    return QuantWeight(blocks, qtype, k, int8_activations)._bind(lib)(x)


def quant_matmul_c(
    x: torch.Tensor, blocks: torch.Tensor, qtype: str, k: int, int8_activations: bool = False
) -> torch.Tensor:
    """The C kernel (CPU tensors); raises RuntimeError where the C kernels are not available."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the C quantized matmul is not available on this machine (no C compiler, or switched off)")
    return _run_c(lib, x, blocks, qtype, k, int8_activations)


def quant_matmul(
    x: torch.Tensor, blocks: torch.Tensor, qtype: str, k: int, int8_activations: bool = False
) -> torch.Tensor:
    """``x @ W.T``: the C kernel for CPU ``x`` where it is available, else the torch reference.
    ``int8_activations``: x quantized to int8 per group of 32, as llama.cpp does (``quant_matmul_ref``)."""
    if x.is_cpu:
        lib = _library()
        if lib is not None:
            return _run_c(lib, x, blocks, qtype, k, int8_activations)
    return quant_matmul_ref(x, blocks, qtype, k, int8_activations)


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """Float ``[n, k]`` -> Q8_0 blocks uint8 ``[n, row_bytes("Q8_0", k)]``: per block of 32, d = max|w| / 127 and
    q = round(w / d) half away from zero, in float32, as llama.cpp's reference quantizer (and gguf's) do."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"quantize_q8_0 takes a float [n, k] weight, got {w.dtype} {tuple(w.shape)}")
    n, k = w.shape
    width = row_bytes("Q8_0", k)
    blocks = w.float().reshape(n * (k // 32), 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    scaled = blocks * inv
    a = scaled.abs()
    whole = a.floor()
    q = torch.sign(scaled) * (whole + (2 * (a - whole)).floor())  # roundf: halves away from zero, exactly
    out = torch.cat((d.to(torch.float16).view(torch.uint8), q.to(torch.int8).view(torch.uint8)), dim=1)
    return out.reshape(n, width)
