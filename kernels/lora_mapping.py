"""Per-step token → LoRA-slot mapping shared by every LoRA layer of one forward pass.

Built once per engine step from ``token_lora_indices`` (``-1`` = no adapter). It holds the
per-token form (for the references), the segment form (tokens grouped by slot, for the
Triton SGMV kernels) and, built lazily on first use, the padded-batch plan of the CPU
path (:class:`GroupedPlan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

__all__ = ["GroupedPlan", "LoRABatchMapping"]

# Cost model of the CPU plan, in units of "one padded token row of a batched matmul":
# every batch entry costs about one extra row (weight read, call overhead), and copying
# one slot's weights into a gathered batch about three more (calibrated with torch.bmm on
# SmolLM2 shapes, float32, one CPU thread).
_ENTRY_COST = 1.0
_GATHER_COST = 3.0


@dataclass(frozen=True, eq=False)
class GroupedPlan:
    """How the CPU path lays tokens out for one ``torch.bmm`` over batch entries.

    Entry ``e`` holds up to ``chunk_size`` tokens of one slot. Its weights are either
    the contiguous slot range ``slot_lo .. slot_lo + num_entries`` of the stacked
    weights (a view, no copy; slots without tokens just get padding rows) when
    ``entry_slots`` is None, or the slots in ``entry_slots`` (gathered, which lets a long
    prefill segment split into several entries instead of padding every other slot).
    """

    chunk_size: int
    num_entries: int
    slot_lo: int
    entry_slots: torch.Tensor | None  # [num_entries] int64, None = slot range view
    row_tokens: torch.Tensor  # [num_entries * chunk_size] token per padded row (pads: token 0)
    valid_rows: torch.Tensor | None  # [num_active_tokens] padded row of each sorted token; None = all rows real


def _grouped_plan(
    sorted_token_ids: torch.Tensor, active_slots: torch.Tensor, seg_lens: torch.Tensor, seg_starts: torch.Tensor
) -> GroupedPlan:
    """Pick the cheapest chunk size / weight source under the cost model (host tensors)."""
    max_len = int(seg_lens.max())
    slot_lo = int(active_slots[0])
    slot_span = int(active_slots[-1]) - slot_lo + 1
    # Candidate 0: one entry per slot of the active range, weights as a view.
    best_cost, chunk_size, use_view = slot_span * (max_len + _ENTRY_COST), max_len, True
    chunk = 1
    while True:  # gathered candidates: power-of-two chunk sizes, then the longest segment
        chunk = min(chunk, max_len)
        entries = int(((seg_lens + chunk - 1) // chunk).sum())
        cost = entries * (chunk + _ENTRY_COST + _GATHER_COST)
        if cost < best_cost:
            best_cost, chunk_size, use_view = cost, chunk, False
        if chunk == max_len:
            break
        chunk *= 2
    chunk = chunk_size

    num_active_tokens = sorted_token_ids.shape[0]
    seg_of_token = torch.repeat_interleave(torch.arange(seg_lens.shape[0]), seg_lens)
    pos_in_seg = torch.arange(num_active_tokens) - seg_starts[seg_of_token]
    if use_view:
        entry_base = active_slots - slot_lo
        num_entries = slot_span
        entry_slots = None
    else:
        entries_per_seg = (seg_lens + chunk - 1) // chunk
        entry_base = torch.cumsum(entries_per_seg, 0) - entries_per_seg
        num_entries = int(entries_per_seg.sum())
        entry_slots = torch.repeat_interleave(active_slots, entries_per_seg)
    rows = (entry_base[seg_of_token] + pos_in_seg // chunk) * chunk + pos_in_seg % chunk
    row_tokens = torch.zeros(num_entries * chunk, dtype=torch.long)
    row_tokens[rows] = sorted_token_ids
    dense = num_entries * chunk == num_active_tokens  # rows is then 0..n-1 in order
    return GroupedPlan(
        chunk_size=chunk,
        num_entries=num_entries,
        slot_lo=slot_lo,
        entry_slots=entry_slots,
        row_tokens=row_tokens,
        valid_rows=None if dense else rows,
    )


@dataclass(frozen=True, eq=False)
class LoRABatchMapping:
    """Token → adapter-slot mapping of one step, in per-token and segment form.

    Segment form: ``sorted_token_ids`` lists the tokens that use an adapter grouped by
    slot (stable order inside a slot); segment ``i`` belongs to ``active_slots[i]`` and
    covers ``sorted_token_ids[seg_starts[i] : seg_starts[i] + seg_lens[i]]``.
    All tensors are int64 on ``device``.
    """

    token_lora_indices: torch.Tensor  # [num_tokens], -1 = no adapter
    num_slots: int
    sorted_token_ids: torch.Tensor  # [num_active_tokens]
    active_slots: torch.Tensor  # [num_active]
    seg_lens: torch.Tensor  # [num_active]
    seg_starts: torch.Tensor  # [num_active]
    max_seg_len: int
    # (sorted_token_ids, active_slots, seg_lens, seg_starts) on the CPU, contiguous int64: input of the
    # lazily built plan, read directly by the C kernel.
    host_segments: tuple[torch.Tensor, ...] = field(repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return self.token_lora_indices.shape[0]

    @property
    def num_active(self) -> int:
        """Number of slots with at least one token."""
        return self.active_slots.shape[0]

    @property
    def num_active_tokens(self) -> int:
        return self.sorted_token_ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.token_lora_indices.device

    @classmethod
    def build(
        cls,
        token_lora_indices: torch.Tensor | Sequence[int],
        num_slots: int,
        device: torch.device | str | None = None,
    ) -> LoRABatchMapping:
        """Group tokens by slot. ``device`` defaults to the indices' device (CPU for a list)."""
        if device is None:
            device = token_lora_indices.device if isinstance(token_lora_indices, torch.Tensor) else "cpu"
        idx = torch.as_tensor(token_lora_indices).to(device="cpu", dtype=torch.long).reshape(-1)
        if idx.numel() and (int(idx.min()) < -1 or int(idx.max()) >= num_slots):
            raise ValueError(
                f"token_lora_indices must lie in [-1, {num_slots}) for {num_slots} slots, "
                f"got values in [{int(idx.min())}, {int(idx.max())}]"
            )
        active = idx >= 0
        # Stable sort with "no adapter" (-1) moved past every slot, then cut it off.
        order = torch.argsort(torch.where(active, idx, num_slots), stable=True)
        sorted_token_ids = order[: int(active.sum())]
        counts = torch.bincount(idx[active], minlength=num_slots)
        active_slots = torch.nonzero(counts).flatten()
        seg_lens = counts[active_slots]
        seg_starts = torch.cumsum(seg_lens, 0) - seg_lens
        host = (sorted_token_ids, active_slots, seg_lens, seg_starts)
        dev = [t.to(device) for t in (idx, *host)]
        return cls(
            token_lora_indices=dev[0],
            num_slots=num_slots,
            sorted_token_ids=dev[1],
            active_slots=dev[2],
            seg_lens=dev[3],
            seg_starts=dev[4],
            max_seg_len=int(seg_lens.max()) if seg_lens.numel() else 0,
            host_segments=host,
        )

    @cached_property
    def grouped_plan(self) -> GroupedPlan | None:
        """Padded-batch plan of the CPU path (None when no token uses an adapter)."""
        if self.num_active_tokens == 0:
            return None
        plan = _grouped_plan(*self.host_segments)
        if self.device.type == "cpu":
            return plan
        move = lambda t: None if t is None else t.to(self.device)  # noqa: E731
        return GroupedPlan(
            chunk_size=plan.chunk_size,
            num_entries=plan.num_entries,
            slot_lo=plan.slot_lo,
            entry_slots=move(plan.entry_slots),
            row_tokens=move(plan.row_tokens),
            valid_rows=move(plan.valid_rows),
        )
