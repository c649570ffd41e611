"""Apply packed token bitmasks to logits (structured output), in place.

``bitmask[i]`` (int32 words) masks logits row ``indices[i]``: bit ``b`` of word ``w``
(least significant first, the xgrammar / llguidance layout) set = token ``32 * w + b``
allowed. Disallowed tokens, and logit columns past ``32 * num_words``, become ``-inf``;
bits past the vocabulary are ignored; rows not in ``indices`` are untouched.
"""

from __future__ import annotations

import torch

__all__ = [
    "apply_token_bitmask",
    "apply_token_bitmask_ref",
    "apply_token_bitmask_triton",
    "unpack_bitmask",
]


def _check(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got {tuple(logits.shape)}")
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be a 2-D int32 tensor, got {tuple(bitmask.shape)} {bitmask.dtype}")
    if indices.dim() != 1 or indices.shape[0] != bitmask.shape[0]:
        raise ValueError(
            f"indices must have one entry per bitmask row ({bitmask.shape[0]}), got {tuple(indices.shape)}"
        )


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[N, words]`` int32 -> ``[N, vocab_size]`` bool (True = allowed), vectorised."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask[:, :, None] >> shifts) & 1  # arithmetic shift; & 1 keeps bit b only
    allowed = bits.view(bitmask.shape[0], -1).bool()
    width = allowed.shape[1]
    if width >= vocab_size:
        return allowed[:, :vocab_size]
    pad = torch.zeros(bitmask.shape[0], vocab_size - width, dtype=torch.bool, device=bitmask.device)
    return torch.cat([allowed, pad], dim=1)


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor) -> None:
    """Torch path: unpack with shifts, then one masked fill over the selected rows."""
    _check(logits, bitmask, indices)
    if indices.numel() == 0:
        return
    rows = indices.to(device=logits.device, dtype=torch.long)
    allowed = unpack_bitmask(bitmask.to(logits.device), logits.shape[1])
    masked = logits.index_select(0, rows).masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, rows, masked)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor) -> None:
    """Triton path: one program per (masked row, vocab block); writes only disallowed entries."""
    _check(logits, bitmask, indices)
    if indices.numel() == 0:
        return
    from ._triton_bitmask import launch_bitmask

    launch_bitmask(logits, bitmask.to(logits.device), indices.to(logits.device))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor) -> None:
    """Mask ``logits`` in place: Triton on CUDA, torch elsewhere."""
    impl = apply_token_bitmask_triton if logits.is_cuda else apply_token_bitmask_ref
    impl(logits, bitmask, indices)
