"""Block manager: free list, reference counts, prefix sharing, LRU eviction, invariants."""

from __future__ import annotations

from loraplex.engine.block_manager import BlockManager
from loraplex.engine.sampling_params import SamplingParams
from loraplex.engine.sequence import Sequence


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
