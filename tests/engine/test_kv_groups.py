"""KV-cache groups (engine.core.kv_groups) and the block manager's per-group tables for models that mix sliding and
global layers: the sliding group keeps only the blocks its window needs, the global group keeps all, prefix hits
need what each group needs, and drafts' rejection and freeing release every group's blocks."""

from __future__ import annotations

import pytest

from loraplex.engine.core.block_manager import NULL_BLOCK, BlockManager
from loraplex.engine.core.kv_groups import KVGroups
from loraplex.engine.core.sequence import Sequence
from loraplex.engine.sample.sampling_params import SamplingParams

W, BS = 11, 4
GLOBAL, SLIDING = 0, 1


def seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams())


def touching(lo: int, hi: int) -> int:
    """Blocks of size BS holding any position in lo..hi (inclusive)."""
    return hi // BS - max(lo, 0) // BS + 1


def step(bm: BlockManager, s: Sequence, n: int) -> None:
    assert bm.allocate(s, n)
    s.num_computed_tokens += n
    bm.register_full_blocks(s)


# ------------------------------------------------------------------------------------------ grouping
def test_gemma3_270m_layout_is_five_sliding_groups_and_one_global():
    windows = tuple(None if (i + 1) % 6 == 0 else 512 for i in range(18))  # 5 sliding : 1 global, 18 layers
    g = KVGroups.from_windows(windows)
    assert g.windows == (None, 512, 512, 512, 512, 512) and g.layers_per_group == 3
    assert [i for i, grp in enumerate(g.layer_group) if grp == 0] == [5, 11, 17]  # the global layers
    assert [i for i, grp in enumerate(g.layer_group) if grp == 1] == [0, 1, 2]
    assert g.layer_slot[5:18:6] == (0, 1, 2) and g.layer_slot[:3] == (0, 1, 2)
    # each slot (cache tensor) serves exactly one layer of every group
    for slot in range(3):
        assert sorted(g.layer_group[i] for i in range(18) if g.layer_slot[i] == slot) == list(range(6))


def test_alternating_and_single_kind_layouts():
    alt = KVGroups.from_windows((9, None, 9))  # tiny Gemma 2: sliding, global, sliding
    assert alt.windows == (None, 9, 9) and alt.layer_group == (1, 0, 2) and alt.layers_per_group == 1
    assert KVGroups.from_windows((None,) * 4) == KVGroups((None,), (0, 0, 0, 0), (0, 1, 2, 3))
    assert KVGroups.from_windows((7,) * 3) == KVGroups((7,), (0, 0, 0), (0, 1, 2))
    two = KVGroups.from_windows((4, 8, 4, 8))  # two windows: a group per window
    assert two.windows == (4, 8) and two.layer_group == (0, 1, 0, 1)


@pytest.mark.parametrize("bad", [(), (0, None), (None, True), (None, 2.5)])
def test_bad_layer_windows_are_named(bad):
    with pytest.raises(ValueError, match=r"at least one attention layer|positive number of tokens"):
        KVGroups.from_windows(bad)


def test_both_window_arguments_refused():
    with pytest.raises(ValueError, match="not both"):
        BlockManager(8, BS, sliding_window=W, group_windows=(None, W))
    with pytest.raises(ValueError, match="positive number"):
        BlockManager(8, BS, group_windows=(None, 0))


# ------------------------------------------------------------------------------------------ block manager
def test_sliding_group_holds_its_window_global_group_holds_all():
    """Decoding token by token past the window: at every step the sliding group holds exactly the blocks
    touching c - W + 1 .. c (<= ceil(W / BS) + 1), the global group every block of the context."""
    bm = BlockManager(64, BS, group_windows=(None, W))
    s = seq(list(range(1, 81)))
    peak = 0
    for c in range(80):
        assert bm.allocate(s, 1)
        sliding = bm.num_held_blocks(s, SLIDING)
        assert sliding == touching(c - W + 1, c) <= -(-W // BS) + 1, c
        assert bm.num_held_blocks(s, GLOBAL) == c // BS + 1
        assert bm.num_used_blocks == bm.num_held_blocks(s) == sliding + c // BS + 1
        peak = max(peak, sliding)
        s.num_computed_tokens += 1
        bm.register_full_blocks(s)
        bm.check_invariants([s])
    assert peak == -(-(W - 1) // BS) + 1  # reached, not just respected
    assert NULL_BLOCK not in s.block_tables[GLOBAL]
    assert s.block_tables[SLIDING][: s.released_blocks[SLIDING]] == [NULL_BLOCK] * s.released_blocks[SLIDING] != []
    bm.free(s)
    bm.check_invariants([])
    assert bm.num_free_blocks == 64 and s.block_tables == [[], []] and s.released_blocks == [0, 0]


def test_chunks_hold_the_blocks_touching_the_chunk_and_its_window():
    bm = BlockManager(64, BS, group_windows=(None, W, W))
    s = seq(list(range(1, 60)))
    for n in (9, 9, 9, 9, 9, 9):
        c = s.num_computed_tokens
        assert bm.allocate(s, n)
        for g in (1, 2):
            assert bm.num_held_blocks(s, g) == touching(c - W + 1, c + n - 1) <= -(-(W + n - 2) // BS) + 1
        assert bm.num_held_blocks(s, GLOBAL) == -(-(c + n) // BS)
        s.num_computed_tokens += n
        bm.register_full_blocks(s)
        bm.check_invariants([s])


def test_allocation_is_all_groups_or_none():
    """A step needs a block in each group; with fewer free than that nothing is taken."""
    bm = BlockManager(3, BS, group_windows=(None, W))
    s = seq(list(range(1, 20)))
    assert bm.blocks_needed(s, 5) == 4  # 2 blocks in each group
    assert not bm.allocate(s, 5)
    assert bm.num_free_blocks == 3 and s.block_tables == [[], []]
    assert bm.allocate(s, 4) and bm.num_free_blocks == 1
    bm.check_invariants([s])


def test_prefix_hit_needs_every_global_block_and_the_sliding_window():
    """A later request with a prefix longer than the window hits the global group's whole chain and only the
    sliding group's blocks its next query reads (the earlier ones attach released, even once recycled);
    a recycled block in the window, or anywhere in the global chain, shortens the hit."""
    bm = BlockManager(24, BS, group_windows=(None, W))
    prefix = list(range(100, 132))  # 8 full blocks, longer than the window
    a = seq(prefix + [1, 2, 3], "a")
    for _ in range(5):
        step(bm, a, min(7, a.num_tokens - a.num_computed_tokens))
    assert a.released_blocks[SLIDING] == 6
    bm.free(a)  # every block free but cached
    bm.check_invariants([])

    b = seq(prefix + [9], "b")
    assert bm.match_prefix(b) == 32
    dead = (32 - W + 1) // BS  # 5 sliding blocks no query from position 32 on reads
    assert b.block_tables[SLIDING][:dead] == [NULL_BLOCK] * dead and b.released_blocks[SLIDING] == dead
    assert NULL_BLOCK not in b.block_tables[SLIDING][dead:] and len(b.block_tables[SLIDING]) == 8
    assert NULL_BLOCK not in b.block_tables[GLOBAL] and len(b.block_tables[GLOBAL]) == 8
    bm.check_invariants([b])
    held_sliding = list(b.block_tables[SLIDING][dead:])
    bm.free(b)

    # recycle a sliding-window block (block 6 of the chain): a hit may cover at most 6 blocks now, and with
    # n = 6 the query at 24 reads blocks (24 - 10) // 4 = 3 .. 5 of the sliding group: all still cached
    evict(bm, held_sliding[1])
    c = seq(prefix + [9], "c")
    assert bm.match_prefix(c) == 24
    bm.check_invariants([c])
    bm.free(c)

    # recycle the global group's block 2: no hit may reach past it
    evict(bm, bm.cached[(GLOBAL, c.prefix_hashes[2])])
    d = seq(prefix + [9], "d")
    assert bm.first_uncached_block(d) == d.prefix_hashes[2]
    assert bm.match_prefix(d) == 8
    bm.check_invariants([d])


def evict(bm: BlockManager, block: int) -> None:
    """Make the allocator recycle ``block`` next (as it does a least-recently-freed one)."""
    bm.free_queue.move_to_end(block, last=False)
    taker = seq([0] * BS, f"taker{block}")
    assert bm.allocate(taker, 1)  # one group per table: takes one block per group
    assert block in [t[0] for t in taker.block_tables]
    bm.free(taker)


def test_truncate_releases_rejected_drafts_in_every_group():
    bm = BlockManager(64, BS, group_windows=(None, W))
    s = seq(list(range(1, 40)))
    step(bm, s, 30)
    assert bm.allocate(s, 9)  # 30 known tokens + 9 drafts' worth: up to position 38, 10 blocks per group
    assert [len(t) for t in s.block_tables] == [10, 10]
    s.num_computed_tokens += 2  # two accepted
    bm.truncate(s)
    bm.register_full_blocks(s)
    assert [len(t) for t in s.block_tables] == [8, 8]
    assert bm.num_held_blocks(s, SLIDING) == touching(32 - W + 1, 31)
    bm.check_invariants([s])


def test_forget_returns_the_sole_blocks_of_every_group():
    bm = BlockManager(32, BS, group_windows=(None, W))
    s = seq(list(range(1, 30)))
    step(bm, s, 29)
    blocks = bm.forget(s)
    assert sorted(blocks) == sorted(b for t in s.block_tables for b in t if b != NULL_BLOCK)
    assert all(bm.block_hash[b] is None for b in blocks)
    bm.free(s)
    bm.check_invariants([])


def test_lone_sequence_bound():
    """The longest sequence that fits the pool alone counts each sliding group's window, not its length."""
    bm = BlockManager(20, BS, group_windows=(None, W))
    # 12 global blocks (48 tokens) + a sliding group of at most ceil((11 + 8 - 2) / 4) + 1 = 6 blocks
    assert bm.lone_sequence_blocks(48, max_chunk=8) == 12 + 6
    assert bm.max_lone_tokens(1000, max_chunk=8) == 14 * BS  # 14 + 6 = 20 blocks
    assert BlockManager(20, BS).max_lone_tokens(1000, max_chunk=8) == 80  # one global group: every block
    assert BlockManager(1, BS, group_windows=(None, W)).max_lone_tokens(100, 8) == 0


def test_invariants_catch_a_released_global_entry():
    bm = BlockManager(32, BS, group_windows=(None, W))
    s = seq(list(range(1, 30)))
    step(bm, s, 29)
    live = s.block_tables[GLOBAL][0]
    s.block_tables[GLOBAL][0] = NULL_BLOCK
    s.released_blocks[GLOBAL] = 1
    bm._unref(live)
    with pytest.raises(AssertionError, match="group 0, but only 0 lie before the window"):
        bm.check_invariants([s])


@pytest.mark.parametrize("windows", [(None, W), (W,), (None, 5, 9), (None,)])
def test_prefix_hit_length_matches_its_definition(windows):
    """On random caches: the hit is the most n with blocks 0 .. n - 1 cached in each global group and, in each
    sliding group, the blocks from (n * BS - W + 1) // BS to n - 1 (counted here directly, for every n)."""
    import random

    rng = random.Random(len(windows))
    bm = BlockManager(4096, BS, group_windows=windows)
    for trial in range(200):
        hashes = [bytes([trial % 256, i]) for i in range(rng.randint(0, 24))]
        bm.cached = {
            (g, h): 0 for g in range(len(windows)) for h in hashes if rng.random() < (0.95 if trial % 2 else 0.7)
        }

        def good(n: int, hashes: list[bytes] = hashes) -> bool:
            for g, w in enumerate(windows):
                first = 0 if w is None else max(0, n * BS - w + 1) // BS
                if any((g, hashes[i]) not in bm.cached for i in range(first, n)):
                    return False
            return True

        expect = max(n for n in range(len(hashes) + 1) if good(n))
        assert bm._hit_blocks(hashes) == expect, (trial, windows)
