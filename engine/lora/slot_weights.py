"""Device-resident LoRA weights: ``max_loras`` slots per layer and projection group, in the kernels' layout.

Per group (``qkv``, ``o``, ``gate_up``, ``down``) one tensor holds every layer and slot:
``a[group]``: ``[num_layers, num_slots, num_slices, max_rank, in_features]`` and
``bt[group]``: ``[num_layers, num_slots, max_rank, out_total]`` (B transposed, scaling folded in, zero padding).
``a[group][layer]`` is the kernels' ``lora_a`` as a contiguous view and ``bt[group][layer].transpose(1, 2)``
their ``lora_b`` ``[num_slots, out_total, max_rank]``: a strided view whose per-slot matrices the CPU path
multiplies as plain row-major GEMMs (faster than through the transposed layout) and whose rows the Triton
kernels read coalesced.

DoRA adapters add, per group, a row factor per output feature (``dora_scale[group]``:
``[num_layers, num_slots + 1, out_total]``, 1 where a slot has no DoRA; the last row, all 1, is the base
tokens') and, on projections with a bias, a shift (``dora_shift[group]``, 0 elsewhere): the step context multiplies
each token's output row by its slot's factor after adding the LoRA delta. Both are allocated at the first DoRA
adapter loaded: an engine that never serves one holds neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # DoRA only: per (layer, group) its row factors [out_total] and, where the projection has a bias, the shift
    # (1 - factor) * bias [out_total] (peft scales the biasless output; the engine scales the output with the bias)
    dora: dict[LayerGroup, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)


class SlotWeights:
    def __init__(
        self, base: BaseModelSpec, num_slots: int, max_rank: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.a: dict[str, torch.Tensor] = {}
        self.bt: dict[str, torch.Tensor] = {}
        self.slice_offsets: dict[str, tuple[int, ...]] = {}
        self.dora_scale: dict[str, torch.Tensor] = {}  # see the module's docstring
        self.dora_shift: dict[str, torch.Tensor] = {}
        self._layers = base.num_hidden_layers
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
        self.dora: list[frozenset[LayerGroup]] = [frozenset()] * num_slots  # per slot: pairs with DoRA factors

    def nbytes(self) -> int:
        tables = (*self.a.values(), *self.bt.values(), *self.dora_scale.values(), *self.dora_shift.values())
        return sum(t.numel() * t.element_size() for t in tables)

    def _dora_tables(self, dtype: torch.dtype, shift: bool) -> None:
        """Allocate the DoRA factor tables (and the shift tables, if ``shift``) on first use."""
        for group, offsets in self.slice_offsets.items():
            size = (self._layers, self.num_slots + 1, offsets[-1])
            if group not in self.dora_scale:
                self.dora_scale[group] = torch.ones(size, device=self.device, dtype=dtype)
            if shift and group not in self.dora_shift:
                self.dora_shift[group] = torch.zeros(size, device=self.device, dtype=dtype)

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
        for layer, group in self.dora[slot]:
            self.dora_scale[group][layer, slot].fill_(1)
            if group in self.dora_shift:
                self.dora_shift[group][layer, slot].zero_()
        for (layer, group), (scale, shift) in adapter.dora.items():
            self._dora_tables(scale.dtype, shift is not None)
            self.dora_scale[group][layer, slot].copy_(scale, non_blocking=True)
            if shift is not None:
                self.dora_shift[group][layer, slot].copy_(shift, non_blocking=True)
        self.dora[slot] = frozenset(adapter.dora)

    @property
    def device(self) -> torch.device:
        return self.a["qkv"].device
