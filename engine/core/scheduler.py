"""Continuous batching with chunked prefill (one token budget per step, vLLM v1 style).

Every sequence simply has `num_tokens` known tokens of which `num_computed_tokens` have K/V in the
cache; a step gives each scheduled sequence some of the difference. Running sequences (decodes and
unfinished prefills) go first, in the policy's order (`engine.core.request_queue`: admission order under
fcfs, the least-served tenant first under fair); then waiting ones are admitted in the policy's order
while the token budget, `max_num_seqs`, the KV cache and the admission hooks (adapter slots, compiled
grammars) allow. When the cache runs out, the last running sequence in that order is preempted (the
newest under fcfs; the newest of the tenant furthest over its share under fair): its blocks are freed
and it is recomputed later (prefix caching usually brings most of it back).

Two more rules serve a request the queue puts *ahead* of running work (under fair: a tenant below the
others' share; under priority: a more urgent class; never under fcfs), so that one tenant's flood does not
set another's time to first token:

* a running sequence's multi-token chunk (a prefill chunk) of a tenant behind the first waiting request is
  scheduled after the admissions, from what is left of the budget: the newcomer's prefill goes first and
  the step is not filled with the flood's prompts before it (its decodes, one token each, still go first);
* when the batch is full (``max_num_seqs`` or KV blocks) and the first admissible waiting request is ahead of
  the last running sequence, that sequence gives up its seat: it is preempted as under memory pressure (at
  most one per step; under fair only when the newcomer's tenant stays below the other even after paying
  for its prompt, so that two tenants near parity do not trade seats);
* while two or more tenants have had requests in the engine within ``MULTI_TENANT_MEMORY_S`` (fair), the
  step's token budget is cut so a step takes about ``multi_tenant_step_ms`` (the engine learns
  its ``token_cap`` from recent step times): on a CPU a step's time grows with its tokens, and another
  tenant's newcomer waits for the step in flight;
* a tenant that far ahead (the same test) gets a step to itself: the running work of the tenants it is ahead
  of, decodes included, sits out the step in which its prefill runs (and their newcomers are not admitted in
  it), so its first token waits for the step in flight and its own prefill, not for a full batch of the flood's
  decodes. No sequence sits out two steps in a row, and none at all when the newcomer cannot be admitted
  after all. On a CPU a step's time grows with its rows, so this is what bounds such a tenant's TTFT.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from loraplex.engine.core.block_manager import BlockManager
from loraplex.engine.core.request_queue import RequestQueue, make_queue
from loraplex.engine.core.sequence import Sequence, SequenceStatus
from loraplex.engine.core.share import DEFAULT_SHARE
from loraplex.engine.core.token_cap import TokenCap

if TYPE_CHECKING:
    from loraplex.engine.config import SchedulingPolicy

# how long a tenant counts for the multi-tenant cut after its last request left the engine: a tenant between
# two requests is still there, and its next newcomer should not wait for a full-budget step of another's
MULTI_TENANT_MEMORY_S = 30.0


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __len__(self) -> int:
        return len(self.seqs)


class AdmissionPolicy(Protocol):
    """Decides whether a waiting sequence may join this step (adapter slots, grammar readiness)."""

    def begin_step(self, running: list[Sequence]) -> None: ...

    def can_admit(self, seq: Sequence) -> bool: ...

    def admitted(self, seq: Sequence) -> None: ...


# (running sequence whose known tokens all fit this step, tokens left in the step's budget) -> draft tokens to
# verify after them (engine.spec.speculative); they share the step's token budget
Proposer = Callable[[Sequence, int], list[int]]


@dataclass
class _Step:
    """One schedule() call's working state, handed from phase to phase."""

    batch: ScheduledBatch
    budget: int
    head: Sequence | None = None  # the first admissible waiting request, when the queue puts it ahead
    deferred: list[Sequence] = field(default_factory=list)  # chunks of sequences behind `head`: after admissions
    held: list[Sequence] = field(default_factory=list)  # all work of sequences far behind `head`: not this step
    memory_preempted: bool = False
    admitted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        admission: list[AdmissionPolicy] | None = None,
        policy: SchedulingPolicy = "fcfs",
        *,
        proposer: Proposer | None = None,
        on_preempt: Callable[[Sequence], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        token_cap: TokenCap | None = None,
    ) -> None:
        """``token_cap``: the step's token budget while two or more tenants were seen lately (the engine learns
        it from step times and EngineArgs.multi_tenant_step_ms); none: no cut. ``clock`` dates tenants' last
        requests (MULTI_TENANT_MEMORY_S)."""
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.waiting: RequestQueue = make_queue(policy)
        self.running: list[Sequence] = []
        self.admission = admission or []
        self.on_preempt = on_preempt
        self.proposer = proposer
        self.clock = clock
        self.token_cap = token_cap or TokenCap()
        self._arrivals = itertools.count(1)
        self._held_last: set[int] = set()  # ids of the sequences held last step: never twice in a row
        self._tenants_seen: dict[str, float] = {}  # tenant -> when it last had requests in the engine

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        seq.arrival = next(self._arrivals)
        self.waiting.add(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence from the queues and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq.status is not SequenceStatus.RUNNING and seq in self.waiting:
            self.waiting.remove(seq)
        self.waiting.finished(seq)
        self.bm.free(seq)

    def _first_admissible(self) -> Sequence | None:
        for seq in self.waiting.candidates():
            if all(policy.can_admit(seq) for policy in self.admission):
                return seq
        return None

    def _make_room(self, batch: ScheduledBatch) -> Sequence | None:
        """The first admissible waiting request, if the queue puts it ahead of some running work; when the batch
        is full, the last running sequence behind it gives up its seat (preempted)."""
        if not self.running or not self.waiting or not self.waiting.can_overtake:
            return None
        head = self._first_admissible()
        if head is None:
            return None
        victim = self.running[-1]
        full = len(self.running) >= self.max_num_seqs or self.bm.num_free_blocks < self.bm.blocks_needed(
            head, min(head.num_tokens, self.max_num_batched_tokens)
        )
        if full and self.waiting.ahead_of(head, victim, preempt=True):
            self._preempt(victim, batch)
            for policy in self.admission:  # the victim's adapter slot may be free now
                policy.begin_step(self.running)
        return head

    def _shared_recently(self) -> bool:
        """Two or more tenants have had requests in the engine within the last MULTI_TENANT_MEMORY_S: the next
        newcomer of another tenant is likely, and it would wait for the step in flight."""
        now = self.clock()
        seen = self._tenants_seen
        for tenant in self.waiting.live_tenants():
            if tenant != DEFAULT_SHARE.tenant:  # internal work (start-up warm-up) is no tenant's: it never cuts steps
                seen[tenant] = now
        if len(seen) > 1:
            for tenant in [t for t, last in seen.items() if now - last > MULTI_TENANT_MEMORY_S]:
                del seen[tenant]
        return len(seen) > 1

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        self.bm.free(seq)
        seq.spec_token_ids = []
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.requeue(seq)
        batch.preempted.append(seq)
        if self.on_preempt:
            self.on_preempt(seq)

    def schedule(self) -> ScheduledBatch:
        """One step: running work first, then admissions, then the chunks deferred behind a newcomer."""
        step = _Step(ScheduledBatch(), self.max_num_batched_tokens)
        for policy in self.admission:
            policy.begin_step(self.running)
        self._schedule_running(step)
        self._admit_waiting(step)
        self._schedule_deferred(step)
        return step.batch

    def _schedule_running(self, step: _Step) -> None:
        """Phase 1: running sequences in the policy's order (drafts proposed where all known tokens fit);
        preempt from the end of that order when blocks run out."""
        batch = step.batch
        self.running = self.waiting.running_order(self.running)
        head = step.head = self._make_room(batch)
        deferred, held = step.deferred, step.held
        holds = head is not None and any(
            id(seq) not in self._held_last and self.waiting.ahead_of(head, seq, preempt=True) for seq in self.running
        )
        cap = self.token_cap.value
        if not holds and cap is not None and self._shared_recently():
            # every running sequence keeps at least one token (none is starved by the cut) and a block's worth
            # of prompt chunk is left for the others
            step.budget = min(step.budget, max(cap, len(self.running) + self.bm.block_size))
        i = 0
        while i < len(self.running) and step.budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, step.budget)
            if n <= 0:
                i += 1
                continue
            if (
                holds
                and head is not None
                and id(seq) not in self._held_last
                and self.waiting.ahead_of(head, seq, preempt=True)
            ):
                held.append(seq)
                i += 1
                continue
            if n > 1 and head is not None and self.waiting.ahead_of(head, seq):
                deferred.append(seq)
                i += 1
                continue
            seq.spec_token_ids = []
            if self.proposer is not None and n == seq.num_tokens - seq.num_computed_tokens and step.budget > n:
                seq.spec_token_ids = self.proposer(seq, step.budget - n)
            while not self.bm.allocate(seq, n + len(seq.spec_token_ids)):
                if seq.spec_token_ids:  # drafts are the first thing to give up
                    seq.spec_token_ids = []
                    continue
                victim = self.running[-1]
                self._preempt(victim, batch)
                step.memory_preempted = True
                for skipped in (deferred, held):
                    if victim in skipped:
                        skipped.remove(victim)
                if victim is seq:
                    break
            else:
                self.waiting.charge(seq, n)  # drafts are charged only once accepted (engine.spec.settle)
                n += len(seq.spec_token_ids)
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                step.budget -= n
                i += 1
                continue
            break  # seq itself was preempted: it was the last, nothing after it remains

    def _admit_waiting(self, step: _Step) -> None:
        """Phase 2: admit waiting sequences (none when this step ran out of blocks). A sequence whose first
        uncached block another sequence of this step computes waits for the next step, where that block is
        cached, rather than computing it a second time now (it keeps its place in the queue)."""
        batch = step.batch
        computing = {
            h
            for seq, n in zip(batch.seqs, batch.num_new_tokens)
            for h in self.bm.blocks_completed_by(seq, n - len(seq.spec_token_ids))  # drafts are not known yet
        }
        admitted = step.admitted
        if not step.memory_preempted:
            for seq in self.waiting.candidates():
                if step.budget <= 0 or len(self.running) >= self.max_num_seqs:
                    break
                if step.held and step.head is not None and self.waiting.ahead_of(step.head, seq, preempt=True):
                    continue  # the held tenants' newcomers wait with their running work
                if not all(policy.can_admit(seq) for policy in self.admission):
                    continue  # e.g. grammar still compiling: wait without blocking others
                if computing and self.bm.first_uncached_block(seq) in computing:
                    continue
                if not seq.block_table:
                    self.bm.match_prefix(seq)
                n = min(seq.num_tokens - seq.num_computed_tokens, step.budget)
                if not self.bm.allocate(seq, n):
                    self.bm.free(seq)  # give back prefix hits; retry next step
                    break
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                admitted.append(seq)
                for policy in self.admission:
                    policy.admitted(seq)
                self.waiting.charge(seq, n)
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                step.budget -= n
                computing.update(self.bm.blocks_completed_by(seq, n))
        for seq in admitted:  # the queue is not changed while its candidates are visited
            self.waiting.remove(seq)

    def _schedule_deferred(self, step: _Step) -> None:
        """Phase 3: the deferred chunks, from what is left (no preemption for them: they run next step
        otherwise); the held sequences too when `head` was not admitted after all (blocks, a shared block
        computing): a step is never given up for nothing."""
        deferred, held = step.deferred, step.held
        if step.head is not None and not any(seq is step.head for seq in step.admitted):
            deferred, held = held + deferred, []
        self._held_last = {id(seq) for seq in held}
        for seq in deferred:
            seq.spec_token_ids = []  # no drafts behind a deferred chunk
            n = min(seq.num_tokens - seq.num_computed_tokens, step.budget)
            if n <= 0 or seq not in self.running or not self.bm.allocate(seq, n):
                continue
            self.waiting.charge(seq, n)
            step.batch.seqs.append(seq)
            step.batch.num_new_tokens.append(n)
            step.budget -= n

    def num_waiting(self) -> int:
        return len(self.waiting)

    def num_running(self) -> int:
        return len(self.running)
