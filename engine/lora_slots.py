"""Device-resident LoRA weights: ``max_loras`` slots per layer and projection group, in the kernels' layout,
and the per-step LoRA context that applies them.

Per group (``qkv``, ``o``, ``gate_up``, ``down``) one tensor holds every layer and slot:
``a[group]``: ``[num_layers, num_slots, num_slices, max_rank, in_features]`` and
``b[group]``: ``[num_layers, num_slots, out_total, max_rank]`` (scaling folded in, zero padding), so
``a[group][layer]`` is exactly the ``lora_a`` the kernels take, as a contiguous view.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.adapters import LORA_GROUPS, BaseModelSpec
from loraplex.kernels.lora import LoRABatchMapping, lora_expand, lora_shrink

LayerGroup = tuple[int, str]


@dataclass
class HostAdapter:
    """One adapter's stacked weights in host memory, only for the (layer, group) pairs it touches."""

    content_hash: str
    weights: dict[LayerGroup, tuple[torch.Tensor, torch.Tensor]]  # A [slices, R, in], B [out_total, R]
    nbytes: int


class LoRASlots:
    def __init__(self, base: BaseModelSpec, num_slots: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.a: dict[str, torch.Tensor] = {}
        self.b: dict[str, torch.Tensor] = {}
        self.slice_offsets: dict[str, tuple[int, ...]] = {}
        layers = base.num_hidden_layers
        for group, modules in LORA_GROUPS.items():
            in_features = base.module_shape(modules[0])[0]
            offsets = [0]
            for module in modules:
                offsets.append(offsets[-1] + base.module_shape(module)[1])
            self.slice_offsets[group] = tuple(offsets)
            self.a[group] = torch.zeros(layers, num_slots, len(modules), max_rank, in_features, device=device,
                                        dtype=dtype)
            self.b[group] = torch.zeros(layers, num_slots, offsets[-1], max_rank, device=device, dtype=dtype)
        # (layer, group) pairs holding non-zero weights, per slot
        self.touched: list[frozenset[LayerGroup]] = [frozenset()] * num_slots

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.a.values(), *self.b.values()))

    def load(self, slot: int, adapter: HostAdapter) -> None:
        """Copy an adapter into a slot, zeroing what the previous occupant left behind."""
        keys = frozenset(adapter.weights)
        for layer, group in self.touched[slot] - keys:
            self.a[group][layer, slot].zero_()
            self.b[group][layer, slot].zero_()
        for (layer, group), (a, b) in adapter.weights.items():
            self.a[group][layer, slot].copy_(a, non_blocking=True)
            self.b[group][layer, slot].copy_(b, non_blocking=True)
        self.touched[slot] = keys

    def context(self, token_slots: torch.Tensor, active_slots: set[int]) -> BatchLoRAContext:
        """The LoRA context of one step; ``token_slots`` holds a slot per token (-1 = base model)."""
        mapping = LoRABatchMapping.build(token_slots, self.num_slots, device=self.a["qkv"].device)
        active: set[LayerGroup] = set()
        for slot in active_slots:
            active |= self.touched[slot]
        return BatchLoRAContext(self, mapping, frozenset(active))


class BatchLoRAContext:
    """Implements llama.LoRAContext for one step: ``y += B[slot] @ (A[slot] @ x)`` per token, in place.

    Layer/group pairs that no adapter of this step touches are skipped.
    """

    def __init__(self, slots: LoRASlots, mapping: LoRABatchMapping, active: frozenset[LayerGroup]) -> None:
        self.slots = slots
        self.mapping = mapping
        self.active = active

    def apply(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> None:
        if (layer, group) not in self.active:
            return
        s = self.slots
        buf = lora_shrink(x, s.a[group][layer], self.mapping)
        lora_expand(y, buf, s.b[group][layer], self.mapping, s.slice_offsets[group])
