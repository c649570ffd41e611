"""Block manager: free list, reference counts, prefix sharing, LRU eviction, invariants."""

from __future__ import annotations

import pytest

from loraplex.engine.core.block_manager import NULL_BLOCK, BlockManager
from loraplex.engine.core.sequence import Sequence
from loraplex.engine.sample.sampling_params import SamplingParams


def seq(tokens: list[int], rid: str = "r", adapter: str | None = None) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(), adapter_hash=adapter)


def compute_all(bm: BlockManager, s: Sequence) -> None:
    assert bm.allocate(s, s.num_tokens - s.num_computed_tokens)
    s.num_computed_tokens = s.num_tokens
    bm.register_full_blocks(s)


def test_allocate_and_free_returns_every_block():
    bm = BlockManager(8, 4)
    a, b = seq(list(range(10)), "a"), seq(list(range(100, 105)), "b")
    compute_all(bm, a)
    compute_all(bm, b)
    assert len(a.block_table) == 3 and len(b.block_table) == 2
    assert bm.num_free_blocks == 3
    bm.check_invariants([a, b])
    bm.free(a)
    bm.free(b)
    bm.check_invariants([])
    assert bm.num_free_blocks == 8


def test_allocation_fails_cleanly_when_out_of_blocks():
    bm = BlockManager(2, 4)
    s = seq(list(range(12)))
    assert not bm.allocate(s, 12)
    assert s.block_table == [] and bm.num_free_blocks == 2


def test_identical_prefixes_share_physical_blocks():
    bm = BlockManager(16, 4)
    prefix = list(range(50, 62))  # three full blocks
    a = seq(prefix + [1, 2], "a")
    compute_all(bm, a)
    b = seq(prefix + [7, 8, 9], "b")
    hit = bm.match_prefix(b)
    assert hit == 12
    assert b.block_table == a.block_table[:3]
    assert all(bm.ref_counts[x] == 2 for x in b.block_table)
    compute_all(bm, b)
    bm.check_invariants([a, b])
    bm.free(a)
    bm.check_invariants([b])
    bm.free(b)
    bm.check_invariants([])


def test_a_block_hash_covers_its_whole_prefix_not_only_its_own_tokens():
    # [A, B] and [B, A] cached: [A, A] may reuse its first block, never the second (K/V of A after B).
    bm = BlockManager(16, 4)
    blk_a, blk_b = [1, 2, 3, 4], [5, 6, 7, 8]
    compute_all(bm, seq(blk_a + blk_b + [9], "ab"))
    compute_all(bm, seq(blk_b + blk_a + [9], "ba"))
    aa = seq(blk_a + blk_a + [9], "aa")
    assert bm.match_prefix(aa) == 4
    ab_again = seq(blk_a + blk_b + [10], "ab2")
    assert bm.match_prefix(ab_again) == 8  # the same whole prefix is a hit


def test_prefix_hit_always_leaves_a_token_to_compute():
    bm = BlockManager(16, 4)
    a = seq(list(range(8)), "a")
    compute_all(bm, a)
    bm.free(a)
    b = seq(list(range(8)), "b")
    assert bm.match_prefix(b) == 4  # not 8: the last token must be recomputed to get logits


def test_adapter_hash_separates_prefix_cache():
    bm = BlockManager(16, 4)
    a = seq(list(range(9)), "a", adapter="hash-a")
    compute_all(bm, a)
    assert bm.match_prefix(seq(list(range(9)), "b", adapter="hash-b")) == 0
    assert bm.match_prefix(seq(list(range(9)), "c", adapter=None)) == 0
    assert bm.match_prefix(seq(list(range(9)), "d", adapter="hash-a")) == 8


def test_freed_blocks_stay_cached_until_evicted_lru():
    bm = BlockManager(4, 4)
    a = seq(list(range(8)) + [99], "a")  # 2 full blocks + 1 partial
    compute_all(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 4
    b = seq(list(range(8)) + [5, 6], "b")
    assert bm.match_prefix(b) == 8  # still cached after free
    bm.free(b)
    # Filling the cache with other tokens evicts the cached blocks.
    c = seq(list(range(200, 216)), "c")
    compute_all(bm, c)
    bm.free(c)
    d = seq(list(range(8)) + [1], "d")
    assert bm.match_prefix(d) == 0
    bm.check_invariants([d])


def test_tail_blocks_are_evicted_before_shared_prefix():
    bm = BlockManager(5, 4)
    a = seq(list(range(12)) + [1], "a")  # blocks: p0 p1 p2 + partial
    compute_all(bm, a)
    bm.free(a)
    # two blocks are needed: the never-used block, then the tail (partial) block, never the prefix blocks
    x = seq([7] * 5, "x")
    assert bm.allocate(x, 5)
    assert bm.match_prefix(seq(list(range(12)) + [3], "b")) == 12


# ------------------------------------------------------------------------------------------ sliding windows
W, BS = 11, 4  # window 11 over blocks of 4: ceil((11 - 1) / 4) + 1 = 4 blocks at most for a decode


def bound(n: int) -> int:
    """The most blocks a step computing n tokens holds (engine.core.block_manager's docstring)."""
    return -(-(W + n - 2) // BS) + 1


def blocks_touching(lo: int, hi: int) -> int:
    """Blocks of size BS that hold any position in lo..hi (inclusive)."""
    return hi // BS - max(lo, 0) // BS + 1


def test_sliding_window_keeps_only_the_blocks_the_window_needs():
    """Decoding token by token, the sequence holds exactly the blocks touching its next query's window
    (positions c - W + 1 .. c), never more than ceil(W / BS) + 1; the released ones go back to the pool."""
    bm = BlockManager(32, BS, sliding_window=W)
    s = seq(list(range(1, 61)))
    s.num_computed_tokens = 0
    peak = 0
    for c in range(60):
        assert bm.allocate(s, 1)
        held = bm.num_held_blocks(s)
        assert held == blocks_touching(c - W + 1, c), c
        assert held <= bound(1) <= -(-W // BS) + 1
        assert bm.num_used_blocks == held
        peak = max(peak, held)
        bm.check_invariants([s])
        s.num_computed_tokens += 1
        bm.register_full_blocks(s)
        bm.check_invariants([s])
    assert peak == bound(1)  # the bound is reached, not just respected
    assert len(s.block_table) == 15 and s.block_table[:12] == [NULL_BLOCK] * 12 and NULL_BLOCK not in s.block_table[12:]
    bm.free(s)
    bm.check_invariants([])
    assert bm.num_free_blocks == 32


def test_sliding_window_chunk_bound():
    """A chunk of n tokens holds the blocks touching c - W + 1 .. c + n - 1: at most ceil((W + n - 2) / BS) + 1."""
    bm = BlockManager(32, BS, sliding_window=W)
    s = seq(list(range(1, 50)))
    for n in (7, 7, 7, 7, 7, 7, 7):
        c = s.num_computed_tokens
        assert bm.allocate(s, n)
        assert bm.num_held_blocks(s) == blocks_touching(c - W + 1, c + n - 1)
        assert bm.num_held_blocks(s) <= bound(n)
        s.num_computed_tokens += n
        bm.register_full_blocks(s)
        bm.check_invariants([s])
    # between steps the next query (position 49) needs keys 39..49; 39..48 are cached: blocks 9..12
    assert bm.num_held_blocks(s) == blocks_touching(49 - W + 1, 48) == 4


def test_without_a_window_every_block_stays():
    """Mixed or global-attention models (sliding_window=None) never release a block."""
    bm = BlockManager(32, BS)
    s = seq(list(range(1, 41)))
    compute_all(bm, s)
    assert NULL_BLOCK not in s.block_table and bm.num_held_blocks(s) == 10


def test_released_blocks_stay_reusable_until_recycled():
    """A released block keeps its hash (its K/V is what the hash names), so a later request with the same
    prefix longer than the window hits it; once the allocator recycles it the hash is gone and the request
    misses instead of reading another sequence's data."""
    bm = BlockManager(12, BS, sliding_window=W)
    prefix = list(range(100, 132))  # 8 full blocks, longer than the window
    a = seq(prefix + [1, 2, 3], "a")
    for _ in range(5):  # chunked prefill: 7 tokens a step
        assert bm.allocate(a, min(7, a.num_tokens - a.num_computed_tokens))
        a.num_computed_tokens = min(a.num_computed_tokens + 7, a.num_tokens)
        bm.register_full_blocks(a)
    assert a.num_released_blocks == 6 and bm.num_held_blocks(a) == 3
    b = seq(prefix + [9], "b")
    assert bm.match_prefix(b) == 32  # every block of the prefix, the released ones included
    assert bm.allocate(b, 1)  # b's own out-of-window blocks are released again at once
    assert bm.num_held_blocks(b) == blocks_touching(32 - W + 1, 32)
    bm.check_invariants([a, b])
    bm.free(b)
    # recycle every free block: the released blocks' hashes are dropped
    x = seq(list(range(500, 500 + BS * bm.num_free_blocks)), "x")
    assert bm.allocate(x, x.num_tokens)
    bm.check_invariants([a, x])
    assert all(bm.block_hash[blk] is None for blk in x.block_table)
    c = seq(prefix + [9], "c")
    assert bm.match_prefix(c) == 0  # the chain's first block was recycled: no hit from stale data
    bm.free(x)
    bm.free(a)
    bm.free(c)
    bm.check_invariants([])
    assert bm.num_free_blocks == 12


def test_preempted_sequence_with_released_blocks_frees_and_recomputes():
    bm = BlockManager(16, BS, sliding_window=W, enable_prefix_caching=False)
    s = seq(list(range(1, 31)))
    compute_all(bm, s)
    assert s.num_released_blocks == 5
    bm.free(s)  # what preemption and abort do
    bm.check_invariants([])
    assert bm.num_free_blocks == 16 and s.block_table == [] and s.num_released_blocks == 0
    compute_all(bm, s)  # recomputed from the start
    bm.check_invariants([s])
    assert bm.num_held_blocks(s) == blocks_touching(30 - W + 1, 29)


def test_invariants_catch_a_released_entry_inside_the_window():
    bm = BlockManager(16, BS, sliding_window=W)
    s = seq(list(range(1, 21)))
    compute_all(bm, s)
    live = s.block_table[s.num_released_blocks]
    s.block_table[s.num_released_blocks] = NULL_BLOCK  # a block the window still needs
    s.num_released_blocks += 1
    bm.ref_counts[live] -= 1
    bm.free_queue[live] = None
    with pytest.raises(AssertionError, match="before the window"):
        bm.check_invariants([s])


def test_bad_window_is_named():
    with pytest.raises(ValueError, match="sliding_window must be a positive number"):
        BlockManager(4, BS, sliding_window=0)
