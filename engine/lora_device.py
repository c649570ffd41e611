"""Which adapter sits in which device slot: rank-class pools, slot choice (free first, then least recently
used among those no running sequence needs), load and eviction counts.

On CPU the slots come in pools by rank class (8, 16, ... up to max_lora_rank), each with ``max_loras``
slots: the CPU LoRA path is bound by reading adapter weights, and a rank-8 adapter in a rank-16 slot
would read twice its bytes (zero padding included). On CUDA one pool at max_lora_rank (the Triton kernels
tile over the rank and device memory is the scarcer resource).
"""
from __future__ import annotations

import torch

from loraplex.adapters import BaseModelSpec
from loraplex.engine.lora_slots import HostAdapter, LoRASlots

SlotId = tuple[int, int]  # (pool, slot)


def rank_classes(max_rank: int, device: torch.device) -> list[int]:
    if device.type != "cpu":
        return [max_rank]
    ranks, r = [], 8
    while r < max_rank:
        ranks.append(r)
        r *= 2
    return ranks + [max_rank]


class DeviceSlots:
    def __init__(self, base: BaseModelSpec, num_slots: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.num_slots = num_slots
        self.ranks = rank_classes(max_rank, device)
        self.pools = [LoRASlots(base, num_slots, r, device, dtype) for r in self.ranks]
        self._where: dict[str, SlotId] = {}
        self._holder: list[list[str | None]] = [[None] * num_slots for _ in self.pools]
        self._last_used: list[list[int]] = [[0] * num_slots for _ in self.pools]
        self.num_loads = 0
        self.num_evictions = 0

    def pool_for(self, rank: int) -> int:
        """The pool an adapter of this rank goes to (the smallest rank class that holds it)."""
        return next(i for i, r in enumerate(self.ranks) if rank <= r)

    def pool_rank(self, rank: int) -> int:
        """The rank to stack an adapter of this rank at, for its pool."""
        return self.ranks[self.pool_for(rank)]

    def __contains__(self, content_hash: str) -> bool:
        return content_hash in self._where

    def resident(self) -> list[str]:
        return list(self._where)

    def activate(self, content_hash: str, host: HostAdapter | None, running: set[str], step: int) -> SlotId:
        """The adapter's slot, loading ``host`` into one first if it is not resident.

        ``running``: adapters of running sequences, whose slots are never taken.
        """
        where = self._where.get(content_hash)
        if where is None:
            if host is None:
                raise RuntimeError(f"LoRA adapter {content_hash} was scheduled before it was loaded")
            pool = self.pool_for(host.rank)
            where = (pool, self._pick(pool, running))
            self.pools[pool].load(where[1], host)
            self._where[content_hash] = where
            self._holder[pool][where[1]] = content_hash
            self.num_loads += 1
        self._last_used[where[0]][where[1]] = step
        return where

    def _pick(self, pool: int, running: set[str]) -> int:
        holders = self._holder[pool]
        free = [i for i, h in enumerate(holders) if h is None]
        if free:
            return free[0]  # lowest first: keeps the active slots in a short range (the CPU path reads the range)
        idle = [i for i, h in enumerate(holders) if h not in running]
        if not idle:
            raise RuntimeError(f"all {self.num_slots} LoRA slots of rank {self.ranks[pool]} hold adapters of "
                               f"running sequences (the scheduler admitted more than max_loras adapters)")
        slot = min(idle, key=lambda i: self._last_used[pool][i])
        self.release(holders[slot])  # type: ignore[arg-type]
        self.num_evictions += 1
        return slot

    def release(self, content_hash: str) -> bool:
        """Free the adapter's slot (the caller makes sure no running sequence needs it)."""
        where = self._where.pop(content_hash, None)
        if where is None:
            return False
        self._holder[where[0]][where[1]] = None
        return True

    def demote(self, content_hash: str) -> None:
        """Make the adapter's slot the first to be evicted."""
        where = self._where.get(content_hash)
        if where is not None:
            self._last_used[where[0]][where[1]] = -1

    def check_invariants(self, running: set[str]) -> None:
        missing = running - set(self._where)
        if missing:
            raise AssertionError(f"running adapters without a device slot: {sorted(missing)}")
        for h, (pool, slot) in self._where.items():
            if self._holder[pool][slot] != h:
                raise AssertionError(f"slot {pool}/{slot} holds {self._holder[pool][slot]}, the index says {h}")
        held = sum(h is not None for holders in self._holder for h in holders)
        if held != len(self._where):
            raise AssertionError(f"{held} slots held but {len(self._where)} adapters indexed")
