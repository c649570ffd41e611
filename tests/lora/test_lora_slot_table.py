"""Device slot choice: a free slot first, else the least recently used slot whose adapter no running sequence
needs. Evicting a running adapter's slot would overwrite weights a sequence of this very step is about to read."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine.lora.slot_table import SlotTable
from loraplex.engine.lora.slot_weights import HostAdapter
from tests.lora.test_lora_context import BASE


def host(name: str) -> HostAdapter:
    return HostAdapter(content_hash=name, rank=1, weights={}, nbytes=0)


def table(num_slots: int) -> SlotTable:
    return SlotTable(BASE, num_slots, max_rank=1, device=torch.device("cpu"), dtype=torch.float32)


def test_the_least_recently_used_running_adapter_keeps_its_slot() -> None:
    slots = table(2)
    a = slots.activate("a", host("a"), running={"a"}, step=1)
    b = slots.activate("b", host("b"), running={"a", "b"}, step=2)
    assert {a, b} == {0, 1} and slots.num_evictions == 0
    # "a" is the least recently used, but a running sequence still needs it: "b"'s slot is taken.
    c = slots.activate("c", host("c"), running={"a", "c"}, step=3)
    assert c == b and slots.num_evictions == 1
    assert set(slots.resident()) == {"a", "c"}
    slots.check_invariants({"a", "c"})


def test_no_idle_slot_is_an_error_not_an_eviction() -> None:
    slots = table(2)
    slots.activate("a", host("a"), running={"a"}, step=1)
    slots.activate("b", host("b"), running={"a", "b"}, step=2)
    with pytest.raises(RuntimeError, match="all 2 LoRA slots hold adapters of running sequences"):
        slots.activate("c", host("c"), running={"a", "b", "c"}, step=3)
    assert set(slots.resident()) == {"a", "b"} and slots.num_evictions == 0
