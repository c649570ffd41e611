"""Paged attention over one batch of prefill chunks and decodes, plus the KV-cache write.

Layout (shared by the torch reference and the Triton kernel):

* ``q``: ``[num_tokens, num_heads, head_dim]``; sequence ``s`` owns rows
  ``query_start_loc[s]:query_start_loc[s + 1]``.
* ``k_cache`` / ``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``; this
  step's K/V are already stored.
* ``block_tables``: ``[num_seqs, max_blocks_per_seq]``; entries past a sequence's last
  block are arbitrary and never read.
* ``seq_lens``: context length of each sequence including this step's query tokens.
  Query ``j`` of a chunk of ``q_len`` rows sits at position ``seq_len - q_len + j`` and
  attends to keys ``0..position``.

The engine calls the Triton kernel through ``attention_plan`` on CUDA; the torch reference is what it is
tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "PagedAttentionInputs",
    "paged_attention_ref",
    "paged_attention_triton",
    "store_kv",
]


@dataclass(frozen=True, slots=True)
class PagedAttentionInputs:
    """What every paged-attention implementation reads (torch, Triton, C): the layout in the module docstring.

    ``query_start_loc`` ``None`` means one query row per sequence (a batch of decodes; the decode kernels of
    ``cpu_decode_attention`` take only that). ``window``: a query at position p sees keys p - window + 1 .. p
    (a sliding-window layer); ``softcap``: scores become ``softcap * tanh(scores / softcap)`` before the
    softmax (Gemma 2).
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor | None
    scale: float
    window: int | None = None
    softcap: float | None = None

    def query_starts(self) -> torch.Tensor:
        """``query_start_loc``, or one row per sequence (int32 on q's device) where it is ``None``."""
        if self.query_start_loc is not None:
            return self.query_start_loc
        return torch.arange(self.seq_lens.shape[0] + 1, dtype=torch.int32, device=self.q.device)


def _check_shapes(inputs: PagedAttentionInputs) -> None:
    q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
    block_tables, seq_lens, query_start_loc = inputs.block_tables, inputs.seq_lens, inputs.query_starts()
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"head_dim mismatch: q has {head_dim}, the cache has {k_cache.shape[3]}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    num_seqs = seq_lens.shape[0]
    if inputs.query_start_loc is None and q.shape[0] != num_seqs:
        raise ValueError(f"without query_start_loc q needs one row per sequence ({num_seqs}), got {q.shape[0]}")
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(
            f"query_start_loc must have num_seqs + 1 = {num_seqs + 1} entries, got {tuple(query_start_loc.shape)}"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [num_seqs={num_seqs}, max_blocks], got {tuple(block_tables.shape)}")


def _attend_padded(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_starts: torch.Tensor,
    q_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Attention for a group of sequences, queries padded to the group's longest chunk.

    All index tensors are int64 and describe only this group's sequences. Results are
    written into ``out`` (float32, ``[num_tokens, num_heads, head_dim]``).
    """
    num_seqs = seq_lens.shape[0]
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    num_heads = q.shape[1]
    group = num_heads // num_kv_heads
    max_q = int(q_lens.max())
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    device = q.device

    # Keys and values in [S, kv_heads, L, D] order with one row gather each. Positions
    # past a sequence's end read its position 0 instead (finite data; the table and the
    # partial last page hold arbitrary values there) and are excluded by the mask.
    key_pos = torch.arange(max_len, device=device)
    key_valid = key_pos[None, :] < seq_lens[:, None]  # [S, L]
    pos = torch.where(key_valid, key_pos[None, :], 0)
    blocks = torch.gather(block_tables[:, :num_blocks].long(), 1, pos // block_size)
    slot_rows = (blocks * block_size + pos % block_size) * num_kv_heads  # [S, L]
    heads = torch.arange(num_kv_heads, device=device)
    rows_kv = (slot_rows[:, None, :] + heads[None, :, None]).flatten()

    def gather(cache: torch.Tensor) -> torch.Tensor:
        picked = cache.reshape(-1, head_dim).index_select(0, rows_kv)
        return picked.view(num_seqs, num_kv_heads, max_len, head_dim).float()

    k = gather(k_cache)
    v = gather(v_cache)

    # Queries: [S, max_q] token rows; padding rows repeat the chunk's first token.
    q_off = torch.arange(max_q, device=device)
    q_valid = q_off[None, :] < q_lens[:, None]
    rows = torch.where(q_valid, q_starts[:, None] + q_off[None, :], q_starts[:, None])
    qp = q[rows].float()  # [S, max_q, H, D]
    # Group the query heads of each kv head together: [S, kv_heads, group * max_q, D].
    qg = qp.view(num_seqs, max_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(num_seqs, num_kv_heads, group * max_q, head_dim)

    q_pos = seq_lens[:, None] - q_lens[:, None] + q_off[None, :]  # [S, max_q]
    # Padding rows get q_pos >= seq_len, so no row is fully masked (no NaN).
    allowed = (key_pos[None, None, :] <= q_pos[:, :, None]) & key_valid[:, None, :]  # [S, max_q, L]
    if window is not None:
        allowed &= key_pos[None, None, :] > q_pos[:, :, None] - window
    mask = allowed[:, None, None].expand(num_seqs, 1, group, max_q, max_len)
    mask = mask.reshape(num_seqs, 1, group * max_q, max_len)

    if softcap is None:
        att = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    else:
        scores = torch.tanh(qg @ k.transpose(-1, -2) * (scale / softcap)) * softcap
        att = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
    att = att.view(num_seqs, num_kv_heads, group, max_q, head_dim).permute(0, 3, 1, 2, 4)
    att = att.reshape(num_seqs, max_q, num_heads, head_dim)
    out[rows[q_valid]] = att[q_valid]


def paged_attention_ref(inputs: PagedAttentionInputs) -> torch.Tensor:
    """Torch paged attention, vectorised over the batch (float32 softmax).

    Decodes (one query row) and longer chunks are two padded groups, so a long prefill
    chunk does not pad every decode to its length; no loop over sequences.
    """
    _check_shapes(inputs)
    q = inputs.q
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    if q.shape[0] == 0 or inputs.seq_lens.shape[0] == 0:
        return out.to(q.dtype)
    qsl = inputs.query_starts().long()
    q_lens = qsl[1:] - qsl[:-1]
    seq_lens_l = inputs.seq_lens.long()
    is_decode = q_lens == 1
    for group in (is_decode, (~is_decode) & (q_lens > 0)):
        if bool(group.any()):
            _attend_padded(
                q,
                inputs.k_cache,
                inputs.v_cache,
                inputs.block_tables[group],
                seq_lens_l[group],
                qsl[:-1][group],
                q_lens[group],
                inputs.scale,
                out,
                inputs.window,
                inputs.softcap,
            )
    return out.to(q.dtype)


def paged_attention_triton(inputs: PagedAttentionInputs) -> torch.Tensor:
    """Triton paged attention: one launch for mixed prefill chunks and decodes."""
    _check_shapes(inputs)
    from ._triton_attention import launch_paged_attention

    out = torch.empty_like(inputs.q)
    if inputs.q.shape[0] == 0 or inputs.seq_lens.shape[0] == 0:
        return out
    launch_paged_attention(inputs, out)
    return out


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    all_valid: bool = False,
) -> None:
    """Write ``k``/``v`` (``[T, kv_heads, head_dim]``) into flat cache slots.

    ``slot = block_id * block_size + offset``; slot ``-1`` skips the token. ``all_valid``: the caller knows
    no slot is ``-1`` (the attention metadata checks once per step), so no layer checks again.
    """
    if k.shape != v.shape or k.shape[0] != slot_mapping.shape[0]:
        raise ValueError(
            f"k {tuple(k.shape)}, v {tuple(v.shape)} and slot_mapping {tuple(slot_mapping.shape)} "
            "must agree on the number of tokens"
        )
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"k rows {tuple(k.shape[1:])} do not match cache rows {tuple(k_cache.shape[2:])}")
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.long)
    if all_valid and k_cache.is_contiguous() and v_cache.is_contiguous():
        # one copy per cache into its rows of slots (the same values as the indexed write below, in one
        # op instead of a check, two divisions and an index_put: this runs in every layer of every step)
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))
        return
    keep = slots >= 0
    if not bool(keep.all()):
        slots, k, v = slots[keep], k[keep], v[keep]
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, offsets] = v.to(v_cache.dtype)
