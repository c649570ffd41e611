"""Which adapter sits in which device slot: slot choice (free first, then the least recently used among
those no running sequence needs), and load / eviction counts. The weights live in ``SlotWeights``.
"""

from __future__ import annotations

import torch

from loraplex.adapters import BaseModelSpec
from loraplex.engine.lora.slot_weights import HostAdapter, SlotWeights


class SlotTable:
    def __init__(
        self, base: BaseModelSpec, num_slots: int, max_rank: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.num_slots = num_slots
        self.weights = SlotWeights(base, num_slots, max_rank, device, dtype)
        self._where: dict[str, int] = {}
        self._holder: list[str | None] = [None] * num_slots
        self._last_used: list[int] = [0] * num_slots  # step of last use, for LRU
        self.num_loads = 0
        self.num_evictions = 0

    def __contains__(self, content_hash: str) -> bool:
        return content_hash in self._where

    def resident(self) -> list[str]:
        return list(self._where)

    def activate(self, content_hash: str, host: HostAdapter | None, running: set[str], step: int) -> int:
        """The adapter's slot, loading ``host`` into one first if it is not resident.

        ``running``: adapters of running sequences, whose slots are never taken.
        """
        slot = self._where.get(content_hash)
        if slot is None:
            if host is None:
                raise RuntimeError(f"LoRA adapter {content_hash} was scheduled before it was loaded")
            slot = self._pick(running)
            self.weights.load(slot, host)
            self._where[content_hash] = slot
            self._holder[slot] = content_hash
            self.num_loads += 1
        self._last_used[slot] = step
        return slot

    def _pick(self, running: set[str]) -> int:
        free = [i for i, h in enumerate(self._holder) if h is None]
        if free:
            return free[0]  # lowest first: keeps active slots in a short range (the CPU path reads the range)
        idle = [i for i, h in enumerate(self._holder) if h not in running]
        if not idle:
            raise RuntimeError(
                f"all {self.num_slots} LoRA slots hold adapters of running sequences "
                f"(the scheduler admitted more than max_loras adapters)"
            )
        slot = min(idle, key=lambda i: self._last_used[i])
        holder = self._holder[slot]
        assert holder is not None  # (an idle slot is not free: it holds an adapter no running sequence uses)
        self.release(holder)
        self.num_evictions += 1
        return slot

    def release(self, content_hash: str) -> bool:
        """Free the adapter's slot (the caller makes sure no running sequence needs it)."""
        slot = self._where.pop(content_hash, None)
        if slot is None:
            return False
        self._holder[slot] = None
        return True

    def demote(self, content_hash: str) -> None:
        """Make the adapter's slot the first to be evicted."""
        slot = self._where.get(content_hash)
        if slot is not None:
            self._last_used[slot] = -1

    def check_invariants(self, running: set[str]) -> None:
        missing = running - set(self._where)
        if missing:
            raise AssertionError(f"running adapters without a device slot: {sorted(missing)}")
        for h, slot in self._where.items():
            if self._holder[slot] != h:
                raise AssertionError(f"slot {slot} holds {self._holder[slot]}, the index says {h}")
        held = sum(h is not None for h in self._holder)
        if held != len(self._where):
            raise AssertionError(f"{held} slots held but {len(self._where)} adapters indexed")
