"""The waiting queue and the order requests leave it, one class per ``--scheduling-policy``.

* ``fcfs``: arrival order; a preempted sequence goes back to the head.
* ``priority``: lowest ``Share.priority`` first, then arrival (vLLM's ``priority`` policy).
* ``fair``: weighted fair share of tokens between tenants, the Virtual Token Counter of Sheng et al.,
  "Fairness in Serving Large Language Models" (OSDI 2024). Every tenant has a counter of the service it
  received: each computed prompt token adds ``PROMPT_COST / weight`` and each generated token
  ``OUTPUT_COST / weight`` (prefix-cache hits cost nothing: they are not computed; a preempted sequence's
  recomputation is not charged twice). The next admitted request is the oldest one of the tenant with the
  lowest counter, so under saturation tenants receive tokens in proportion to their weights. A tenant that
  becomes active again has its counter lifted to the lowest counter among active tenants: an idle tenant
  banks no credit, and a tenant cannot escape its debt by pausing briefly either (its counter is kept).
  Priority classes come first: a request of class 1 (background) is admitted only when no admissible
  request of class 0 waits. Within this order the scheduler still applies its other rules (``max_loras``
  and adapter draining, compiled grammars, prefix sharing, KV blocks), which only ever skip a request.

Each queue also orders the *running* sequences for the scheduler: it serves them in that order and, when
KV blocks run out, preempts from the end, so under ``fair`` the tenant furthest over its share loses its
newest sequence first.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from loraplex.engine.core.sequence import Sequence

if TYPE_CHECKING:
    from loraplex.engine.config import SchedulingPolicy

PROMPT_COST = 1.0
OUTPUT_COST = 2.0  # a generated token costs a decode step of its own: twice a prefill token (the paper's default)


class RequestQueue(Protocol):
    def add(self, seq: Sequence) -> None:
        """A new request (``seq.arrival`` is set)."""

    def requeue(self, seq: Sequence) -> None:
        """A preempted sequence returns (ahead of newer requests of its class)."""

    def remove(self, seq: Sequence) -> None:
        """Leave the queue: admitted (the caller removes after iterating ``candidates``) or finished."""

    def finished(self, seq: Sequence) -> None:
        """A request ended (finished, aborted or failed), wherever it was."""

    def candidates(self) -> Iterator[Sequence]:
        """Waiting sequences in the order to try admitting them; ``charge`` may be called between items, and
        nothing may be removed until the iteration ends."""

    def charge(self, seq: Sequence, num_new_tokens: int) -> None:
        """``seq`` computes ``num_new_tokens`` more tokens this step."""

    def running_order(self, running: list[Sequence]) -> list[Sequence]:
        """The order to serve running sequences (preemption takes from the end)."""

    can_overtake: bool  # whether a waiting request can ever be ahead of a running one (not under fcfs)

    def live_tenants(self) -> Iterable[str]:
        """Tenants with requests in the engine (waiting or running); none where the policy does not tell them
        apart (fcfs, priority)."""

    def ahead_of(self, waiting: Sequence, running: Sequence, preempt: bool = False) -> bool:
        """Whether ``waiting`` goes before ``running``'s remaining work (its prefill chunks); with ``preempt``,
        whether it is far enough ahead to take ``running``'s seat when the batch is full."""

    def __iter__(self) -> Iterator[Sequence]: ...

    def __len__(self) -> int: ...

    def __contains__(self, seq: object) -> bool: ...


class _ListQueue:
    """What fcfs and priority share: one ordered container, no per-tenant accounting."""

    _q: deque[Sequence] | list[Sequence]

    def finished(self, seq: Sequence) -> None:
        pass

    def live_tenants(self) -> Iterable[str]:
        return ()

    def candidates(self) -> Iterator[Sequence]:
        return iter(list(self._q))

    def charge(self, seq: Sequence, num_new_tokens: int) -> None:
        pass

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._q)

    def __len__(self) -> int:
        return len(self._q)

    def __contains__(self, seq: object) -> bool:
        return seq in self._q


class FcfsQueue(_ListQueue):
    can_overtake = False

    def __init__(self) -> None:
        self._q: deque[Sequence] = deque()

    def ahead_of(self, waiting: Sequence, running: Sequence, preempt: bool = False) -> bool:
        return False  # arrival order: a running request arrived first

    def add(self, seq: Sequence) -> None:
        self._q.append(seq)

    def requeue(self, seq: Sequence) -> None:
        self._q.appendleft(seq)

    def remove(self, seq: Sequence) -> None:
        if self._q and self._q[0] is seq:
            self._q.popleft()
        else:
            self._q.remove(seq)

    def running_order(self, running: list[Sequence]) -> list[Sequence]:
        return running  # admission order


def _priority_key(seq: Sequence) -> tuple[int, int]:
    return seq.share.priority, seq.arrival


class PriorityQueue(_ListQueue):
    """Sorted by (priority, arrival); a preempted sequence keeps its arrival, so it goes back ahead."""

    can_overtake = True

    def __init__(self) -> None:
        self._q: list[Sequence] = []

    def ahead_of(self, waiting: Sequence, running: Sequence, preempt: bool = False) -> bool:
        return waiting.share.priority < running.share.priority

    def add(self, seq: Sequence) -> None:
        bisect.insort(self._q, seq, key=_priority_key)

    requeue = add

    def remove(self, seq: Sequence) -> None:
        i = bisect.bisect_left(self._q, _priority_key(seq), key=_priority_key)
        if i < len(self._q) and self._q[i] is seq:
            del self._q[i]
        else:
            self._q.remove(seq)

    def running_order(self, running: list[Sequence]) -> list[Sequence]:
        return sorted(running, key=_priority_key)


class FairQueue:
    """Virtual Token Counter scheduling (see the module docstring)."""

    can_overtake = True

    def __init__(self) -> None:
        # priority class -> tenant -> that tenant's waiting sequences, oldest first
        self._classes: dict[int, dict[str, list[Sequence]]] = {}
        self._len = 0
        self.counters: dict[str, float] = {}
        self._live: Counter[str] = Counter()  # tenant -> requests not yet finished (waiting or running)

    def ahead_of(self, waiting: Sequence, running: Sequence, preempt: bool = False) -> bool:
        """A tie goes to the waiting request (a tenant that just became active starts level with the lowest
        active counter). To take a seat, the waiting tenant must stay below the running one even after paying
        for its prompt: otherwise the next step would hand the seat straight back (each trade recomputes)."""
        a, b = waiting.share, running.share
        if a.tenant == b.tenant or a.priority != b.priority:
            return a.priority < b.priority
        gap = self.counters.get(b.tenant, 0.0) - self.counters.get(a.tenant, 0.0)
        if not preempt:
            return gap >= 0
        return gap > PROMPT_COST * waiting.num_prompt_tokens / a.weight

    # -- accounting
    def _activate(self, tenant: str) -> None:
        if self._live[tenant] == 0:
            active = [self.counters.get(t, 0.0) for t, n in self._live.items() if n > 0]
            if active:
                self.counters[tenant] = max(self.counters.get(tenant, 0.0), min(active))
            else:
                self.counters.clear()  # the engine was idle: nobody is owed or owes anything
                self.counters[tenant] = 0.0
        self._live[tenant] += 1

    def live_tenants(self) -> Iterable[str]:
        return self._live.keys()

    def finished(self, seq: Sequence) -> None:
        tenant = seq.share.tenant
        self._live[tenant] -= 1
        if self._live[tenant] <= 0:
            del self._live[tenant]  # its counter stays: debt survives a short pause

    def charge(self, seq: Sequence, num_new_tokens: int) -> None:
        start = max(seq.num_computed_tokens, seq.num_charged_tokens)
        end = seq.num_computed_tokens + num_new_tokens
        if end <= start:
            return  # recomputing what was charged before a preemption
        prompt = max(0, min(end, seq.num_prompt_tokens) - start)
        output = (end - start) - prompt
        seq.num_charged_tokens = end
        tenant = seq.share.tenant
        self.counters[tenant] = (
            self.counters.get(tenant, 0.0) + (PROMPT_COST * prompt + OUTPUT_COST * output) / seq.share.weight
        )

    # -- the queue
    def add(self, seq: Sequence) -> None:
        self._activate(seq.share.tenant)
        self._insert(seq)

    def requeue(self, seq: Sequence) -> None:
        self._insert(seq)

    def _insert(self, seq: Sequence) -> None:
        tenants = self._classes.setdefault(seq.share.priority, {})
        bisect.insort(tenants.setdefault(seq.share.tenant, []), seq, key=_arrival)
        self._len += 1

    def remove(self, seq: Sequence) -> None:
        tenants = self._classes[seq.share.priority]
        queue = tenants[seq.share.tenant]
        i = bisect.bisect_left(queue, seq.arrival, key=_arrival)
        if not (i < len(queue) and queue[i] is seq):
            i = queue.index(seq)
        del queue[i]
        self._len -= 1
        if not queue:
            del tenants[seq.share.tenant]
            if not tenants:
                del self._classes[seq.share.priority]

    def candidates(self) -> Iterator[Sequence]:
        for priority in sorted(self._classes):
            heads = dict.fromkeys(self._classes[priority], 0)
            queues = self._classes[priority]
            while heads:
                # re-evaluated per item: admitting a request charges its tenant, which may pass the turn on
                tenant = min(heads, key=lambda t: (self.counters.get(t, 0.0), queues[t][heads[t]].arrival))
                i = heads[tenant]
                if i + 1 < len(queues[tenant]):
                    heads[tenant] = i + 1
                else:
                    del heads[tenant]
                yield queues[tenant][i]

    def running_order(self, running: list[Sequence]) -> list[Sequence]:
        return sorted(running, key=lambda s: (s.share.priority, self.counters.get(s.share.tenant, 0.0), s.arrival))

    def __iter__(self) -> Iterator[Sequence]:
        """Every waiting sequence, by class, then tenant, then arrival (not the admission order)."""
        for priority in sorted(self._classes):
            for queue in self._classes[priority].values():
                yield from queue

    def __len__(self) -> int:
        return self._len

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, Sequence):
            return False
        queue = self._classes.get(seq.share.priority, {}).get(seq.share.tenant, [])
        return any(s is seq for s in queue)


def _arrival(seq: Sequence) -> int:
    return seq.arrival


def make_queue(policy: SchedulingPolicy) -> RequestQueue:
    queues: dict[SchedulingPolicy, type[RequestQueue]] = {
        "fcfs": FcfsQueue,
        "priority": PriorityQueue,
        "fair": FairQueue,
    }
    try:
        return queues[policy]()
    except KeyError:
        raise ValueError(f"unknown scheduling policy {policy!r}; one of {', '.join(queues)}") from None
