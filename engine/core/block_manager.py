"""Paged KV-cache bookkeeping: a free list with reference counts, block tables and prefix caching.

Every physical block is either free (reference count 0, in the free queue) or owned by one or more
sequences (reference count = number of block tables holding it). Full blocks are identified by a
hash of (parent block hash, their token ids, the adapter's content hash, a cache salt), so identical
prefixes under the same adapter share physical blocks. Freed blocks keep their hash and stay
reusable until the allocator needs them: the free queue is ordered least-recently-freed first, and
a sequence's blocks are freed tail first so that shared prefixes are evicted last.

Sliding windows: when every attention layer of the model slides with window W (``sliding_window``), no
query at position p >= c (c = the sequence's computed tokens) reads a key before p - W + 1, so the blocks lying
wholly before c - W + 1 are released back to the pool as the sequence grows and their block-table entries
become ``NULL_BLOCK`` (the table keeps its length: position // block_size still indexes it). A released block
keeps its prefix-cache hash like any freed block: its K/V is exactly what that hash names, and it stays
reusable until the allocator recycles it, which drops the hash. During a step computing n tokens from position
c a sequence holds exactly the blocks touching positions c - W + 1 .. c + n - 1: at most
ceil((W + n - 2) / block_size) + 1; for a decode ceil((W - 1) / block_size) + 1 <= ceil(W / block_size) + 1.
KV-cache groups (``engine.core.kv_groups``): a model that mixes sliding and global layers (Gemma 2 / 3) has one block
table per group and sequence, all drawn from one pool of block ids. Blocks of a sliding group are released as
above; a global group keeps all. A step allocates each group's new blocks together (all or none), so the
scheduler's admission and preemption see the sum. Prefix caching keys a cached block by (group, hash): a hit of
n blocks needs every block 0 .. n - 1 in a global group and, in a sliding group, only the blocks the next query
(position n * block_size) reads; the entries before those are attached released. The all-global and
all-sliding models are one group, as before groups existed.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from loraplex.engine.core.sequence import Sequence
from loraplex.engine.stats import KVCacheStats

NULL_BLOCK = -1  # a block-table entry released because no future query's window reaches it


def hash_block(parent: bytes | None, token_ids: list[int], adapter_hash: str | None, cache_salt: str | None) -> bytes:
    """Content hash of one full block; the adapter hash keeps one adapter's KV from serving another."""
    h = hashlib.sha256()
    h.update(parent or b"root")
    h.update(array("q", token_ids).tobytes())
    h.update(b"|lora:" + (adapter_hash or "").encode())
    h.update(b"|salt:" + (cache_salt or "").encode())
    return h.digest()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        sliding_window: int | None = None,
        group_windows: tuple[int | None, ...] | None = None,
    ) -> None:
        """``sliding_window``: the window of every attention layer (the largest when they differ), or None when
        any layer sees the whole context; with a window, blocks no future query can see are released.
        ``group_windows``: instead, one window (or None) per KV-cache group (``engine.core.kv_groups``)."""
        if num_blocks <= 0:
            raise ValueError("the KV cache needs at least one block")
        if group_windows is None:
            group_windows = (sliding_window,)
        elif sliding_window is not None:
            raise ValueError("give sliding_window (one group) or group_windows, not both")
        if not group_windows:
            raise ValueError("group_windows needs at least one group")
        for w in group_windows:
            if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
                raise ValueError(f"sliding_window must be a positive number of tokens or None, got {w!r}")
        self.group_windows = tuple(group_windows)
        self.num_groups = len(self.group_windows)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[tuple[int, bytes] | None] = [None] * num_blocks  # (group, content hash)
        self.cached: dict[tuple[int, bytes], int] = {}  # (group, block hash) -> physical block
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        # prefix-cache statistics (over admitted prompt tokens)
        self.query_tokens = 0
        self.hit_tokens = 0

    @property
    def sliding_window(self) -> int | None:
        """The window when the model is one group whose every layer slides; None otherwise."""
        return self.group_windows[0] if self.num_groups == 1 else None

    def _ensure_groups(self, seq: Sequence) -> None:
        """Give ``seq`` one (empty) table per group (a new Sequence has one)."""
        while len(seq.block_tables) < self.num_groups:
            seq.block_tables.append([])
            seq.released_blocks.append(0)

    # ---------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def stats(self) -> KVCacheStats:
        return KVCacheStats(
            blocks_total=self.num_blocks,
            blocks_used=self.num_used_blocks,
            usage=self.usage(),
            prefix_cache_hit_rate=self.hit_rate(),
            prefix_cache_queries=self.query_tokens,
            prefix_cache_hits=self.hit_tokens,
        )

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks (over all groups) for ``num_new_tokens`` more tokens, before any out-of-window release."""
        want = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        have = seq.block_tables + [[]] * (self.num_groups - len(seq.block_tables))
        return sum(max(0, want - len(table)) for table in have)

    def lone_sequence_blocks(self, num_tokens: int, max_chunk: int) -> int:
        """The most blocks one sequence of ``num_tokens`` tokens holds at once when a step computes at most
        ``max_chunk`` tokens: all of them in a global group; in a sliding group those touching
        c - W + 1 .. c + n - 1 during a step computing n tokens from c."""
        bs = self.block_size
        total = -(-num_tokens // bs)
        chunk = min(max_chunk, num_tokens)
        return sum(total if w is None else min(total, -(-(w + chunk - 2) // bs) + 1) for w in self.group_windows)

    def max_lone_tokens(self, limit: int, max_chunk: int) -> int:
        """The longest sequence (at most ``limit`` tokens) that fits the pool alone: preemption can always
        make room for it. 0 when not even one token fits."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.lone_sequence_blocks(mid, max_chunk) <= self.num_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ---------------------------------------------------------------- prefix cache
    def match_prefix(self, seq: Sequence) -> int:
        """Attach cached blocks holding this sequence's leading tokens; return how many tokens they cover.

        At least one token is always left to compute, so the step still produces logits.
        """
        if not self.enable_prefix_caching or seq.block_table or seq.params.prompt_logprobs is not None:
            return 0  # a request for prompt logprobs computes its whole prompt
        hashes = self._cacheable_prefix_hashes(seq)
        hit = self._hit_blocks(hashes)
        self._ensure_groups(seq)
        n = hit * self.block_size
        for g, table in enumerate(seq.block_tables):
            dead = self._dead_blocks(g, n)
            table.extend([NULL_BLOCK] * dead)
            seq.released_blocks[g] = dead
            for h in hashes[dead:hit]:
                block = self.cached[(g, h)]
                if self.ref_counts[block] == 0:
                    del self.free_queue[block]
                self.ref_counts[block] += 1
                table.append(block)
        seq.block_hashes = hashes[:hit]
        seq.num_computed_tokens = n
        if seq.num_preemptions == 0:
            seq.num_cached_prompt_tokens = min(n, seq.num_prompt_tokens)
            self.query_tokens += seq.num_prompt_tokens
            self.hit_tokens += min(n, seq.num_prompt_tokens)
        return n

    def _hit_blocks(self, hashes: list[bytes]) -> int:
        """How many leading blocks of this chain a sequence may take from the cache: the most n for which every
        global group has blocks 0 .. n - 1 cached and every sliding group the blocks the query at position
        n * block_size reads (the earlier ones it attaches released). One pass: per sliding group, n is good when
        its last uncached block before n lies before the window of position n * block_size."""
        limit = len(hashes)
        for g, w in enumerate(self.group_windows):
            if w is None:
                limit = next((i for i, h in enumerate(hashes[:limit]) if (g, h) not in self.cached), limit)
        sliding = [g for g, w in enumerate(self.group_windows) if w is not None]
        if not sliding:
            return limit
        last_miss = dict.fromkeys(sliding, -1)
        best = 0
        for n in range(1, limit + 1):
            for g in sliding:
                if (g, hashes[n - 1]) not in self.cached:
                    last_miss[g] = n - 1
            if all(last_miss[g] < self._dead_blocks(g, n * self.block_size) for g in sliding):
                best = n
        return best

    def _cacheable_prefix_hashes(self, seq: Sequence) -> list[bytes]:
        """Hashes of a sequence's leading full blocks up to the last one a cache hit may cover (all but the
        last token). Kept on the sequence: a waiting sequence is looked up again at every step."""
        bs = self.block_size
        hashes = seq.prefix_hashes
        for i in range(len(hashes), (seq.num_tokens - 1) // bs):  # grows only when preemption added tokens
            hashes.append(
                hash_block(
                    hashes[-1] if hashes else None, seq.tokens(i * bs, (i + 1) * bs), seq.adapter_hash, seq.cache_salt
                )
            )
        return hashes  # never longer than that: a sequence's tokens only grow

    def first_uncached_block(self, seq: Sequence) -> bytes | None:
        """The hash of the first block a waiting sequence would compute that the cache might have held (None:
        caching is off, or every such block is cached). Nothing is attached."""
        if not self.enable_prefix_caching or seq.block_table or seq.params.prompt_logprobs is not None:
            return None
        hashes = self._cacheable_prefix_hashes(seq)
        hit = self._hit_blocks(hashes)
        return hashes[hit] if hit < len(hashes) else None

    def blocks_completed_by(self, seq: Sequence, num_new_tokens: int) -> list[bytes]:
        """Hashes of the blocks that computing ``num_new_tokens`` more tokens of ``seq`` fills, which
        register_full_blocks caches after the step."""
        if not self.enable_prefix_caching:
            return []
        return self._new_full_block_hashes(seq, seq.num_computed_tokens + num_new_tokens)

    def register_full_blocks(self, seq: Sequence) -> None:
        """Hash the blocks that became full (their K/V written) so later requests can share them, then release
        the blocks that slid out of every future query's window (after hashing: they stay reusable)."""
        if self.enable_prefix_caching:
            start = len(seq.block_hashes)
            for i, h in enumerate(self._new_full_block_hashes(seq, seq.num_computed_tokens), start):
                seq.block_hashes.append(h)  # kept for a released block too: later blocks chain on it
                for g, table in enumerate(seq.block_tables):
                    block = table[i]
                    if block != NULL_BLOCK and self.block_hash[block] is None and (g, h) not in self.cached:
                        self.block_hash[block] = (g, h)
                        self.cached[(g, h)] = block
        self.release_out_of_window(seq)

    def _new_full_block_hashes(self, seq: Sequence, num_tokens: int) -> list[bytes]:
        """Hashes of the full blocks within ``seq``'s first ``num_tokens`` tokens past those in
        ``seq.block_hashes``, continuing its chain; blocks of the memoised prefix chain are not hashed again."""
        bs = self.block_size
        known = seq.prefix_hashes
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        hashes = []
        for i in range(len(seq.block_hashes), num_tokens // bs):
            parent = (
                known[i]
                if i < len(known)
                else hash_block(parent, seq.tokens(i * bs, (i + 1) * bs), seq.adapter_hash, seq.cache_salt)
            )
            hashes.append(parent)
        return hashes

    # ---------------------------------------------------------------- sliding window
    def _dead_blocks(self, group: int, num_computed: int) -> int:
        """Leading blocks of ``group`` no query at position ``num_computed`` or later reads."""
        w = self.group_windows[group]
        return 0 if w is None else max(0, num_computed - w + 1) // self.block_size

    def num_dead_blocks(self, seq: Sequence, group: int = 0) -> int:
        """How many leading blocks of ``seq``'s table in ``group`` no future query reads: those wholly before
        position c - W + 1, c = its computed tokens (the next query's position; later ones see less)."""
        return self._dead_blocks(group, seq.num_computed_tokens)

    def release_out_of_window(self, seq: Sequence) -> None:
        """Give back the blocks that slid out of the window, leaving NULL_BLOCK in their table entries."""
        for g, table in enumerate(seq.block_tables):
            if self.group_windows[g] is None:
                continue
            dead = min(self.num_dead_blocks(seq, g), len(table))
            for i in range(seq.released_blocks[g], dead):
                self._unref(table[i])
                table[i] = NULL_BLOCK
            seq.released_blocks[g] = max(seq.released_blocks[g], dead)

    def num_held_blocks(self, seq: Sequence, group: int | None = None) -> int:
        """Physical blocks ``seq`` holds in ``group`` (None: in all groups): its table less the released entries."""
        groups = range(len(seq.block_tables)) if group is None else [group]
        return sum(len(seq.block_tables[g]) - seq.released_blocks[g] for g in groups if g < len(seq.block_tables))

    def _unref(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_queue[block] = None

    # ---------------------------------------------------------------- allocation
    def _pop_free_block(self) -> int:
        block, _ = self.free_queue.popitem(last=False)
        old = self.block_hash[block]
        if old is not None:  # evict its cached contents
            self.block_hash[block] = None
            if self.cached.get(old) == block:
                del self.cached[old]
        return block

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow the sequence's block tables (every group's) to hold `num_new_tokens` more tokens; False, with
        nothing allocated, if out of blocks. Blocks that slid out of a window are released first (always safe:
        no future query reads them)."""
        self._ensure_groups(seq)
        self.release_out_of_window(seq)
        need = self.blocks_needed(seq, num_new_tokens)
        if need > len(self.free_queue):
            return False
        want = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        for table in seq.block_tables:
            while len(table) < want:
                block = self._pop_free_block()
                self.ref_counts[block] = 1
                table.append(block)
        return True

    def truncate(self, seq: Sequence) -> None:
        """Release the tail blocks past those holding ``seq.num_computed_tokens`` tokens (after rejected drafts:
        their K/V is void). Those blocks were never registered (only full blocks of accepted tokens are)."""
        for g, table in enumerate(seq.block_tables):
            keep = max(-(-seq.num_computed_tokens // self.block_size), seq.released_blocks[g])
            while len(table) > keep:
                self._unref(table.pop())

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks (tail first, every group's i-th block before their (i-1)-th); cached
        ones stay reusable until evicted."""
        tables = seq.block_tables
        for i in reversed(range(max(len(t) for t in tables))):
            for table in tables:
                if i < len(table) and table[i] != NULL_BLOCK:
                    self._unref(table[i])
        seq.block_tables = [[] for _ in tables]
        seq.released_blocks = [0] * len(tables)
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def forget(self, seq: Sequence) -> list[int]:
        """The blocks only ``seq`` holds, taken out of the prefix cache: their contents are not to be read again
        (a request that produced non-finite values). The caller scrubs them before ``free`` returns them."""
        blocks = [b for table in seq.block_tables for b in table if b != NULL_BLOCK and self.ref_counts[b] == 1]
        for block in blocks:
            old = self.block_hash[block]
            if old is not None:
                self.block_hash[block] = None
                if self.cached.get(old) == block:
                    del self.cached[old]
        return blocks

    def reset_prefix_cache(self) -> None:
        for key, block in list(self.cached.items()):
            if self.ref_counts[block] == 0:
                self.block_hash[block] = None
                del self.cached[key]

    # ---------------------------------------------------------------- invariants
    def check_invariants(self, live: list[Sequence]) -> None:
        """Every block is free or owned, and reference counts equal the number of owners; a sequence's tables
        (one per group) have one length; released (NULL_BLOCK) entries are exactly a table's leading
        out-of-window blocks, and only in a sliding group; a cached block is cached under its own group."""
        owners = [0] * self.num_blocks
        for seq in live:
            tables = seq.block_tables
            if len(tables) not in (1, self.num_groups) or len(seq.released_blocks) != len(tables):
                raise AssertionError(
                    f"{seq.request_id}: {len(tables)} block tables, {len(seq.released_blocks)} released counts "
                    f"for {self.num_groups} groups"
                )
            if len({len(t) for t in tables}) > 1:
                raise AssertionError(f"{seq.request_id}: block tables of lengths {[len(t) for t in tables]}")
            for g, table in enumerate(tables):
                released = seq.released_blocks[g]
                if released > self.num_dead_blocks(seq, g) or released > len(table):
                    raise AssertionError(
                        f"{seq.request_id}: {released} blocks released in group {g}, but only "
                        f"{self.num_dead_blocks(seq, g)} lie before the window (of {len(table)})"
                    )
                for i, block in enumerate(table):
                    if (block == NULL_BLOCK) != (i < released):
                        raise AssertionError(
                            f"{seq.request_id}: group {g} block-table entry {i} is {block}, released prefix is "
                            f"{released} long"
                        )
                    if block != NULL_BLOCK:
                        owners[block] += 1
                        key = self.block_hash[block]
                        if key is not None and key[0] != g:
                            raise AssertionError(f"block {block} in group {g}'s table is cached for group {key[0]}")
        for block in range(self.num_blocks):
            if owners[block] != self.ref_counts[block]:
                raise AssertionError(f"block {block}: ref count {self.ref_counts[block]} != owners {owners[block]}")
            if (owners[block] == 0) != (block in self.free_queue):
                raise AssertionError(
                    f"block {block}: owned={owners[block]} but in free queue={block in self.free_queue}"
                )
        for key, block in self.cached.items():
            if self.block_hash[block] != key:
                raise AssertionError(f"cache map points to block {block} whose hash differs")
