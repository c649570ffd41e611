"""Paged attention for prefill chunks on the CPU: a C kernel that reads the paged cache in place.

``paged_prefill_attention_c(inputs)`` takes the :class:`kernels.attention.PagedAttentionInputs` of
:func:`kernels.attention.paged_attention_ref` and returns the same result (float32 or
bfloat16 CPU tensors of one dtype, ``head_dim`` a multiple of 8; bfloat16 is widened on load, summed in
float32 and the output rounded once). Chunks that continue a cached context cost no more than fresh
ones: the kernel walks each chunk's block table, so nothing is gathered, masked or padded
(``csrc/paged_prefill_attention.c``).

Two keyword arguments serve the engine: ``out`` receives the rows in place, and ``skip_decodes`` leaves
the rows of one-token sequences alone (the decode kernel of ``cpu_decode_attention`` does those). With
``check_tables=False`` the bounds check of the block tables is skipped for a caller that checked the same
tables already (once per step, not per layer).
"""

from __future__ import annotations

import ctypes

import torch

from .attention import PagedAttentionInputs, _check_shapes, paged_attention_ref
from .cpu_build import load
from .cpu_decode_attention import C_DTYPES, _softcap_arg, _window_arg, check_block_tables

__all__ = ["cpu_prefill_kernel_available", "paged_prefill_attention_c", "paged_prefill_attention_ref"]

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_VARIANTS = {
    torch.float32: "loraplex_paged_prefill_attention_f32",
    torch.bfloat16: "loraplex_paged_prefill_attention_bf16",
}
_SIGNATURES = dict.fromkeys(
    _VARIANTS.values(),
    (
        ctypes.c_int,
        [
            _ptr,
            _i64,
            _ptr,
            _ptr,
            _ptr,
            _i64,
            _ptr,
            _ptr,
            _i64,
            _i64,
            _ptr,
            _i64,
            _i64,
            _i64,
            _i64,
            ctypes.c_float,
            _i64,
            ctypes.c_float,
            ctypes.c_int,
        ],
    ),
)

MAX_GROUP = 64  # the kernel's largest GQA group


def _library() -> ctypes.CDLL | None:
    return load("paged_prefill_attention", _SIGNATURES)


def cpu_prefill_kernel_available() -> bool:
    return _library() is not None


paged_prefill_attention_ref = paged_attention_ref


def _check_tables(
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_lens: torch.Tensor,
    num_tokens: int,
    num_blocks: int,
    block_size: int,
) -> None:
    """Memory safety: every row and block the kernel touches lies inside q and the cache."""
    if int(q_lens.min()) < 0 or int(q_lens.sum()) > num_tokens:
        raise ValueError("query_start_loc must be non-decreasing and within the query rows")
    if bool((seq_lens < q_lens).any()):
        raise ValueError("every seq_len must cover its chunk's query rows")
    check_block_tables(tables, seq_lens, num_blocks, block_size, rows=q_lens > 0)


def paged_prefill_attention_c(
    inputs: PagedAttentionInputs,
    *,
    out: torch.Tensor | None = None,
    skip_decodes: bool = False,
    check_tables: bool = True,
) -> torch.Tensor:
    """The C kernel; raises when it cannot serve these tensors (not float32 or bfloat16 CPU tensors of one
    dtype, or not built)."""
    _check_shapes(inputs)
    q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
    lib = _library()
    if lib is None:
        raise RuntimeError("the C prefill-attention kernel is not available on this machine")
    if q.device.type != "cpu" or q.dtype not in C_DTYPES or not q.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(
            f"the C prefill-attention kernel takes float32 or bfloat16 CPU tensors of one dtype, got q "
            f"{q.dtype} on {q.device.type}, caches {k_cache.dtype} and {v_cache.dtype}"
        )
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    if head_dim % 8 != 0 or num_heads // kv_heads > MAX_GROUP:
        raise ValueError(
            f"the C prefill-attention kernel needs head_dim a multiple of 8 and a GQA group of at "
            f"most {MAX_GROUP}; got {head_dim} and {num_heads // kv_heads}"
        )
    if out is None:
        out = torch.zeros(q.shape, dtype=q.dtype)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {q.dtype} tensor of q's shape {tuple(q.shape)}")
    if q.shape[0] == 0 or inputs.seq_lens.shape[0] == 0:
        return out
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    lens = inputs.seq_lens.to(torch.int32).contiguous()
    starts = inputs.query_starts().to(torch.int32).contiguous()
    tables = inputs.block_tables.to(torch.int32).contiguous()
    if check_tables:
        q_lens = (starts[1:] - starts[:-1]).long()
        if int(starts[0]) < 0:
            raise ValueError("query_start_loc must start at a row >= 0")
        _check_tables(tables, lens.long(), q_lens, q.shape[0] - int(starts[0]), num_blocks, block_size)
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    rc = getattr(lib, _VARIANTS[q.dtype])(
        q.data_ptr(),
        q.stride(0),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        tables.data_ptr(),
        tables.shape[1],
        lens.data_ptr(),
        starts.data_ptr(),
        lens.shape[0],
        2 if skip_decodes else 1,
        out.data_ptr(),
        num_heads,
        kv_heads,
        head_dim,
        block_size,
        float(inputs.scale),
        _window_arg(inputs.window),
        _softcap_arg(inputs.softcap),
        torch.get_num_threads(),
    )
    if rc == -2:
        raise ValueError("the C prefill-attention kernel refused the shapes (head_dim or GQA ratio)")
    if rc != 0:
        raise MemoryError("the C prefill-attention kernel could not allocate its task list")
    return out
