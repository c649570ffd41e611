"""Scheduler admission: a prefix that one sequence of a step computes is not computed again by another."""

from __future__ import annotations

from loraplex.engine.core.block_manager import BlockManager
from loraplex.engine.core.scheduler import ScheduledBatch, Scheduler
from loraplex.engine.core.sequence import Sequence
from loraplex.engine.sample.sampling_params import SamplingParams

PREFIX = list(range(50, 58))  # two full blocks of 4


def seq(tokens: list[int], rid: str, adapter: str | None = None) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(), adapter_hash=adapter)


def finish_step(bm: BlockManager, batch: ScheduledBatch) -> None:
    """What the engine does after the model ran: the tokens are computed, full blocks get cached."""
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        s.num_computed_tokens += n
        bm.register_full_blocks(s)


def scheduled(batch: ScheduledBatch) -> dict[str, int]:
    return {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)}


def test_a_prefix_computed_in_this_step_is_reused_next_step():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    a, b = seq(PREFIX + [1, 2, 3], "a"), seq(PREFIX + [4, 5, 6], "b")
    c = seq(list(range(200, 210)), "c")  # another prefix
    d = seq(PREFIX + [7], "d", adapter="lora-x")  # the same tokens under an adapter: other K/V
    for s in (a, b, c, d):
        sched.add(s)
    batch = sched.schedule()
    assert scheduled(batch) == {"a": 11, "c": 10, "d": 9}
    assert list(sched.waiting) == [b]
    finish_step(bm, batch)
    batch = sched.schedule()
    assert scheduled(batch)["b"] == 3 and b.num_cached_prompt_tokens == 8  # both blocks from a
    assert b.block_table[:2] == a.block_table[:2]
    bm.check_invariants([a, b, c, d])


def test_a_chunked_prefill_is_followed_block_by_block():
    """With chunked prefill the duplicate waits while its next uncached block is being computed, then
    takes every block from the cache."""
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=8)
    prompt = list(range(300, 321))  # 21 tokens: five cacheable blocks
    a, b = seq(prompt, "a"), seq(prompt, "b")
    sched.add(a)
    sched.add(b)
    steps = []
    while b.num_computed_tokens < b.num_tokens:
        batch = sched.schedule()
        steps.append(scheduled(batch))
        finish_step(bm, batch)
    assert steps[:3] == [{"a": 8}, {"a": 8}, {"a": 5}]
    assert steps[3] == {"b": 1}  # (a produces no token here: nothing else to schedule)
    assert b.num_cached_prompt_tokens == 20


def test_without_prefix_caching_nothing_waits():
    bm = BlockManager(64, 4, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    for rid in "ab":
        sched.add(seq(PREFIX + [1], rid))
    assert scheduled(sched.schedule()) == {"a": 9, "b": 9}
