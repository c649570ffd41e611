"""Per-step attention metadata and the attention call the model makes in every layer.

The metadata is built once per step (not per layer), for the engine's compute backend (``kernels.backend``).
On ``triton`` the paged-attention kernel reads the block tables directly. On the CPU the batch is split
into vectorised groups (no loop over sequences):

* ``cpu-c``: single-token decodes through ``kernels.cpu_decode_attention``, and all prefill chunks in one
  call of ``kernels.cpu_prefill_attention``. Both read the paged cache in place: decode attention is bound
  by memory traffic, which a gathered copy multiplies, and a chunk continuing a cached prefix then costs no
  more than a fresh one (no gather, no position mask, no padding).
* ``torch``:
  - single-token decodes as one padded group, like the continued chunks below;
  - prefill chunks with nothing cached before them: one causal scaled-dot-product attention over this
    step's own keys and values, right-padded to the longest chunk (padded keys sit after every real
    query, so the causal mask hides them); no gather from the cache, and the flash kernel skips the
    masked upper triangle;
  - prefill chunks that continue a cached context: their blocks are gathered once per layer and one
    scaled-dot-product attention runs with an explicit position mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .attention import PagedAttentionInputs, paged_attention_triton, store_kv
from .backend import BackendName
from .cpu_decode_attention import paged_decode_attention_c
from .cpu_prefill_attention import paged_prefill_attention_c


@dataclass
class GroupPlan:
    """One vectorised CPU attention group (all decodes, or all prefill chunks)."""

    rows: torch.Tensor  # [B, Q] token rows in the flat batch (padding rows repeat a valid row)
    valid: torch.Tensor | None  # [B*Q] bool, None when no padding (every decode group)
    blocks: torch.Tensor  # [B, nblk] physical blocks to gather
    mask: torch.Tensor  # [B, 1, Q, nblk*block_size] bool, True = attend
    flat_rows: torch.Tensor  # [num valid] rows of the output to write
    q_pos: torch.Tensor  # [B, Q] absolute position of each query row
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)  # the mask per sliding window, built once


@dataclass
class CausalPlan:
    """Prefill chunks starting at position 0: causal attention over the step's own keys and values."""

    rows: torch.Tensor  # [B, Q] token rows in the flat batch, right-padded by repeating the last row
    valid: torch.Tensor | None  # [B*Q] bool, None when no padding
    flat_rows: torch.Tensor  # [num valid] rows of the output to write
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)  # the [Q, Q] mask per window, built once


@dataclass
class CDecodePlan:
    """The decode group on the C kernel: it reads the paged cache through the block tables itself."""

    rows: torch.Tensor  # [B] token row of each decode in the flat batch
    tables: torch.Tensor  # [B, nblk] int32
    seq_lens: torch.Tensor  # [B] int32
    checked: bool = False  # the tables passed the kernel's bounds check (first layer); later layers skip it
    whole: bool = False  # every token of the step is one of these decodes, in order: no gather, no scatter


@dataclass
class CPrefillPlan:
    """Every prefill chunk of the step on the C kernel, over the step's own tables and query layout."""

    skip_decodes: bool  # the decode rows belong to a CDecodePlan
    checked: bool = False  # as CDecodePlan.checked


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] flat cache slot of every new token
    block_tables: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32, context incl. this step's tokens
    query_start_loc: torch.Tensor  # [S+1] int32
    num_tokens: int
    backend: BackendName
    groups: list[GroupPlan | CDecodePlan | CausalPlan | CPrefillPlan]
    slots_valid: bool = False  # no slot is -1: every layer's store_kv skips its own check

    @classmethod
    def build(
        cls,
        q_lens: list[int],
        ctx_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device,
        backend: BackendName,
    ) -> AttentionMetadata:
        """q_lens: new tokens per sequence; ctx_lens: tokens already cached before this step."""
        num_seqs = len(q_lens)
        seq_lens = [c + q for c, q in zip(ctx_lens, q_lens)]
        starts = [0]
        for q in q_lens:
            starts.append(starts[-1] + q)
        slots: list[int] = []
        for table, c, q in zip(block_tables, ctx_lens, q_lens):
            for pos in range(c, c + q):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        max_blocks = max(len(t) for t in block_tables)
        padded = [t + [0] * (max_blocks - len(t)) for t in block_tables]
        meta = cls(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            num_tokens=starts[-1],
            backend=backend,
            groups=[],
            slots_valid=not slots or min(slots) >= 0,
        )
        c_kernels = backend == "cpu-c"
        if backend != "triton":
            decode = [i for i in range(num_seqs) if q_lens[i] == 1]
            fresh = [i for i in range(num_seqs) if q_lens[i] > 1 and ctx_lens[i] == 0]
            continued = [i for i in range(num_seqs) if q_lens[i] > 1 and ctx_lens[i] > 0]
            if decode and c_kernels:
                plan = _c_decode_plan(decode, seq_lens, starts, block_tables, block_size, device)
                plan.whole = len(decode) == num_seqs  # all decodes: row i is sequence i
                meta.groups.append(plan)
            elif decode:
                meta.groups.append(_group_plan(decode, q_lens, seq_lens, starts, block_tables, block_size, device))
            if (fresh or continued) and c_kernels:
                meta.groups.append(CPrefillPlan(skip_decodes=bool(decode)))
            else:
                if fresh:
                    meta.groups.append(_causal_plan(fresh, q_lens, starts, device))
                if continued:
                    meta.groups.append(
                        _group_plan(continued, q_lens, seq_lens, starts, block_tables, block_size, device)
                    )
        return meta

    def paged_inputs(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> PagedAttentionInputs:
        """One layer's attention inputs over this step's block tables and query layout."""
        return PagedAttentionInputs(
            q, k_cache, v_cache, self.block_tables, self.seq_lens, self.query_start_loc, scale, window, softcap
        )


def _c_decode_plan(
    members: list[int],
    seq_lens: list[int],
    starts: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
) -> CDecodePlan:
    nblk = max(-(-seq_lens[i] // block_size) for i in members)
    tables = [block_tables[i][:nblk] + [0] * (nblk - min(nblk, len(block_tables[i]))) for i in members]
    return CDecodePlan(
        rows=torch.tensor([starts[i] for i in members], dtype=torch.long, device=device),
        tables=torch.tensor(tables, dtype=torch.int32, device=device),
        seq_lens=torch.tensor([seq_lens[i] for i in members], dtype=torch.int32, device=device),
    )


def _padded_rows(
    members: list[int], q_lens: list[int], starts: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Each member's token rows right-padded (repeating its last row) to the longest [B, Q]; which of
    them are real [B*Q] (None without padding); the real rows in order."""
    qmax = max(q_lens[i] for i in members)
    rows, valid, flat_rows = [], [], []
    for i in members:
        r = list(range(starts[i], starts[i] + q_lens[i]))
        flat_rows.extend(r)
        rows.append(r + [r[-1]] * (qmax - len(r)))
        valid.extend([True] * len(r) + [False] * (qmax - len(r)))
    return (
        torch.tensor(rows, dtype=torch.long, device=device),
        None if all(valid) else torch.tensor(valid, dtype=torch.bool, device=device),
        torch.tensor(flat_rows, dtype=torch.long, device=device),
    )


def _causal_plan(members: list[int], q_lens: list[int], starts: list[int], device: torch.device) -> CausalPlan:
    rows, valid, flat_rows = _padded_rows(members, q_lens, starts, device)
    return CausalPlan(rows=rows, valid=valid, flat_rows=flat_rows)


def _group_plan(
    members: list[int],
    q_lens: list[int],
    seq_lens: list[int],
    starts: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
) -> GroupPlan:
    qmax = max(q_lens[i] for i in members)
    nblk = max(-(-seq_lens[i] // block_size) for i in members)
    rows, valid, flat_rows = _padded_rows(members, q_lens, starts, device)
    blocks = []
    for i in members:
        table = block_tables[i][:nblk]
        blocks.append(table + [table[-1]] * (nblk - len(table)))
    L = nblk * block_size
    key_pos = torch.arange(L, device=device)
    qlen_t = torch.tensor([q_lens[i] for i in members], device=device)
    slen_t = torch.tensor([seq_lens[i] for i in members], device=device)
    # query j of a sequence sits at position seq_len - q_len + j and sees keys 0..that position
    q_pos = slen_t[:, None] - qlen_t[:, None] + torch.arange(qmax, device=device)[None, :]
    mask = key_pos[None, None, :] <= q_pos[:, :, None]
    return GroupPlan(
        rows=rows,
        valid=valid,
        blocks=torch.tensor(blocks, dtype=torch.long, device=device),
        mask=mask.unsqueeze(1),
        flat_rows=flat_rows,
        q_pos=q_pos,
    )


def attention(inputs: PagedAttentionInputs, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """inputs.q: [T, H, D]; k, v: [T, KVH, D]. Writes k, v to the cache, returns attention output [T, H, D].

    ``inputs`` come from ``meta.paged_inputs`` (this step's tables). Every path takes the layer's ``window``
    and ``softcap``: the Triton and C kernels and the torch ones."""
    store_kv(k, v, inputs.k_cache, inputs.v_cache, meta.slot_mapping, all_valid=meta.slots_valid)
    if meta.backend == "triton":
        return paged_attention_triton(inputs)
    q, k_cache, v_cache = inputs.q, inputs.k_cache, inputs.v_cache
    scale, window, softcap = inputs.scale, inputs.window, inputs.softcap
    if len(meta.groups) == 1:
        g0 = meta.groups[0]
        if isinstance(g0, CDecodePlan) and g0.whole:  # a decode-only step (batch 1 included): the kernel's output
            decodes = PagedAttentionInputs(q, k_cache, v_cache, g0.tables, g0.seq_lens, None, scale, window, softcap)
            result = paged_decode_attention_c(decodes, check_tables=not g0.checked)
            g0.checked = True
            return result
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _, _bs, kvh, d = k_cache.shape
    for g in meta.groups:
        if isinstance(g, CPrefillPlan):
            paged_prefill_attention_c(inputs, out=out, skip_decodes=g.skip_decodes, check_tables=not g.checked)
            g.checked = True
            continue
        if isinstance(g, CDecodePlan):
            decodes = PagedAttentionInputs(
                q[g.rows], k_cache, v_cache, g.tables, g.seq_lens, None, scale, window, softcap
            )
            out[g.rows] = paged_decode_attention_c(decodes, check_tables=not g.checked)
            g.checked = True  # every layer's cache has the same number of blocks
            continue
        if isinstance(g, CausalPlan):
            b, qn = g.rows.shape
            qg, kg, vg = (t[g.rows].transpose(1, 2) for t in (q, k, v))  # [B, heads, Q, D]
            if window is None and softcap is None:
                o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=scale, enable_gqa=True)
            else:
                o = _masked_attention(qg, kg, vg, _causal_mask(g, qn, window, q.device), scale, softcap)
            o = o.transpose(1, 2).reshape(b * qn, -1, d)
            out[g.flat_rows] = o if g.valid is None else o[g.valid]
            continue
        b, qn = g.rows.shape
        keys = k_cache[g.blocks].view(b, -1, kvh, d).transpose(1, 2)
        vals = v_cache[g.blocks].view(b, -1, kvh, d).transpose(1, 2)
        qg = q[g.rows].transpose(1, 2)  # [B, H, Q, D]
        mask = g.mask if window is None else _window_mask(g, window)
        if softcap is None:
            o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=mask, scale=scale, enable_gqa=True)
        else:
            o = _masked_attention(qg, keys, vals, mask, scale, softcap)
        o = o.transpose(1, 2).reshape(b * qn, -1, d)
        if g.valid is not None:
            o = o[g.valid]
        out[g.flat_rows] = o
    return out


def _causal_mask(plan: CausalPlan, qn: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[Q, Q] bool: causal, and within ``window`` when one is given (built once per plan and window)."""
    key = window or 0
    if key not in plan.windowed:
        i = torch.arange(qn, device=device)
        mask = i[None, :] <= i[:, None]
        if window is not None:
            mask &= i[:, None] - i[None, :] < window
        plan.windowed[key] = mask
    return plan.windowed[key]


def _window_mask(plan: GroupPlan, window: int) -> torch.Tensor:
    """The plan's mask restricted to the last ``window`` positions of each query (built once per window)."""
    if window not in plan.windowed:
        key_pos = torch.arange(plan.mask.shape[-1], device=plan.mask.device)
        recent = key_pos[None, None, :] > plan.q_pos[:, :, None] - window
        plan.windowed[window] = plan.mask & recent.unsqueeze(1)
    return plan.windowed[window]


def _masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
) -> torch.Tensor:
    """Attention with a boolean mask and optional tanh soft-capping of the scores (transformers' eager order:
    scale, cap, mask, softmax in float32). q: [B, H, Q, D]; k, v: [B, KVH, L, D]."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)
