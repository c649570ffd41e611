"""A decoder block's elementwise steps (residual add + RMSNorm, rotary embedding, SiLU- or GELU-gated product) as
C kernels on the CPU, each beside its torch reference with the same signature.

* ``add_rms_norm_*(residual, delta, weight, eps)``: ``residual += delta`` in place (skipped when ``delta`` is
  None), then returns RMSNorm(residual) * weight, in the operation order of transformers' LlamaRMSNorm.
* ``rope_*(qkv, heads, head_dim, cos, sin, positions)``: rotary embedding (rotate-half) in place on the
  first ``heads`` heads of each row of ``qkv`` (the q and k heads at the front of a fused qkv row);
  ``cos``/``sin`` are ``[max_positions, head_dim]`` tables indexed by ``positions``.
* ``silu_mul_*(gate_up, inter)``: ``silu(gate_up[:, :inter]) * gate_up[:, inter:]``, the MLP's gated product
  from the fused gate_up projection.
* ``gelu_tanh_mul_*(gate_up, inter)``: the same with transformers' ``gelu_pytorch_tanh`` (Gemma's GeGLU).

The C paths (``csrc/elementwise.c``) serve float32 and bfloat16 CPU tensors (every tensor of a call one
dtype; bfloat16 computed in float32 and rounded where transformers' bfloat16 modules round: ``c_ready``);
the references serve anything else (other dtypes, mixed dtypes, CUDA, no compiler). ``backend`` picks one
set per engine.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import cpu_build
from .cpu_build import load

__all__ = [
    "add_rms_norm_c",
    "add_rms_norm_ref",
    "c_function_address",
    "c_ready",
    "cpu_elementwise_available",
    "gelu_tanh_mul_c",
    "gelu_tanh_mul_ref",
    "rope_c",
    "rope_ref",
    "silu_mul_c",
    "silu_mul_ref",
]

_p, _i64 = ctypes.c_void_p, ctypes.c_int64


_ARGS = {
    "loraplex_add_rms_norm": [_p, _p, _p, _p, _i64, _i64, ctypes.c_float, ctypes.c_int],
    "loraplex_rope": [_p, _i64, _i64, _i64, _i64, _p, _p, _p, ctypes.c_int],
    "loraplex_silu_mul": [_p, _p, _i64, _i64, ctypes.c_int],
    "loraplex_gelu_tanh_mul": [_p, _p, _i64, _i64, ctypes.c_int],
}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the element types the C kernels take
_SIGNATURES = {f"{name}_{s}": (None, args) for name, args in _ARGS.items() for s in _SUFFIX.values()}


def _library() -> ctypes.CDLL | None:
    # The built library straight from the loader's cache (no lock): this runs several times per layer per step.
    found = cpu_build._loaded.get("elementwise")
    if isinstance(found, ctypes.CDLL):
        return found
    return load("elementwise", _SIGNATURES)


def cpu_elementwise_available() -> bool:
    return _library() is not None


def c_function_address(name: str, dtype: torch.dtype) -> int | None:
    """The address of kernel ``name`` (``loraplex_add_rms_norm``, ``loraplex_rope``, ``loraplex_silu_mul``...) for
    ``dtype``, for C that calls it directly (``kernels.decode_layers``); None where there is no such kernel."""
    suffix, lib = _SUFFIX.get(dtype), _library()
    if suffix is None or lib is None:
        return None
    return ctypes.cast(getattr(lib, f"{name}_{suffix}"), ctypes.c_void_p).value


def c_ready(*tensors: torch.Tensor) -> bool:
    """All CPU tensors of one dtype the C kernels take, and the kernels built."""
    dtype = tensors[0].dtype
    if dtype not in _SUFFIX:
        return False
    for t in tensors:  # a plain loop: is_cpu needs no device object, and no generator per call
        if not t.is_cpu or t.dtype != dtype:
            return False
    return cpu_elementwise_available()


def _kernel(name: str, *tensors: torch.Tensor) -> Callable[..., None] | None:
    """``name``'s C function for these tensors' dtype, or None where ``c_ready`` would say no: one lookup for
    the check and the function (these kernels run several times per layer in every decode step)."""
    dtype = tensors[0].dtype
    suffix = _SUFFIX.get(dtype)
    if suffix is None:
        return None
    for t in tensors:
        if not t.is_cpu or t.dtype != dtype:
            return None
    lib = _library()
    return None if lib is None else getattr(lib, f"{name}_{suffix}")


# ------------------------------------------------------------------------------------------ add + RMSNorm
def _norm_tensors(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (residual, weight) if delta is None else (residual, weight, delta)


def _check_norm(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> None:
    if residual.dim() != 2 or weight.shape != (residual.shape[1],):
        raise ValueError(
            f"residual must be [rows, dim] and weight [dim]; got {tuple(residual.shape)} and {tuple(weight.shape)}"
        )
    if delta is not None and delta.shape != residual.shape:
        raise ValueError(f"delta {tuple(delta.shape)} does not match residual {tuple(residual.shape)}")


def add_rms_norm_ref(
    residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Torch reference: normalise in float32, then scale (transformers' LlamaRMSNorm)."""
    _check_norm(residual, delta, weight)
    if delta is not None:
        residual.add_(delta)
    xf = residual.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(residual.dtype)


def add_rms_norm_c(
    residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """The C kernel; raises when it cannot serve these tensors."""
    _check_norm(residual, delta, weight)
    kernel = _kernel("loraplex_add_rms_norm", *_norm_tensors(residual, delta, weight))
    if kernel is None:
        raise ValueError(
            "the C add_rms_norm kernel takes float32 or bfloat16 CPU tensors of one dtype (and a C compiler)"
        )
    if not residual.is_contiguous():
        raise ValueError("the C add_rms_norm kernel updates residual in place: it must be contiguous")
    delta = None if delta is None else delta.contiguous()
    weight = weight.contiguous()
    out = torch.empty_like(residual)
    kernel(
        residual.data_ptr(),
        None if delta is None else delta.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        residual.shape[0],
        residual.shape[1],
        float(eps),
        torch.get_num_threads(),
    )
    return out


# ------------------------------------------------------------------------------------------ rotary
def _check_rope(
    qkv: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> None:
    if qkv.dim() != 2 or qkv.shape[1] < heads * head_dim or head_dim % 2:
        raise ValueError(
            f"qkv must be [rows, >= heads * head_dim] with an even head_dim; got {tuple(qkv.shape)} "
            f"for {heads} heads of {head_dim}"
        )
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != head_dim:
        raise ValueError(f"cos/sin must be [max_positions, {head_dim}]; got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if positions.shape != (qkv.shape[0],):
        raise ValueError(f"need one position per row ({qkv.shape[0]}), got {tuple(positions.shape)}")


def rope_ref(
    qkv: torch.Tensor,
    heads: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    check_positions: bool = True,
) -> None:
    """Torch reference: x * cos + rotate_half(x) * sin on the first `heads` heads, written back in place.

    (``check_positions`` is the C kernel's; indexing the tables checks the positions here.)"""
    _check_rope(qkv, heads, head_dim, cos, sin, positions)
    x = qkv[:, : heads * head_dim].view(-1, heads, head_dim)
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    half = head_dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    x.copy_(x * c + rotated * s)


def rope_c(
    qkv: torch.Tensor,
    heads: int,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    check_positions: bool = True,
) -> None:
    """The C kernel; raises when it cannot serve these tensors.

    ``check_positions=False`` skips the bounds check of the positions against the tables, for a caller that
    checked the same positions already (the model checks once per forward, not in every layer)."""
    _check_rope(qkv, heads, head_dim, cos, sin, positions)
    kernel = _kernel("loraplex_rope", qkv, cos, sin)
    if kernel is None:
        raise ValueError("the C rope kernel takes float32 or bfloat16 CPU tensors of one dtype (and a C compiler)")
    if qkv.stride(1) != 1 or not cos.is_contiguous() or not sin.is_contiguous():
        raise ValueError("the C rope kernel needs unit-stride qkv rows and contiguous cos/sin tables")
    if check_positions and positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= cos.shape[0]):
        raise ValueError(f"positions must lie in [0, {cos.shape[0]})")
    pos = (
        positions
        if positions.dtype == torch.int64 and positions.is_contiguous()
        else positions.to(torch.int64).contiguous()
    )
    kernel(
        qkv.data_ptr(),
        qkv.shape[0],
        qkv.stride(0),
        heads,
        head_dim,
        cos.data_ptr(),
        sin.data_ptr(),
        pos.data_ptr(),
        torch.get_num_threads(),
    )


# ------------------------------------------------------------------------------------------ SiLU-gated product
def _check_gated(gate_up: torch.Tensor, inter: int) -> None:
    if gate_up.dim() != 2 or gate_up.shape[1] != 2 * inter:
        raise ValueError(f"gate_up must be [rows, 2 * {inter}], got {tuple(gate_up.shape)}")


def silu_mul_ref(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    """Torch reference: silu(gate) * up."""
    _check_gated(gate_up, inter)
    return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]


def _gated_c(name: str, gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    _check_gated(gate_up, inter)
    kernel = _kernel(f"loraplex_{name}", gate_up)
    if kernel is None:
        raise ValueError(f"the C {name} kernel takes float32 or bfloat16 CPU tensors (and a C compiler)")
    gate_up = gate_up.contiguous()
    out = gate_up.new_empty((gate_up.shape[0], inter))
    kernel(gate_up.data_ptr(), out.data_ptr(), gate_up.shape[0], inter, torch.get_num_threads())
    return out


def silu_mul_c(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    """The C kernel; raises when it cannot serve this tensor."""
    return _gated_c("silu_mul", gate_up, inter)


def gelu_tanh_mul_ref(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    """Torch reference: gelu_pytorch_tanh(gate) * up (transformers' GeGLU, Gemma)."""
    _check_gated(gate_up, inter)
    return F.gelu(gate_up[:, :inter], approximate="tanh") * gate_up[:, inter:]


def gelu_tanh_mul_c(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    """The C kernel; raises when it cannot serve this tensor."""
    return _gated_c("gelu_tanh_mul", gate_up, inter)
