"""Decode attention on the CPU: a C kernel that reads the paged cache in place, beside its torch reference.

``paged_decode_attention(inputs)`` handles a batch of single-token decodes (a
:class:`kernels.attention.PagedAttentionInputs` without ``query_start_loc``: ``q`` is
``[num_seqs, num_heads, head_dim]``, one row per sequence; the cache layout and ``seq_lens`` as in
:mod:`kernels.attention`, this step's K/V already stored). The C path
(``csrc/paged_decode_attention.c``) serves float32 and bfloat16 CPU tensors (q and the caches of one dtype;
bfloat16 is widened on load, summed in float32 and the output rounded once); the reference — the general
torch paged attention with one query per sequence — serves everything else and is what the tests compare
it with.
"""

from __future__ import annotations

import ctypes

import torch

from . import cpu_build
from .attention import PagedAttentionInputs, paged_attention_ref
from .cpu_build import load

__all__ = [
    "C_DTYPES",
    "cpu_decode_kernel_available",
    "decode_kernel_address",
    "paged_decode_attention_c",
    "paged_decode_attention_ref",
]

_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


_VARIANTS = {
    torch.float32: "loraplex_paged_decode_attention_f32",
    torch.bfloat16: "loraplex_paged_decode_attention_bf16",
}
C_DTYPES = tuple(_VARIANTS)  # the element types the C attention kernels take
_SIGNATURES = dict.fromkeys(
    _VARIANTS.values(), (ctypes.c_int, [_ptr] * 6 + [_i64] * 6 + [_f32, _i64, _f32, ctypes.c_int])
)


def _library() -> ctypes.CDLL | None:
    # straight from the loader's cache once built (no lock): every layer of a decode step calls the kernel
    found = cpu_build._loaded.get("paged_decode_attention")
    if isinstance(found, ctypes.CDLL):
        return found
    return load("paged_decode_attention", _SIGNATURES)


def _int32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as contiguous int32, itself where it is one already (the plans build their tables so)."""
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def cpu_decode_kernel_available() -> bool:
    return _library() is not None


def _check(inputs: PagedAttentionInputs) -> None:
    q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
    block_tables, seq_lens = inputs.block_tables, inputs.seq_lens
    if inputs.query_start_loc is not None:
        raise ValueError("the decode kernels take one query row per sequence: leave query_start_loc None")
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"q must be [num_seqs, heads, head_dim] and the caches [blocks, block_size, kv_heads, "
            f"head_dim]; got {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2] != 0:
        raise ValueError(
            f"q {tuple(q.shape)} does not fit a cache of {k_cache.shape[2]} kv heads x {k_cache.shape[3]} dims"
        )
    if seq_lens.shape != (q.shape[0],) or block_tables.dim() != 2 or block_tables.shape[0] != q.shape[0]:
        raise ValueError(
            f"need one seq_len and one block-table row per query row ({q.shape[0]}), got "
            f"{tuple(seq_lens.shape)} and {tuple(block_tables.shape)}"
        )


def decode_kernel_address(dtype: torch.dtype) -> int | None:
    """The address of the C kernel for ``dtype``, for C that calls it directly (``kernels.decode_layers``, with
    the arguments ``paged_decode_attention_c`` passes); None where there is no such kernel."""
    lib = _library()
    if lib is None or dtype not in _VARIANTS:
        return None
    return ctypes.cast(getattr(lib, _VARIANTS[dtype]), ctypes.c_void_p).value


def check_block_tables(
    tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int, block_size: int, rows: torch.Tensor | None = None
) -> None:
    """Memory safety for the C attention kernels: every block a sequence's context reads lies in the cache.

    ``rows`` (bool per sequence, default all) picks the sequences the kernel will read."""
    used = -(-int(seq_lens.max()) // block_size)
    if used > tables.shape[1]:
        raise ValueError(f"seq_lens need {used} blocks, the block tables hold {tables.shape[1]}")
    pos = torch.arange(tables.shape[1], device=tables.device)
    reads = pos[None, :] * block_size < seq_lens[:, None]
    read = tables.masked_select(reads if rows is None else reads & rows[:, None])
    if read.numel() and (int(read.min()) < 0 or int(read.max()) >= num_blocks):
        raise ValueError(f"block table entries must lie in [0, {num_blocks})")


def paged_decode_attention_ref(inputs: PagedAttentionInputs) -> torch.Tensor:
    """Torch reference: the general paged attention with a one-token chunk per sequence."""
    _check(inputs)
    return paged_attention_ref(inputs)


def paged_decode_attention_c(inputs: PagedAttentionInputs, *, check_tables: bool = True) -> torch.Tensor:
    """The C kernel; raises when it cannot serve these tensors (not float32 or bfloat16 CPU tensors of one
    dtype, or not built).

    ``check_tables=False`` skips the bounds check of the table entries, for a caller that already checked
    the same tables against a cache of the same size (the engine checks once per step, not per layer)."""
    _check(inputs)
    q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
    lib = _library()
    if lib is None:
        raise RuntimeError("the C decode-attention kernel is not available on this machine")
    if q.device.type != "cpu" or q.dtype not in C_DTYPES or not q.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(
            f"the C decode-attention kernel takes float32 or bfloat16 CPU tensors of one dtype, got q "
            f"{q.dtype} on {q.device.type}, caches {k_cache.dtype} and {v_cache.dtype}"
        )
    if q.shape[2] % 8 != 0:
        raise ValueError(f"the C decode-attention kernel needs head_dim to be a multiple of 8, got {q.shape[2]}")
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    num_seqs, num_heads = q.shape[0], q.shape[1]
    out = torch.empty(q.shape, dtype=q.dtype)
    if num_seqs == 0:
        return out
    q = q.contiguous()
    lens = _int32(inputs.seq_lens)
    if check_tables and int(lens.min()) < 1:
        raise ValueError("every decode sequence needs a context of at least one token")
    tables = _int32(inputs.block_tables)
    if check_tables:
        check_block_tables(tables, lens, num_blocks, block_size)
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    rc = getattr(lib, _VARIANTS[q.dtype])(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        tables.data_ptr(),
        lens.data_ptr(),
        out.data_ptr(),
        num_seqs,
        num_heads,
        kv_heads,
        head_dim,
        block_size,
        tables.shape[1],
        float(inputs.scale),
        _window_arg(inputs.window),
        _softcap_arg(inputs.softcap),
        torch.get_num_threads(),
    )
    if rc == -2:
        raise ValueError("the C decode-attention kernel refused the shapes (head_dim or GQA ratio)")
    if rc != 0:
        raise MemoryError("the C decode-attention kernel could not allocate its scratch buffers")
    return out


def _window_arg(window: int | None) -> int:
    """The kernels' encoding of a sliding window: 0 for none; a window is at least one token."""
    if window is not None and window < 1:
        raise ValueError(f"a sliding window must be at least 1 token, got {window}")
    return int(window or 0)


def _softcap_arg(softcap: float | None) -> float:
    """The kernels' encoding of a soft-cap: 0 for none; a cap must be positive."""
    if softcap is not None and not softcap > 0:
        raise ValueError(f"a soft-cap must be positive, got {softcap}")
    return float(softcap or 0.0)
