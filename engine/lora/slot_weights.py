"""Device-resident LoRA weights: ``max_loras`` slots per layer and projection group, in the kernels' layout.

Per group (``qkv``, ``o``, ``gate_up``, ``down``) one tensor holds every layer and slot:
``a[group]``: ``[num_layers, num_slots, num_slices, max_rank, in_features]`` and
``bt[group]``: ``[num_layers, num_slots, max_rank, out_total]`` (B transposed, scaling folded in, zero padding).
``a[group][layer]`` is the kernels' ``lora_a`` as a contiguous view and ``bt[group][layer].transpose(1, 2)``
their ``lora_b`` ``[num_slots, out_total, max_rank]``: a strided view whose per-slot matrices the CPU path
multiplies as plain row-major GEMMs (faster than through the transposed layout) and whose rows the Triton
kernels read coalesced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.adapters import LORA_GROUPS, BaseModelSpec

LayerGroup = tuple[int, str]


@dataclass
class HostAdapter:
    """One adapter's stacked weights in host memory, only for the (layer, group) pairs it touches."""

    content_hash: str
    rank: int  # the largest rank over its modules
    weights: dict[LayerGroup, tuple[torch.Tensor, torch.Tensor]]  # A [slices, R, in], B^T [R, out_total]
    nbytes: int


class SlotWeights:
    def __init__(
        self, base: BaseModelSpec, num_slots: int, max_rank: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.a: dict[str, torch.Tensor] = {}
        self.bt: dict[str, torch.Tensor] = {}
        self.slice_offsets: dict[str, tuple[int, ...]] = {}
        layers = base.num_hidden_layers
        for group, modules in LORA_GROUPS.items():
            in_features = base.module_shape(modules[0])[0]
            offsets = [0]
            for module in modules:
                offsets.append(offsets[-1] + base.module_shape(module)[1])
            self.slice_offsets[group] = tuple(offsets)
            self.a[group] = torch.zeros(
                layers, num_slots, len(modules), max_rank, in_features, device=device, dtype=dtype
            )
            self.bt[group] = torch.zeros(layers, num_slots, max_rank, offsets[-1], device=device, dtype=dtype)
        # per slot: (layer, group) pairs holding non-zero weights, and the occupant's rank
        self.touched: list[frozenset[LayerGroup]] = [frozenset()] * num_slots
        self.ranks: list[int] = [0] * num_slots

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.a.values(), *self.bt.values()))

    def load(self, slot: int, adapter: HostAdapter) -> None:
        """Copy an adapter into a slot, zeroing what the previous occupant left behind."""
        keys = frozenset(adapter.weights)
        for layer, group in self.touched[slot] - keys:
            self.a[group][layer, slot].zero_()
            self.bt[group][layer, slot].zero_()
        for (layer, group), (a, bt) in adapter.weights.items():
            self.a[group][layer, slot].copy_(a, non_blocking=True)
            self.bt[group][layer, slot].copy_(bt, non_blocking=True)
        self.touched[slot] = keys
        self.ranks[slot] = adapter.rank

    @property
    def device(self) -> torch.device:
        return self.a["qkv"].device
