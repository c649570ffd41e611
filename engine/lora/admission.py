"""Scheduler admission for LoRA requests: at most ``max_loras`` distinct adapters among running sequences,
only adapters that are loaded, and no adapter starved.

The running set (not just one step's batch) is capped, because a running sequence keeps its adapter in a
device slot until it finishes. A request whose adapter is still loading, or that would need a slot while
all are held, is skipped and waits without blocking the requests behind it.

Starvation-freedom: when a loaded adapter finds every slot held, the held adapter with the fewest running
sequences is *drained*: its new requests are no longer admitted, so its slot frees once its running
sequences finish (each within its max_tokens / max_model_len). The oldest blocked request then gets the
slot, as the waiting queue is visited oldest first. So an adapter waits at most one drain per adapter
whose requests are queued ahead of it, however steady the stream of requests for the other adapters.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from loraplex.engine.core.sequence import Sequence
from loraplex.engine.lora.manager import LoRAManager


class LoRAAdmission:
    """An AdmissionPolicy (see scheduler.py)."""

    def __init__(self, manager: LoRAManager, waiting: Callable[[], Iterable[Sequence]]) -> None:
        self.manager = manager
        self.max_loras = manager.max_loras
        self._waiting = waiting
        self.running_counts: Counter[str] = Counter()
        self.draining: str | None = None

    def begin_step(self, running: list[Sequence]) -> None:
        self.running_counts = Counter(s.adapter_hash for s in running if s.adapter_hash)
        if self.draining not in self.running_counts:
            self.draining = None
        wanted = list(dict.fromkeys(s.adapter_hash for s in self._waiting() if s.adapter_hash))
        self.manager.plan_loads(wanted, keep=set(self.running_counts))

    def can_admit(self, seq: Sequence) -> bool:
        h = seq.adapter_hash
        if h is None:
            return True
        if h == self.draining:
            return False
        if h in self.running_counts:
            return True
        if not self.manager.is_ready(h):
            return False
        if len(self.running_counts) < self.max_loras:
            return True
        if self.draining is None:
            self.draining = min(self.running_counts, key=lambda a: self.running_counts[a])
        return False

    def admitted(self, seq: Sequence) -> None:
        if seq.adapter_hash:
            self.running_counts[seq.adapter_hash] += 1
