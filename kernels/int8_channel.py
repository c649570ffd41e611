"""Matrix products with int8 weights quantized per output channel, beside their torch reference.

``--quantization int8`` quantizes a float checkpoint's projections at load: each output row ``r`` of ``W [n, k]``
keeps one float32 ``scale[r] = max|W[r]| / 127`` and int8 ``q[r] = round(W[r] / scale[r])`` (symmetric, -127..127;
``quantize_int8_channel``). Decode then reads one byte a weight instead of float32's four. ``int8_matmul(x, q,
scale)`` is ``x @ (scale[:, None] * q).T`` for float32 or bfloat16 ``x [m, k]``: on the CPU the C kernel
(``csrc/int8_matmul.c``) widens the int8 rows to float32 in registers and scales each output once; elsewhere, or
without the C kernels, the reference (pure torch, any device). ``Int8Weight`` is the same prepared once per weight.

``int8_activations=True`` computes as llama.cpp does: x quantized per group of 32 to int8 (``quantize_activations``,
llama.cpp's Q8_0), each group's product with the weight's integers an exact integer sum (VNNI's vpdpbusd, AVX2's
vpmaddubsw), scaled in float: ``y = scale * sum_g dx_g * isum_g``.
"""

from __future__ import annotations

import ctypes

import torch

from .cpu_build import load
from .quant import _VARIANT_FLAGS, output_rows, quantize_activations

__all__ = [
    "Int8Weight",
    "dequantize_int8_channel",
    "int8_kernel_available",
    "int8_matmul",
    "int8_matmul_c",
    "int8_matmul_ref",
    "quantize_int8_channel",
]

_ACTIVATIONS = (torch.float32, torch.bfloat16)
_p, _i64, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "loraplex_int8_matmul": (_int, [_p, _int, _p, _p, _i64, _i64, _i64, _p, _i64, _int, _int]),
    "loraplex_int8_vector_width": (_int, []),
    "loraplex_int8_int8_path": (_int, []),
}


def quantize_int8_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float ``[n, k]`` -> ``(q, scale)``: int8 ``[n, k]`` and float32 ``[n]``, ``scale = max|w row| / 127`` and
    ``q = round(w / scale)`` (halves to even, as torch.round); a row of zeros gets scale 0 and q 0."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"quantize_int8_channel takes a float [n, k] weight, got {w.dtype} {tuple(w.shape)}")
    w32 = w.float()
    scale = w32.abs().amax(dim=1) / 127
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(w32 / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8_channel(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight ``[n, k]`` ``scale[r] * q[r]`` in ``dtype``."""
    _check_weight(q, scale)
    return (q.float() * scale[:, None]).to(dtype)


def _check_weight(q: torch.Tensor, scale: torch.Tensor) -> None:
    if q.dtype != torch.int8 or q.ndim != 2:
        raise ValueError(f"int8 weights must be int8 [n, k], got {q.dtype} {tuple(q.shape)}")
    if scale.dtype != torch.float32 or tuple(scale.shape) != (q.shape[0],):
        raise ValueError(f"int8 weight scales must be float32 [{q.shape[0]}], got {scale.dtype} {tuple(scale.shape)}")


def _check_x(x: torch.Tensor, k: int, int8_activations: bool) -> None:
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [m, k={k}], got {tuple(x.shape)}")
    if x.dtype not in _ACTIVATIONS:
        raise ValueError(f"x must be float32 or bfloat16, got {x.dtype}")
    if int8_activations and k % 32:
        raise ValueError(f"int8 activations are quantized per group of 32: k={k} is not a multiple of 32")


def int8_matmul_ref(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, int8_activations: bool = False
) -> torch.Tensor:
    """``x @ (scale * q).T`` in x's dtype, the product taken in float32 and each output scaled once (as the C
    kernel computes). ``int8_activations``: x quantized per group of 32 (``quantize_activations``), the exact
    integer sums per group with q, ``y = scale * sum_g dx_g * isum_g`` (here in float64)."""
    _check_weight(q, scale)
    _check_x(x, q.shape[1], int8_activations)
    if not int8_activations:
        return (torch.nn.functional.linear(x.float(), q.float()) * scale).to(x.dtype)
    qx, dx = quantize_activations(x.float())  # [m, groups, 32], [m, groups]
    qw = q.reshape(q.shape[0], -1, 32).double()
    y = torch.zeros(x.shape[0], q.shape[0], dtype=torch.float64, device=x.device)
    for g in range(qw.shape[1]):  # one group at a time: memory m n, not m n k / 32
        y += dx[:, g, None].double() * (qx[:, g].double() @ qw[:, g].T)  # exact integer sums: |sum| < 2^24
    return (y * scale.double()).to(x.dtype)


def _library(variant: str = "native") -> ctypes.CDLL | None:
    return load("int8_matmul", _SIGNATURES, _VARIANT_FLAGS[variant])


def int8_kernel_available() -> bool:
    return _library() is not None


class Int8Weight:
    """``y = x @ (scale * q).T`` for a fixed int8 weight, prepared once for repeated calls (the checks and the
    kernel's constant arguments at construction, as ``kernels.quant.QuantWeight``). ``out``: written in place,
    ``[m, n]`` in x's dtype with contiguous rows (may be columns of a wider matrix). Off the CPU, or without the
    C kernels, the torch reference."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, int8_activations: bool = False) -> None:
        _check_weight(q, scale)
        self.q, self.scale = q.contiguous(), scale.contiguous()  # (kept: the kernel reads them by address)
        self.n, self.k = int(q.shape[0]), int(q.shape[1])
        if int8_activations and self.k % 32:
            raise ValueError(f"int8 activations are quantized per group of 32: k={self.k} is not a multiple of 32")
        self.int8_activations = int8_activations
        self._bind(_library() if self.q.is_cpu else None)

    def _bind(self, lib: ctypes.CDLL | None) -> Int8Weight:
        """Call ``lib``'s kernel (a build of it: the tests bind each), or the reference for None."""
        self._kernel = None if lib is None else lib.loraplex_int8_matmul
        self._q_arg, self._scale_arg = ctypes.c_void_p(self.q.data_ptr()), ctypes.c_void_p(self.scale.data_ptr())
        self._n_arg, self._k_arg, self._int8_arg = _i64(self.n), _i64(self.k), _int(int(self.int8_activations))
        return self

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        kernel = self._kernel
        if kernel is None or not x.is_cpu:
            y = int8_matmul_ref(x, self.q, self.scale, self.int8_activations)
            return y if out is None else out.copy_(y)
        if x.ndim != 2 or x.shape[1] != self.k or x.dtype not in _ACTIVATIONS:
            _check_x(x, self.k, self.int8_activations)
        x = x.contiguous()
        m = x.shape[0]
        out = output_rows(out, m, self.n, x.dtype)
        if m and self.n:
            rc = kernel(
                x.data_ptr(),
                x.dtype == torch.bfloat16,
                self._q_arg,
                self._scale_arg,
                m,
                self._n_arg,
                self._k_arg,
                out.data_ptr(),
                out.stride(0),
                self._int8_arg,
                torch.get_num_threads(),
            )
            if rc != 0:
                raise MemoryError("the C int8 matmul could not allocate its scratch buffers")
        return out


def _run_c(
    lib: ctypes.CDLL, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, int8_activations: bool = False
) -> torch.Tensor:
    _check_weight(q, scale)
    _check_x(x, q.shape[1], int8_activations)
    if not (x.is_cpu and q.is_cpu and scale.is_cpu):
        raise ValueError(f"the C int8 matmul takes CPU tensors, got x on {x.device}, q on {q.device}")
    return Int8Weight(q, scale, int8_activations)._bind(lib)(x)


def int8_matmul_c(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, int8_activations: bool = False
) -> torch.Tensor:
    """The C kernel (CPU tensors); raises RuntimeError where the C kernels are not available."""
    lib = _library()
    if lib is None:
        raise RuntimeError("the C int8 matmul is not available on this machine (no C compiler, or switched off)")
    return _run_c(lib, x, q, scale, int8_activations)


def int8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, int8_activations: bool = False) -> torch.Tensor:
    """``x @ (scale * q).T``: the C kernel for CPU ``x`` where it is available, else the torch reference."""
    if x.is_cpu:
        lib = _library()
        if lib is not None:
            return _run_c(lib, x, q, scale, int8_activations)
    return int8_matmul_ref(x, q, scale, int8_activations)
