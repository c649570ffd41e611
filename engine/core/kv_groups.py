"""KV-cache groups: how a model's layers share block tables and cache tensors (a hybrid KV-cache layout).

Layers are split by attention kind (global, or sliding with window W) into groups of the same size k (the
greatest common divisor of the kinds' layer counts). Each sequence has one block table per group: a global
group keeps every block, a sliding group releases the blocks that slid out of its window
(``engine.core.block_manager``). There are k cache tensors per K and V, each ``[num_blocks + 1, block_size, kv_heads,
head_dim]``; the i-th layer of every group uses the i-th tensor. So one physical block id holds the K/V of k
layers of whichever group took it, and the groups draw on one pool: memory goes where the sequences need it,
with no fixed split between kinds.

One kind (every layer global, or every layer sliding with one window) is one group of all layers: one block
table per sequence and one cache tensor per layer, as without groups. Gemma 3 270M (15 sliding, 3 global
layers) is 5 sliding groups and 1 global group of 3 layers; a sequence of n blocks' length holds n block ids in
the global group and at most about W / block_size + 1 in each sliding group, instead of n for all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class KVGroups:
    windows: tuple[int | None, ...]  # per group: its layers' sliding window, None = global
    layer_group: tuple[int, ...]  # per layer: its group (whose block table it reads)
    layer_slot: tuple[int, ...]  # per layer: its cache tensor, 0 .. layers_per_group - 1

    @classmethod
    def from_windows(cls, layer_windows: tuple[int | None, ...]) -> KVGroups:
        """Groups for these per-layer windows (None: the layer sees every earlier token); global groups first."""
        if not layer_windows:
            raise ValueError("a model needs at least one attention layer to group")
        for w in layer_windows:
            if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
                raise ValueError(f"a layer's sliding window must be a positive number of tokens or None, got {w!r}")
        kinds = sorted(set(layer_windows), key=lambda w: (w is not None, w or 0))
        members = {kind: [i for i, w in enumerate(layer_windows) if w == kind] for kind in kinds}
        size = math.gcd(*(len(m) for m in members.values()))
        windows: list[int | None] = []
        group = [0] * len(layer_windows)
        slot = [0] * len(layer_windows)
        for kind in kinds:
            layers = members[kind]
            for start in range(0, len(layers), size):
                for j, layer in enumerate(layers[start : start + size]):
                    group[layer], slot[layer] = len(windows), j
                windows.append(kind)
        return cls(tuple(windows), tuple(group), tuple(slot))

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def layers_per_group(self) -> int:
        """Layers of each group, and the number of cache tensors (per K and V) they share."""
        return len(self.layer_group) // len(self.windows)
