"""The scheduling policies (engine.core.request_queue) driven through the real Scheduler and BlockManager, with the
model step simulated: every scheduled sequence computes its tokens and a decode yields one output token."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest

from loraplex.engine.core.block_manager import BlockManager
from loraplex.engine.core.request_queue import OUTPUT_COST, PROMPT_COST, FairQueue
from loraplex.engine.core.scheduler import MULTI_TENANT_MEMORY_S, ScheduledBatch, Scheduler
from loraplex.engine.core.sequence import Sequence
from loraplex.engine.core.share import Share
from loraplex.engine.errors import RequestError
from loraplex.engine.sample.sampling_params import SamplingParams


class Sim:
    """A scheduler over a small KV cache; ``step`` plays the model: computes what was scheduled, gives every
    sequence that reached the end of its tokens one output token, and finishes those at ``max_tokens``."""

    def __init__(
        self,
        policy: str,
        *,
        blocks: int = 256,
        max_num_seqs: int = 4,
        budget: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bm = BlockManager(blocks, 4)
        self.sched = Scheduler(
            self.bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, policy=policy, clock=clock
        )
        self.finished: list[str] = []
        self.tokens: Counter[str] = Counter()  # computed tokens per tenant
        self._n = 0

    def add(self, tenant: str, prompt_len: int = 8, max_tokens: int = 4, **share) -> Sequence:
        self._n += 1
        prompt = [1000 + self._n * 64 + i for i in range(prompt_len)]  # no prefix shared across requests
        seq = Sequence(
            f"{tenant}-{self._n}", prompt, SamplingParams(max_tokens=max_tokens), share=Share(tenant, **share)
        )
        self.sched.add(seq)
        return seq

    def step(self) -> ScheduledBatch:
        batch = self.sched.schedule()
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            self.bm.register_full_blocks(seq)
            self.tokens[seq.share.tenant] += n
            if seq.num_computed_tokens == seq.num_tokens:
                seq.output_token_ids.append(7)
                if seq.num_output_tokens >= seq.params.max_tokens:
                    self.sched.remove(seq)
                    self.finished.append(seq.request_id)
        return batch

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()


def admitted_tenants(batch: ScheduledBatch) -> list[str]:
    return [s.share.tenant for s in batch.seqs]


def admitted_before(sim: Sim, late: Sequence) -> list[str]:
    """The requests admitted (first scheduled) after ``late`` arrived and before it was admitted."""
    seen = {s.request_id for s in sim.sched.running}
    admitted = []
    while late not in sim.sched.running:
        batch = sim.step()
        ahead = batch.seqs[: batch.seqs.index(late)] if late in batch.seqs else batch.seqs  # admission order
        admitted += [s.request_id for s in ahead if s.request_id not in seen]
        seen.update(s.request_id for s in batch.seqs)
    return admitted


def test_fcfs_serves_a_flood_before_a_later_tenant():
    sim = Sim("fcfs")
    for _ in range(40):
        sim.add("A")
    sim.run(2)
    assert len(admitted_before(sim, sim.add("B"))) == 36  # B waited behind the whole flood


def test_fair_admits_a_later_tenant_at_the_next_free_slot():
    sim = Sim("fair")
    for _ in range(40):
        sim.add("A")
    sim.run(2)
    assert admitted_before(sim, sim.add("B")) == []  # the first slot that frees is B's


@pytest.mark.parametrize(("weights", "expected"), [((1.0, 1.0), 1.0), ((2.0, 1.0), 2.0), ((3.0, 1.0), 3.0)])
def test_fair_shares_tokens_in_proportion_to_weights(weights, expected):
    sim = Sim("fair", max_num_seqs=4)
    for _ in range(200):
        sim.add("A", weight=weights[0])
        sim.add("B", weight=weights[1])
    sim.run(150)  # saturated throughout: both tenants always have waiting requests
    assert len(sim.sched.waiting) > 100
    ratio = sim.tokens["A"] / sim.tokens["B"]
    assert expected * 0.9 <= ratio <= expected * 1.1, (ratio, sim.tokens)


def test_fcfs_ignores_weights():
    sim = Sim("fcfs", max_num_seqs=4)
    for _ in range(100):
        sim.add("A", weight=1.0)
    for _ in range(100):
        sim.add("B", weight=5.0)
    sim.run(60)
    assert sim.tokens["B"] == 0


def test_an_idle_tenant_banks_no_credit():
    """B was idle while A ran alone; when B arrives its counter starts at A's, so A keeps its fair half instead of
    waiting while B 'catches up' on the time it did not ask for."""
    sim = Sim("fair", max_num_seqs=4)
    for _ in range(300):
        sim.add("A")
    sim.run(100)
    assert len(sim.sched.waiting) > 150  # A is still backlogged when B arrives
    for _ in range(100):
        sim.add("B")
    before = Counter(sim.tokens)
    sim.run(60)
    gained = {t: sim.tokens[t] - before[t] for t in "AB"}
    assert 0.8 <= gained["A"] / gained["B"] <= 1.25, gained


def test_a_paused_tenant_keeps_its_debt():
    """A heavy tenant cannot reset its counter by letting its requests finish and coming straight back."""
    q = FairQueue()
    a1 = Sequence("a1", [1] * 10, SamplingParams(), share=Share("A"))
    b1 = Sequence("b1", [1] * 10, SamplingParams(), share=Share("B"))
    q.add(a1)
    q.add(b1)
    q.charge(a1, 10)
    a1.num_computed_tokens = 10
    q.finished(a1)  # A's only request ends; B still runs
    q.add(Sequence("a2", [1] * 10, SamplingParams(), share=Share("A")))
    assert q.counters["A"] == 10 * PROMPT_COST and q.counters["B"] == 0.0


def test_charges_prompt_and_output_tokens_once_and_skip_cached_ones():
    q = FairQueue()
    seq = Sequence("s", [1] * 10, SamplingParams(), share=Share("T", weight=2.0))
    q.add(seq)
    seq.num_computed_tokens = 4  # a prefix-cache hit: not computed, not charged
    q.charge(seq, 6)
    assert q.counters["T"] == 6 * PROMPT_COST / 2.0
    seq.num_computed_tokens = 10
    seq.output_token_ids += [5, 6]
    q.charge(seq, 1)  # the decode that computes the first output token's K/V
    assert q.counters["T"] == (6 * PROMPT_COST + OUTPUT_COST) / 2.0
    seq.num_computed_tokens = 0  # preempted: its recomputation is not charged again
    q.charge(seq, 11)
    assert q.counters["T"] == (6 * PROMPT_COST + OUTPUT_COST) / 2.0
    q.charge(seq, 12)
    assert q.counters["T"] == (6 * PROMPT_COST + 2 * OUTPUT_COST) / 2.0


def test_fair_preempts_the_newest_sequence_of_the_tenant_furthest_over_its_share():
    # 10 blocks of 4 tokens; 4 running sequences of 8-token prompts use 2 blocks each, 3 with their first token
    sim = Sim("fair", blocks=10, max_num_seqs=4, budget=64)
    a_old, a_new = sim.add("A", max_tokens=8), sim.add("A", max_tokens=8)
    b_old, b_new = sim.add("B", max_tokens=8), sim.add("B", max_tokens=8)
    sim.sched.waiting.counters["A"] = 100.0  # A was served far more than B before
    preempted: list[Sequence] = []
    for _ in range(12):
        batch = sim.step()
        preempted += batch.preempted
        if preempted:
            break
    assert preempted and preempted[0] is a_new, [s.request_id for s in preempted]
    assert all(s in sim.sched.running for s in (a_old, b_old, b_new))


def test_fcfs_preempts_the_newest_sequence():
    sim = Sim("fcfs", blocks=10, max_num_seqs=4, budget=64)
    seqs = [sim.add(t, max_tokens=8) for t in "BBAA"]
    preempted: list[Sequence] = []
    for _ in range(12):
        preempted += sim.step().preempted
        if preempted:
            break
    assert preempted[0] is seqs[-1]


def test_priority_policy_serves_lower_values_first_and_preempted_ones_ahead():
    sim = Sim("priority", max_num_seqs=1)
    late_urgent = [sim.add("A", priority=5), sim.add("B", priority=-1), sim.add("C", priority=0)]
    order = []
    while len(order) < 3:
        batch = sim.step()
        order += [s.request_id for s in batch.seqs if s.request_id not in order]
    assert order == [late_urgent[1].request_id, late_urgent[2].request_id, late_urgent[0].request_id]


def test_fair_runs_background_work_only_when_nothing_interactive_waits():
    sim = Sim("fair", max_num_seqs=2)
    background = [sim.add("A", priority=1) for _ in range(3)]
    sim.add("B")
    sim.add("B")
    first = sim.step()
    assert admitted_tenants(first) == ["B", "B"]
    while not all(s.request_id in sim.finished for s in background):
        sim.step()
    assert sim.sched.waiting.counters["A"] > 0  # then the background class ran


def test_fair_order_composes_with_max_loras_admission():
    """An admission hook that refuses a request only skips it: the next tenant in fair order is admitted."""

    class OneAdapter:
        def begin_step(self, running):
            self.held = {s.adapter_hash for s in running if s.adapter_hash}

        def can_admit(self, seq):
            return seq.adapter_hash is None or not self.held or seq.adapter_hash in self.held

        def admitted(self, seq):
            if seq.adapter_hash:
                self.held.add(seq.adapter_hash)

    sim = Sim("fair", max_num_seqs=4)
    sim.sched.admission.append(OneAdapter())
    a = [sim.add("A", max_tokens=6) for _ in range(3)]
    for s in a:
        s.adapter_hash = "x"
    b = sim.add("B", max_tokens=6)
    b.adapter_hash = "y"
    c = sim.add("C", max_tokens=6)
    batch = sim.step()
    assert {s.request_id for s in batch.seqs} == {a[0].request_id, a[1].request_id, a[2].request_id, c.request_id}
    while b.request_id not in sim.finished:  # y gets its slot once x's sequences are done
        sim.step()


def test_share_values_are_checked():
    with pytest.raises(RequestError, match="weight"):
        Share("t", weight=0.0)
    with pytest.raises(RequestError, match="weight"):
        Share("t", weight=float("nan"))
    with pytest.raises(RequestError, match="priority"):
        Share("t", priority=2**70)
    with pytest.raises(ValueError, match="scheduling policy"):
        Sim("lottery")


def test_fair_gives_a_full_batch_seat_to_a_tenant_far_below_its_share():
    sim = Sim("fair", max_num_seqs=2)
    a_old, a_new = sim.add("A", max_tokens=100), sim.add("A", max_tokens=100)
    sim.run(2)
    b = sim.add("B")  # B starts level with A (an idle tenant banks no credit)
    assert not sim.step().preempted and b not in sim.sched.running  # no seat at parity
    # A's decodes are charged step by step; once A is ahead by more than B's prompt costs, B takes a seat
    gap_needed = PROMPT_COST * b.num_prompt_tokens
    steps = 0
    while b not in sim.sched.running:
        gap = sim.sched.waiting.counters["A"] - sim.sched.waiting.counters["B"]
        batch = sim.step()
        steps += 1
        assert bool(batch.preempted) == (gap > gap_needed), (gap, batch.preempted)
    assert batch.preempted == [a_new]  # the newest sequence of the tenant over its share gives up its seat
    assert batch.seqs == [b] and a_old in sim.sched.running and steps < 10  # a_old keeps its seat, sits out
    while b.request_id not in sim.finished:
        assert not sim.step().preempted  # B keeps its seat: no trade back
    assert a_new.request_id not in sim.finished  # A's sequence comes back later, recomputed
    while a_new.request_id not in sim.finished:
        sim.step()


def test_fcfs_never_preempts_for_a_later_request():
    sim = Sim("fcfs", max_num_seqs=2)
    sim.add("A", max_tokens=100), sim.add("A", max_tokens=100)
    sim.run(2)
    b = sim.add("B")
    for _ in range(20):
        assert not sim.step().preempted
    assert b not in sim.sched.running


@pytest.mark.parametrize("policy", ["fair", "fcfs"])
def test_a_newcomers_prefill_goes_before_the_flood_tenants_prompt_chunks(policy):
    sim = Sim(policy, budget=16)
    a = sim.add("A", prompt_len=64, max_tokens=4)  # prefilled in chunks of the 16-token budget
    sim.step()
    b = sim.add("B", prompt_len=8)
    batch = sim.step()
    if policy == "fair":  # B (level with A) has its whole prompt first, A's chunk gets what is left
        assert batch.seqs == [b, a] and batch.num_new_tokens == [8, 8]
    else:  # fcfs: A's chunk fills the step, B waits
        assert batch.seqs == [a] and batch.num_new_tokens == [16]


def _far_below(sim: Sim, prompt_len: int = 8, a_weight: float = 1.0) -> Sequence:
    """A's three long requests run while B's first one keeps B live; A's decodes (three per step against B's
    one) carry A far past B; then B's second request arrives."""
    for _ in range(3):
        sim.add("A", max_tokens=200, weight=a_weight)
    sim.add("B", max_tokens=200)
    sim.run(40)
    gap = sim.sched.waiting.counters["A"] - sim.sched.waiting.counters["B"]
    late = sim.add("B", prompt_len=prompt_len)
    assert gap > PROMPT_COST * late.num_prompt_tokens  # far below: the precondition of the rule under test
    return late


def test_fair_gives_a_tenant_far_below_its_share_a_step_of_its_own():
    sim = Sim("fair", max_num_seqs=8)
    late = _far_below(sim)
    a_running = [s for s in sim.sched.running if s.share.tenant == "A"]
    a_waiting = sim.add("A")  # the flood tenant's newcomer waits too
    batch = sim.step()
    assert late in batch.seqs and batch.num_new_tokens[batch.seqs.index(late)] == late.num_prompt_tokens
    assert admitted_tenants(batch) == ["B", "B"]  # B's running decode and B's prefill, none of A's
    assert a_waiting not in sim.sched.running
    following = sim.step()  # A's sequences are never held two steps in a row
    assert all(s in following.seqs for s in a_running)


def test_a_held_step_is_not_given_up_when_the_newcomer_cannot_be_admitted():
    # 4-token blocks: the four running requests hold 48 of 60; B's 200-token prompt needs 50, more than the 12
    # free and the 12 of the one seat the newcomer may take
    sim = Sim("fair", max_num_seqs=8, blocks=60, budget=256)
    late = _far_below(sim, prompt_len=200, a_weight=0.1)
    batch = sim.step()
    assert late not in batch.seqs and len(batch.preempted) == 1
    assert sorted(admitted_tenants(batch)) == ["A", "A", "B"]  # everyone still running decodes


def test_fcfs_and_parity_never_hold_running_work():
    for policy in ("fcfs", "fair"):
        sim = Sim(policy, max_num_seqs=8)
        for _ in range(3):
            sim.add("A", max_tokens=200)
        sim.run(3)
        b = sim.add("B")  # fair: B starts level with A (no credit banked), so nothing is held
        batch = sim.step()
        assert admitted_tenants(batch).count("A") == 3
        assert b in batch.seqs  # seats and budget to spare: admitted beside A's decodes


def test_the_token_cap_applies_while_two_tenants_are_live_and_for_a_while_after():
    now = [1000.0]
    sim = Sim("fair", max_num_seqs=8, budget=64, clock=lambda: now[0])
    sim.sched.token_cap.value = 12
    a = sim.add("A", prompt_len=40, max_tokens=30)
    assert sim.step().num_new_tokens == [40]  # one tenant: the whole budget
    b = sim.add("B", prompt_len=40, max_tokens=30)
    batch = sim.step()
    # A's decode and B's first prompt chunk share the cut budget
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 11]
    while b.num_computed_tokens < b.num_prompt_tokens:
        assert sim.step().total_tokens <= 12
    while a.request_id not in sim.finished:
        sim.step()
    assert sim.step().total_tokens == 1 and sim.add("B", prompt_len=40)  # B's decode; then a newcomer of B's
    now[0] += MULTI_TENANT_MEMORY_S - 1  # A left, but lately: A's next newcomer would still wait for this step
    assert sim.step().num_new_tokens == [1, 11]
    now[0] += 2  # nobody but B for longer than the memory: the whole budget
    assert sim.step().num_new_tokens == [1, 29]
    # fcfs never cuts (no tenant is ever ahead of running work)
    fcfs = Sim("fcfs", max_num_seqs=8, budget=64)
    fcfs.sched.token_cap.value = 12
    fcfs.add("A", prompt_len=40)
    fcfs.add("B", prompt_len=20)
    assert fcfs.step().total_tokens == 60


def test_the_token_cap_never_leaves_a_running_sequence_without_a_token():
    sim = Sim("fair", max_num_seqs=8, budget=64)
    sim.sched.token_cap.value = 1
    running = [sim.add(t, prompt_len=4, max_tokens=50) for t in "AABBCC"]
    sim.run(10)
    batch = sim.step()
    assert all(s in batch.seqs for s in running)  # six decodes although the cap is one token


def test_a_step_held_for_a_tenant_far_below_keeps_the_whole_budget():
    sim = Sim("fair", max_num_seqs=8, budget=64)
    late = _far_below(sim, prompt_len=40)
    sim.sched.token_cap.value = 8
    batch = sim.step()
    assert batch.seqs[-1] is late and batch.num_new_tokens[-1] == 40  # its whole prompt in one step
