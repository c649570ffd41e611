"""Batched multi-LoRA shrink / expand (Punica / S-LoRA style).

Weights, as the engine's LoRA manager stacks them (one instance per layer and
projection group: qkv has 3 slices, gate_up 2, o and down 1):

* ``lora_a``: ``[num_slots, num_slices, max_rank, in_features]``
* ``lora_b``: ``[num_slots, out_total, max_rank]``; slice ``s`` covers output columns
  ``slice_offsets[s]:slice_offsets[s + 1]`` and uses the rank rows of shrink slice ``s``.
  Scaling is folded into B; ranks below ``max_rank`` are zero-padded.

``lora_shrink_*(x, lora_a, mapping) -> buf [num_slices, T, max_rank]`` (zero rows for tokens
without adapter) and ``lora_expand_*(y, buf, lora_b, mapping, slice_offsets) -> y``
(``y += ...`` in place, rows without adapter untouched). Each op has a per-token torch
reference (``*_ref``), Triton SGMV kernels (``*_triton``) and a vectorised CPU path
(``*_grouped``: padded ``torch.bmm`` over slots, see :class:`GroupedPlan`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .lora_mapping import GroupedPlan, LoRABatchMapping

__all__ = [
    "GroupedPlan",
    "LoRABatchMapping",
    "lora_expand_grouped",
    "lora_expand_ref",
    "lora_expand_triton",
    "lora_shrink_grouped",
    "lora_shrink_ref",
    "lora_shrink_triton",
]


def _check_shrink(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRABatchMapping) -> None:
    if lora_a.dim() != 4:
        raise ValueError(f"lora_a must be [num_slots, num_slices, max_rank, in_features], got {tuple(lora_a.shape)}")
    if x.dim() != 2 or x.shape[1] != lora_a.shape[3]:
        raise ValueError(f"x must be [num_tokens, {lora_a.shape[3]}], got {tuple(x.shape)}")
    _check_mapping(x.shape[0], lora_a.shape[0], mapping)


def _check_expand(
    y: torch.Tensor,
    buf_shape: Sequence[int],
    lora_b: torch.Tensor,
    mapping: LoRABatchMapping,
    slice_offsets: Sequence[int],
) -> None:
    if lora_b.dim() != 3:
        raise ValueError(f"lora_b must be [num_slots, out_total, max_rank], got {tuple(lora_b.shape)}")
    num_slots, out_total, rank = lora_b.shape
    offsets = list(slice_offsets)
    if (
        len(offsets) < 2
        or offsets[0] != 0
        or offsets[-1] != out_total
        or any(b < a for a, b in zip(offsets, offsets[1:]))
    ):
        raise ValueError(f"slice_offsets must rise from 0 to out_total={out_total}, got {tuple(slice_offsets)}")
    if y.dim() != 2 or y.shape[1] != out_total:
        raise ValueError(f"y must be [num_tokens, {out_total}], got {tuple(y.shape)}")
    expected = (len(offsets) - 1, y.shape[0], rank)
    if tuple(buf_shape) != expected:
        raise ValueError(f"buf must be [num_slices, num_tokens, max_rank] = {expected}, got {tuple(buf_shape)}")
    _check_mapping(y.shape[0], num_slots, mapping)


def _check_mapping(num_tokens: int, num_slots: int, mapping: LoRABatchMapping) -> None:
    if mapping.num_tokens != num_tokens:
        raise ValueError(f"the mapping covers {mapping.num_tokens} tokens, the batch has {num_tokens}")
    if mapping.num_slots > num_slots:
        raise ValueError(f"the mapping addresses {mapping.num_slots} slots, the weights hold {num_slots}")


# ---------------------------------------------------------------- references


def lora_shrink_ref(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRABatchMapping) -> torch.Tensor:
    """Per-token gather: ``buf[s, t] = x[t] @ lora_a[idx[t], s].T`` (zeros where idx is -1)."""
    _check_shrink(x, lora_a, mapping)
    idx = mapping.token_lora_indices
    a = lora_a[idx.clamp(min=0)].float()  # [T, slices, rank, in]
    buf = torch.einsum("ti,tsri->str", x.float(), a)
    buf = buf.masked_fill((idx < 0)[None, :, None], 0.0)
    return buf.to(x.dtype)


def lora_expand_ref(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    mapping: LoRABatchMapping,
    slice_offsets: Sequence[int],
) -> torch.Tensor:
    """Per-token gather: ``y[t, slice s] += buf[s, t] @ lora_b[idx[t], slice s].T``."""
    _check_expand(y, buf.shape, lora_b, mapping, slice_offsets)
    idx = mapping.token_lora_indices
    tokens = torch.nonzero(idx >= 0).flatten()
    slots = idx[tokens]
    for s, (lo, hi) in enumerate(zip(slice_offsets[:-1], slice_offsets[1:])):
        delta = torch.einsum("tr,tnr->tn", buf[s, tokens].float(), lora_b[slots, lo:hi].float())
        y[tokens, lo:hi] = (y[tokens, lo:hi].float() + delta).to(y.dtype)
    return y


# ---------------------------------------------------------------- CPU (grouped) path


def _entry_weights(stacked: torch.Tensor, plan: GroupedPlan) -> torch.Tensor:
    """Weights of every batch entry: a view of a slot range, or gathered slots."""
    if plan.entry_slots is None:
        return stacked.narrow(0, plan.slot_lo, plan.num_entries)
    return stacked.index_select(0, plan.entry_slots)


def lora_shrink_grouped(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRABatchMapping) -> torch.Tensor:
    """Shrink as one padded ``torch.bmm`` over the plan's batch entries (no Python loop)."""
    _check_shrink(x, lora_a, mapping)
    _num_slots, num_slices, rank, in_features = lora_a.shape
    buf = x.new_zeros(num_slices, x.shape[0], rank)
    plan = mapping.grouped_plan
    if plan is None:
        return buf
    weights = _entry_weights(lora_a.flatten(1, 2), plan)  # [E, slices * rank, in]
    rows = x.index_select(0, plan.row_tokens).view(plan.num_entries, plan.chunk_size, in_features)
    out = torch.bmm(rows, weights.mT).view(-1, num_slices * rank)
    if plan.valid_rows is not None:
        out = out.index_select(0, plan.valid_rows)
    buf.index_copy_(1, mapping.sorted_token_ids, out.view(-1, num_slices, rank).transpose(0, 1))
    return buf


def lora_expand_grouped(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    mapping: LoRABatchMapping,
    slice_offsets: Sequence[int],
) -> torch.Tensor:
    """Expand as one padded ``torch.bmm`` per slice (1-3 slices) plus one ``index_add_``.

    The slices' outputs are joined into full rows first: on the CPU ``index_add_`` goes over whole
    contiguous rows, never over column slices of ``y`` (the figures: bench/README.md).
    """
    _check_expand(y, buf.shape, lora_b, mapping, slice_offsets)
    plan = mapping.grouped_plan
    if plan is None:
        return y
    rank = lora_b.shape[2]
    rows = buf.index_select(1, plan.row_tokens)  # [slices, E * chunk, rank]
    parts = []
    for s, (lo, hi) in enumerate(zip(slice_offsets[:-1], slice_offsets[1:])):
        weights = _entry_weights(lora_b[:, lo:hi], plan)  # [E, width, rank]
        parts.append(torch.bmm(rows[s].view(plan.num_entries, plan.chunk_size, rank), weights.mT))
    delta = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)).view(-1, y.shape[1])
    if plan.valid_rows is not None:
        delta = delta.index_select(0, plan.valid_rows)
    y.index_add_(0, mapping.sorted_token_ids, delta.to(y.dtype))
    return y


# ---------------------------------------------------------------- Triton path


def lora_shrink_triton(x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRABatchMapping) -> torch.Tensor:
    """Segment-based (SGMV) Triton shrink."""
    _check_shrink(x, lora_a, mapping)
    buf = x.new_zeros(lora_a.shape[1], x.shape[0], lora_a.shape[2])
    if mapping.num_active_tokens == 0:
        return buf
    from ._triton_lora import launch_shrink

    launch_shrink(x, lora_a, mapping, buf)
    return buf


def lora_expand_triton(
    y: torch.Tensor,
    buf: torch.Tensor,
    lora_b: torch.Tensor,
    mapping: LoRABatchMapping,
    slice_offsets: Sequence[int],
) -> torch.Tensor:
    """Segment-based (SGMV) Triton expand, in place on ``y``."""
    _check_expand(y, buf.shape, lora_b, mapping, slice_offsets)
    if mapping.num_active_tokens == 0:
        return y
    from ._triton_lora import launch_expand

    launch_expand(y, buf, lora_b, mapping, tuple(slice_offsets))
    return y
