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
Models that mix sliding and global layers (Gemma 2 / 3) keep every block: one block table is shared by all
layers and the global ones read the whole context (separate per-kind tables would be needed to free more).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from loraplex.engine.sequence import Sequence

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
    ) -> None:
        """``sliding_window``: the window of every attention layer (the largest when they differ), or None when
        any layer sees the whole context; with a window, blocks no future query can see are released."""
        if num_blocks <= 0:
            raise ValueError("the KV cache needs at least one block")
        if sliding_window is not None and (isinstance(sliding_window, bool) or sliding_window < 1):
            raise ValueError(f"sliding_window must be a positive number of tokens or None, got {sliding_window!r}")
        self.sliding_window = sliding_window
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # block hash -> physical block
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        # prefix-cache statistics (over admitted prompt tokens)
        self.query_tokens = 0
        self.hit_tokens = 0

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

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_table))

    # ---------------------------------------------------------------- prefix cache
    def match_prefix(self, seq: Sequence) -> int:
        """Attach cached blocks holding this sequence's leading tokens; return how many tokens they cover.

        At least one token is always left to compute, so the step still produces logits.
        """
        if not self.enable_prefix_caching or seq.block_table or seq.params.prompt_logprobs is not None:
            return 0  # a request for prompt logprobs computes its whole prompt
        hashes: list[bytes] = []
        for h in self._cacheable_prefix_hashes(seq):
            if h not in self.cached:
                break
            hashes.append(h)
        for h in hashes:
            block = self.cached[h]
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
            seq.block_table.append(block)
        seq.block_hashes = hashes
        n = len(hashes) * self.block_size
        seq.num_computed_tokens = n
        if seq.num_preemptions == 0:
            seq.num_cached_prompt_tokens = min(n, seq.num_prompt_tokens)
            self.query_tokens += seq.num_prompt_tokens
            self.hit_tokens += min(n, seq.num_prompt_tokens)
        return n

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
        return next((h for h in self._cacheable_prefix_hashes(seq) if h not in self.cached), None)

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
                block = seq.block_table[i]
                if block != NULL_BLOCK and self.block_hash[block] is None and h not in self.cached:
                    self.block_hash[block] = h
                    self.cached[h] = block
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
    def num_dead_blocks(self, seq: Sequence) -> int:
        """How many leading blocks of ``seq`` no future query reads: those wholly before position
        c - W + 1, c = its computed tokens (the next query's position; later ones see less)."""
        if self.sliding_window is None:
            return 0
        return max(0, seq.num_computed_tokens - self.sliding_window + 1) // self.block_size

    def release_out_of_window(self, seq: Sequence) -> None:
        """Give back the blocks that slid out of the window, leaving NULL_BLOCK in their table entries."""
        dead = min(self.num_dead_blocks(seq), len(seq.block_table))
        for i in range(seq.num_released_blocks, dead):
            self._unref(seq.block_table[i])
            seq.block_table[i] = NULL_BLOCK
        seq.num_released_blocks = max(seq.num_released_blocks, dead)

    def num_held_blocks(self, seq: Sequence) -> int:
        """Physical blocks ``seq`` holds (its table less the released entries)."""
        return len(seq.block_table) - seq.num_released_blocks

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
        """Grow the sequence's block table to hold `num_new_tokens` more tokens; False if out of blocks. Blocks
        that slid out of the window are released first (always safe: no future query reads them)."""
        self.release_out_of_window(seq)
        need = self.blocks_needed(seq, num_new_tokens)
        if need > len(self.free_queue):
            return False
        for _ in range(need):
            block = self._pop_free_block()
            self.ref_counts[block] = 1
            seq.block_table.append(block)
        return True

    def truncate(self, seq: Sequence) -> None:
        """Release the tail blocks past those holding ``seq.num_computed_tokens`` tokens (after rejected drafts:
        their K/V is void). Those blocks were never registered (only full blocks of accepted tokens are)."""
        keep = max(-(-seq.num_computed_tokens // self.block_size), seq.num_released_blocks)
        while len(seq.block_table) > keep:
            self._unref(seq.block_table.pop())

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks (tail first); cached ones stay reusable until evicted."""
        for block in reversed(seq.block_table):
            if block != NULL_BLOCK:
                self._unref(block)
        seq.block_table = []
        seq.num_released_blocks = 0
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def forget(self, seq: Sequence) -> list[int]:
        """The blocks only ``seq`` holds, taken out of the prefix cache: their contents are not to be read again
        (a request that produced non-finite values). The caller scrubs them before ``free`` returns them."""
        blocks = [b for b in seq.block_table if b != NULL_BLOCK and self.ref_counts[b] == 1]
        for block in blocks:
            old = self.block_hash[block]
            if old is not None:
                self.block_hash[block] = None
                if self.cached.get(old) == block:
                    del self.cached[old]
        return blocks

    def reset_prefix_cache(self) -> None:
        for h, block in list(self.cached.items()):
            if self.ref_counts[block] == 0:
                self.block_hash[block] = None
                del self.cached[h]

    # ---------------------------------------------------------------- invariants
    def check_invariants(self, live: list[Sequence]) -> None:
        """Every block is free or owned, and reference counts equal the number of owners; released
        (NULL_BLOCK) entries are exactly a sequence's leading out-of-window blocks, and only with a window."""
        owners = [0] * self.num_blocks
        for seq in live:
            released = seq.num_released_blocks
            if released > self.num_dead_blocks(seq) or released > len(seq.block_table):
                raise AssertionError(
                    f"{seq.request_id}: {released} blocks released, but only {self.num_dead_blocks(seq)} lie "
                    f"before the window (of {len(seq.block_table)})"
                )
            for i, block in enumerate(seq.block_table):
                if (block == NULL_BLOCK) != (i < released):
                    raise AssertionError(
                        f"{seq.request_id}: block-table entry {i} is {block}, released prefix is {released} long"
                    )
                if block != NULL_BLOCK:
                    owners[block] += 1
        for block in range(self.num_blocks):
            if owners[block] != self.ref_counts[block]:
                raise AssertionError(f"block {block}: ref count {self.ref_counts[block]} != owners {owners[block]}")
            if (owners[block] == 0) != (block in self.free_queue):
                raise AssertionError(
                    f"block {block}: owned={owners[block]} but in free queue={block in self.free_queue}"
                )
        for h, block in self.cached.items():
            if self.block_hash[block] != h:
                raise AssertionError(f"cache map points to block {block} whose hash differs")
